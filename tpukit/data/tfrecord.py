"""ImageNet-style TFRecord files: `tf.train.Example`s with encoded images and integer labels, read by glob.

The layout of the TF/TPU ImageNet conversion (`train-00000-of-01024`, `validation-00000-of-00128`, JPEG bytes
under `image/encoded`, labels 1..1000 under `image/class/label`) works with `label_offset: -1`:

    examples = tfrecord_images("train", ctx, file_pattern="gs://my-bucket/imagenet/{split}-*", label_offset=-1)

Images are decoded on the host. Training reads whole files per input pipeline (one pipeline per host) and
interleaves them in parallel; with fewer files than pipelines it falls back to every pipeline reading all files
and keeping every n-th record (with a warning). Evaluation always shards by record, so every pipeline holds at
most ceil(n / pipelines) examples, which exact evaluation (`eval_batches`) relies on.

Corrupt files (see `tpukit.data.corrupt`): counting a split without `split_sizes` reads every record and raises
`CorruptDataError` on a truncated or damaged file; with `skip_corrupt=True` unreadable records and images that do
not decode are dropped, and `scan` counts and names them.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from tpukit.data import corrupt, images
from tpukit.data.images import Augment, Normalize
from tpukit.data.pipeline import AUTOTUNE, maybe_cache
from tpukit.data.tfds import is_training_split

logger = logging.getLogger("tpukit")

READ_BUFFER_BYTES = 8 * 1024 * 1024


def list_files(file_pattern: str, split: str) -> list[str]:
    """Sorted files matching `file_pattern` with `{split}` replaced by the split name; raises if none."""
    pattern = file_pattern.replace("{split}", split)
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise ValueError(
            f"tfrecord_images: no file matches {pattern!r} (file_pattern={file_pattern!r}, split={split!r}). "
            "Fix: point file_pattern at the TFRecord files, with {split} where the split name goes, e.g. "
            "'gs://bucket/imagenet/{split}-*'."
        )
    return files


def _file_size(path: str) -> int:
    try:
        return tf.io.gfile.stat(path).length
    except tf.errors.OpError:
        return 0


def records(
    files: list[str],
    input_context: tf.distribute.InputContext | None,
    training: bool,
    cycle_length: int = 16,
    seed: int = 0,
    skip_corrupt: bool = False,
) -> tuple[tf.data.Dataset, int]:
    """Serialized records of this pipeline's share of `files`, and the bytes of the files it reads.

    Training shards by file when there are enough files, else each file by record (in whatever order the
    interleave reads it, each pipeline keeps its own records of every file). Evaluation
    reads files in a fixed order and keeps every n-th record, so shard sizes differ by at most one.
    `skip_corrupt` ends a file at its first truncated or damaged record instead of failing.
    """
    pipelines = input_context.num_input_pipelines if input_context else 1
    index = input_context.input_pipeline_id if input_context else 0
    by_file = training and pipelines > 1 and len(files) >= pipelines
    by_record_per_file = training and pipelines > 1 and not by_file
    if by_record_per_file:
        logger.warning(
            "tpukit: %d TFRecord file(s) for %d input pipelines: every pipeline reads all files and keeps every "
            "%d-th record. Fix for speed: write at least %d files.",
            len(files),
            pipelines,
            pipelines,
            pipelines,
        )
    if by_file:
        files = files[index::pipelines]

    def read(path):
        dataset = tf.data.TFRecordDataset(path, buffer_size=READ_BUFFER_BYTES)
        if skip_corrupt:
            # After a DataLossError the reader moves on to the next file, so the rest of this one is lost
            # (tensorflow/tensorflow: tensorflow/core/kernels/data/tf_record_dataset_op.cc, "so that it works
            # with ignore_errors").
            dataset = dataset.ignore_errors()
        return dataset.shard(pipelines, index) if by_record_per_file else dataset

    dataset = tf.data.Dataset.from_tensor_slices(files)
    if training:
        dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.interleave(
        read,
        cycle_length=max(1, min(cycle_length, len(files))),
        num_parallel_calls=AUTOTUNE,
        # Evaluation always reads in order; training follows the pipeline's tf.data options (data.deterministic).
        # An explicit False here would override `Options.deterministic = True` and reorder every epoch.
        deterministic=None if training else True,
    )
    if pipelines > 1 and not training:
        dataset = dataset.shard(pipelines, index)
    size = sum(_file_size(f) for f in files)
    return dataset, size if by_file or pipelines == 1 else size // pipelines


def tfrecord_images(
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    file_pattern: str = "",
    image_size: tuple[int, ...] = (224, 224),
    image_key: str = "image/encoded",
    label_key: str = "image/class/label",
    label_offset: int = 0,
    channels: int = 3,
    augment: Augment = "crop_flip",
    normalize: Normalize = "imagenet",
    min_crop_area: float = 0.08,
    eval_crop_fraction: float = 0.875,
    cycle_length: int = 16,
    split_sizes: dict[str, int] | None = None,
    training: bool | None = None,
    cache: bool = False,
    skip_corrupt: bool = False,
) -> tf.data.Dataset:
    """`(image float32 [*image_size, channels], label int32)` from TFRecord files of `tf.train.Example`s.

    Args:
        split: replaces `{split}` in `file_pattern` ('train', 'validation', ...).
        input_context: this pipeline's place (see the module docstring for how files are shared).
        file_pattern: glob of the files, local or gs://, e.g. 'gs://bucket/imagenet/{split}-*'.
        image_size: [height, width] of the images produced.
        image_key: feature with the encoded image (JPEG, PNG, BMP or GIF).
        label_key: int64 feature with the class.
        label_offset: added to every label (-1 for ImageNet's 1-based labels).
        channels: decoded channels (3: RGB, 1: grayscale).
        augment, normalize, min_crop_area, eval_crop_fraction: see `tpukit.data.images.preprocess`.
        cycle_length: files read in parallel by each pipeline.
        split_sizes: examples per split, e.g. {train: 1281167, validation: 50000}, so that counting needs no
            pass over the files (see `count`).
        training: shuffle files, read them per pipeline and augment; None: True for 'train' splits.
        cache: cache the encoded records in memory (if they fit), so later epochs skip the reads.
        skip_corrupt: drop records that are unreadable (truncated or damaged file: the rest of that file) or do not
            parse/decode, instead of failing; `scan` counts them. Set by the run from `data.skip_corrupt`.
    """
    if not file_pattern:
        raise ValueError(
            "tfrecord_images: file_pattern is required; received ''. Fix: set data.file_pattern, e.g. "
            "'gs://bucket/imagenet/{split}-*'."
        )
    images.check_choices("tfrecord_images", augment, normalize, image_size)
    if channels not in (1, 3):
        raise ValueError(f"tfrecord_images: channels must be 1 or 3; received channels={channels}.")
    training = is_training_split(split) if training is None else training
    dataset, size = records(
        list_files(file_pattern, split),
        input_context,
        training,
        cycle_length,
        skip_corrupt=skip_corrupt,
    )
    dataset = maybe_cache(dataset, cache, total_bytes=size, name=f"TFRecords of split {split!r}")
    options = dict(
        augment=augment,
        normalization=normalize,
        min_crop_area=min_crop_area,
        eval_crop_fraction=eval_crop_fraction,
    )

    def decode(serialized):
        image, label = parse_and_decode(serialized, image_key, label_key, channels)
        image = images.preprocess(image, tuple(image_size), training, **options)
        return image, tf.cast(label + label_offset, tf.int32)

    dataset = dataset.map(decode, num_parallel_calls=AUTOTUNE)
    # Native in tf.data: a record whose parse or decode fails is dropped, with no Python in the input path.
    return dataset.ignore_errors() if skip_corrupt else dataset


def parse_and_decode(
    serialized: tf.Tensor, image_key: str, label_key: str, channels: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """`(image uint8 [h, w, channels], label int64)` of one serialized `tf.train.Example`; raises on a bad one."""
    spec = {
        image_key: tf.io.FixedLenFeature([], tf.string),
        label_key: tf.io.FixedLenFeature([], tf.int64),
    }
    example = tf.io.parse_single_example(serialized, spec)
    image = tf.io.decode_image(example[image_key], channels=channels, expand_animations=False)
    return image, example[label_key]


def count(
    split: str,
    file_pattern: str = "",
    split_sizes: dict[str, int] | None = None,
    skip_corrupt: bool = False,
    **_,
) -> int:
    """Examples in `split`: from `split_sizes` if it names the split, else one pass over the raw records.

    The pass checks every record's framing on the way: a truncated or damaged file raises `CorruptDataError` naming
    it, unless `skip_corrupt` (then the readable records are counted, as the pipeline reads them).
    """
    if split_sizes and split in split_sizes:
        return int(split_sizes[split])
    files = list_files(file_pattern, split)
    logger.info(
        "tpukit: counting the records of %d file(s) of split %r (set split_sizes to skip this)",
        len(files),
        split,
    )
    report = corrupt.scan_tfrecords(files, source="tfrecord_images", split=split)
    if report.corrupt and not skip_corrupt:
        raise corrupt.error("tfrecord_images", split, report.corrupt)
    return report.readable


def scan(
    split: str,
    file_pattern: str = "",
    image_key: str = "image/encoded",
    label_key: str = "image/class/label",
    channels: int = 3,
    cycle_length: int = 16,
    **_,
) -> corrupt.CorruptReport:
    """Every record of `split` that `tfrecord_images(skip_corrupt=True)` drops: unreadable, or failing to parse or
    decode. One pass over the split that decodes every image (no resizing), files in parallel."""

    def check(serialized):
        image, _ = parse_and_decode(serialized, image_key, label_key, channels)
        return tf.shape(image)

    files = list_files(file_pattern, split)
    return corrupt.scan_tfrecords(
        files, check, source="tfrecord_images", split=split, cycle_length=cycle_length
    )
