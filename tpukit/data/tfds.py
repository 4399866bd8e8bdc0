"""TensorFlow Datasets by name: image classification, text classification and character language modelling.

What the dataset holds decides the task, from its feature names:
  * `image_key` and `label_key` (mnist, cifar10, imagenette, ...): images cropped/resized to `image_size`,
    augmented when training, normalised float32; int32 labels.
  * `text_key` and `label_key` (imdb_reviews, ag_news_subset, ...): UTF-8 bytes as int32 ids, truncated/padded
    to `sequence_length`; int32 labels.
  * `text_key` only (tiny_shakespeare: one long text per split): packed next-byte windows
    (inputs tokens[t:t+L], labels tokens[t+1:t+L+1]).

    examples = tfds_dataset("train", None, name="cifar10", image_size=(32, 32))

TFDS reads its own TFRecord shards and decodes inside `as_dataset`. A truncated shard or an undecodable record
fails the run with TensorFlow's error, which `tpukit.data.explain_data_error` turns into a `CorruptDataError`
naming the shard and record (`scan` reads the split's shards); `skip_corrupt=True` drops such records instead.
"""

from __future__ import annotations

import logging
import re

import tensorflow as tf

from tpukit.data import corrupt, images, text
from tpukit.data.images import Augment, Normalize
from tpukit.data.pipeline import AUTOTUNE, maybe_cache, shard

logger = logging.getLogger("tpukit")


def is_training_split(split: str) -> bool:
    """The default for `training`: 'train', 'train[:90%]' and the like are training splits."""
    return split.split("[")[0].strip() == "train"


def _did_you_mean(error: Exception) -> str | None:
    """The name TFDS suggests for an unknown one ("Did you mean: mnsit -> mnist ?" in its error), or None."""
    match = re.search(r"Did you mean: \S+ -> (\S+) \?", str(error))
    return match.group(1) if match else None


def _find_builder(name: str, data_dir: str | None, try_gcs: bool):
    """`tfds.builder(name)`; an unknown name raises ValueError "unknown dataset" with TFDS's suggestion (its own
    message lists every dataset it has)."""
    import tensorflow_datasets as tfds

    try:
        return tfds.builder(name, data_dir=data_dir, try_gcs=try_gcs)
    except tfds.core.registered.DatasetNotFoundError as error:
        suggestion = _did_you_mean(error)
        hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
        raise ValueError(
            f"tfds: unknown dataset name={name!r}{hint}. Fix: use a name from `tfds.list_builders()`, "
            "e.g. mnist, cifar10, imdb_reviews, tiny_shakespeare."
        ) from None


class DataUnavailableError(RuntimeError):
    """The data could not be read or fetched (a failed download, no network): the message names the dataset, the
    cause and the fix. An environment fault, not a bad recipe: the CLI exits 1 without a traceback."""


def prepared_here(name: str, data_dir: str | None = None) -> bool:
    """Whether TFDS has `name` prepared in `data_dir` (default: TFDS's), so reading it needs no network. Asks nothing
    of the network itself (no GCS lookup)."""
    return _find_builder(name, data_dir, try_gcs=False).is_prepared()


def _builder(name: str, data_dir: str | None, try_gcs: bool, download: bool):
    builder = _find_builder(name, data_dir, try_gcs)
    if download:
        try:
            builder.download_and_prepare()
        except Exception as error:
            gcs = "" if try_gcs else ", or set try_gcs: true to read TFDS's public GCS copy"
            raise DataUnavailableError(
                f"tfds: could not download and prepare {name!r} into data_dir={data_dir!r}: "
                f"{type(error).__name__}: {error}. Fix: check the network, or prepare it once elsewhere and copy it "
                f"into data_dir (local or gs://){gcs}."
            ) from error
    return builder


def _num_shards(builder, split: str) -> int | None:
    """Files behind `split` (None when unknown, e.g. under tfds.testing.mock_data)."""
    try:
        info = builder.info.splits[split]
    except KeyError:  # no split info: unprepared data, tfds.testing.mock_data
        return None
    shards = getattr(info, "num_shards", None)
    if shards is None and hasattr(info, "file_instructions"):
        shards = len(info.file_instructions)
    return shards


def read_plan(
    num_shards: int | None, input_context: tf.distribute.InputContext | None, training: bool
) -> str:
    """How a pipeline reads its share: 'all' (one pipeline), 'files' (TFDS file-level sharding, training with
    enough files), 'even' (`tfds.even_splits`: exact, for evaluation or too few files) or 'examples' (read all,
    keep every n-th: when the number of files is unknown)."""
    if input_context is None or input_context.num_input_pipelines == 1:
        return "all"
    if num_shards is None:
        return "examples"
    if training and num_shards >= input_context.num_input_pipelines:
        return "files"
    if training:
        logger.warning(
            "tpukit: tfds split has %d file(s) for %d input pipelines; sharding by examples instead of files",
            num_shards,
            input_context.num_input_pipelines,
        )
    return "even"


