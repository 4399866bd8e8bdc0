"""TFRecord images: decoding, labels, file- and record-level sharding, exact counts, static batches."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from tpukit import data
from tpukit.data import tfrecord


def _write(path, ids, image_key="image/encoded", label_key="image/class/label"):
    """One TFRecord file of JPEG images (sizes vary) whose label is the id."""
    rng = np.random.default_rng(int(ids[0]) if len(ids) else 0)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in ids:
            height, width = 40 + 8 * (i % 3), 48
            jpeg = tf.io.encode_jpeg(
                rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            ).numpy()
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        image_key: tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                        label_key: tf.train.Feature(int64_list=tf.train.Int64List(value=[int(i)])),
                    }
                )
            )
            writer.write(example.SerializeToString())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfrecords")
    ids = np.arange(30)
    for k, chunk in enumerate(np.array_split(ids, 4)):
        _write(root / f"train-{k:05d}-of-00004", chunk)
    _write(root / "validation-00000-of-00001", np.arange(11))
    return str(root / "{split}-*")


def _labels(dataset):
    return [int(y) for _, y in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("training", [True, False])
def test_decodes_to_static_normalised_images(files, training):
    split = "train" if training else "validation"
    examples = data.tfrecord_images(
        split, None, file_pattern=files, image_size=(32, 32), normalize="unit", training=training
    )
    assert examples.element_spec[0].shape.as_list() == [32, 32, 3]
    image, label = next(iter(examples))
    assert image.dtype == tf.float32 and label.dtype == tf.int32
    assert 0.0 <= float(tf.reduce_min(image)) and float(tf.reduce_max(image)) <= 1.0
    spec = data.training_batches(examples, 4).element_spec
    assert [s.shape.as_list() for s in spec] == [[4, 32, 32, 3], [4]]


def test_training_order_repeats_with_deterministic_options(files):
    # The parallel interleave follows data.deterministic: 4 files read 16-wide reorder on every pass otherwise.
    def order():
        examples = data.tfrecord_images(
            "train", None, file_pattern=files, image_size=(16, 16), augment="none", training=True
        )
        options = tf.data.Options()
        options.deterministic = True
        return _labels(examples.with_options(options))

    first = order()
    assert sorted(first) == list(range(30))
    assert all(order() == first for _ in range(4))


def test_file_level_sharding_splits_files_between_pipelines(files):
    seen = []
    for i in range(2):
        ctx = tf.distribute.InputContext(2, i, 2)
        seen += _labels(data.tfrecord_images("train", ctx, file_pattern=files, image_size=(16, 16)))
    assert sorted(seen) == list(range(30))


@pytest.mark.integration
def test_fewer_files_than_pipelines_falls_back_to_records_with_a_warning(files, caplog):
    seen = []
    with caplog.at_level(logging.WARNING, logger="tpukit"):
        for i in range(8):
            ctx = tf.distribute.InputContext(8, i, 8)
            seen += _labels(
                data.tfrecord_images("train", ctx, file_pattern=files, image_size=(16, 16))
            )
    assert sorted(seen) == list(range(30))
    assert "4 TFRecord file(s) for 8 input pipelines" in caplog.text


def test_eval_shards_by_record_so_evaluation_is_exact(files):
    seen, weight = [], 0.0
    for i in range(2):
        ctx = tf.distribute.InputContext(2, i, 4)
        examples = data.tfrecord_images(
            "validation", ctx, file_pattern=files, image_size=(16, 16), training=False
        )
        for _, labels, weights in data.eval_batches(examples, 11, 4, ctx):
            weight += float(tf.reduce_sum(weights))
            seen += [int(y) for y, w in zip(labels.numpy(), weights.numpy(), strict=True) if w > 0]
    assert weight == 11 and sorted(seen) == list(range(11))


def test_custom_keys_and_label_offset(tmp_path):
    _write(tmp_path / "train-0", np.arange(1, 4), image_key="jpeg", label_key="cls")
    examples = data.tfrecord_images(
        "train",
        None,
        file_pattern=str(tmp_path / "{split}-*"),
        image_key="jpeg",
        label_key="cls",
        label_offset=-1,
        channels=1,
        image_size=(8, 8),
        normalize="symmetric",
        training=False,
    )
    assert sorted(_labels(examples)) == [0, 1, 2]
    assert examples.element_spec[0].shape.as_list() == [8, 8, 1]


def test_count_reads_records_or_uses_split_sizes(files):
    assert tfrecord.count("train", file_pattern=files) == 30
    assert tfrecord.count("validation", file_pattern=files) == 11
    assert tfrecord.count("train", file_pattern=files, split_sizes={"train": 1234}) == 1234


def test_cache_stores_records_before_augmentation(files):
    examples = data.tfrecord_images(
        "train", None, file_pattern=files, image_size=(16, 16), cache=True
    )
    first = sorted((int(y), x.sum()) for x, y in examples.as_numpy_iterator())
    second = sorted((int(y), x.sum()) for x, y in examples.as_numpy_iterator())
    assert [y for y, _ in first] == list(range(30))
    assert [s for _, s in first] != [s for _, s in second]  # augmentation is redrawn every epoch


def test_missing_files_name_the_pattern(tmp_path):
    with pytest.raises(ValueError, match=r"no file matches .*nothing/train-\*.*split='train'"):
        data.tfrecord_images("train", None, file_pattern=str(tmp_path / "nothing" / "{split}-*"))
    with pytest.raises(ValueError, match="file_pattern is required"):
        data.tfrecord_images("train", None)
