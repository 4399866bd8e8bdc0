"""`tpukit.fit`: your own Keras model and data through tpukit's trainer, with the same outputs and guarantees as a
recipe run (preemption-safe resume, multi-replica `steps_per_execution`, exact eval, NaN rollback, MFU, export).

    def build_model():                       # called under the strategy's scope by tpukit
        return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10)])

    metrics = tpukit.fit(build_model, x_train, y_train, validation_data=(x_test, y_test), epochs=3,
                         batch_size=1024, output_dir="runs/mlp", steps_per_execution=8)

For the duration of the call it registers the builder and the data as a model and a source (the registries are
as before once it returns or raises), builds a `Recipe` and calls `tpukit.run`, so running the same call again
resumes from `output_dir`. Any model Keras trains fits: several named inputs (x as a dict, by input name, or a
tuple), several outputs (y as a dict by output name, or a tuple), class ids, one-hot or soft labels, binary,
multi-label and regression targets. The loss and metrics follow from the model and the labels
(`tpukit.task.targets`), or from `loss=`/`metrics=`, or from the model's own `compile`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from tpukit.recipe import DataConfig, RecipeError, RuntimeConfig, TrainConfig, from_dict
from tpukit.recipe.registry import register_model, register_source
from tpukit.recipe.schema import MODEL_FIELDS

_SECTIONS = {"data": DataConfig, "train": TrainConfig, "runtime": RuntimeConfig}
_ABSENT = object()  # a registry had no entry under the name


def _section_of(key: str) -> str:
    if key in MODEL_FIELDS[1:]:
        return "model"
    for section, config in _SECTIONS.items():
        if key in {f.name for f in dataclasses.fields(config)} and key not in ("source", "options"):
            return section
    valid = sorted(
        [
            f.name
            for c in _SECTIONS.values()
            for f in dataclasses.fields(c)
            if f.name not in ("source", "options")
        ]
        + list(MODEL_FIELDS[1:])
    )
    raise RecipeError(f"tpukit.fit: unknown setting {key!r}. Valid settings: {', '.join(valid)}.")


def _length(arrays, what: str) -> int:
    """The one length of a NumPy array or of every array in a dict, list or tuple of them."""
    import numpy as np

    leaves = [
        np.asarray(a)
        for a in (
            arrays.values()
            if isinstance(arrays, dict)
            else arrays
            if isinstance(arrays, (list, tuple))
            else [arrays]
        )
    ]
    lengths = {len(a) if a.ndim else 0 for a in leaves}
    if len(lengths) != 1 or 0 in lengths:
        shown = (
            {k: len(v) for k, v in arrays.items()} if isinstance(arrays, dict) else sorted(lengths)
        )
        raise RecipeError(
            f"tpukit.fit: the arrays of {what} must all hold one example per row, the same number of rows; "
            f"received lengths {shown}. Fix: pass arrays of equal length (a dict of them for named inputs)."
        )
    return lengths.pop()


def _arrays_source(x, y, validation_data, sample_weight=None) -> Callable:
    import numpy as np

    from tpukit import data

    def source(split: str = "train", input_context=None):
        if split == "train":
            return data.arrays(x, y, input_context, sample_weight)
        if validation_data is None:
            raise ValueError(f"no data for split {split!r}: pass validation_data=(x, y)")
        return data.arrays(*validation_data[:2], input_context, *validation_data[2:])

    def labels(split: str):
        """Every label of a split (the task and the label range are checked on all of them)."""
        chosen = y if split == "train" else validation_data[1]
        if isinstance(chosen, dict):
            return {k: np.asarray(v) for k, v in chosen.items()}
        if isinstance(chosen, (list, tuple)):
            return tuple(np.asarray(v) for v in chosen)
        return np.asarray(chosen)

    source.tpukit_labels = labels
    return source


def _check_weight_shape(weight, y, what: str) -> None:
    """Refuses a sample weight whose shape per example cannot weigh the labels' losses, before any pipeline is
    built: one weight per example (shape [N]), or one per label position (a prefix of the label's shape per
    example, e.g. [N, T] for per-token labels [N, T]); trailing axes of 1 broadcast, as in Keras. One
    array weighs every output; a dict or tuple gives one per output."""
    import numpy as np

    def per_output(labels):
        if isinstance(labels, dict):
            return list(labels.items())
        if isinstance(labels, (list, tuple)):
            return [(f"[{i}]", v) for i, v in enumerate(labels)]
        return [("", labels)]

    outputs = per_output(y)
    if isinstance(weight, (dict, list, tuple)):
        weights = dict(per_output(weight))
        pairs = [(name, label, weights[name]) for name, label in outputs if name in weights]
    else:
        pairs = [(name, label, weight) for name, label in outputs]
    for name, label, given in pairs:
        label_shape, shape = np.shape(label)[1:], np.shape(given)[1:]
        while shape and shape[-1] == 1:  # broadcast as Keras broadcasts it
            shape = shape[:-1]
        if tuple(shape) == tuple(label_shape[: len(shape)]):
            continue
        fits = ", ".join(
            f"[N{''.join(f', {d}' for d in label_shape[:rank])}]"
            for rank in range(len(label_shape) + 1)
        )
        raise RecipeError(
            f"tpukit.fit: {what}{name} has shape {list(np.shape(given))}, which does not fit labels of shape "
            f"{list(np.shape(label))}: a sample weight gives one weight per example, or one per label position. "
            f"Fix: a {what} of shape {fits} (N examples)."
        )


def _checked_validation(validation_data):
    """`validation_data` as Keras takes it: `(x, y)` or `(x, y, sample_weight)` (a trailing None dropped), or
    True (split "validation" of `dataset_fn`), or None."""
    if validation_data is None or validation_data is True:
        return validation_data
    if not isinstance(validation_data, (tuple, list)) or len(validation_data) not in (2, 3):
        raise RecipeError(
            f"tpukit.fit: validation_data must be (x_val, y_val) or (x_val, y_val, sample_weight_val), or True "
            f"with dataset_fn; received a {type(validation_data).__name__}"
            f"{f' of {len(validation_data)}' if isinstance(validation_data, (tuple, list)) else ''}. Fix: e.g. "
            "validation_data=(x_test, y_test)."
        )
    validation_data = tuple(validation_data)
    if len(validation_data) == 3 and validation_data[2] is None:
        validation_data = validation_data[:2]
    if _length(validation_data[0], "validation x") != _length(
        validation_data[1], "validation y"
    ) or (
        len(validation_data) == 3
        and _length(validation_data[2], "validation sample_weight")
        != _length(validation_data[0], "validation x")
    ):
        raise RecipeError(
            "tpukit.fit: validation_data's x, y (and sample weights) must hold the same number of examples. Fix: "
            "pass the labels (and weights) of every validation example."
        )
    if len(validation_data) == 3:
        _check_weight_shape(
            validation_data[2], validation_data[1], "validation_data's sample weight"
        )
    return validation_data


def _class_weight(value) -> dict | None:
    """`class_weight` as recipe data: {int class id: float weight} (NumPy scalars as Python numbers)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RecipeError(
            f"tpukit.fit: class_weight must be a dict of class id to weight, as in keras.Model.fit; received a "
            f"{type(value).__name__}. Fix: e.g. class_weight={{0: 1.0, 1: 3.0}}."
        )

    def plain(number):
        item = getattr(number, "item", None)
        return item() if callable(item) else number

    return {plain(k): plain(v) for k, v in value.items()}


