"""`tpukit.fit`: your own Keras model and data through tpukit's trainer, with the same outputs and guarantees as a
recipe run (preemption-safe resume, multi-replica `steps_per_execution`, exact eval, NaN rollback, MFU, export).

    def build_model():                       # called under the strategy's scope by tpukit
        return keras.Sequential([keras.Input((28, 28)), keras.layers.Flatten(), keras.layers.Dense(10)])

    metrics = tpukit.fit(build_model, x_train, y_train, validation_data=(x_test, y_test), epochs=3,
                         batch_size=1024, output_dir="runs/mlp", steps_per_execution=8)

For the duration of the call it registers the builder and the data as a model and a source (the registries are
as before once it returns or raises), builds a `Recipe` and calls `tpukit.run`, so running the same call again
resumes from `output_dir`. Models return logits for integer labels (tpukit compiles them with
sparse categorical cross-entropy from logits, accuracy and an exact weighted cross-entropy).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from tpukit.recipe import DataConfig, RecipeError, RuntimeConfig, TrainConfig, from_dict
from tpukit.recipe.registry import register_model, register_source

_SECTIONS = {"data": DataConfig, "train": TrainConfig, "runtime": RuntimeConfig}
_ABSENT = object()  # a registry had no entry under the name


def _section_of(key: str) -> str:
    for section, config in _SECTIONS.items():
        if key in {f.name for f in dataclasses.fields(config)} and key not in ("source", "options"):
            return section
    valid = sorted(
        f.name
        for c in _SECTIONS.values()
        for f in dataclasses.fields(c)
        if f.name not in ("source", "options")
    )
    raise RecipeError(f"tpukit.fit: unknown setting {key!r}. Valid settings: {', '.join(valid)}.")


def _arrays_source(x, y, validation_data) -> Callable:
    from tpukit import data

    def source(split: str = "train", input_context=None):
        if split == "train":
            return data.arrays(x, y, input_context)
        if validation_data is None:
            raise ValueError(f"no data for split {split!r}: pass validation_data=(x, y)")
        return data.arrays(*validation_data, input_context)

    return source


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
    epochs: int,
    batch_size: int,
    output_dir: str,
    learning_rate: float = 1e-3,
    strategy=None,
    callbacks: list | None = None,
    name: str | None = None,
    **settings: Any,
) -> dict:
    """Trains `model_fn()` with tpukit's trainer; returns the metrics written to `output_dir/metrics.json`.

    Args:
        model_fn: a function returning a `keras.Model` that outputs logits (built under the strategy's scope; its
            keyword parameters, if any, take their defaults).
        x, y: training arrays (Keras-style), or None with `dataset_fn`.
        dataset_fn: `dataset_fn(split) -> tf.data.Dataset` of unbatched `(features, label)` for split "train" and,
            with validation, "validation"; tpukit shards it per host, batches, shuffles and pads eval.
        validation_data: `(x_val, y_val)` arrays, or True to read split "validation" from `dataset_fn`.
        epochs, batch_size, learning_rate: as in a recipe's `train.epochs`, `data.global_batch_size` (global, summed
            over replicas) and `train.learning_rate`.
        output_dir: checkpoints, logs, `model.keras`, `metrics.json`; calling again with it resumes.
        strategy: a `tf.distribute.Strategy` (default: `tpukit.connect()`).
        callbacks: extra Keras callbacks.
        name: the registered model/source name (default: model_fn's module and name).
        **settings: any other key of a recipe's `data`, `train` or `runtime` section, e.g. `optimizer="adamw"`,
            `steps_per_execution=8`, `checkpoint_every_steps=100`, `precision="mixed_bfloat16"`.
    """
    from tpukit.runner import run

    if (x is None) == (dataset_fn is None):
        raise RecipeError(
            "tpukit.fit: pass either x and y (arrays) or dataset_fn, not both and not neither."
        )
    if x is not None and (y is None or len(x) != len(y)):
        received = "no y" if y is None else f"len(x)={len(x)}, len(y)={len(y)}"
        raise RecipeError(
            f"tpukit.fit: x and y must be arrays of the same length (integer class labels in y); received {received}."
            " Fix: pass y, e.g. tpukit.fit(build_model, x_train, y_train, ...)."
        )
    name = (
        name
        or f"fit:{getattr(model_fn, '__module__', '')}.{getattr(model_fn, '__qualname__', 'model')}"
    )
    if dataset_fn is None:
        source = _arrays_source(x, y, validation_data if validation_data is not True else None)
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
    with _registered(name, model_fn, source):
        recipe = from_dict(raw, f"tpukit.fit({name})")
        return run(recipe, output_dir, strategy=strategy, callbacks=callbacks)


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
