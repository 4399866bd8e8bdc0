"""Recipes: YAML with four sections (model, data, train, runtime), loaded strictly into dataclasses.

Strictness is the point: a typo in a key, a wrong type, a value out of range (NaN and infinity included) or a key
that does not apply to the chosen option stops the run before any device work, with a one-paragraph message naming
the file, the key path, the value received and the fix (Accelerate/Lightning style).

The checks live in the dataclasses themselves (`__post_init__`), so a recipe built in Python, or changed with
`dataclasses.replace`, is held to the same rules as one loaded from YAML. The `model` section is `name` plus the
keyword arguments of that model's builder; the `data` section is the pipeline knobs below plus the keyword arguments
of the chosen `source`. Builders and sources are the schema for their own keys: their signatures and annotations
are read, so adding a model needs no schema edit here.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import logging
import math
import re
import reprlib
import types
import typing
from typing import Any, Literal, Union

SECTIONS = ("model", "data", "train", "runtime")

# Counts and sizes (batches, steps, epochs, buffers) must fit TensorFlow's int32 shapes and sizes.
INT32_MAX = 2**31 - 1
# Any other integer (model and source arguments) must fit int64: a larger one overflows in NumPy or TensorFlow.
INT64_MAX = 2**63 - 1
# keras.utils.set_random_seed (NumPy's legacy seeding) accepts only [0, 2**32 - 1].
SEED_MAX = 2**32 - 1
# Recipes are a few KB; a file this large is not a recipe (say, a dataset passed by mistake), so it is not parsed.
MAX_RECIPE_BYTES = 1 << 20


class RecipeError(ValueError):
    """A recipe (or an override) is invalid. The message names the file, key, value received and the fix."""


# Keys of the `model` section that tpukit reads itself (fine-tuning); every other key goes to the builder.
# Data keys a source may declare that default to the model section's (`_inherit_model_arguments`).
INHERITED_DATA_KEYS = ("preset", "sequence_length")
MODEL_FIELDS = ("name", "init_weights", "freeze", "lora_rank", "lora_targets")

# What a model's output is trained to predict (`train.task`); "auto" infers it from the model and the labels.
TASKS = ("auto", "classification", "binary", "multi_label", "regression")
Task = Literal["auto", "classification", "binary", "multi_label", "regression"]


@dataclasses.dataclass
class ModelConfig:
    """`name` picks a builder in `tpukit.models.MODELS`; every other key is passed to that builder, except the
    fine-tuning keys below, which tpukit applies to the built model (a new run only: a resume restores its own)."""

    name: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Weights to start from: a `.keras` file, a `.weights.h5` file or a tpukit output directory (its model.keras).
    init_weights: str | None = None
    # Regular expressions (re.search) over layer names (and weight paths): matching layers are not trained.
    freeze: tuple[str, ...] | None = None
    # LoRA rank for every Dense and EinsumDense layer not frozen (Keras' `layer.enable_lora(rank)`); null: none.
    lora_rank: int | None = None
    # With lora_rank: the names of the layers to adapt (on a KerasHub backbone its `enable_lora(rank,
    # target_layer_names=...)`, e.g. [query, value, ffw_gating]); null: KerasHub's default_lora_layer_names(), or
    # every Dense and EinsumDense elsewhere.
    lora_targets: tuple[str, ...] | None = None

    def __post_init__(self):
        _validate_model(self)


@dataclasses.dataclass
class DataConfig:
    """Input pipeline. Batch sizes are GLOBAL (summed over replicas); per-replica sizes are derived.

    Keys not listed here are keyword arguments of the `source` function in `tpukit.data.SOURCES`.
    """

    source: str
    global_batch_size: int
    eval_global_batch_size: int | None = None  # defaults to global_batch_size
    train_split: str = "train"
    eval_split: str | None = "test"  # null: no evaluation
    shuffle_buffer: int = 10_000
    cache: bool = True  # in memory, if it fits (else logged and skipped)
    # true: tf.data keeps its order, so train.seed repeats a run exactly (random augmentation aside: see docs/data.md)
    # and a resumed run sees an uninterrupted run's batches; false: parallel stages may reorder, for input-bound runs.
    deterministic: bool = True
    cast_to_compute_dtype: bool = (
        True  # float features -> the policy's compute dtype on the host (bf16 infeed)
    )
    prefetch_batches: int | None = None  # null: AUTOTUNE; 0: no prefetching
    private_threadpool_size: int = 0  # >0: tf.data threads of its own; 0: TensorFlow's shared pool
    # true: skip records that fail to parse/decode and count them (log + metrics.json); false: stop with an error
    # naming the file and record.
    skip_corrupt: bool = False
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # source kwargs

    def __post_init__(self):
        _validate_data(self)


@dataclasses.dataclass
class TrainConfig:
    """Optimization. Keys marked "only" are refused when their option is not chosen; null means the default."""

    epochs: int
    # The peak rate (scaled by global/reference batch when reference_batch_size is set). null: the optimizer the
    # model was compiled with, if it was (else Adam at Keras' default 0.001).
    learning_rate: float | None
    steps_per_epoch: int | None = None  # null: one pass over the training split
    optimizer: Literal["adam", "adamw", "sgd", "lamb", "lars"] = "adam"
    momentum: float | None = None  # sgd and lars only; null: 0.9
    weight_decay: float = (
        0.0  # in the optimizer (decoupled for adamw/lamb, coupled L2 for sgd/lars), not the loss
    )
    schedule: Literal["constant", "cosine", "step"] = "constant"
    warmup_steps: int = 0
    decay_boundaries: tuple[float, ...] | None = (
        None  # schedule step only, fractions of the total steps; null: [0.5, 0.75]
    )
    decay_rate: float | None = None  # schedule step only, the factor at each boundary; null: 0.1
    reference_batch_size: int | None = (
        None  # linear scaling rule: lr * global_batch_size / reference_batch_size
    )
    trust_coefficient: float | None = None  # lars only; null: 0.001
    label_smoothing: float = 0.0
    seed: int = 0
    eval_every_epochs: int = 1  # validation during training (mode train_and_eval)
    early_stopping_patience: int | None = (
        None  # epochs without improvement of early_stopping_metric
    )
    early_stopping_metric: str | None = None  # with early_stopping_patience only; null: val_loss
    export_best_by: str | None = (
        None  # e.g. val_accuracy: also keep best.keras, the best model by that metric
    )
    max_nan_retries: int = (
        3  # rollbacks to the last checkpoint after a non-finite loss before giving up
    )
    # What each output predicts: auto (inferred from the model's outputs and the labels), classification (integer,
    # one-hot or soft labels), binary, multi_label or regression; a mapping of output name -> task for several.
    task: Task | dict[str, Task] = "auto"
    # The loss instead of the task's: a Keras loss name ("huber") or "module.path:function"; per output: a list in
    # output order or a mapping by output name.
    loss: str | tuple[str, ...] | dict[str, str] | None = None
    loss_weights: dict[str, float] | tuple[float, ...] | None = (
        None  # several outputs: weight of each loss
    )
    # Metrics instead of the task's (Keras names or "module.path:function"): the same for every output, or per output
    # a mapping by output name, or (several outputs) a list with one entry per output, as Keras reads it.
    metrics: tuple[str | tuple[str, ...], ...] | dict[str, str | tuple[str, ...]] | None = None
    gradient_accumulation_steps: int | None = (
        None  # apply the summed gradients every k steps; null: every step
    )
    ema_momentum: float | None = (
        None  # keep an exponential moving average of the weights (e.g. 0.999); null: none
    )
    global_clipnorm: float | None = (
        None  # clip the gradients' global norm to this; null: no clipping
    )
    # The tensorflow engine sums the gradient slices of an embedding row looked up several times in a batch before
    # the optimizer (one update per row, as the optimizer's definition and the jax engine say). false: Keras-TF's
    # own per-lookup updates (tensorflow/tensorflow#28090), to reproduce a plain Keras-TF run exactly.
    combine_repeated_ids: bool = True
    # Weigh training examples by class, as keras.Model.fit(class_weight=...): class id -> weight (>= 0; a class it
    # does not name weighs 1), times any per-example sample weight. One classification or binary output only.
    class_weight: dict[int, float] | None = None
    # Also score the trivial baseline on the eval split (metrics.json "baseline"): a regression output predicting
    # the training labels' mean, a classifier its most frequent training class. One extra pass over the labels.
    baseline: bool = False
    # A model that generates text (a KerasHub causal LM): prompts whose generations are logged, and written to
    # TensorBoard, after each evaluation and at the end; null: none. sample_max_length: tokens in a generation
    # (prompt included); null: the model's sequence_length.
    sample_prompts: tuple[str, ...] | None = None
    sample_max_length: int | None = None

    def __post_init__(self):
        _validate_train(self)


@dataclasses.dataclass
class RuntimeConfig:
    """The only section that mentions hardware: a CPU and a TPU recipe differ here (and in batch size)."""

    tpu: str | None = None  # a TPU name, grpc://host:port or "local"; null: auto-detect
    precision: Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"] = "auto"
    jit_compile: bool | Literal["auto"] = "auto"
    # Steps per host call (the main TPU throughput knob). auto: the largest divisor of the epoch whose call takes
    # at most steps_per_execution_target_seconds, estimated from the model's FLOPs and the devices' peak.
    steps_per_execution: int | Literal["auto"] = 1
    steps_per_execution_target_seconds: float | None = (
        None  # with steps_per_execution auto only; null: 0.5
    )
    checkpoint_every_steps: int | None = (
        None  # null: no saves by step count (epoch ends: see below)
    )
    # Epoch-end saves are skipped while saving would take more than this fraction of the wall time since the last
    # save (a 14 ms save after 0.1 s epochs costs 12%); the first save's cost is estimated from the checkpoint's
    # size. null: save at every epoch end. The last step, an early stop, SIGTERM and checkpoint_every_steps always
    # save.
    checkpoint_max_overhead: float | None = 0.02
    max_checkpoints_to_keep: int = 3
    profile_steps: tuple[int, ...] | None = (
        None  # [first, last] step for a TensorBoard profiler trace
    )
    verbose: int | Literal["auto"] = (
        "auto"  # auto: progress bar on a terminal, one line per epoch otherwise
    )
    # Who runs the steps: auto = Keras' own train function, except where it fails (2+ Mirrored replicas with
    # steps_per_execution > 1, MultiWorkerMirroredStrategy), which get tpukit's Orbit-style loop (tpukit/engines/tensorflow/loop.py);
    # tpukit = tpukit's loop everywhere (the escape hatch when Keras' loop fails on a TPU); keras = Keras' always.
    loop: Literal["auto", "keras", "tpukit"] = "auto"
    # Bounded waits (each logs what it waits for every 30 s and answers SIGTERM/Ctrl-C): connecting to and
    # initializing a TPU (a v4/v5 slice takes 1-3 minutes to come up), and, on a TF_CONFIG cluster, waiting for every
    # worker to start (pod hosts and schedulers can start minutes apart). An address where nothing listens is known
    # within seconds, not at the timeout.
    tpu_timeout_seconds: float = 600.0
    workers_timeout_seconds: float = 1800.0
    # Who trains: tensorflow (tf.distribute + Keras' TensorFlow trainer) or jax (Keras on JAX with
    # keras.distribution: data and model parallelism). auto, in order: the backend of a Keras this process imported
    # already; tensorflow for a $TF_CONFIG cluster; on a TPU, tensorflow if tensorflow-tpu is installed, else jax
    # (Colab, Kaggle, TPU VMs with jax[tpu]); tensorflow on GPUs and CPUs (tpukit/environment/engine_choice.py).
    # The backend is fixed when Keras is first imported: the CLI sets it from this key; in Python call
    # tpukit.use_engine("auto") (or "jax") before anything imports Keras.
    engine: Literal["auto", "tensorflow", "jax"] = "auto"
    # The device mesh: `data` devices split the batch, `model` devices split each sharded weight (the jax engine
    # only). data: auto = every device not on the model axis. `mesh: auto` (the default) is {data: auto, model: 1},
    # or the device_mesh of a Keras LayoutMap in runtime.layout.
    mesh: dict[str, Any] | Literal["auto"] = "auto"
    # Which weights shard on the `model` axis (the jax engine only): {key: [an axis name or null per dimension]},
    # e.g. {".*mlp_in/kernel": [null, model]}, keys matched as Keras' LayoutMap matches them (the key equal to a
    # variable's path, else each key as a regex matched whole); a key `<layer path>/output` lays out that layer's
    # output. From Python also a keras.distribution.LayoutMap (its axes data or batch -> data, the other -> model;
    # its device_mesh sizes runtime.mesh) or a builder of one (KerasHub's `GemmaBackbone.get_layout_map`; tpukit
    # calls it with its mesh). null: the built-in model's default layout (a model without one stays replicated).
    # Every entry must match a variable or a layer's output (tpukit.planner.layouts).
    layout: dict[str, Any] | None = None
    # Set by tpukit, not by a recipe: what sized runtime.mesh when a Keras LayoutMap's device_mesh did (messages
    # then name that DeviceMesh, not runtime.mesh); null: runtime.mesh itself.
    mesh_from: str | None = None

    def __post_init__(self):
        _validate_runtime(self)


@dataclasses.dataclass
class Recipe:
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    path: str = "<dict>"

    def __post_init__(self):
        for name, cls in (
            ("model", ModelConfig),
            ("data", DataConfig),
            ("train", TrainConfig),
            ("runtime", RuntimeConfig),
        ):
            value = getattr(self, name)
            if not isinstance(value, cls):
                raise RecipeError(
                    f"{self.path}: Recipe.{name} must be a tpukit.recipe.{cls.__name__}; received "
                    f"{_show(value)} ({type(value).__name__}). Fix: build it with {cls.__name__}(...), or load the "
                    "recipe with tpukit.load_recipe / tpukit.recipe.from_dict."
                )
        _inherit_model_arguments(self)

    def validate(self) -> Recipe:
        """Checks every section again (after fields were assigned in place); returns self. Raises RecipeError.

        Construction already validates; this is for code that mutates a recipe's sections attribute by attribute.
        """
        try:
            for section in (self.model, self.data, self.train, self.runtime):
                section.__post_init__()
        except RecipeError as error:
            raise RecipeError(f"{self.path}: {error}") from None
        return self

    def with_engine(self, engine: str) -> Recipe:
        """This recipe with `runtime.engine` set to `engine`: what a run trains with once `auto` is resolved
        (`tpukit.environment.engine_choice`), so that the plan, the task and the engine read one engine."""
        if self.runtime.engine == engine:
            return self
        return dataclasses.replace(self, runtime=dataclasses.replace(self.runtime, engine=engine))

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain YAML-able data, in the same shape as the file (used to save the resolved recipe)."""
        data = {
            f.name: getattr(self.data, f.name)
            for f in dataclasses.fields(DataConfig)
            if f.name != "options"
        }
        data.update(self.data.options)
        tuned = {
            key: getattr(self.model, key)
            for key in MODEL_FIELDS[1:]
            if getattr(self.model, key) is not None
        }
        return {
            "model": {"name": self.model.name, **self.model.kwargs, **tuned},
            "data": data,
            "train": dataclasses.asdict(self.train),
            "runtime": dataclasses.asdict(self.runtime),
        }