def _dataset_source(dataset_fn) -> Callable:
    from tpukit import data

    def source(split: str = "train", input_context=None):
        return data.shard(dataset_fn(split), input_context)

    return source


def fit(
    model_fn: Callable,
    x=None,
    y=None,
    *,
    dataset_fn: Callable | None = None,
    validation_data: tuple | None = None,
    validation_split: float | None = None,
    sample_weight=None,
    class_weight: dict | None = None,
    epochs: int,
    batch_size: int,
    output_dir: str,
    learning_rate: float | None = None,
    loss=None,
    metrics=None,
    loss_weights=None,
    strategy=None,
    callbacks: list | None = None,
    name: str | None = None,
    accept_changes: tuple[str, ...] | list[str] = (),
    break_lock: bool = False,
    **settings: Any,
) -> dict:
    """Trains `model_fn()` with tpukit's trainer; returns the metrics written to `output_dir/metrics.json`.

    Args:
        model_fn: a function returning a `keras.Model` (built under the strategy's scope; its keyword parameters,
            if any, take their defaults). It may compile the model: its loss, metrics and optimizer are kept.
        x, y: training arrays (Keras-style: a dict of arrays by input or output name, or a tuple, for several),
            or None with `dataset_fn`.
        dataset_fn: `dataset_fn(split) -> tf.data.Dataset` of unbatched `(features, label)` or `(features, label,
            sample_weight)` (a KerasHub preprocessor's output) for split "train" and, with validation, "validation";
            tpukit shards it per host, batches, shuffles and pads eval.
        validation_data: `(x_val, y_val)` or `(x_val, y_val, sample_weight_val)` arrays, or True to read split
            "validation" from `dataset_fn`.
        validation_split: as in `keras.Model.fit`: this fraction of `x`, `y` (and `sample_weight`), their last
            examples (taken before any shuffling), is the validation data. Arrays only; not with `validation_data`.
        sample_weight: as in `keras.Model.fit`: one weight per example of `x` (or per loss value, e.g. per token),
            one array for every output or one per output (dict or tuple). Arrays only: a `dataset_fn` yields them.
        class_weight: as in `keras.Model.fit`: {class id: weight} for one classification, binary or custom-loss
            output (`train.class_weight`). Where Keras refuses both together, tpukit multiplies each example's
            class weight by its sample weight.
        epochs, batch_size: as in a recipe's `train.epochs` and `data.global_batch_size` (global).
        learning_rate: `train.learning_rate`; None: the optimizer `model_fn` compiled, else Adam at 0.001.
        loss, metrics, loss_weights: as in `keras.Model.compile` (names, or Keras objects and functions; a dict by
            output name for several outputs). Default: the model's own compile, else the task's (inferred from
            the model and the labels, or `task=`). Metrics are compiled as weighted metrics, so evaluation is exact
            (with weights, `metrics=` are then weighted, unlike Keras').
        output_dir: checkpoints, logs, `model.keras`, `metrics.json`; calling again with it resumes.
        strategy: a `tf.distribute.Strategy` (default: `tpukit.connect()`).
        callbacks: extra Keras callbacks.
        name: the registered model/source name (default: model_fn's module and name).
        accept_changes: recipe keys that may differ from the run in `output_dir` (`tpukit.run`), e.g. `"train.epochs"`.
        break_lock: see `tpukit.run`.
        **settings: any other key of a recipe's `data`, `train` or `runtime` section, e.g. `optimizer="adamw"`,
            `steps_per_execution=8`, `precision="mixed_bfloat16"`, `task="binary"`, `engine="jax"` (default
            `auto`: the backend of the Keras that built your model), and the model section's `init_weights`,
            `freeze`, `lora_rank`.

    Raises:
        tpukit.TrainingInterrupted: Ctrl-C (a notebook's stop button) stopped training after the step in flight
            and saved a checkpoint; the cell stops with a one-line message, and running it again resumes.
        tpukit.ExportFailedError: training ended but an output (`model.keras`, the SavedModel) could not be
            written: `metrics.json` says which (`outputs_missing`), the error's `.metrics` holds the run's numbers,
            the checkpoint is kept, and calling again exports without training.
    """
    return _fit(
        **locals()
    )  # here `locals()` is exactly fit's arguments: nothing else is defined yet


