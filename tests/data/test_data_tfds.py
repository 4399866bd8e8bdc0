"""TFDS source on mock data (no download): image and text classification, packed language-model windows.

`tfds.testing.mock_data` gives random examples of each dataset's real features but ignores sharding and split
sizes, so the sharding decision is tested on its own (`read_plan`) and example-level sharding on the mock.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tpukit import data
from tpukit.data import text
from tpukit.data.tfds import read_plan


@pytest.fixture(autouse=True)
def _mock():
    with tfds.testing.mock_data(num_examples=12):
        yield


def test_mnist_images_are_unit_float32_with_int32_labels():
    examples = data.tfds_dataset("train", None, name="mnist")
    assert examples.element_spec[0].shape.as_list() == [28, 28, 1]
    images, labels = next(iter(examples.batch(12)))
    assert images.dtype == tf.float32 and labels.dtype == tf.int32
    assert 0.0 <= float(tf.reduce_min(images)) and float(tf.reduce_max(images)) <= 1.0
    assert 0 <= int(tf.reduce_min(labels)) and int(tf.reduce_max(labels)) < 10


@pytest.mark.parametrize("split", ["train", "test"])
def test_cifar10_resized_augmented_and_static(split):
    examples = data.tfds_dataset(
        split,
        None,
        name="cifar10",
        image_size=(24, 24),
        augment="crop_flip",
        normalize="imagenet",
        cache=True,
    )
    spec = data.training_batches(examples, 4).element_spec
    assert [s.shape.as_list() for s in spec] == [[4, 24, 24, 3], [4]]
    assert sum(1 for _ in examples) == 12


@pytest.mark.slow
def test_imdb_reviews_become_fixed_length_byte_ids():
    examples = data.tfds_dataset("train", None, name="imdb_reviews", sequence_length=32)
    tokens, label = next(iter(examples))
    assert tokens.shape == (32,) and tokens.dtype == tf.int32 and label.dtype == tf.int32
    assert 0 <= int(tf.reduce_min(tokens)) and int(tf.reduce_max(tokens)) < text.VOCAB_SIZE
    assert int(label) in (0, 1)


def test_tiny_shakespeare_becomes_packed_next_byte_windows():
    examples = data.tfds_dataset("train", None, name="tiny_shakespeare", sequence_length=8)
    assert int(examples.cardinality()) > 0  # known: the run counts it without a pass
    x, y = next(iter(examples))
    assert x.shape == y.shape == (8,) and x.dtype == tf.int32
    assert x.numpy()[1:].tolist() == y.numpy()[:-1].tolist()


def test_example_level_sharding_is_disjoint_and_complete():
    seen = []
    for i in range(3):
        ctx = tf.distribute.InputContext(3, i, 3)
        seen += [
            int(np.sum(x)) for x, _ in data.tfds_dataset("test", ctx, name="mnist", training=False)
        ]
    whole = [
        int(np.sum(x)) for x, _ in data.tfds_dataset("test", None, name="mnist", training=False)
    ]
    assert sorted(seen) == sorted(whole) and len(whole) == 12


def test_read_plan():
    ctx = tf.distribute.InputContext(4, 0, 8)
    assert read_plan(10, None, True) == "all"
    assert read_plan(10, ctx, True) == "files"  # tfds.ReadConfig(input_context=ctx)
    assert read_plan(2, ctx, True) == "even"  # too few files: tfds.even_splits
    assert read_plan(10, ctx, False) == "even"  # evaluation: shard sizes differ by at most one
    assert read_plan(None, ctx, True) == "examples"


def test_feature_names_are_configurable_and_checked():
    with pytest.raises(ValueError, match="none matches image_key='img'"):
        data.tfds_dataset("train", None, name="tiny_shakespeare", image_key="img", text_key="body")
    with pytest.raises(ValueError, match="augment must be one of"):
        data.tfds_dataset("train", None, name="mnist", augment="rotate")


def test_count_uses_split_info_and_defers_when_it_cannot_say():
    from tpukit.data import tfds as tfds_source

    assert (
        tfds_source.count("train", name="tiny_shakespeare") is None
    )  # windows depend on sequence_length
    assert (
        tfds_source.count("train", name="mnist") is None
    )  # mock_data: no split info, the run counts instead
    with pytest.raises(ValueError, match="unknown dataset name='no_such_dataset'"):
        data.tfds_dataset("train", None, name="no_such_dataset")


@pytest.mark.parametrize("entry", ["tfds_dataset", "count", "scan"])
def test_a_misspelled_name_is_an_unknown_dataset_with_tfds_suggestion(entry):
    # The dataset is looked up before any data is read: no download, and the mock does not hide the name.
    from tpukit.data import tfds as tfds_source

    function = {
        "tfds_dataset": lambda: data.tfds_dataset("train", None, name="mnsit"),
        "count": lambda: tfds_source.count("train", name="mnsit"),
        "scan": lambda: data.scan_corrupt("tfds", "train", {"name": "mnsit"}),
    }[entry]
    with pytest.raises(ValueError, match="unknown dataset") as caught:
        function()
    message = str(caught.value)
    assert "tfds: unknown dataset name='mnsit' (did you mean 'mnist'?)" in message
    # Examples of names, not TFDS's list of every dataset it has.
    assert "cifar10" in message and "abstract_reasoning" not in message


def test_an_unknown_name_without_a_close_match_has_no_suggestion():
    with pytest.raises(ValueError, match="unknown dataset name='qqqqqqqqqqqqqqqq'") as caught:
        data.tfds_dataset("train", None, name="qqqqqqqqqqqqqqqq")
    assert "did you mean" not in str(caught.value)
