"""Byte-level text: encoding, packed language-model windows, the text_files source and its default corpus."""

import numpy as np
import pytest
import tensorflow as tf

from tpukit import data
from tpukit.data import text


def test_encode_bytes_truncates_and_pads_to_a_static_length():
    ids = text.encode_bytes(tf.constant("héllo"), 8)
    assert ids.shape == (8,) and ids.dtype == tf.int32
    assert ids.numpy().tolist() == [104, 195, 169, 108, 108, 111, 0, 0]
    assert text.encode_bytes(tf.constant("abcdef"), 3).numpy().tolist() == [97, 98, 99]


def test_pack_windows_shifts_labels_by_one_token():
    tokens = np.arange(23, dtype=np.uint8)
    inputs, labels = text.pack_windows(tokens, 5)
    assert inputs.shape == labels.shape == (4, 5)  # (23 - 1) // 5
    assert inputs[1].tolist() == [5, 6, 7, 8, 9] and labels[1].tolist() == [6, 7, 8, 9, 10]
    with pytest.raises(ValueError, match="do not fill one window of sequence_length=50"):
        text.pack_windows(tokens, 50)


@pytest.fixture
def corpus(tmp_path):
    for i in range(3):
        (tmp_path / f"doc{i}.txt").write_text(
            f"document {i}: " + "the quick brown fox jumps. " * 40
        )
    return str(tmp_path / "*.txt")


def test_text_files_splits_deterministically_and_disjointly(corpus):
    train = list(
        data.text_files("train", None, file_pattern=corpus, sequence_length=16, test_fraction=0.25)
    )
    test = list(
        data.text_files("test", None, file_pattern=corpus, sequence_length=16, test_fraction=0.25)
    )
    assert len(test) == round(len(train + test) * 0.25) and len(train) > 3 * len(test) - 3
    x, y = train[0]
    assert x.shape == y.shape == (16,) and x.dtype == y.dtype == tf.int32
    assert x.numpy()[1:].tolist() == y.numpy()[:-1].tolist()
    assert 0 <= int(tf.reduce_min(x)) and int(tf.reduce_max(x)) < text.VOCAB_SIZE
    again = list(
        data.text_files("train", None, file_pattern=corpus, sequence_length=16, test_fraction=0.25)
    )
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(train, again, strict=True))


def test_text_files_shards_windows_across_pipelines(corpus):
    whole = data.text_files("train", None, file_pattern=corpus, sequence_length=16)
    shards = [
        data.text_files(
            "train", tf.distribute.InputContext(2, i, 2), file_pattern=corpus, sequence_length=16
        )
        for i in range(2)
    ]
    assert sum(int(s.cardinality()) for s in shards) == int(whole.cardinality())


def test_default_corpus_is_the_standard_library_and_batches_are_static():
    examples = data.text_files("train", None, sequence_length=64, max_bytes=200_000)
    assert int(examples.cardinality()) > 1000
    spec = data.training_batches(examples, 8).element_spec
    assert [s.shape.as_list() for s in spec] == [[8, 64], [8, 64]]


def test_text_files_errors_name_the_argument(tmp_path):
    with pytest.raises(ValueError, match="no file matches file_pattern="):
        data.text_files("train", None, file_pattern=str(tmp_path / "*.nothing"))
    with pytest.raises(ValueError, match="unknown split 'validation'"):
        data.text_files("validation", None, max_bytes=10_000)
