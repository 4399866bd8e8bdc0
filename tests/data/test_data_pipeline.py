"""The distributed pipeline: per-replica shapes, exact sharding, exact evaluation, static shapes, dtypes."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored

from tpukit import data
from tpukit.data import pipeline


def _ids(n):
    """A source of ids: features are the id as a float vector, the label is the id."""
    ids = np.arange(n, dtype=np.int32)
    features = np.repeat(ids[:, None], 3, axis=1).astype(np.float32)
    return features, ids


def _ids_source(n):
    features, ids = _ids(n)
    return lambda ctx: data.arrays(features, ids, ctx)


def _contexts(pipelines, replicas):
    return [
        tf.distribute.InputContext(
            num_input_pipelines=pipelines, input_pipeline_id=i, num_replicas_in_sync=replicas
        )
        for i in range(pipelines)
    ]


@pytest.mark.parametrize("replicas", [1, 2, 8])
def test_per_replica_shapes_on_virtual_devices(replicas):
    strategy = mirrored(replicas)
    source = _ids_source(256)
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: data.training_batches(source(ctx), 64, ctx, shuffle_buffer=16)
    )
    features, labels = next(iter(dataset))
    per_replica = strategy.experimental_local_results(features)
    assert len(per_replica) == replicas
    assert all(tuple(x.shape) == (64 // replicas, 3) for x in per_replica)
    assert all(
        tuple(y.shape) == (64 // replicas,) for y in strategy.experimental_local_results(labels)
    )


def test_training_over_two_pipelines_loses_and_duplicates_nothing():
    source = _ids_source(96)
    seen = []
    for ctx in _contexts(2, 4):
        batches = data.training_batches(source(ctx), 16, ctx, shuffle_buffer=8, repeat=False)
        seen += [int(i) for _, labels in batches for i in labels.numpy()]
    assert sorted(seen) == list(range(96))


@pytest.mark.parametrize(
    "pipelines,replicas,n", [(1, 1, 37), (1, 2, 37), (2, 2, 37), (2, 4, 101), (2, 8, 5)]
)
def test_eval_counts_every_example_exactly_once(pipelines, replicas, n):
    source = _ids_source(n)
    weights_total, seen, batch_counts = 0.0, [], []
    for ctx in _contexts(pipelines, replicas):
        batches = list(data.eval_batches(source(ctx), n, 8, ctx))
        batch_counts.append(len(batches))
        for features, labels, weights in batches:
            assert tuple(features.shape) == (8 // replicas, 3)
            weights_total += float(tf.reduce_sum(weights))
            seen += [int(i) for i, w in zip(labels.numpy(), weights.numpy(), strict=True) if w > 0]
    assert weights_total == n
    assert sorted(seen) == list(range(n))
    assert len(set(batch_counts)) == 1  # every pipeline stops after the same number of batches


def test_eval_on_mirrored_strategy_is_exact():
    strategy = mirrored(2)
    source = _ids_source(21)
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: data.eval_batches(source(ctx), 21, 8, ctx)
    )
    seen = []
    for _, labels, weights in dataset:
        for y, w in zip(
            strategy.experimental_local_results(labels),
            strategy.experimental_local_results(weights),
            strict=True,
        ):
            seen += [int(i) for i, wi in zip(y.numpy(), w.numpy(), strict=True) if wi > 0]
    assert sorted(seen) == list(range(21))


def test_feature_dtype_casts_floats_only():
    tokens = data.arrays(np.zeros((8, 4), np.int32), np.zeros(8, np.int32))
    images = data.arrays(np.zeros((8, 4), np.float32), np.zeros(8, np.int32))
    assert (
        data.training_batches(tokens, 4, feature_dtype="bfloat16").element_spec[0].dtype == tf.int32
    )
    spec = data.training_batches(images, 4, feature_dtype="bfloat16").element_spec
    assert (spec[0].dtype, spec[1].dtype) == (tf.bfloat16, tf.int32)
    eval_spec = data.eval_batches(images, 8, 4, feature_dtype="bfloat16").element_spec
    assert (eval_spec[0].dtype, eval_spec[2].dtype) == (tf.bfloat16, tf.float32)


def test_options_knobs_are_applied():
    dataset = data.training_batches(
        data.arrays(np.zeros((8, 2)), np.zeros(8)), 4, private_threadpool_size=3
    )
    opts = dataset.options()
    assert opts.threading.private_threadpool_size == 3
    assert (
        opts.deterministic is True
    )  # a seed repeats the batches unless the caller trades that away
    assert (
        data.training_batches(data.arrays(np.zeros((8, 2)), np.zeros(8)), 4, deterministic=False)
        .options()
        .deterministic
        is False
    )
    assert (
        data.eval_batches(data.arrays(np.zeros((8, 2)), np.zeros(8)), 8, 4).options().deterministic
        is True
    )


def test_cache_is_skipped_and_logged_when_it_would_not_fit(monkeypatch, caplog):
    monkeypatch.setattr(pipeline, "available_memory_bytes", lambda: 1000)
    examples = data.arrays(np.zeros((100, 10), np.float32), np.zeros(100, np.int32))  # 4,400 bytes
    with caplog.at_level(logging.INFO, logger="tpukit"):
        assert pipeline.maybe_cache(examples) is examples
        assert "not caching" in caplog.text and "would not fit" in caplog.text
    monkeypatch.setattr(pipeline, "available_memory_bytes", lambda: 10**9)
    assert pipeline.maybe_cache(examples) is not examples
    assert pipeline.maybe_cache(examples, enabled=False) is examples


def test_batch_that_does_not_divide_names_both_numbers():
    ctx = _contexts(1, 8)[0]
    with pytest.raises(ValueError, match="global batch size 12 does not divide by the 8 replicas"):
        data.training_batches(data.arrays(np.zeros((8, 2)), np.zeros(8)), 12, ctx)


def test_eval_weights_are_shaped_like_sequence_labels():
    # A language model's labels are [T] per example; its per-token loss needs [B, T] weights, padding all zero.
    tokens = tf.data.Dataset.from_tensor_slices(
        (tf.zeros((5, 3), tf.int32), tf.ones((5, 3), tf.int32))
    )
    batches = list(data.eval_batches(tokens, num_examples=5, global_batch_size=4))
    assert [tuple(w.shape) for _, _, w in batches] == [(4, 3), (4, 3)]
    assert batches[1][2].numpy().tolist() == [[1.0] * 3] + [[0.0] * 3] * 3


@pytest.mark.parametrize(
    "steps_per_epoch", [3, 4]
)  # 3 x 8 of 30 examples: one pass; 4 x 8: needs a repeat
def test_an_epoch_one_pass_covers_gives_the_same_batches_without_the_repeat(steps_per_epoch):
    """Known cardinality lets an epoch that one pass covers skip `repeat` (no read-ahead into a second pass); the
    batches must be those of the unknown-cardinality path, which always repeats."""
    examples = tf.data.Dataset.from_tensor_slices(np.arange(30, dtype=np.int64))
    unknown = examples.filter(lambda _: True)
    assert int(examples.cardinality()) == 30 and int(unknown.cardinality()) < 0

    def batches(source):
        dataset = pipeline.training_batches(
            source, 8, shuffle_buffer=16, seed=3, cache=False, steps_per_epoch=steps_per_epoch
        )
        return [b.numpy().tolist() for b in dataset.take(3 * steps_per_epoch)]

    known_batches = batches(examples)
    assert known_batches == batches(unknown)
    # Fresh shuffles per epoch, and no example twice within an epoch that one pass covers.
    epochs = [
        known_batches[i : i + steps_per_epoch]
        for i in range(0, len(known_batches), steps_per_epoch)
    ]
    assert epochs[0] != epochs[1]
    if steps_per_epoch == 3:
        assert all(len({x for b in e for x in b}) == 24 for e in epochs)


def test_pipelines_over_examples_cached_in_memory_run_without_the_autotuning_model():
    """Its optimization pass held `fit`'s return (the training iterator's teardown) for up to 4.7 s; over cached
    examples there is little to tune. Pipelines that read their source every epoch, or augment after their own
    cache (cache=False here), keep it."""
    examples = tf.data.Dataset.from_tensor_slices(
        (np.zeros((64, 2), np.float32), np.zeros(64, np.int32))
    )
    cached = pipeline.training_batches(examples, 8, steps_per_epoch=4)
    read = pipeline.training_batches(examples, 8, steps_per_epoch=4, cache=False)
    assert cached.options().autotune.enabled is False
    assert read.options().autotune.enabled is True
    evaluation = pipeline.eval_batches(examples, 64, 8, cache=True)
    assert evaluation.options().autotune.enabled is False
    assert pipeline.eval_batches(examples, 64, 8).options().autotune.enabled is True
    assert len(list(cached.take(8))) == 8  # and it still yields
    # An epoch (32 examples) plus the shuffle buffer (1) never reaches the end of the 64: the cache never fills, the
    # source is read every epoch, and the autotuning model stays.
    unfilled = pipeline.training_batches(examples, 8, steps_per_epoch=4, shuffle_buffer=1)
    assert unfilled.options().autotune.enabled is True


def test_epochs_that_stop_short_of_a_pass_cache_nothing_and_tensorflow_stays_silent(caplog, capfd):
    """A cache fills only at the end of a pass: an epoch that stops short would fill it partly and have TensorFlow
    discard it with a C++ warning ("did not fully read the dataset being cached") every time an iterator ends."""
    examples = tf.data.Dataset.from_tensor_slices(
        (np.zeros((640, 2), np.float32), np.zeros(640, np.int32))
    )
    with caplog.at_level(logging.INFO, logger="tpukit"):
        short = pipeline.training_batches(examples, 8, steps_per_epoch=4, shuffle_buffer=16)
        for _ in range(2):  # two iterators, each ended after part of a pass
            iterator = iter(short)
            next(iterator)
            del iterator
    assert "not caching training examples: an epoch reads 32 of this pipeline's 640" in caplog.text
    assert "did not fully read the dataset being cached" not in capfd.readouterr().err
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tpukit"):
        pipeline.training_batches(examples, 8, steps_per_epoch=80, shuffle_buffer=16)
    assert "caching training examples in memory" in caplog.text
