"""tf.data sources and the distributed pipeline. Usable on their own, in any Keras code."""

from tpukit.environment import backend as _backend

_backend.use_default()  # before anything below imports Keras or TensorFlow

import inspect
import logging

from tpukit.data import causal_lm as _causal_lm
from tpukit.data import corrupt
from tpukit.data import movielens as _movielens
from tpukit.data import text as _text
from tpukit.data import tfds as _tfds
from tpukit.data import tfrecord as _tfrecord
from tpukit.data.corrupt import CorruptDataError, CorruptRecord, CorruptReport
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
from tpukit.data.tfds import DataUnavailableError, tfds_dataset
from tpukit.data.tfrecord import tfrecord_images

# Sources a recipe's `data.source` may name. Each takes `split` and `input_context`, and its other keyword
# arguments are the recipe keys it accepts (validated against its signature by tpukit.recipe).
SOURCES = {
    "digits": digits,
    # Text for a KerasHub causal LM (model.name: keras_hub_causal_lm), tokenized by its preset's preprocessor; its
    # `preset` and `sequence_length` default to the model's (tpukit.recipe fills them in).
    "keras_hub_text": _causal_lm.keras_hub_text,
    # By module: `tpukit.data.movielens` stays the module (its VOCABULARY sizes the embeddings), not the function.
    "movielens": _movielens.movielens,
    "movielens_synthetic": _movielens.movielens_synthetic,
    "synthetic": synthetic,
    "text_files": text_files,
    "tfds": tfds_dataset,
    "tfrecord_images": tfrecord_images,
}
# Set by the run, never by a recipe key. `training` and `cache` are passed only to sources that declare them:
# those with random augmentation, which must cache before it (caching after would freeze the augmentation).
# `skip_corrupt` (from `data.skip_corrupt`) goes to the sources that can skip corrupt records.
SOURCE_RESERVED_ARGS = ("split", "input_context", "training", "cache", "skip_corrupt")

# Fast example counts, `fn(split, **source_kwargs) -> int | None`, from metadata or raw records instead of a pass
# over decoded examples; None falls back to the dataset's cardinality, then to counting.
EXAMPLE_COUNTS = {
    "movielens_synthetic": _movielens.count_synthetic,
    "tfds": _tfds.count,
    "tfrecord_images": _tfrecord.count,
}

# Corrupt-record scans, `fn(split, **source_kwargs) -> CorruptReport | None`: one pass over a split that finds
# (and names) every record the source drops with `skip_corrupt=True`. See tpukit/data/corrupt.py.
SCANS = {
    "text_files": _text.scan,
    "tfds": _tfds.scan,
    "tfrecord_images": _tfrecord.scan,
}

logger = logging.getLogger("tpukit")


def run_args(source, training: bool, cache: bool, skip_corrupt: bool = False) -> dict:
    """The reserved arguments `source` declares (`training`, `cache`, `skip_corrupt`), with the run's values."""
    params = inspect.signature(source).parameters
    values = (("training", training), ("cache", cache), ("skip_corrupt", skip_corrupt))
    return {k: v for k, v in values if k in params}


def scan_corrupt(source: str, split: str, options: dict) -> CorruptReport | None:
    """What `SOURCES[source](split, skip_corrupt=True, **options)` will drop, counted and named; None when the
    source cannot have corrupt records (in-memory sources) or cannot be scanned (TFDS not stored as TFRecords).

    Costs one pass over the split's records that decodes them (files in parallel); the report's `summary()` is
    the log line and `to_json()` the `metrics.json` entry.
    """
    scanner = SCANS.get(source)
    return scanner(split=split, **options) if scanner else None


def explain_data_error(
    error: BaseException, source: str, splits, options: dict
) -> CorruptDataError | None:
    """A `CorruptDataError` naming the corrupt file and record behind a TensorFlow error raised by the input
    pipeline inside `fit`/`evaluate`, or None when `error` is not about corrupt data.

    TensorFlow's own message names neither the file nor the record ("truncated record at 2820", "Unknown image file
    format"), so this scans `splits` of the source (`scan_corrupt`, one decoding pass) to find them. Only
    `DataLossError` and `InvalidArgumentError` raised by a tf.data iterator are scanned for.
    """
    import tensorflow as tf

    if isinstance(error, CorruptDataError):
        return error
    from_input = isinstance(error, tf.errors.DataLossError) or (
        isinstance(error, tf.errors.InvalidArgumentError) and "Iterator" in str(error)
    )
    if not from_input or source not in SCANS:
        return None
    logger.warning(
        "tpukit: the input pipeline failed; scanning %s split(s) %s for corrupt records",
        source,
        list(splits),
    )
    for split in splits:
        report = scan_corrupt(source, split, options)
        if report is not None and report.corrupt:
            return corrupt.error(source, split, report.corrupt)
    return None


__all__ = [
    "DataUnavailableError",
    "EXAMPLE_COUNTS",
    "SCANS",
    "SOURCES",
    "CorruptDataError",
    "CorruptRecord",
    "CorruptReport",
    "arrays",
    "cast_floats",
    "digits",
    "distribute",
    "eval_batches",
    "eval_steps",
    "explain_data_error",
    "maybe_cache",
    "options",
    "padded_eval_steps",
    "per_replica_batch_size",
    "run_args",
    "scan_corrupt",
    "shard",
    "synthetic",
    "text_files",
    "tfds_dataset",
    "tfrecord_images",
    "training_batches",
]
