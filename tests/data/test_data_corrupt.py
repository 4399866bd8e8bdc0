"""Corrupt inputs: each fault is a file built broken here (truncated TFRecord, undecodable image, Latin-1 text,
truncated or undecodable TFDS shard). Default: a `CorruptDataError` naming the file and the record; with
`skip_corrupt`: exactly the good examples, and a scan that counts and names the broken ones."""

import functools
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpukit import data
from tpukit.data import CorruptDataError, corrupt, tfrecord

GARBAGE = b"\xff\xd8\xff\xe0 this is no JPEG"  # starts like a JPEG, then nonsense


def _example(label, image_bytes=None, shape=(12, 16)):
    if image_bytes is None:
        pixels = np.full((*shape, 3), (label * 37) % 256, np.uint8)
        image_bytes = tf.io.encode_jpeg(pixels).numpy()
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "image/encoded": tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[image_bytes])
                ),
                "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
            }
        )
    ).SerializeToString()


def _write(path, labels, garbage=()):
    """TFRecord file of JPEG examples labelled `labels`; those in `garbage` carry bytes that do not decode."""
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label in labels:
            writer.write(_example(label, GARBAGE if label in garbage else None))


def _truncate(path, drop_bytes):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size - drop_bytes)


def _labels(dataset):
    return sorted(int(y) for _, y in dataset.as_numpy_iterator())


def _options(root):
    return dict(file_pattern=str(root / "{split}-*"), image_size=(8, 8), normalize="unit")


@pytest.fixture()
def truncated(tmp_path):
    """3 files of 5 records; the last record of the middle file loses its last 10 bytes."""
    for k in range(3):
        _write(tmp_path / f"train-{k}", range(5 * k, 5 * k + 5))
    _truncate(tmp_path / "train-1", 10)
    return tmp_path


@pytest.fixture()
def undecodable(tmp_path):
    """2 files of 6 records; records 7 and 9 (file 1, records 1 and 3) hold garbage instead of a JPEG."""
    _write(tmp_path / "train-0", range(6))
    _write(tmp_path / "train-1", range(6, 12), garbage=(7, 9))
    return tmp_path


def test_truncated_tfrecord_is_named_when_the_split_is_counted(truncated):
    with pytest.raises(CorruptDataError) as caught:
        tfrecord.count("train", file_pattern=str(truncated / "{split}-*"))
    message = str(caught.value)
    path = str(truncated / "train-1")
    assert f"{path}: record 4 (byte offset " in message
    assert "truncated: the record says" in message
    assert (
        "Fix: set data.skip_corrupt: true to skip such records, or repair/regenerate the file."
        in message
    )
    assert [(r.path, r.index) for r in caught.value.records] == [(path, 4)]
    # The byte offset is where the broken record starts: after the 4 whole records before it.
    sizes = [len(r.numpy()) + corrupt.FRAMING_BYTES for r in tf.data.TFRecordDataset(path).take(4)]
    assert caught.value.records[0].offset == sum(sizes)


def test_truncated_tfrecord_inside_fit_is_explained_with_file_and_record(truncated):
    # split_sizes: no counting pass, so the fault surfaces only when the pipeline reads the file.
    options = {**_options(truncated), "split_sizes": {"train": 15}}
    examples = data.tfrecord_images("train", None, training=False, **options)
    with pytest.raises(tf.errors.DataLossError) as caught:
        _labels(examples)
    explained = data.explain_data_error(caught.value, "tfrecord_images", ["train"], options)
    assert isinstance(explained, CorruptDataError)
    assert f"{truncated / 'train-1'}: record 4 (byte offset" in str(explained)


def test_truncated_tfrecord_skipped_yields_the_other_records_and_counts_one(truncated):
    options = _options(truncated)
    examples = data.tfrecord_images("train", None, training=False, skip_corrupt=True, **options)
    assert _labels(examples) == [i for i in range(15) if i != 9]
    report = data.scan_corrupt("tfrecord_images", "train", options)
    assert (report.skipped, report.scanned, report.good, report.readable) == (1, 15, 14, 14)
    assert report.corrupt[0].path == str(truncated / "train-1") and report.corrupt[0].index == 4
    assert report.unread_bytes == os.path.getsize(truncated / "train-1") - report.corrupt[0].offset
    assert tfrecord.count("train", file_pattern=options["file_pattern"], skip_corrupt=True) == 14
    assert report.to_json()["skipped"] == 1 and "train-1: record 4" in report.summary()