def _fit(
    model_fn,
    x,
    y,
    *,
    output_dir,
    strategy,
    callbacks,
    accept_changes,
    break_lock,
    settings,
    **arguments,
) -> dict:
    """`fit` itself: its arguments as a recipe (`as_recipe`) run by `tpukit.run`."""
    from tpukit.runner import run

    with as_recipe(model_fn, x, y, **arguments, **settings) as recipe:
        return run(
            recipe,
            output_dir,
            strategy=strategy,
            callbacks=callbacks,
            accept_changes=accept_changes,
            break_lock=break_lock,
        )


@contextlib.contextmanager
def as_recipe(
    model_fn: Callable,
    x=None,
    y=None,
    *,
    dataset_fn: Callable | None = None,
    validation_data: tuple | None = None,
    validation_split: float | None = None,
    sample_weight=None,
    class_weight: dict | None = None,
    epochs: int,
    batch_size: int,
    learning_rate: float | None = None,
    loss=None,
    metrics=None,
    loss_weights=None,
    name: str | None = None,
    **settings: Any,
) -> Iterator[Any]:
    """The `Recipe` that `fit`'s arguments make, with `model_fn` and the data registered under its model and
    source name while the block runs (`tpukit.fit` trains it, `tpukit.check` compiles it)."""
    _check_arguments(model_fn, x, y, dataset_fn, sample_weight)
    validation_data = _checked_validation(validation_data)
    if validation_split is not None:
        x, y, validation_data, sample_weight = _split_off(
            x, y, validation_split, validation_data, sample_weight
        )
    name = (
        name
        or f"fit:{getattr(model_fn, '__module__', '')}.{getattr(model_fn, '__qualname__', 'model')}"
    )
    if dataset_fn is None:
        source = _arrays_source(
            x, y, validation_data if validation_data is not True else None, sample_weight
        )
    else:
        source = _dataset_source(dataset_fn)
    raw = {
        "model": {"name": name},
        "data": {
            "source": name,
            "global_batch_size": batch_size,
            "train_split": "train",
            "eval_split": "validation" if validation_data is not None else None,
        },
        "train": {"epochs": epochs, "learning_rate": learning_rate},
        "runtime": {},
    }
    for key, value in settings.items():
        raw[_section_of(key)][key] = value
    if class_weight is not None:
        raw["train"]["class_weight"] = _class_weight(class_weight)
    objects = {}
    for key, value in (("loss", loss), ("metrics", metrics), ("loss_weights", loss_weights)):
        if value is not None:
            raw["train"][key], named = _by_name(name, key, value)
            objects.update(named)
    with _registered(name, model_fn, source), _objects(objects):
        yield from_dict(raw, f"tpukit.fit({name})")