def _read(
    builder, split, input_context, training: bool, seed: int, skip_corrupt: bool = False
) -> tf.data.Dataset:
    import tensorflow_datasets as tfds

    plan = read_plan(_num_shards(builder, split), input_context, training)
    # 'examples' keeps every n-th example, so all pipelines must read in the same order: one file at a time.
    in_order = plan == "examples"
    read_config = tfds.ReadConfig(
        shuffle_seed=seed,
        input_context=input_context if plan == "files" else None,
        interleave_cycle_length=1 if in_order else 16,
        num_parallel_calls_for_interleave_files=1 if in_order else AUTOTUNE,
        # TFDS asserts the split's example count; after a skipped record that assertion fails at the end of every
        # pass, and ignore_errors would retry it forever.
        assert_cardinality=not skip_corrupt,
    )
    if plan == "even":
        split = tfds.even_splits(split, n=input_context.num_input_pipelines)[
            input_context.input_pipeline_id
        ]
    dataset = builder.as_dataset(
        split=split, shuffle_files=training and not in_order, read_config=read_config
    )
    if skip_corrupt:  # before sharding by example, so every pipeline drops the same records
        dataset = dataset.ignore_errors()
    return shard(dataset, input_context) if in_order else dataset


def tfds_dataset(
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    name: str = "mnist",
    data_dir: str | None = None,
    try_gcs: bool = False,
    download: bool = True,
    image_key: str = "image",
    label_key: str = "label",
    text_key: str = "text",
    image_size: tuple[int, ...] | None = None,
    augment: Augment = "none",
    normalize: Normalize = "unit",
    min_crop_area: float = 0.08,
    eval_crop_fraction: float = 0.875,
    sequence_length: int = 256,
    training: bool | None = None,
    cache: bool = False,
    skip_corrupt: bool = False,
) -> tf.data.Dataset:
    """Examples of a TFDS dataset split, sharded for `input_context` (see the module docstring for the tasks).

    Args:
        split: a TFDS split, slices included ('train', 'test', 'train[:90%]').
        input_context: this pipeline's place; training reads whole files per pipeline
            (`tfds.ReadConfig(input_context=...)`) when there are enough, evaluation splits examples evenly.
        name: the TFDS name, optionally with config and version ('mnist', 'imagenette/320px-v2').
        data_dir: where prepared data lives (local or gs://); None: TFDS's default (~/tensorflow_datasets).
        try_gcs: read TFDS's public copy on GCS when it has one (fast on Colab / Cloud).
        download: download and prepare the dataset if `data_dir` does not have it.
        image_key, label_key, text_key: feature names of the image, label and text.
        image_size: [height, width] of the images produced; None: the dataset's own (fixed) size.
        augment: training augmentation: 'none', 'flip', 'crop' (pad+crop at the native size, random resized crop
            otherwise) or 'crop_flip'. Not for digits: 'flip' turns a 2 into something else.
        normalize: 'unit' ([0, 1]), 'symmetric' ([-1, 1]) or 'imagenet' (mean/std).
        min_crop_area: smallest area fraction of a random resized crop.
        eval_crop_fraction: central fraction kept by the evaluation crop when resizing.
        sequence_length: tokens per text example / language-model window.
        training: random augmentation and file shuffling; None: True for 'train' splits.
        cache: cache the decoded, not yet augmented examples in memory (if they fit).
        skip_corrupt: drop records TFDS cannot read or decode instead of failing (`scan` counts them). Set by the
            run from `data.skip_corrupt`.
    """
    images.check_choices("tfds", augment, normalize, image_size)
    training = is_training_split(split) if training is None else training
    builder = _builder(name, data_dir, try_gcs, download)
    features = builder.info.features
    seed = 0
    if image_key in features and label_key in features:
        dataset = _read(builder, split, input_context, training, seed, skip_corrupt)
        return _image_classification(
            dataset,
            features[image_key],
            image_key,
            label_key,
            image_size,
            training,
            cache,
            dict(
                augment=augment,
                normalization=normalize,
                min_crop_area=min_crop_area,
                eval_crop_fraction=eval_crop_fraction,
            ),
        )
    if text_key in features and label_key in features:
        dataset = _read(builder, split, input_context, training, seed, skip_corrupt)
        return _text_classification(dataset, text_key, label_key, sequence_length, cache)
    if text_key in features:
        return _language_model(
            builder, split, input_context, text_key, sequence_length, skip_corrupt
        )
    raise ValueError(
        f"tfds: dataset {name!r} has features {', '.join(features.keys())}; none matches image_key={image_key!r}, "
        f"text_key={text_key!r} with label_key={label_key!r}. Fix: set image_key/text_key/label_key to its "
        "feature names."
    )