def test_undecodable_image_is_explained_with_file_and_record(undecodable):
    options = _options(undecodable)
    assert tfrecord.count("train", file_pattern=options["file_pattern"]) == 12  # framing is fine
    examples = data.tfrecord_images("train", None, training=False, **options)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        _labels(examples)
    explained = data.explain_data_error(caught.value, "tfrecord_images", ["train"], options)
    assert isinstance(explained, CorruptDataError)
    path = str(undecodable / "train-1")
    assert [(r.path, r.index) for r in explained.records] == [(path, 1), (path, 3)]
    message = str(explained)
    assert f"{path}: record 1 (byte offset " in message and "does not decode: " in message
    assert "function_node" not in message and "[Op:" not in message


def test_undecodable_images_skipped_yield_exactly_the_good_ones_and_count_two(undecodable):
    options = _options(undecodable)
    examples = data.tfrecord_images("train", None, training=True, skip_corrupt=True, **options)
    assert _labels(examples) == [i for i in range(12) if i not in (7, 9)]
    report = data.scan_corrupt("tfrecord_images", "train", options)
    assert (report.skipped, report.scanned, report.good, report.readable) == (2, 12, 10, 12)
    counted = tfrecord.count("train", file_pattern=options["file_pattern"], skip_corrupt=True)
    assert (counted, report.examples(counted)) == (12, 10)
    assert [r.index for r in report.corrupt] == [1, 3] and report.unread_bytes == 0


def test_skipped_eval_records_are_zero_weight_padding_on_two_pipelines(undecodable):
    # Evaluation is sized by the records read (the counting pass: 12), each pipeline drops its own undecodable
    # ones after sharding, and the padding weighs 0: the weights add up to exactly the 10 good examples.
    options = _options(undecodable)
    num_examples = tfrecord.count("train", file_pattern=options["file_pattern"], skip_corrupt=True)
    weights, labels = 0.0, []
    for pipeline in range(2):
        ctx = tf.distribute.InputContext(2, pipeline, 2)
        examples = data.tfrecord_images("train", ctx, training=False, skip_corrupt=True, **options)
        for _, label, weight in data.eval_batches(
            examples, num_examples, 4, ctx
        ).as_numpy_iterator():
            weights += weight.sum()
            labels += label[weight > 0].tolist()
    assert weights == 10 and sorted(labels) == [i for i in range(12) if i not in (7, 9)]


def test_keras_fit_error_from_an_undecodable_image_is_explained(undecodable):
    # What the runner meets: the TensorFlow error that escapes Keras' fit.
    options = _options(undecodable)
    examples = data.tfrecord_images("train", None, training=False, **options)
    model = keras.Sequential(
        [keras.Input((8, 8, 3)), keras.layers.Flatten(), keras.layers.Dense(12)]
    )
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(tf.errors.OpError) as caught:
        model.fit(examples.batch(4), epochs=1, verbose=0)
    explained = data.explain_data_error(caught.value, "tfrecord_images", ["train"], options)
    assert isinstance(explained, CorruptDataError) and "train-1: record 1" in str(explained)


def test_errors_that_are_not_about_data_are_not_explained(undecodable):
    options = _options(undecodable)
    not_input = tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [4,10] vs. [4,12]")
    assert data.explain_data_error(not_input, "tfrecord_images", ["train"], options) is None
    assert data.explain_data_error(ValueError("x"), "tfrecord_images", ["train"], options) is None
    assert (
        data.explain_data_error(tf.errors.DataLossError(None, None, "x"), "digits", ["train"], {})
        is None
    )


def test_a_file_that_is_not_a_tfrecord_is_named_at_record_0(tmp_path):
    _write(tmp_path / "train-0", range(3))
    (tmp_path / "train-1").write_bytes(b"PK\x03\x04 a zip file matched by the glob" * 4)
    with pytest.raises(CorruptDataError, match=r"train-1: record 0 \(byte offset 0\)"):
        tfrecord.count("train", file_pattern=str(tmp_path / "{split}-*"))


def _texts(root):
    (root / "a.txt").write_text("first file, plain ASCII text.\n" * 20, encoding="utf-8")
    (root / "b.txt").write_bytes(
        "second file: caf\u00e9 cr\u00e8me br\u00fbl\u00e9e\n".encode("latin-1") * 20
    )
    (root / "c.txt").write_text(
        "third file, UTF-8: caf\u00e9 \u00fc\u00df \u2713\n" * 20, encoding="utf-8"
    )
    return str(root / "*.txt")


def test_text_that_is_not_utf8_is_named_with_its_byte_offset(tmp_path):
    pattern = _texts(tmp_path)
    with pytest.raises(CorruptDataError) as caught:
        data.text_files("train", None, file_pattern=pattern, sequence_length=16)
    offset = "second file: caf".__len__()
    assert (
        f"{tmp_path / 'b.txt'} is not UTF-8: byte offset {offset}: not UTF-8: byte 0xe9 on line 1"
        in str(caught.value)
    )
    assert "data.skip_corrupt: true" in str(caught.value)