def _check_arguments(model_fn, x, y, dataset_fn, sample_weight) -> None:
    """`tpukit.fit`'s model builder, arrays and sample weights, refused with the fix before anything is built."""
    if _is_keras_layer(model_fn) or not callable(model_fn):
        raise RecipeError(
            "tpukit.fit: model_fn must be a function that builds and returns a new keras.Model (tpukit calls it "
            "under the strategy's scope, so that its variables live on the devices that train); received a "
            f"{type(model_fn).__name__} {'instance' if callable(model_fn) else 'value'}. Fix: pass the function "
            "that builds it, e.g. tpukit.fit(build_model, x, y, ...) or tpukit.fit(lambda: make_model(), ...); "
            "to start from a trained model's weights, save it (model.save('trained.keras')) and add "
            "init_weights='trained.keras'."
        )
    if (x is None) == (dataset_fn is None):
        raise RecipeError(
            "tpukit.fit: pass either x and y (arrays) or dataset_fn, not both and not neither."
        )
    if x is not None and y is None:
        raise RecipeError(
            "tpukit.fit: x and y must be arrays of the same length (the labels in y); received no y. Fix: pass y, "
            "e.g. tpukit.fit(build_model, x_train, y_train, ...)."
        )
    if x is not None and _length(x, "x") != _length(y, "y"):
        raise RecipeError(
            f"tpukit.fit: x and y must hold the same number of examples; received {_length(x, 'x')} in x and "
            f"{_length(y, 'y')} in y. Fix: pass the labels of every example of x."
        )
    if sample_weight is not None and (
        x is None or _length(sample_weight, "sample_weight") != _length(x, "x")
    ):
        raise RecipeError(
            "tpukit.fit: sample_weight must hold one weight (or one row of weights) per example of x"
            + (
                "; with dataset_fn, yield (features, label, sample_weight) instead"
                if x is None
                else ""
            )
            + ". Fix: pass sample_weight with x and y, of the same length, as in keras.Model.fit."
        )
    if sample_weight is not None:
        _check_weight_shape(sample_weight, y, "sample_weight")


