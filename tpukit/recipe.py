"""Recipes: YAML with four sections (model, data, train, runtime), loaded strictly into dataclasses.

Strictness is the point: a typo in a key, a wrong type or a bad choice stops the run before any device work with a
message naming the file, the key path, the value received and the valid choices (Accelerate/Lightning style).

The `model` section is `name` plus the keyword arguments of that model's builder; the `data` section is the
pipeline knobs below plus the keyword arguments of the chosen `source`. Builders and sources are the schema for
their own keys: their signatures and annotations are read, so adding a model needs no schema edit here.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import inspect
import os
import types
import typing
from typing import Any, Literal, Union

import yaml

SECTIONS = ("model", "data", "train", "runtime")


class RecipeError(ValueError):
    """A recipe (or an override) is invalid. The message names the file, key, value received and the fix."""


@dataclasses.dataclass
class ModelConfig:
    """`name` picks a builder in `tpukit.models.MODELS`; every other key is passed to that builder."""

    name: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


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
    deterministic: bool = False
    cast_to_compute_dtype: bool = True  # float features -> the policy's compute dtype on the host (bf16 infeed)
    prefetch_batches: int | None = None  # null: AUTOTUNE
    private_threadpool_size: int = 0  # >0: tf.data threads of its own; 0: TensorFlow's shared pool
    # true: skip records that fail to parse/decode and count them (log + metrics.json); false: stop with an error
    # naming the file and record.
    skip_corrupt: bool = False
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # source kwargs


@dataclasses.dataclass
class TrainConfig:
    epochs: int
    learning_rate: float  # the peak rate; scaled by global/reference batch when reference_batch_size is set
    steps_per_epoch: int | None = None  # null: one pass over the training split
    optimizer: Literal["adam", "adamw", "sgd", "lamb", "lars"] = "adam"
    momentum: float = 0.9
    weight_decay: float = 0.0  # in the optimizer (decoupled for adamw/lamb, coupled L2 for sgd/lars), not the loss
    schedule: Literal["constant", "cosine", "step"] = "constant"
    warmup_steps: int = 0
    decay_boundaries: tuple[float, ...] = (0.5, 0.75)  # schedule: step, as fractions of the total steps
    decay_rate: float = 0.1  # schedule: step, factor at each boundary
    reference_batch_size: int | None = None  # linear scaling rule: lr * global_batch_size / reference_batch_size
    trust_coefficient: float = 0.001  # LARS only
    label_smoothing: float = 0.0
    seed: int = 0
    eval_every_epochs: int = 1  # validation during training (mode train_and_eval)
    early_stopping_patience: int | None = None  # epochs without improvement of early_stopping_metric
    early_stopping_metric: str = "val_loss"
    export_best_by: str | None = None  # e.g. val_accuracy: also keep best.keras, the best model by that metric
    max_nan_retries: int = 3  # rollbacks to the last checkpoint after a non-finite loss before giving up


@dataclasses.dataclass
class RuntimeConfig:
    """The only section that mentions hardware: a CPU and a TPU recipe differ here (and in batch size)."""

    tpu: str | None = None  # a TPU name, grpc://host:port or "local"; null: auto-detect
    precision: Literal["auto", "float32", "mixed_bfloat16", "mixed_float16"] = "auto"
    jit_compile: bool | Literal["auto"] = "auto"
    # Steps per host call (the main TPU throughput knob). auto: the largest divisor of the epoch whose call takes
    # at most steps_per_execution_target_seconds, timed on a throwaway copy of the model before training.
    steps_per_execution: int | Literal["auto"] = 1
    steps_per_execution_target_seconds: float = 0.5
    checkpoint_every_steps: int | None = None  # null: at the end of every epoch only
    max_checkpoints_to_keep: int = 3
    profile_steps: tuple[int, ...] | None = None  # [first, last] step for a TensorBoard profiler trace
    verbose: int | Literal["auto"] = "auto"  # auto: progress bar on a terminal, one line per epoch otherwise


@dataclasses.dataclass
class Recipe:
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    runtime: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)
    path: str = "<dict>"

    def to_dict(self) -> dict[str, Any]:
        """The recipe as plain YAML-able data, in the same shape as the file (used to save the resolved recipe)."""
        data = {f.name: getattr(self.data, f.name) for f in dataclasses.fields(DataConfig) if f.name != "options"}
        data.update(self.data.options)
        return {
            "model": {"name": self.model.name, **self.model.kwargs},
            "data": data,
            "train": dataclasses.asdict(self.train),
            "runtime": dataclasses.asdict(self.runtime),
        }


# --------------------------------------------------------------------------------------------------------------
# Type checking of single values.


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
    return {int: "an integer", float: "a number", str: "a string", bool: "true/false"}.get(tp, getattr(tp, "__name__", str(tp)))


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
        return value
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


def _check_value(path: str, key: str, value: Any, tp: Any) -> Any:
    try:
        return _coerce(value, tp)
    except _Mismatch:
        received = f"{value!r} ({type(value).__name__})"
        if typing.get_origin(tp) is Literal:
            raise RecipeError(
                f"{path}: {key} must be one of {_type_name(tp)}; received {received}. "
                f"Fix: set {key} to one of the valid choices."
            ) from None
        raise RecipeError(
            f"{path}: {key} must be {_type_name(tp)}; received {received}. Fix: change the value of {key}."
        ) from None


def _unknown_key_error(path: str, section: str, key: str, value: Any, valid: list[str], where: str) -> RecipeError:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    return RecipeError(
        f"{path}: unknown key {section}.{key} (received {value!r}).{hint} Valid keys in {section}{where}: "
        f"{', '.join(sorted(valid))}. Fix: rename or remove {section}.{key}."
    )


def _missing_key_error(path: str, section: str, key: str, tp: Any, where: str = "") -> RecipeError:
    return RecipeError(
        f"{path}: missing required key {section}.{key}{where} ({_type_name(tp)}). "
        f"Fix: add `{key}: ...` under `{section}:`."
    )


# --------------------------------------------------------------------------------------------------------------
# Sections.


def _load_dataclass(cls: type, values: dict[str, Any], path: str, section: str, extra: dict[str, inspect.Parameter] | None = None, extra_where: str = ""):
    """Builds dataclass `cls` from `values`; keys matching `extra` (a signature's parameters) are returned apart."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in ("options", "kwargs")}
    extra = extra or {}
    known, rest = {}, {}
    for key, value in values.items():
        if key in fields:
            known[key] = _check_value(path, f"{section}.{key}", value, hints[key])
        elif key in extra:
            rest[key] = value
        else:
            raise _unknown_key_error(path, section, key, value, list(fields) + list(extra), extra_where)
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in known:
            raise _missing_key_error(path, section, name, hints[name])
    return known, rest


def _signature_params(fn, skip: tuple[str, ...]) -> dict[str, inspect.Parameter]:
    params = inspect.signature(fn).parameters
    return {
        name: p
        for name, p in params.items()
        if name not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _check_kwargs(fn, kwargs: dict[str, Any], params: dict[str, inspect.Parameter], path: str, section: str, where: str) -> dict[str, Any]:
    hints = typing.get_type_hints(fn)
    out = {}
    for key, value in kwargs.items():
        out[key] = _check_value(path, f"{section}.{key}", value, hints.get(key, Any))
    for name, p in params.items():
        if p.default is inspect.Parameter.empty and name not in out:
            raise _missing_key_error(path, section, name, hints.get(name, Any), where)
    return out


def _lookup(registry: dict[str, Any], name: Any, path: str, key: str):
    if not isinstance(name, str) or name not in registry:
        close = difflib.get_close_matches(str(name), list(registry), n=1)
        hint = f" Did you mean '{close[0]}'?" if close else ""
        raise RecipeError(
            f"{path}: {key} must be one of {', '.join(sorted(registry))}; received {name!r}.{hint} "
            f"Fix: set {key} to one of those names."
        )
    return registry[name]


def _model_section(raw: dict[str, Any], path: str) -> ModelConfig:
    from tpukit.models import MODELS

    if "name" not in raw:
        raise _missing_key_error(path, "model", "name", str, f" (one of {', '.join(sorted(MODELS))})")
    name = raw["name"]
    builder = _lookup(MODELS, name, path, "model.name")
    params = _signature_params(builder, skip=())
    where = f" for model {name!r}"
    kwargs = {}
    for key, value in raw.items():
        if key == "name":
            continue
        if key not in params:
            raise _unknown_key_error(path, "model", key, value, ["name", *params], where)
        kwargs[key] = value
    return ModelConfig(name=name, kwargs=_check_kwargs(builder, kwargs, params, path, "model", where))


def _data_section(raw: dict[str, Any], path: str) -> DataConfig:
    from tpukit.data import SOURCE_RESERVED_ARGS, SOURCES

    if "source" not in raw:
        raise _missing_key_error(path, "data", "source", str, f" (one of {', '.join(sorted(SOURCES))})")
    source = _lookup(SOURCES, raw["source"], path, "data.source")
    params = _signature_params(source, skip=SOURCE_RESERVED_ARGS)
    where = f" for source {raw['source']!r}"
    known, rest = _load_dataclass(DataConfig, raw, path, "data", extra=params, extra_where=where)
    options = _check_kwargs(source, rest, params, path, "data", where)
    config = DataConfig(**known, options=options)
    for key in ("global_batch_size", "eval_global_batch_size", "shuffle_buffer"):
        value = getattr(config, key)
        if value is not None and value < 1:
            raise RecipeError(f"{path}: data.{key} must be >= 1; received {value}. Fix: use a positive number.")
    return config


def _positive(path: str, key: str, value: Any, minimum: float = 1) -> None:
    if value is not None and value < minimum:
        raise RecipeError(f"{path}: {key} must be >= {minimum}; received {value!r}. Fix: use a value >= {minimum}.")


def from_dict(raw: Any, path: str = "<dict>") -> Recipe:
    """Validates a recipe given as nested dicts (the parsed YAML). Raises RecipeError."""
    if not isinstance(raw, dict):
        raise RecipeError(
            f"{path}: a recipe is a mapping with sections {', '.join(SECTIONS)}; received {type(raw).__name__}. "
            "Fix: start the file with `model:`."
        )
    for key in raw:
        if key not in SECTIONS:
            raise _unknown_key_error(path, "<top level>", key, raw[key], list(SECTIONS), "")
    for section in ("model", "data", "train"):
        if section not in raw:
            raise RecipeError(f"{path}: missing required section `{section}:`. Fix: add it (sections: {', '.join(SECTIONS)}).")
    for section in SECTIONS:
        if section in raw and not isinstance(raw[section] or {}, dict):
            raise RecipeError(
                f"{path}: section {section} must be a mapping of keys; received {raw[section]!r}. "
                f"Fix: write `{section}:` followed by indented `key: value` lines."
            )
    model = _model_section(raw["model"] or {}, path)
    data = _data_section(raw["data"] or {}, path)
    train_known, _ = _load_dataclass(TrainConfig, raw["train"] or {}, path, "train")
    runtime_known, _ = _load_dataclass(RuntimeConfig, raw.get("runtime") or {}, path, "runtime")
    train, runtime = TrainConfig(**train_known), RuntimeConfig(**runtime_known)
    _positive(path, "train.epochs", train.epochs)
    _positive(path, "train.steps_per_epoch", train.steps_per_epoch)
    _positive(path, "train.learning_rate", train.learning_rate, 0)
    _positive(path, "train.warmup_steps", train.warmup_steps, 0)
    _positive(path, "train.weight_decay", train.weight_decay, 0)
    _positive(path, "train.reference_batch_size", train.reference_batch_size)
    if not 0 <= train.label_smoothing < 1:
        raise RecipeError(
            f"{path}: train.label_smoothing must be in [0, 1); received {train.label_smoothing!r}. Fix: e.g. 0.1."
        )
    if train.decay_rate <= 0 or any(not 0 < b < 1 for b in train.decay_boundaries):
        raise RecipeError(
            f"{path}: train.decay_rate must be > 0 and train.decay_boundaries fractions in (0, 1); received "
            f"decay_rate={train.decay_rate!r}, decay_boundaries={list(train.decay_boundaries)!r}. Fix: e.g. "
            "decay_boundaries: [0.5, 0.75], decay_rate: 0.1."
        )
    if train.optimizer == "adam" and train.weight_decay > 0:
        raise RecipeError(
            f"{path}: train.weight_decay={train.weight_decay} has no effect with train.optimizer: adam. "
            "Fix: use optimizer: adamw (decoupled weight decay), or set weight_decay: 0."
        )
    if runtime.steps_per_execution != "auto":
        _positive(path, "runtime.steps_per_execution", runtime.steps_per_execution)
    _positive(path, "runtime.steps_per_execution_target_seconds", runtime.steps_per_execution_target_seconds, 1e-3)
    _positive(path, "runtime.max_checkpoints_to_keep", runtime.max_checkpoints_to_keep)
    _positive(path, "runtime.checkpoint_every_steps", runtime.checkpoint_every_steps)
    _positive(path, "train.eval_every_epochs", train.eval_every_epochs)
    _positive(path, "train.max_nan_retries", train.max_nan_retries, 0)
    _positive(path, "train.early_stopping_patience", train.early_stopping_patience, 0)
    if runtime.profile_steps is not None and (len(runtime.profile_steps) != 2 or not 0 < runtime.profile_steps[0] <= runtime.profile_steps[1]):
        raise RecipeError(
            f"{path}: runtime.profile_steps must be [first, last] with 0 < first <= last; received "
            f"{list(runtime.profile_steps)!r}. Fix: e.g. profile_steps: [10, 20]."
        )
    return Recipe(model=model, data=data, train=train, runtime=runtime, path=path)


# --------------------------------------------------------------------------------------------------------------
# Files, packaged recipes and --set overrides.


def packaged_recipes() -> dict[str, str]:
    """Recipes shipped inside the installed package: {name: path}."""
    root = importlib.resources.files("tpukit.recipes")
    return {
        entry.name[: -len(".yaml")]: str(entry)
        for entry in root.iterdir()
        if entry.name.endswith(".yaml")
    }


def resolve_path(name_or_path: str) -> str:
    """A recipe file path: an existing file as given, else a packaged recipe by name or by file name.

    So `recipes/cifar10_resnet.yaml` works both in a clone and after `pip install tpukit` (e.g. on Colab).
    """
    if os.path.isfile(name_or_path):
        return name_or_path
    stem = os.path.basename(name_or_path)
    stem = stem[: -len(".yaml")] if stem.endswith(".yaml") else stem
    shipped = packaged_recipes()
    if stem in shipped:
        return shipped[stem]
    raise RecipeError(
        f"recipe {name_or_path!r} not found: no such file, and no packaged recipe named {stem!r}. "
        f"Packaged recipes: {', '.join(sorted(shipped))}. Fix: pass a path to a YAML file or one of those names."
    )


def apply_override(raw: dict[str, Any], override: str, path: str) -> None:
    """Applies one `section.key=value` override (value parsed as YAML) to the raw recipe in place."""
    if "=" not in override:
        raise RecipeError(
            f"--set {override!r}: expected section.key=value, e.g. --set train.epochs=3. Fix: add `=value`."
        )
    dotted, text = override.split("=", 1)
    section, _, key = dotted.strip().partition(".")
    if section not in SECTIONS or not key or "." in key:
        raise RecipeError(
            f"--set {override!r}: the key must be section.key with section one of {', '.join(SECTIONS)}; "
            f"received {dotted!r}. Fix: e.g. --set data.global_batch_size=256."
        )
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise RecipeError(f"--set {override!r}: the value {text!r} is not valid YAML ({error}).") from None
    raw.setdefault(section, {})
    if raw[section] is None:
        raw[section] = {}
    raw[section][key] = value  # unknown keys are rejected by from_dict with the valid names


def load_recipe(name_or_path: str, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Loads, overrides and validates a recipe. Raises RecipeError with a one-paragraph message."""
    path = resolve_path(name_or_path)
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as error:
        raise RecipeError(f"{path}: not valid YAML: {error}. Fix: check indentation and `key: value` syntax.") from None
    if raw is None:
        raw = {}
    if isinstance(raw, dict):
        for override in overrides:
            apply_override(raw, override, path)
    return from_dict(raw, path)


def save_recipe(recipe: Recipe, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# Resolved from {recipe.path} (with overrides applied)\n")
        yaml.safe_dump(_plain(recipe.to_dict()), f, sort_keys=False)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