def test_text_that_is_not_utf8_skipped_leaves_exactly_the_other_files(tmp_path):
    pattern = _texts(tmp_path)
    good = tmp_path / "good"
    good.mkdir()
    for name in ("a.txt", "c.txt"):
        (good / name).write_bytes((tmp_path / name).read_bytes())
    for split in ("train", "test"):
        skipped = data.text_files(
            split, None, file_pattern=pattern, sequence_length=16, skip_corrupt=True
        )
        expected = data.text_files(
            split, None, file_pattern=str(good / "*.txt"), sequence_length=16
        )
        got, want = list(skipped.as_numpy_iterator()), list(expected.as_numpy_iterator())
        assert len(got) == len(want) > 0 and all(
            (g[0] == w[0]).all() and (g[1] == w[1]).all() for g, w in zip(got, want, strict=True)
        )
    report = data.scan_corrupt("text_files", "train", {"file_pattern": pattern})
    assert (report.unit, report.scanned, report.skipped) == ("file", 3, 1)
    assert report.corrupt[0].path == str(tmp_path / "b.txt")


def test_the_default_text_corpus_is_utf8():
    assert data.scan_corrupt("text_files", "train", {}).skipped == 0


def test_run_args_passes_skip_corrupt_to_sources_that_take_it():
    assert "skip_corrupt" in data.SOURCE_RESERVED_ARGS
    assert (
        data.run_args(data.tfrecord_images, True, False, skip_corrupt=True)["skip_corrupt"] is True
    )
    assert data.run_args(data.text_files, True, False, skip_corrupt=True) == {"skip_corrupt": True}
    assert "skip_corrupt" not in data.run_args(data.digits, True, False, skip_corrupt=True)
    assert set(data.SCANS) == {
        name for name, fn in data.SOURCES.items() if "skip_corrupt" in data.run_args(fn, 1, 1, 1)
    }


# TFDS reads its own TFRecord shards: a tiny dataset prepared offline, then broken on disk.


@functools.cache
def _tfds_builder_class():
    """Defined once: TFDS registers a builder class by name when the class is created."""
    tfds = pytest.importorskip("tensorflow_datasets")

    class CorruptTestImages(tfds.core.GeneratorBasedBuilder):
        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.FeaturesDict(
                    {
                        "image": tfds.features.Image(shape=(8, 8, 3)),
                        "label": tfds.features.ClassLabel(num_classes=10),
                    }
                ),
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples(10)}

        def _generate_examples(self, n):
            for i in range(n):
                yield i, {"image": np.full((8, 8, 3), i, np.uint8), "label": i}

    return CorruptTestImages


@pytest.fixture()
def tfds_dir(tmp_path):
    builder = _tfds_builder_class()(data_dir=str(tmp_path))
    builder.download_and_prepare()
    shard = builder.info.splits["train"].file_instructions[0].filename
    return str(tmp_path), shard


def _tfds_options(data_dir):
    return dict(name="corrupt_test_images", data_dir=data_dir, download=False)


def test_tfds_truncated_shard_is_explained_or_skipped(tfds_dir):
    data_dir, shard = tfds_dir
    _truncate(shard, 5)
    options = _tfds_options(data_dir)
    with pytest.raises(tf.errors.DataLossError) as caught:
        _labels(data.tfds_dataset("train", None, training=False, **options))
    explained = data.explain_data_error(caught.value, "tfds", ["train"], options)
    assert isinstance(explained, CorruptDataError) and f"{shard}: record 9 (byte offset" in str(
        explained
    )
    skipped = data.tfds_dataset("train", None, training=False, skip_corrupt=True, **options)
    report = data.scan_corrupt("tfds", "train", options)
    # TFDS shuffles example order by key hash, so which label sat last in the shard is read from the shard.
    assert len(_labels(skipped)) == 9 and (report.skipped, report.good) == (1, 9)


def test_tfds_undecodable_image_is_explained_or_skipped(tfds_dir):
    data_dir, shard = tfds_dir
    records = [r.numpy() for r in tf.data.TFRecordDataset(shard)]
    broken = tf.train.Example.FromString(records[3])
    bad_label = broken.features.feature["label"].int64_list.value[0]
    broken.features.feature["image"].bytes_list.value[0] = GARBAGE
    records[3] = broken.SerializeToString()
    with tf.io.TFRecordWriter(shard) as writer:
        for record in records:
            writer.write(record)
    options = _tfds_options(data_dir)
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        _labels(data.tfds_dataset("train", None, training=False, **options))
    explained = data.explain_data_error(caught.value, "tfds", ["train"], options)
    assert isinstance(explained, CorruptDataError) and f"{shard}: record 3 (byte offset" in str(
        explained
    )
    skipped = data.tfds_dataset("train", None, training=False, skip_corrupt=True, **options)
    assert _labels(skipped) == [i for i in range(10) if i != bad_label]
    assert data.scan_corrupt("tfds", "train", options).skipped == 1