def _inherit_model_arguments(recipe: Recipe) -> None:
    """A source that declares `preset` or `sequence_length` (keras_hub_text) takes the model's when the data section
    leaves them out: `--set model.preset=DIR` then points the tokenizer and the model at the same preset."""
    from tpukit.data import SOURCES

    source = SOURCES.get(recipe.data.source)
    if source is None:
        return
    params = inspect.signature(source).parameters
    for key in INHERITED_DATA_KEYS:
        if key in params and key not in recipe.data.options and key in recipe.model.kwargs:
            recipe.data.options[key] = recipe.model.kwargs[key]


# --------------------------------------------------------------------------------------------------------------
# Messages.


class _Repr(reprlib.Repr):
    def repr_int(self, x, level):
        """Python refuses to print an integer of more than 4300 digits (a YAML 0x... integer can be longer)."""
        try:
            return super().repr_int(x, level)
        except ValueError:
            return f"<an integer of {x.bit_length():,} bits>"


# A message echoes what it received, shortened: never a whole file, a long list or an alias bomb. reprlib keeps the
# start of each string (80 characters) and container (6 items, 4 keys) and 3 levels of nesting; what that can still
# add up to (6 * 6 * 6 strings of 80 characters: 17 KB) is cut to _SHOW_MAX characters, so a message stays a
# paragraph whatever the recipe holds.
_REPR = _Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3
_SHOW_MAX = 240
# Text quoted whole in a message (a key, a --set argument, a YAML parser's problem) up to this many characters.
_QUOTE_MAX = 240


