"""tf.data sources and the distributed pipeline. Usable on their own, in any Keras code."""

import inspect

from tpukit import compat as _compat  # noqa: F401  (sets the Keras backend before TensorFlow/Keras load)
from tpukit.data import tfds as _tfds
from tpukit.data import tfrecord as _tfrecord
from tpukit.data.pipeline import (
    cast_floats,
    distribute,
    eval_batches,
    eval_steps,
    maybe_cache,
    options,
    padded_eval_steps,
    per_replica_batch_size,
    shard,
    training_batches,
)
from tpukit.data.sources import arrays, digits, synthetic
from tpukit.data.text import text_files
from tpukit.data.tfds import tfds_dataset
from tpukit.data.tfrecord import tfrecord_images

# Sources a recipe's `data.source` may name. Each takes `split` and `input_context`, and its other keyword
# arguments are the recipe keys it accepts (validated against its signature by tpukit.recipe).
SOURCES = {
    "digits": digits,
    "synthetic": synthetic,
    "text_files": text_files,
    "tfds": tfds_dataset,
    "tfrecord_images": tfrecord_images,
}
# Set by the run, never by a recipe key. `training` and `cache` are passed only to sources that declare them:
# those with random augmentation, which must cache before it (caching after would freeze the augmentation).
SOURCE_RESERVED_ARGS = ("split", "input_context", "training", "cache")

# Fast example counts, `fn(split, **source_kwargs) -> int | None`, from metadata or raw records instead of a pass
# over decoded examples; None falls back to the dataset's cardinality, then to counting.
EXAMPLE_COUNTS = {
    "tfds": _tfds.count,
    "tfrecord_images": _tfrecord.count,
}


def run_args(source, training: bool, cache: bool) -> dict:
    """The reserved arguments `source` declares (`training`, `cache`), with the run's values."""
    params = inspect.signature(source).parameters
    return {k: v for k, v in (("training", training), ("cache", cache)) if k in params}


__all__ = [
    "EXAMPLE_COUNTS",
    "SOURCES",
    "arrays",
    "cast_floats",
    "digits",
    "distribute",
    "eval_batches",
    "eval_steps",
    "maybe_cache",
    "options",
    "padded_eval_steps",
    "per_replica_batch_size",
    "run_args",
    "shard",
    "synthetic",
    "text_files",
    "tfds_dataset",
    "tfrecord_images",
    "training_batches",
]