def _image_classification(
    dataset, feature, image_key, label_key, image_size, training, cache, options
):
    native = tuple(feature.shape[:2])
    if image_size is None:
        if None in native:
            raise ValueError(
                f"tfds: the images of feature {image_key!r} vary in size {feature.shape}; received image_size=None. "
                "Fix: set image_size: [height, width]."
            )
        image_size = native
    dataset = dataset.map(
        lambda ex: (ex[image_key], tf.cast(ex[label_key], tf.int32)), num_parallel_calls=AUTOTUNE
    )
    dataset = maybe_cache(dataset, cache, name="decoded images")
    return dataset.map(
        lambda image, label: (images.preprocess(image, image_size, training, **options), label),
        num_parallel_calls=AUTOTUNE,
    )


def _text_classification(dataset, text_key, label_key, sequence_length, cache):
    dataset = dataset.map(
        lambda ex: (
            text.encode_bytes(ex[text_key], sequence_length),
            tf.cast(ex[label_key], tf.int32),
        ),
        num_parallel_calls=AUTOTUNE,
    )
    return maybe_cache(dataset, cache, name="tokenized texts")


def _language_model(builder, split, input_context, text_key, sequence_length, skip_corrupt=False):
    # One long document per split: read it whole (MBs), pack windows, then shard the windows evenly.
    import tensorflow_datasets as tfds

    read_config = tfds.ReadConfig(assert_cardinality=not skip_corrupt)
    documents = builder.as_dataset(split=split, shuffle_files=False, read_config=read_config)
    if skip_corrupt:
        documents = documents.ignore_errors()
    try:
        texts = [ex[text_key] for ex in documents.as_numpy_iterator()]
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as failure:
        report = scan_builder(builder, split)
        if report is not None and report.corrupt:
            raise corrupt.error("tfds", split, report.corrupt) from None
        raise failure
    tokens = text.to_tokens(texts)
    inputs, labels = text.pack_windows(tokens, sequence_length)
    return shard(tf.data.Dataset.from_tensor_slices((inputs, labels)), input_context)


# Split sizes the TFDS catalogue publishes (https://www.tensorflow.org/datasets/catalog) for the datasets the shipped
# recipes train on: `tpukit show` plans with them where the data is not downloaded yet (nothing is downloaded then).
PUBLISHED_SPLIT_SIZES = {
    "cifar10": {"train": 50_000, "test": 10_000},
    "mnist": {"train": 60_000, "test": 10_000},
    "imdb_reviews": {"train": 25_000, "test": 25_000, "unsupervised": 50_000},
}


def published_split_size(name: str, split: str) -> int | None:
    """The catalogue's size of a plain split (`train`, not `train[:90%]`) of `name` (`cifar10`, `mnist:3.0.1`);
    None where `PUBLISHED_SPLIT_SIZES` does not know it."""
    return PUBLISHED_SPLIT_SIZES.get(name.split(":")[0].split("/")[0], {}).get(split)


def count(
    split: str,
    name: str = "mnist",
    data_dir: str | None = None,
    try_gcs: bool = False,
    label_key: str = "label",
    **_,
) -> int | None:
    """Examples in `split` from `builder.info.splits` without reading data; None when the info cannot say
    (language-model windows, unprepared data, `tfds.testing.mock_data`).

    Raises:
        ValueError: an unknown dataset name or split (TFDS's message).
    """
    builder = _find_builder(name, data_dir, try_gcs)
    if label_key not in builder.info.features:
        return None  # packed windows: their number depends on sequence_length
    try:
        return int(builder.info.splits[split].num_examples)
    except KeyError:  # no split info: unprepared data, tfds.testing.mock_data
        return None


def scan_builder(builder, split: str) -> corrupt.CorruptReport | None:
    """The records of `split` that TFDS cannot read or decode, from its TFRecord shards; None for other formats."""
    file_format = str(getattr(builder.info, "file_format", "tfrecord") or "tfrecord").lower()
    if "tfrecord" not in file_format:
        return None
    try:
        instructions = builder.info.splits[split].file_instructions
    except KeyError:  # no split info: unprepared data, tfds.testing.mock_data: no shards to read
        return None
    features = builder.info.features

    def touch(tensor):
        # A value that depends on the decoded data: a static shape alone would let graph optimisations prune
        # the decoding (a fixed-shape image's size is a constant).
        first = tf.reshape(tensor, [-1])[:1]
        first = tf.strings.length(first) if tensor.dtype == tf.string else first
        return tf.reduce_sum(tf.cast(first, tf.float64))

    def check(serialized):
        return tf.add_n(
            [touch(t) for t in tf.nest.flatten(features.deserialize_example(serialized))]
        )

    files = [i.filename for i in instructions]
    ranges = [(i.skip, None if i.take < 0 else i.skip + i.take) for i in instructions]
    return corrupt.scan_tfrecords(files, check, source="tfds", split=split, ranges=ranges)


def scan(split: str, name: str = "mnist", data_dir: str | None = None, try_gcs: bool = False, **_):
    """Every record of `split` that `tfds_dataset(skip_corrupt=True)` drops (one pass that decodes them all);
    None when the dataset is not prepared as TFRecord files.

    Raises:
        ValueError: an unknown dataset name or split (TFDS's message).
    """
    return scan_builder(_find_builder(name, data_dir, try_gcs), split)