def _split_off(x, y, fraction, validation_data, sample_weight=None) -> tuple:
    """`(x_train, y_train, (x_val, y_val[, w_val]), w_train)`: the last `fraction` of the examples (and of their
    sample weights) held out, as Keras' `validation_split` does (`split_at = floor(n * (1 - fraction))`, before shuffling: Keras 3.15's
    `keras/src/trainers/data_adapters/array_slicing.py`, `train_validation_split`)."""
    import math

    number = isinstance(fraction, (int, float)) and not isinstance(fraction, bool)
    if x is None or validation_data is not None or not (number and 0 < fraction < 1):
        problem = (
            "it splits arrays: pass x and y, not dataset_fn"
            if x is None
            else "it cannot be combined with validation_data"
            if validation_data is not None
            else f"it must be a fraction between 0 and 1, exclusive; received {fraction!r}"
        )
        raise RecipeError(
            f"tpukit.fit: validation_split={fraction!r}: {problem}. Fix: e.g. validation_split=0.1 with x and "
            "y, or validation_data=(x_val, y_val) instead."
        )
    total = _length(x, "x")
    split_at = math.floor(total * (1.0 - fraction))
    if split_at == 0 or split_at == total:
        left = "no training example" if split_at == 0 else "no validation example"
        raise RecipeError(
            f"tpukit.fit: validation_split={fraction!r} of {total} examples leaves {left}. Fix: another "
            "fraction, or more examples."
        )

    def part(arrays, piece: slice):
        if isinstance(arrays, dict):
            return {key: value[piece] for key, value in arrays.items()}
        if isinstance(arrays, (list, tuple)):
            return type(arrays)(value[piece] for value in arrays)
        return arrays[piece]

    head, tail = slice(None, split_at), slice(split_at, None)
    if sample_weight is None:
        return part(x, head), part(y, head), (part(x, tail), part(y, tail)), None
    held_out = (part(x, tail), part(y, tail), part(sample_weight, tail))
    return part(x, head), part(y, head), held_out, part(sample_weight, head)


def _by_name(name: str, key: str, value) -> tuple[Any, dict]:
    """`value` as recipe data: names kept, Keras objects and functions registered under generated names, inside
    the same dicts and lists (per output)."""
    if key == "loss_weights" or value is None or isinstance(value, str):
        return value, {}
    named: dict = {}
    if isinstance(value, dict):
        result = {}
        for output, item in value.items():
            result[output], more = _by_name(f"{name}.{output}", key, item)
            named.update(more)
        return result, named
    if isinstance(value, (list, tuple)):
        result = []
        for index, item in enumerate(value):
            entry, more = _by_name(f"{name}[{index}]", key, item)
            result.append(entry)
            named.update(more)
        return result, named
    registered = f"{name}:{key}"
    return registered, {registered: value}


@contextlib.contextmanager
def _objects(named: dict) -> Iterator[None]:
    """Loss and metric objects given to `tpukit.fit`, resolvable by their generated names during the call."""
    if not named:
        yield
        return
    from tpukit.task.compiling import OBJECTS

    OBJECTS.update(named)
    try:
        yield
    finally:
        for key in named:
            OBJECTS.pop(key, None)


def _is_keras_layer(value) -> bool:
    """Whether `value` is a Keras layer or model (callable, but a built object rather than a builder)."""
    return any(
        cls.__name__ == "Layer" and cls.__module__.startswith("keras")
        for cls in type(value).__mro__
    )


@contextlib.contextmanager
def _registered(name: str, model_fn: Callable, source: Callable) -> Iterator[None]:
    """`name` as a model and a source for the duration of one `fit`; afterwards (returned or raised) the
    registries hold what they held before, so no closure over the caller's arrays outlives the call."""
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    added = ((MODELS, model_fn), (SOURCES, source))
    before = [(registry, registry.get(name, _ABSENT)) for registry, _ in added]
    try:
        register_model(name, model_fn)
        register_source(name, source)
        yield
    finally:
        for (registry, previous), (_, function) in zip(before, added, strict=True):
            if registry.get(name) is not function:
                continue  # replaced meanwhile: not ours to remove
            if previous is _ABSENT:
                del registry[name]
            else:
                registry[name] = previous
