"""The distributed input pipeline: global batch -> per-replica batches with static shapes, TPU rules built in.

Everything here is plain tf.data and works without the rest of tpukit:

    strategy = tpukit.connect()
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: training_batches(my_examples(ctx), global_batch_size=1024, input_context=ctx))

Per-replica sizes come from the `tf.distribute.InputContext`, training drops the remainder so every shape is
static (TPUs compile for one shape), and evaluation pads the last batch with zero-weight examples so that every
example is counted exactly once and shapes stay static.
"""

from __future__ import annotations

import math

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def per_replica_batch_size(global_batch_size: int, input_context: tf.distribute.InputContext | None) -> int:
    """The per-replica batch for a global batch, with both numbers in the error when they do not divide."""
    if input_context is None:
        return global_batch_size
    replicas = input_context.num_replicas_in_sync
    if global_batch_size % replicas:
        raise ValueError(
            f"global batch size {global_batch_size} does not divide by the {replicas} replicas in sync. "
            f"Fix: use a multiple of {replicas}, e.g. {max(replicas, global_batch_size // replicas * replicas)}."
        )
    return input_context.get_per_replica_batch_size(global_batch_size)


def shard(dataset: tf.data.Dataset, input_context: tf.distribute.InputContext | None) -> tf.data.Dataset:
    """Keeps this input pipeline's share of the examples (one pipeline per host on TPU pods and multi-worker)."""
    if input_context is None or input_context.num_input_pipelines == 1:
        return dataset
    return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


def _options(deterministic: bool) -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = deterministic
    options.autotune.enabled = True
    options.experimental_optimization.map_parallelization = True
    # Sharding is done explicitly above (per file or per example); do not let tf.distribute shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return options


def training_batches(
    examples: tf.data.Dataset,
    global_batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
    *,
    shuffle_buffer: int = 10_000,
    seed: int | None = 0,
    cache: bool = True,
    deterministic: bool = False,
    repeat: bool = True,
) -> tf.data.Dataset:
    """Shuffled, repeated, per-replica batches with `drop_remainder=True`, so every dimension is static.

    `examples` must already be this pipeline's shard (see `shard`) and unbatched.
    """
    batch = per_replica_batch_size(global_batch_size, input_context)
    if cache:
        examples = examples.cache()
    if shuffle_buffer > 1:
        examples = examples.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        examples = examples.repeat()
    return examples.batch(batch, drop_remainder=True, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE).with_options(
        _options(deterministic)
    )


def eval_batches(
    examples: tf.data.Dataset,
    num_examples: int,
    global_batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
    *,
    cache: bool = False,
) -> tf.data.Dataset:
    """Per-replica `(features, label, weight)` batches that see every example exactly once, with static shapes.

    Each pipeline appends zero-weight copies of a zero example after its shard and stops after the same number of
    batches as every other pipeline, so metrics weighted by `weight` are exact and no replica waits for data.
    `num_examples` is the size of the whole split (all pipelines together).
    """
    batch = per_replica_batch_size(global_batch_size, input_context)
    pipelines = input_context.num_input_pipelines if input_context else 1
    replicas_per_pipeline = (input_context.num_replicas_in_sync // pipelines) if input_context else 1
    per_pipeline_batch = batch * replicas_per_pipeline
    largest_shard = math.ceil(num_examples / pipelines)
    batches = math.ceil(largest_shard / per_pipeline_batch) * replicas_per_pipeline

    def with_weight(weight):
        return lambda features, label: (features, label, tf.constant(weight, tf.float32))

    if cache:
        examples = examples.cache()
    real = examples.map(with_weight(1.0), num_parallel_calls=AUTOTUNE)
    zeros = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), examples.element_spec)
    padding = tf.data.Dataset.from_tensors(zeros).map(with_weight(0.0)).repeat()
    padded = real.concatenate(padding).take(batches * batch)
    return padded.batch(batch, drop_remainder=True).prefetch(AUTOTUNE).with_options(_options(deterministic=True))


def distribute(strategy: tf.distribute.Strategy, dataset_fn) -> tf.distribute.DistributedDataset:
    """`strategy.distribute_datasets_from_function(dataset_fn)`: one pipeline per host, per-replica batches."""
    return strategy.distribute_datasets_from_function(dataset_fn)