def _show(value: Any) -> str:
    """A received value as a message shows it: its repr, shortened to at most _SHOW_MAX characters."""
    return "null" if value is None else _clip(_REPR.repr(value), _SHOW_MAX)


def _clip(text: str, limit: int = _QUOTE_MAX) -> str:
    """`text` whole when at most `limit` characters, else its start, '...' and its end (both ends say most)."""
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return f"{text[:half]}...{text[len(text) - half :]}"


def _key_name(key: Any) -> str:
    """A key as written in a message: plain when it reads as a name, else its repr (no newlines, no surprises)."""
    if isinstance(key, str) and key.isidentifier() and len(key) <= _QUOTE_MAX:
        return key
    try:
        shown = repr(key)
    except ValueError:  # an integer beyond the 4300 digits Python prints
        return _show(key)
    return shown if len(shown) <= _QUOTE_MAX else _show(key)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        inner = _type_name(args[0]) if args else "value"
        return f"a list of {inner}"
    if origin is dict:
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _unknown_key_error(
    section: str, key: Any, value: Any, valid: list[str], where: str
) -> RecipeError:
    close = difflib.get_close_matches(key if isinstance(key, str) else _show(key), valid, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    name = _key_name(key)
    return RecipeError(
        f"unknown key {section}.{name} (received {_show(value)}).{hint} Valid keys in {section}{where}: "
        f"{', '.join(sorted(valid))}. Fix: rename or remove {section}.{name}."
    )


def _missing_key_error(section: str, key: str, tp: Any, where: str = "") -> RecipeError:
    return RecipeError(
        f"missing required key {section}.{key}{where} ({_type_name(tp)}). Fix: add `{key}: ...` under `{section}:`."
    )


# --------------------------------------------------------------------------------------------------------------
# Type checking of single values.


class _Mismatch(Exception):
    pass


def _coerce(value: Any, tp: Any) -> Any:
    """Returns `value` converted to `tp` (list -> tuple, int -> float), or raises _Mismatch."""
    if tp is Any or tp is inspect.Parameter.empty:
        return value
    origin = typing.get_origin(tp)
    if tp is type(None):
        if value is None:
            return None
        raise _Mismatch
    if origin is Literal:
        if any(value == choice and type(value) is type(choice) for choice in typing.get_args(tp)):
            return value
        raise _Mismatch
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch
        args = typing.get_args(tp)
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise _Mismatch
        key_tp, value_tp = typing.get_args(tp) or (Any, Any)
        return {_coerce(k, key_tp): _coerce(v, value_tp) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise _Mismatch


def _check_numbers(key: str, value: Any, seen: set[int] | None = None) -> None:
    """Refuses NaN, infinities and integers beyond int64 anywhere inside `value` (lists and mappings included).

    NaN and infinity are valid YAML (`.nan`, `.inf`) and valid Python floats, and would otherwise train until the
    NaN guard gives up. Containers are visited once each, so YAML aliases cannot make this exponential.
    """
    seen = set() if seen is None else seen
    if isinstance(value, float) and not math.isfinite(value):
        raise RecipeError(
            f"{key} must be a finite number; received {_show(value)}. Fix: use a finite value (NaN and infinity are "
            "never valid in a recipe)."
        )
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT64_MAX:
        raise RecipeError(
            f"{key} is too large: received {_show(value)}, beyond the 64-bit integer range (+-{INT64_MAX}). "
            f"Fix: use a smaller value for {key}."
        )
    if isinstance(value, (list, tuple, dict)):
        if id(value) in seen:
            return
        seen.add(id(value))
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for item_key, item in items:
            _check_numbers(key, item_key, seen)
            _check_numbers(key, item, seen)


def _check_value(key: str, value: Any, tp: Any) -> Any:
    _check_numbers(key, value)
    try:
        return _coerce(value, tp)
    except _Mismatch:
        received = f"{_show(value)} ({type(value).__name__})"
        if typing.get_origin(tp) is Literal:
            raise RecipeError(
                f"{key} must be one of {_type_name(tp)}; received {received}. Fix: set {key} to one of the valid choices."
            ) from None
        fix = f"change the value of {key}"
        if isinstance(value, str) and _yaml_number_text(value):
            # YAML 1.1 (PyYAML) reads an exponent without a dot, like 1e-6, as text.
            example = _clip(_yaml_number_text(value))
            fix = f"write it with a dot, e.g. {key.split('.')[-1]}: {example}"
        raise RecipeError(
            f"{key} must be {_type_name(tp)}; received {received}. Fix: {fix}."
        ) from None


def _yaml_number_text(text: str) -> str | None:
    """`1e-6` -> `1.0e-6`, `2E3` -> `2.0e+3`: the YAML 1.1 spelling (a dot and a signed exponent) of a number that
    PyYAML left as a string; None if `text` is no such number."""
    match = re.fullmatch(r"([-+]?\d+)[eE]([-+]?)(\d+)", text.strip())
    return f"{match.group(1)}.0e{match.group(2) or '+'}{match.group(3)}" if match else None


@functools.cache
def _class_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _hints(fn_or_cls) -> dict[str, Any]:
    """Type hints, cached for classes (the recipe's sections) only: a cache keyed by a builder or a source would keep
    it alive, and with it the caller's arrays that a `tpukit.fit` source closes over."""
    if isinstance(fn_or_cls, type):
        return _class_hints(fn_or_cls)
    return typing.get_type_hints(fn_or_cls)


def _check_fields(config, section: str, skip: tuple[str, ...] = ()) -> None:
    """Type-checks (and coerces, e.g. list -> tuple) every field of a section dataclass in place."""
    hints = _hints(type(config))
    for f in dataclasses.fields(config):
        if f.name not in skip:
            setattr(
                config,
                f.name,
                _check_value(f"{section}.{f.name}", getattr(config, f.name), hints[f.name]),
            )


def _in_range(
    key: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    example: Any = None,
) -> None:
    """Raises unless `value` (None is always accepted: the default applies) lies within the bounds given."""
    if value is None:
        return
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        bounds = [
            f"{'>' if low_open else '>='} {low}" if low is not None else "",
            f"{'<' if high_open else '<='} {high}" if high is not None else "",
        ]
        fix = (
            f"e.g. {key.split('.')[-1]}: {example}"
            if example is not None
            else "use a value in that range"
        )
        raise RecipeError(
            f"{key} must be {' and '.join(b for b in bounds if b)}; received {_show(value)}. Fix: {fix}."
        )


def _count(key: str, value: Any, low: int = 1, example: Any = None) -> None:
    _in_range(key, value, low, INT32_MAX, example=example)


# Keys read only under some choice of another key: (the deciding key, the values it applies to, or None for "set to
# anything but null"; its default then). Elsewhere the key must stay null, so it cannot be set by mistake.
_CONDITIONAL: dict[str, dict[str, tuple[str, tuple | None, Any]]] = {
    "train": {
        "momentum": ("optimizer", ("sgd", "lars"), 0.9),
        "trust_coefficient": ("optimizer", ("lars",), 0.001),
        "decay_boundaries": ("schedule", ("step",), (0.5, 0.75)),
        "decay_rate": ("schedule", ("step",), 0.1),
        "early_stopping_metric": ("early_stopping_patience", None, "val_loss"),
    },
    "runtime": {
        "steps_per_execution_target_seconds": ("steps_per_execution", ("auto",), 0.5),
    },
}


def _resolve_conditional(config, section: str) -> None:
    """Refuses a conditional key set where it does not apply; fills in its default where it does."""
    rules = _CONDITIONAL[section]
    applies = {}
    for key, (decider, values, _) in rules.items():
        current = getattr(config, decider)
        applies[key] = current is not None if values is None else current in values
    for key, (decider, values, default) in rules.items():
        value = getattr(config, key)
        if applies[key]:
            if value is None:
                setattr(config, key, default)
            continue
        if value is None:
            continue
        current = getattr(config, decider)
        when = "is set" if values is None else f"is {' or '.join(map(str, values))}"
        valid = [
            f.name
            for f in dataclasses.fields(config)
            if not (f.name in rules and not applies[f.name])
        ]
        raise RecipeError(
            f"key {section}.{key} (received {_show(value)}) does not apply: it is read only when {section}.{decider} "
            f"{when}, and {section}.{decider} is {_show(current)}. Valid keys in {section} with these choices: "
            f"{', '.join(sorted(valid))}. Fix: remove {section}.{key} (or set it to null), or change {section}.{decider}."
        )


# --------------------------------------------------------------------------------------------------------------
# Section validation (run by each dataclass's __post_init__; messages carry no file name, from_dict adds it).


def _signature_params(fn, skip: tuple[str, ...]) -> dict[str, inspect.Parameter]:
    params = inspect.signature(fn).parameters
    return {
        name: p
        for name, p in params.items()
        if name not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _check_kwargs(
    fn,
    kwargs: Any,
    params: dict[str, inspect.Parameter],
    section: str,
    where: str,
    fields: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Checks the keyword arguments of a builder or source against its signature: names, types, required ones."""
    if not isinstance(kwargs, dict):
        raise RecipeError(
            f"the keyword arguments of {section}{where} must be a mapping; received {_show(kwargs)} "
            f"({type(kwargs).__name__}). Fix: pass a dict of argument names to values."
        )
    hints = _hints(fn)
    out = {}
    for key, value in kwargs.items():
        if key not in params:
            raise _unknown_key_error(section, key, value, [*fields, *params], where)
        out[key] = _check_value(f"{section}.{key}", value, hints.get(key, Any))
    for name, p in params.items():
        if p.default is inspect.Parameter.empty and name not in out:
            raise _missing_key_error(section, name, hints.get(name, Any), where)
    return out


def _lookup(registry: dict[str, Any], name: Any, key: str):
    """A registered name, or an importable `module:function` (see tpukit/recipe/registry.py)."""
    from tpukit.recipe import registry as registry_lib

    try:
        return registry_lib.lookup(registry, name, key)
    except registry_lib.RegistryError as error:
        # The registry's message quotes the name whole, twice: a long one gets this shorter message instead.
        if isinstance(name, str) and len(name) > _QUOTE_MAX:
            raise RecipeError(
                f"{key}={_show(name)} ({len(name):,} characters) is neither a registered name nor an importable "
                "'module.path:function'. Fix: check the spelling, and that its package is installed or on "
                "PYTHONPATH."
            ) from None
        raise RecipeError(str(error)) from None


def _validate_model(config: ModelConfig) -> None:
    from tpukit.models import MODELS

    builder = _lookup(MODELS, config.name, "model.name")
    params = _signature_params(builder, skip=())
    where = f" for model {_clip(repr(config.name))}"
    config.kwargs = _check_kwargs(builder, config.kwargs, params, "model", where, MODEL_FIELDS)
    # A builder may check its own arguments' contents before anything is built (tables of a recommender).
    check_arguments = getattr(builder, "check_arguments", None)
    if check_arguments is not None:
        try:
            check_arguments(config.kwargs)
        except ValueError as error:
            raise RecipeError(f"model.{_clip(str(error), 600)}") from None
    _check_fields(config, "model", skip=("name", "kwargs"))
    if config.init_weights == "":
        raise RecipeError(
            "model.init_weights must name a .keras file, a .weights.h5 file or a tpukit output directory; received "
            "''. Fix: e.g. init_weights: runs/pretrained, or null."
        )
    for pattern in config.freeze or ():
        try:
            re.compile(pattern)
        except (re.error, RecursionError, OverflowError) as error:
            problem = (
                "nested too deeply" if isinstance(error, RecursionError) else _clip(str(error))
            )
            raise RecipeError(
                f"model.freeze holds {_show(pattern)}, which is not a regular expression ({problem}). Fix: e.g. "
                "freeze: ['^conv', 'embedding'] (matched with re.search against layer names)."
            ) from None
    _count("model.lora_rank", config.lora_rank, example=8)
    if config.lora_targets is not None:
        if config.lora_rank is None:
            raise RecipeError(
                f"model.lora_targets={list(config.lora_targets)} needs model.lora_rank, which is null. Fix: set "
                "model.lora_rank (e.g. 8), or remove lora_targets."
            )
        if not config.lora_targets or not all(
            isinstance(n, str) and n for n in config.lora_targets
        ):
            raise RecipeError(
                f"model.lora_targets must be a non-empty list of layer names; received "
                f"{_show(list(config.lora_targets))}. Fix: e.g. lora_targets: [query, value], or null."
            )


def _check_source_signature(name: str, source) -> None:
    """A source is called as `source(split=..., input_context=..., **options)`."""
    params = inspect.signature(source).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    missing = [arg for arg in ("split", "input_context") if arg not in params and not takes_any]
    if missing:
        raise RecipeError(
            f"data.source={_show(name)} does not take {' or '.join(missing)}: tpukit calls a source as "
            "source(split=..., input_context=..., **options) and expects an unbatched tf.data.Dataset of "
            "(features, label). Fix: add the parameters, e.g. def my_source(split='train', input_context=None): ... "
            "return tpukit.data.shard(dataset, input_context)."
        )


def _validate_data(config: DataConfig) -> None:
    from tpukit.data import SOURCE_RESERVED_ARGS, SOURCES

    source = _lookup(SOURCES, config.source, "data.source")
    _check_source_signature(config.source, source)
    _check_fields(config, "data", skip=("options",))
    params = _signature_params(source, skip=SOURCE_RESERVED_ARGS)
    fields = tuple(f.name for f in dataclasses.fields(DataConfig) if f.name != "options")
    config.options = _check_kwargs(
        source, config.options, params, "data", f" for source {_clip(repr(config.source))}", fields
    )
    _count("data.global_batch_size", config.global_batch_size, example=64)
    _count("data.eval_global_batch_size", config.eval_global_batch_size, example=64)
    _count("data.shuffle_buffer", config.shuffle_buffer, example=10_000)
    _count("data.prefetch_batches", config.prefetch_batches, low=0, example="null (AUTOTUNE)")
    _count("data.private_threadpool_size", config.private_threadpool_size, low=0, example=0)
    for key in ("train_split", "eval_split"):
        if getattr(config, key) == "":
            raise RecipeError(f"data.{key} must name a split; received ''. Fix: e.g. {key}: train.")


def _check_class_weight(value: Any) -> None:
    """`train.class_weight`: a non-empty mapping of class id (an integer >= 0) to a weight (a number >= 0)."""
    if value is None:
        return
    example = "Fix: a mapping of class id to weight, e.g. class_weight: {0: 1.0, 1: 3.0}"
    if not isinstance(value, dict) or not value:
        raise RecipeError(
            f"train.class_weight must be a mapping of class id to weight; received {_show(value)}. {example}, "
            "or null."
        )
    for key, weight in value.items():
        if isinstance(key, bool) or not isinstance(key, int) or not 0 <= key <= INT32_MAX:
            raise RecipeError(
                f"train.class_weight keys must be class ids (integers >= 0); received key {_show(key)} "
                f"({type(key).__name__}). {example}."
            )
        number = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        if not number or not math.isfinite(weight) or weight < 0:
            raise RecipeError(
                f"train.class_weight[{key}] must be a finite number >= 0; received {_show(weight)}. {example}."
            )


def _validate_train(config: TrainConfig) -> None:
    _check_class_weight(config.class_weight)
    _check_fields(config, "train")
    _resolve_conditional(config, "train")
    _count("train.epochs", config.epochs, example=10)
    _count("train.steps_per_epoch", config.steps_per_epoch, example="null (one pass over the data)")
    _in_range("train.learning_rate", config.learning_rate, 0, example=0.001)
    _in_range("train.momentum", config.momentum, 0, 1, high_open=True, example=0.9)
    _in_range("train.weight_decay", config.weight_decay, 0, example=0.0001)
    _count("train.warmup_steps", config.warmup_steps, low=0, example=0)
    _count("train.sample_max_length", config.sample_max_length, example=64)
    if config.sample_prompts is not None and (
        not config.sample_prompts
        or not all(isinstance(p, str) and p for p in config.sample_prompts)
    ):
        raise RecipeError(
            f"train.sample_prompts must be a non-empty list of prompts (strings); received "
            f"{_show(list(config.sample_prompts))}. Fix: e.g. sample_prompts: ['what is 3 plus 4 ?'], or null."
        )
    _in_range("train.decay_rate", config.decay_rate, 0, low_open=True, example=0.1)
    boundaries = config.decay_boundaries
    if boundaries is not None and (
        any(not 0 < b < 1 for b in boundaries) or list(boundaries) != sorted(set(boundaries))
    ):
        raise RecipeError(
            "train.decay_boundaries must be increasing fractions of the run in (0, 1); received "
            f"{_show(list(boundaries))}. Fix: e.g. decay_boundaries: [0.5, 0.75] decays at half and three quarters of the run."
        )
    _count("train.reference_batch_size", config.reference_batch_size, example=256)
    _in_range("train.trust_coefficient", config.trust_coefficient, 0, low_open=True, example=0.001)
    _in_range("train.label_smoothing", config.label_smoothing, 0, 1, high_open=True, example=0.1)
    _in_range("train.seed", config.seed, 0, SEED_MAX, example=0)
    _count("train.eval_every_epochs", config.eval_every_epochs, example=1)
    _count("train.early_stopping_patience", config.early_stopping_patience, low=0, example=5)
    _count("train.max_nan_retries", config.max_nan_retries, low=0, example=3)
    for key in ("early_stopping_metric", "export_best_by"):
        if getattr(config, key) == "":
            raise RecipeError(
                f"train.{key} must name a metric; received ''. Fix: e.g. {key}: val_accuracy, or null."
            )
    _count("train.gradient_accumulation_steps", config.gradient_accumulation_steps, example=4)
    _in_range(
        "train.ema_momentum",
        config.ema_momentum,
        0,
        1,
        low_open=True,
        high_open=True,
        example=0.999,
    )
    _in_range("train.global_clipnorm", config.global_clipnorm, 0, low_open=True, example=1.0)
    weights = config.loss_weights
    values = weights.values() if isinstance(weights, dict) else (weights or ())
    for value in values:
        _in_range("train.loss_weights", value, 0, example="{output_a: 1.0, output_b: 0.2}")
    for key in ("loss", "metrics"):
        value = getattr(config, key)
        names = value.values() if isinstance(value, dict) else [value]
        if any(name == "" or name == () for name in names):
            raise RecipeError(
                f"train.{key} must name a Keras {key[:-1] if key == 'metrics' else key} or a "
                f"'module.path:function'; received {_show(value)}. Fix: e.g. {key}: "
                f"{'[mae]' if key == 'metrics' else 'huber'}, or null for the task's own."
            )
    if config.learning_rate is None:
        _check_own_optimizer(config)
    if config.optimizer == "adam" and config.weight_decay > 0:
        raise RecipeError(
            f"train.weight_decay={config.weight_decay} has no effect with train.optimizer: adam. "
            "Fix: use optimizer: adamw (decoupled weight decay), or set weight_decay: 0."
        )


# With train.learning_rate null tpukit builds no optimizer, so these settings of its optimizer would be ignored.
_OPTIMIZER_SETTINGS = (
    ("optimizer", "adam"),
    ("weight_decay", 0.0),
    ("schedule", "constant"),
    ("warmup_steps", 0),
    ("reference_batch_size", None),
    ("gradient_accumulation_steps", None),
    ("ema_momentum", None),
    ("global_clipnorm", None),
)


def _check_own_optimizer(config: TrainConfig) -> None:
    for key, default in _OPTIMIZER_SETTINGS:
        value = getattr(config, key)
        if value != default:
            raise RecipeError(
                f"train.{key}={_show(value)} is set but train.learning_rate is null, which trains with the optimizer "
                "the model was compiled with (tpukit builds none, so its settings would be ignored). Fix: set "
                "train.learning_rate (e.g. learning_rate: 0.001) to train with tpukit's optimizer and its settings, "
                f"or remove train.{key}."
            )


MESH_FROM_LAYOUT_MAP = "the Keras LayoutMap's DeviceMesh of shape "


def _validate_runtime(config: RuntimeConfig) -> None:
    _keras_layout(config)
    if config.mesh_from is not None and not str(config.mesh_from).startswith(MESH_FROM_LAYOUT_MAP):
        raise RecipeError(
            f"runtime.mesh_from is set by tpukit (when a Keras LayoutMap's DeviceMesh sizes the mesh), not by a "
            f"recipe; received {_show(config.mesh_from)}. Fix: remove it, and size the mesh with runtime.mesh."
        )
    _check_fields(config, "runtime")
    _resolve_conditional(config, "runtime")
    if config.steps_per_execution != "auto":
        _count("runtime.steps_per_execution", config.steps_per_execution, example="auto")
    _in_range(
        "runtime.steps_per_execution_target_seconds",
        config.steps_per_execution_target_seconds,
        1e-3,
        3600,
        example=0.5,
    )
    _count("runtime.checkpoint_every_steps", config.checkpoint_every_steps, example=1000)
    _count("runtime.max_checkpoints_to_keep", config.max_checkpoints_to_keep, example=3)
    _in_range(
        "runtime.checkpoint_max_overhead",
        config.checkpoint_max_overhead,
        0.0,
        1.0,
        low_open=True,
        example="0.02 (or null to save at every epoch end)",
    )
    for key in ("tpu_timeout_seconds", "workers_timeout_seconds"):
        _in_range(f"runtime.{key}", getattr(config, key), 1.0, 7 * 86400.0, example=600)
    if config.verbose != "auto":
        _in_range("runtime.verbose", config.verbose, 0, 2, example="auto")
    config.mesh = _mesh(config.mesh)
    if config.layout is not None:
        config.layout = {
            pattern: _layout_axes(pattern, axes) for pattern, axes in config.layout.items()
        }
    steps = config.profile_steps
    if steps is not None and (len(steps) != 2 or not 0 < steps[0] <= steps[1] <= INT32_MAX):
        raise RecipeError(
            f"runtime.profile_steps must be [first, last] with 0 < first <= last; received {_show(list(steps))}. "
            "Fix: e.g. profile_steps: [10, 20]."
        )


MESH_AXES = ("data", "model")


def _keras_layout(config: RuntimeConfig) -> None:
    """A Keras `LayoutMap` (or a builder of one) in `runtime.layout` as plain data, its mesh in `runtime.mesh`
    (`tpukit.recipe.layout_maps.from_keras`), so the recipe stays YAML; the axis mapping is logged once."""
    if config.layout is None or isinstance(config.layout, dict):
        return
    from tpukit.recipe.layout_maps import from_keras, is_layout_map

    converted = from_keras(config.layout, config.mesh)
    if converted is None:
        raise RecipeError(
            f"runtime.layout must be a mapping {{regex: [axis or null per dimension]}}, a "
            f"keras.distribution.LayoutMap or a builder of one, or null; received {_show(config.layout)}. Fix: e.g. "
            '{".*mlp_in/kernel": [null, model]}, or layout=keras_hub.models.GemmaBackbone.get_layout_map.'
        )
    if is_layout_map(config.layout):
        shape = tuple(int(n) for n in config.layout.device_mesh.shape)
        config.mesh_from = f"{MESH_FROM_LAYOUT_MAP}{shape}"
    config.layout, config.mesh, line = converted
    logging.getLogger("tpukit").info("%s", line)


def _layout_axes(pattern: Any, axes: Any) -> tuple[str | None, ...]:
    """One `runtime.layout` entry checked: a regular expression, and a list of mesh axis names or nulls."""
    try:
        re.compile(pattern)
    except (re.error, TypeError) as error:
        raise RecipeError(
            f"runtime.layout key {_show(pattern)} is not a regular expression ({error}). Fix: e.g. "
            '".*mlp_in/kernel" (matched whole against a variable path such as block0/mlp_in/kernel).'
        ) from None
    if not isinstance(axes, (list, tuple)) or not all(a is None or a in MESH_AXES for a in axes):
        raise RecipeError(
            f"runtime.layout[{pattern!r}] must list one mesh axis (data or model) or null per dimension of the "
            f"variables it matches; received {_show(axes)}. Fix: e.g. {pattern}: [null, model]."
        )
    return tuple(axes)


def _mesh(value) -> dict[str, int | str]:
    """`runtime.mesh` as {data: int | "auto", model: int}: missing axes take their defaults."""
    if value == "auto":
        value = {}
    unknown = sorted(set(value) - set(MESH_AXES))
    if unknown:
        raise RecipeError(
            f"runtime.mesh has no axis {unknown[0]!r}; received {_show(dict(value))}. Fix: name only the axes "
            "data and model, e.g. mesh: {data: 2, model: 4} (or mesh: auto)."
        )
    mesh = {"data": value.get("data", "auto"), "model": value.get("model", 1)}
    for axis in MESH_AXES:
        if mesh[axis] == "auto" and axis == "data":
            continue
        if isinstance(mesh[axis], bool) or not isinstance(mesh[axis], int) or mesh[axis] < 1:
            raise RecipeError(
                f"runtime.mesh.{axis} must be a positive integer{' or auto' if axis == 'data' else ''}; received "
                f"{_show(mesh[axis])}. Fix: e.g. --set runtime.mesh.{axis}={2 if axis == 'data' else 1}."
            )
    return mesh


# --------------------------------------------------------------------------------------------------------------
# From parsed YAML.


def _split_section(
    cls: type, values: dict[str, Any], section: str, open_ended: bool = False
) -> tuple[dict, dict]:
    """Splits a section's keys into `cls` fields and the rest; the rest is an error unless `open_ended`."""
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in ("options", "kwargs")}
    known, rest = {}, {}
    for key, value in values.items():
        if key in fields:
            known[key] = value
        elif open_ended:
            rest[key] = value
        else:
            raise _unknown_key_error(section, key, value, list(fields), "")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in known:
            raise _missing_key_error(section, name, hints[name])
    return known, rest


def _sections(raw: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict):
        raise RecipeError(
            f"a recipe is a mapping with sections {', '.join(SECTIONS)}; received {type(raw).__name__} "
            f"{_show(raw)}. Fix: start the file with `model:`."
        )
    for key in raw:
        if key not in SECTIONS:
            raise _unknown_key_error("<top level>", key, raw[key], list(SECTIONS), "")
    for section in ("model", "data", "train"):
        if section not in raw:
            raise RecipeError(
                f"missing required section `{section}:`. Fix: add it (sections: {', '.join(SECTIONS)})."
            )
    sections = {}
    for section in SECTIONS:
        value = raw.get(section)
        if value is not None and not isinstance(value, dict):
            raise RecipeError(
                f"section {section} must be a mapping of keys; received {_show(value)}. "
                f"Fix: write `{section}:` followed by indented `key: value` lines."
            )
        sections[section] = value or {}
    return sections


def _from_sections(raw: Any, path: str) -> Recipe:
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    sections = _sections(raw)
    model_raw = dict(sections["model"])
    if "name" not in model_raw:
        raise _missing_key_error("model", "name", str, f" (one of {', '.join(sorted(MODELS))})")
    tuned = {key: model_raw.pop(key) for key in MODEL_FIELDS[1:] if key in model_raw}
    model = ModelConfig(name=model_raw.pop("name"), kwargs=model_raw, **tuned)
    if "source" not in sections["data"]:
        raise _missing_key_error("data", "source", str, f" (one of {', '.join(sorted(SOURCES))})")
    data_known, options = _split_section(DataConfig, sections["data"], "data", open_ended=True)
    data = DataConfig(**data_known, options=options)
    train = TrainConfig(**_split_section(TrainConfig, sections["train"], "train")[0])
    runtime = RuntimeConfig(**_split_section(RuntimeConfig, sections["runtime"], "runtime")[0])
    return Recipe(model=model, data=data, train=train, runtime=runtime, path=path)


def from_dict(raw: Any, path: str = "<dict>") -> Recipe:
    """Validates a recipe given as nested dicts (the parsed YAML). Raises RecipeError naming `path`."""
    try:
        return _from_sections(raw, path)
    except RecipeError as error:
        message = str(error)
        raise RecipeError(
            message if message.startswith(f"{path}: ") else f"{path}: {message}"
        ) from None
