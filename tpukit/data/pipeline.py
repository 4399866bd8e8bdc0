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

import logging
import math
import os

import numpy as np
import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE
logger = logging.getLogger("tpukit")

# Caching may use at most this fraction of the memory available when the pipeline is built.
CACHE_MEMORY_FRACTION = 0.5


def per_replica_batch_size(
    global_batch_size: int, input_context: tf.distribute.InputContext | None
) -> int:
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


def shard(
    dataset: tf.data.Dataset, input_context: tf.distribute.InputContext | None
) -> tf.data.Dataset:
    """Keeps this input pipeline's share of the examples (one pipeline per host on TPU pods and multi-worker)."""
    if input_context is None or input_context.num_input_pipelines == 1:
        return dataset
    return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


def available_memory_bytes() -> int | None:
    """Memory the OS can still give this process (Linux), else physical memory, else None when unknown."""
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            return os.sysconf(name) * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            continue
    return None


def example_bytes(element_spec) -> int | None:
    """Bytes of one example from its (fully static, non-string) element_spec, else None."""
    total = 0
    for spec in tf.nest.flatten(element_spec):
        if spec.dtype == tf.string or not spec.shape.is_fully_defined():
            return None
        total += int(np.prod(spec.shape.as_list(), dtype=np.int64)) * spec.dtype.size
    return total


def maybe_cache(
    dataset: tf.data.Dataset,
    enabled: bool = True,
    *,
    total_bytes: int | None = None,
    name: str = "examples",
) -> tf.data.Dataset:
    """`dataset.cache()` in memory if it fits in `CACHE_MEMORY_FRACTION` of the available memory, else unchanged.

    The size is `total_bytes` if given (e.g. the size of the files read), else cardinality x bytes per example
    from the element_spec. When the size cannot be known the dataset is cached (as asked) and that is logged.
    """
    if not enabled:
        return dataset
    if total_bytes is None:
        per_example, count = example_bytes(dataset.element_spec), int(dataset.cardinality())
        if per_example is not None and count >= 0:
            total_bytes = per_example * count
    budget = available_memory_bytes()
    if total_bytes is None or budget is None:
        logger.info("tpukit: caching %s in memory (size unknown in advance)", name)
        return dataset.cache()
    if total_bytes > CACHE_MEMORY_FRACTION * budget:
        logger.warning(
            "tpukit: not caching %s: %.1f GB would not fit in %.0f%% of the %.1f GB of available memory; "
            "the data is read again every epoch (set data.cache: false to silence this)",
            name,
            total_bytes / 1e9,
            CACHE_MEMORY_FRACTION * 100,
            budget / 1e9,
        )
        return dataset
    logger.info("tpukit: caching %s in memory (%.1f MB)", name, total_bytes / 1e6)
    return dataset.cache()


def cast_floats(dataset: tf.data.Dataset, dtype: str | tf.DType | None) -> tf.data.Dataset:
    """Casts floating-point features (not labels) to `dtype` on the host: bfloat16 halves the TPU infeed.

    Integer features (token ids) and labels are left alone; `dtype=None` or float32 features already in
    `dtype` return the dataset unchanged.
    """
    if dtype is None:
        return dataset
    dtype = tf.as_dtype(dtype)
    features_spec = dataset.element_spec[0]
    if not any(s.dtype.is_floating and s.dtype != dtype for s in tf.nest.flatten(features_spec)):
        return dataset

    def cast(features, *rest):
        features = tf.nest.map_structure(
            lambda t: tf.cast(t, dtype) if t.dtype.is_floating else t, features
        )
        return (features, *rest)

    return dataset.map(cast, num_parallel_calls=AUTOTUNE)


def options(
    deterministic: bool, private_threadpool_size: int = 0, autotune: bool = True
) -> tf.data.Options:
    """tf.data options for tpukit pipelines: autotuned, parallel maps, no automatic sharding.

    Args:
        deterministic: keep element order (the default everywhere); False lets parallel stages hand out whichever
            element is ready first, for input-bound training that does not need to repeat.
        private_threadpool_size: >0 gives this pipeline its own threads (isolates it from the train step's
            host threads); 0 uses TensorFlow's shared pool.
        autotune: tf.data's autotuning model (`autotune.enabled`). Off for examples cached in memory
            (`IN_MEMORY_AUTOTUNE`): then each AUTOTUNE stage runs min(16, the thread pool's size) wide (TF's
            default parallelism without the model), which also holds for a source's decoding before the cache
            fills (the first epoch), and `prefetch(AUTOTUNE)` keeps its own buffer autotuner.
    """
    result = tf.data.Options()
    result.deterministic = deterministic
    result.autotune.enabled = autotune
    result.experimental_optimization.map_parallelization = True
    if private_threadpool_size:
        result.threading.private_threadpool_size = private_threadpool_size
    # Sharding is done explicitly above (per file or per example); do not let tf.distribute shard again.
    result.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return result


# Whether pipelines over examples cached in memory run tf.data's autotuning model. When an iterator is destroyed
# (Keras drops its training iterator as `fit` returns) it waits for the model's optimization pass to finish; on a
# 2-core CPU that held `fit`'s return for 0.5 s (MLP row) and 4.4-4.7 s (transformer row) in 2 of 3 runs
# (benchmarks/vs_keras.py, plain Keras alike). Over cached examples there is little left to tune (shuffle, batch,
# prefetch): with the model off the stall was gone in 6 of 6 runs, and the steady state was unchanged or faster
# (MLP 187-204k vs 173-195k examples/s, transformer 226-233 vs 204-219; 2 runs each).
IN_MEMORY_AUTOTUNE = False


def _prefetch(prefetch_batches: int | None) -> int:
    return AUTOTUNE if prefetch_batches is None else prefetch_batches


def training_batches(
    examples: tf.data.Dataset,
    global_batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
    *,
    shuffle_buffer: int = 10_000,
    seed: int | None = 0,
    cache: bool = True,
    deterministic: bool = True,
    repeat: bool = True,
    feature_dtype: str | tf.DType | None = None,
    prefetch_batches: int | None = None,
    private_threadpool_size: int = 0,
    skip_steps: int = 0,
    steps_per_epoch: int | None = None,
) -> tf.data.Dataset:
    """Shuffled, repeated, per-replica batches with `drop_remainder=True`, so every dimension is static.

    Args:
        examples: this pipeline's shard (see `shard`) of unbatched `(features, label)` or `(features, label,
            sample_weight)` (passed on to Keras as they are).
        global_batch_size: summed over all replicas; each batch here is the per-replica share.
        input_context: from `distribute_datasets_from_function`; None for one device.
        shuffle_buffer: examples in the shuffle buffer (1: no shuffle).
        seed: shuffle seed (None: different every run).
        cache: cache `examples` in memory if they fit (see `maybe_cache`). Sources with random augmentation
            cache before it themselves; pass False for those.
        deterministic: keep the order, so a seed repeats the batches exactly (False: parallel stages may reorder
            batches, and with them which examples an epoch of `steps_per_epoch` batches takes).
        repeat: repeat forever (Keras `fit` with `steps_per_epoch`).
        feature_dtype: cast floating features to this dtype on the host (the compute dtype, e.g. bfloat16).
        prefetch_batches: batches to prefetch (None: AUTOTUNE).
        private_threadpool_size: see `options`.
        skip_steps: global steps already trained (a resumed run): the data starts where an uninterrupted run
            would be after that many steps (with `deterministic=True`, exactly the same batches).
        steps_per_epoch: global steps per epoch. When given (tpukit's trainer), every epoch is a fresh shuffle whose
            seed folds in the epoch number, so epoch `e` has the same order whether or not the run was restarted,
            and a resume at step `s` reads only the `s % steps_per_epoch` batches already trained in its epoch.
            Without it, one shuffle is repeated (and `skip_steps` batches are read and dropped).
    """
    batch = per_replica_batch_size(global_batch_size, input_context)
    per_step = _replicas_per_pipeline(
        input_context
    )  # per-replica batches this pipeline gives each global step
    if cache and steps_per_epoch and repeat:
        cache = _epoch_fills_cache(examples, steps_per_epoch * per_step * batch, shuffle_buffer)
    cached = maybe_cache(examples, cache, name="training examples")
    in_memory, examples = cached is not examples, cached
    if steps_per_epoch and repeat:
        batches = _epochs(
            examples,
            batch,
            steps_per_epoch * per_step,
            shuffle_buffer,
            seed,
            skip_steps // steps_per_epoch,
        )
        skip_steps %= steps_per_epoch
    else:
        if shuffle_buffer > 1:
            examples = examples.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
        if repeat:
            examples = examples.repeat()
        batches = examples.batch(batch, drop_remainder=True, num_parallel_calls=AUTOTUNE)
    if skip_steps:
        batches = batches.skip(skip_steps * per_step)
    batches = cast_floats(batches, feature_dtype)
    return batches.prefetch(_prefetch(prefetch_batches)).with_options(
        options(
            deterministic, private_threadpool_size, autotune=IN_MEMORY_AUTOTUNE or not in_memory
        )
    )


def _epoch_fills_cache(examples: tf.data.Dataset, epoch_examples: int, shuffle_buffer: int) -> bool:
    """Whether a cache of `examples` would fill when each epoch reads `epoch_examples` of them.

    A cache fills only when a pass reaches its end: where an epoch plus the shuffle buffer's read-ahead stops
    short, every epoch reads the source again and the cache is discarded unfilled (TensorFlow then warns "The
    calling iterator did not fully read the dataset being cached"), so nothing is cached.
    """
    count = int(examples.cardinality())
    if count >= 0 and epoch_examples + shuffle_buffer <= count:
        logger.info(
            "tpukit: not caching training examples: an epoch reads %d of this pipeline's %d, and a cache "
            "fills only when a pass reaches its end",
            epoch_examples,
            count,
        )
        return False
    return True


def _epochs(
    examples: tf.data.Dataset,
    batch: int,
    batches_per_epoch: int,
    shuffle_buffer: int,
    seed: int | None,
    first_epoch: int,
) -> tf.data.Dataset:
    """Epochs `first_epoch, first_epoch + 1, ...` of `batches_per_epoch` batches each, epoch `e` shuffled with a seed
    that depends only on (`seed`, `e`): the same order with or without restarts, and no epoch read to reach another.
    Each epoch starts a fresh pass (an epoch longer than the data repeats it), so a remainder is dropped per epoch.

    An epoch that one pass covers (the examples' count known, as for arrays and in-memory caches) does not repeat:
    the batches are the same, but the batch stage's read-ahead past the epoch's last batch would otherwise start a
    second pass and fill its shuffle buffer, copies that are thrown away (with `shuffle_buffer` 8192 and a 30-step
    epoch of 1024, ~27% more copying on the host, which shares the cores with the train step on a CPU)."""
    count = int(examples.cardinality())
    one_pass = count >= 0 and batches_per_epoch * batch <= count

    def epoch(number):
        ordered = examples
        if shuffle_buffer > 1 and seed is not None:
            # The order depends on (seed, epoch) only. With a global seed set (keras.utils.set_random_seed) TF
            # combines it with the op seed and, for a global seed of 0, tests the tensor seed in Python ("Using a
            # symbolic tf.Tensor as a Python bool"); this function's own graph gets no global seed instead.
            tf.compat.v1.get_default_graph().seed = None
            ordered = ordered.shuffle(
                shuffle_buffer,
                seed=tf.constant(seed, tf.int64) * 1_000_003 + number,
                reshuffle_each_iteration=True,
            )
        elif shuffle_buffer > 1:
            ordered = ordered.shuffle(shuffle_buffer, seed=None, reshuffle_each_iteration=True)
        return (
            (ordered if one_pass else ordered.repeat())
            .batch(batch, drop_remainder=True, num_parallel_calls=AUTOTUNE)
            .take(batches_per_epoch)
        )

    return tf.data.Dataset.range(first_epoch, tf.int64.max).flat_map(epoch)


def _replicas_per_pipeline(input_context: tf.distribute.InputContext | None) -> int:
    if input_context is None:
        return 1
    return input_context.num_replicas_in_sync // input_context.num_input_pipelines


def eval_steps(num_examples: int, global_batch_size: int, num_input_pipelines: int = 1) -> int:
    """Global steps in which `eval_batches` covers `num_examples` once (each pipeline padded to the largest shard).

    Pass it to `evaluate(steps=...)`: without `steps`, Keras sizes a distributed dataset by its per-replica batch
    count and reports wrong metrics (measured with Keras 3.15).
    """
    per_pipeline_batch = global_batch_size // num_input_pipelines
    return math.ceil(math.ceil(num_examples / num_input_pipelines) / per_pipeline_batch)


def padded_eval_steps(
    num_examples: int, global_batch_size: int, num_input_pipelines: int, steps_per_execution: int
) -> int:
    """`eval_steps` rounded up to whole executions of `steps_per_execution` steps (the extra batches weigh zero)."""
    steps = eval_steps(num_examples, global_batch_size, num_input_pipelines)
    return -(-steps // steps_per_execution) * steps_per_execution


# Eval passes of at most this many batches per pipeline, from examples cached in memory, are not prefetched.
SHORT_EVAL_BATCHES = 32


def eval_batches(
    examples: tf.data.Dataset,
    num_examples: int,
    global_batch_size: int,
    input_context: tf.distribute.InputContext | None = None,
    *,
    cache: bool = False,
    feature_dtype: str | tf.DType | None = None,
    prefetch_batches: int | None = None,
    private_threadpool_size: int = 0,
    repeat: bool = False,
    steps: int | None = None,
    weight_ranks=None,
) -> tf.data.Dataset:
    """Per-replica `(features, label, weight)` batches that see every example exactly once, with static shapes.

    `examples` are `(features, label)` or `(features, label, sample_weight)`: the weight of a real example is its
    sample weight (as Keras broadcasts it against the loss), of a padding example 0, so weighted metrics equal
    plain Keras `evaluate` over the whole split in one batch. Each pipeline appends zero-weight copies of a zero example after its shard and stops after the same number of
    batches as every other pipeline, so metrics weighted by `weight` are exact and no replica waits for data.
    `num_examples` is the size of the whole split (all pipelines together); no pipeline's shard may hold more
    than `ceil(num_examples / num_input_pipelines)` examples, which example-level sharding (`shard`) guarantees.
    Read it with `evaluate(steps=eval_steps(...))` (see `eval_steps`). Keras' loop ends an execution where a finite
    dataset ends, so one pass is exact at any `steps_per_execution` (tpukit's runner reads it that way).
    `repeat=True` repeats the passes, for loops that cannot end an execution early; then pass
    `steps=padded_eval_steps(...)`, which pads each pass with whole zero-weight batches to whole executions (`steps`:
    global steps per pass, at least `eval_steps(...)`). `weight_ranks`: per label (a structure like the labels),
    the label dimensions after the batch that the weights keep: the shape of that output's per-example loss (0 for
    one-hot, binary or regression labels, whose loss reduces the last axis). None: weights shaped like each label
    (integer class labels, whose loss has the label's shape). Other arguments are as in `training_batches`.
    """
    batch = per_replica_batch_size(global_batch_size, input_context)
    pipelines = input_context.num_input_pipelines if input_context else 1
    replicas_per_pipeline = _replicas_per_pipeline(input_context)
    needed = eval_steps(num_examples, batch * replicas_per_pipeline * pipelines, pipelines)
    if steps is not None and steps < needed:
        raise ValueError(
            f"steps={steps} is fewer than the {needed} eval steps that cover {num_examples} examples"
        )
    batches = (steps or needed) * replicas_per_pipeline
    cached = maybe_cache(examples, cache, name="evaluation examples")
    in_memory, examples = cached is not examples, cached
    padding = tf.data.Dataset.from_tensors(
        _zero_batch(examples.element_spec, batch, weight_ranks)
    ).repeat()
    real = examples.batch(batch).map(
        _weighted_and_padded(batch, weight_ranks), num_parallel_calls=AUTOTUNE
    )
    batched = cast_floats(real.concatenate(padding).take(batches), feature_dtype)
    if repeat:
        batched = batched.repeat()
    # A short pass over examples cached in memory gains little from read-ahead, and a prefetching iterator is slow
    # to tear down: Keras makes a new iterator for every validation pass and drops the old one between the pass
    # and the epoch's end, in the time that counts as training. Longer passes keep their read-ahead.
    if prefetch_batches is None and in_memory and not repeat and batches <= SHORT_EVAL_BATCHES:
        prefetch_batches = 0
    if prefetch_batches != 0:
        batched = batched.prefetch(_prefetch(prefetch_batches))
    return batched.with_options(
        options(True, private_threadpool_size, autotune=IN_MEMORY_AUTOTUNE or not in_memory)
    )


def _weights_of(label, rank=None):
    """Ones shaped like the per-example loss of `label`: its first `rank` dimensions after the batch kept (None:
    all of them)."""
    ones = tf.ones_like(label, tf.float32)
    if rank is None or rank >= label.shape.rank - 1:
        return ones
    return ones[(slice(None),) * (1 + rank) + (0,) * (label.shape.rank - 1 - rank)]


def _times(ones, given):
    """`ones` (the padding weight's shape) times the user's weight `given`, broadcast as Keras broadcasts a sample
    weight against a loss: trailing axes of 1 beyond the loss's rank squeezed, missing trailing axes added."""
    given = tf.cast(given, tf.float32)
    while given.shape.rank > ones.shape.rank and given.shape[-1] == 1:
        given = tf.squeeze(given, -1)
    if given.shape.rank > ones.shape.rank:
        raise ValueError(
            f"a sample weight of shape {given.shape[1:]} per example does not fit a loss of shape "
            f"{ones.shape[1:]} per example. Fix: give one weight per example, or per loss value."
        )
    given = tf.reshape(
        given, tf.concat([tf.shape(given), [1] * (ones.shape.rank - given.shape.rank)], 0)
    )
    return ones * given


def _weights(label, weight_ranks, given=None):
    """Per label, the eval weight: ones shaped like its loss (`weight_ranks`), times the user's sample weights
    `given` (None; one tensor for every label, as Keras applies it; or a structure like the labels)."""
    if weight_ranks is None:
        ones = tf.nest.map_structure(_weights_of, label)
    else:
        ones = tf.nest.map_structure(_weights_of, label, weight_ranks)
    if given is None:
        return ones
    if tf.nest.is_nested(label) and not tf.nest.is_nested(given):
        return tf.nest.map_structure(lambda o: _times(o, given), ones)
    return tf.nest.map_structure(_times, ones, given)


def _weighted_and_padded(batch: int, weight_ranks):
    """The map from a batch of `(features, label)` or `(features, label, sample_weight)` to `(features, label,
    weight)`, each padded to `batch` rows: the weight is 1 per real example (times its sample weight), 0 after.

    Weights are shaped like each output's loss, so per-token losses ([B, T] labels of a language model) are
    weighted too. Batched first and padded per batch: a map per example is much slower.
    """

    def weighted(features, label, given=None):
        weight = _weights(label, weight_ranks, given)
        short = batch - tf.shape(tf.nest.flatten(label)[0])[0]

        def pad(tensor):
            rank = tensor.shape.rank
            padded = tf.pad(tensor, [[0, short]] + [[0, 0]] * (rank - 1))
            return tf.ensure_shape(padded, [batch, *tensor.shape[1:]])

        return tf.nest.map_structure(pad, (features, label, weight))

    return weighted


def _zero_batch(element_spec, batch: int, weight_ranks):
    """One all-zero `(features, label, weight)` batch of `batch` rows: the padding after a pipeline's shard."""
    features_spec, label_spec = element_spec[:2]

    def symbolic(spec):
        return tf.zeros([1, *spec.shape], spec.dtype)

    # The weight's shape as `_weighted_and_padded` makes it (the user's weights broadcast into the loss's shape).
    weight = _weights(
        tf.nest.map_structure(symbolic, label_spec),
        weight_ranks,
        tf.nest.map_structure(symbolic, element_spec[2]) if len(element_spec) > 2 else None,
    )
    weight_spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], tf.float32), weight)
    return tf.nest.map_structure(
        lambda spec: tf.zeros([batch, *spec.shape], spec.dtype),
        (features_spec, label_spec, weight_spec),
    )


def mean_weights(examples: tf.data.Dataset, weight_ranks, batch: int = 8192):
    """Per label (a structure like the labels), the mean of `(features, label, sample_weight)` examples' weights
    per loss value (each weight broadcast over the loss's shape, as `eval_batches` weighs them): one pass."""
    sums = None
    for weights in examples.batch(batch).map(
        lambda _, label, given: _weights(label, weight_ranks, given)
    ):
        values = tf.nest.map_structure(
            lambda w: np.array([float(tf.reduce_sum(w)), float(tf.size(w))]), weights
        )
        sums = values if sums is None else tf.nest.map_structure(np.add, sums, values)
    if sums is None:
        return tf.nest.map_structure(lambda _: 1.0, examples.element_spec[1])
    return tf.nest.map_structure(lambda s: float(s[0] / s[1]) if s[1] else 1.0, sums)


def _class_ids(label, one_hot: bool | None):
    """The class id(s) of one example's `label`: argmax over the last axis when `one_hot`; ids rounded as Keras
    rounds them (a trailing axis of 1 squeezed) when not; as Keras reads them when None (argmax when the last axis
    is longer than 1, else rounded ids)."""
    if one_hot is None and label.shape.rank:
        if label.shape[-1] is None:
            return tf.cond(
                tf.shape(label)[-1] > 1,
                lambda: _class_ids(label, True),
                lambda: _class_ids(label, False),
            )
        one_hot = label.shape[-1] > 1
    if one_hot:
        return tf.argmax(label, axis=-1, output_type=tf.int64)
    ids = label if label.dtype.is_integer else tf.round(tf.cast(label, tf.float32))
    ids = tf.cast(ids, tf.int64)
    if ids.shape.rank and ids.shape[-1] == 1:
        ids = tf.squeeze(ids, -1)
    return ids


def _class_weight_of(ids, class_weight: dict[int, float]):
    """`class_weight[id]` for each of `ids` (1 for an id it does not name): a search of its sorted keys, so the
    lookup grows with the number of keys, not with the largest one."""
    keys = sorted(class_weight)
    known = tf.constant(keys, tf.int64)
    values = tf.constant([float(class_weight[k]) for k in keys], tf.float32)
    flat = tf.reshape(ids, [1, -1])
    at = tf.minimum(tf.searchsorted(known[None], flat, side="left")[0], len(keys) - 1)
    found = tf.gather(known, at) == flat[0]
    weight = tf.where(found, tf.gather(values, at), 1.0)
    return tf.reshape(weight, tf.shape(ids))


def with_class_weights(
    examples: tf.data.Dataset, class_weight: dict[int, float], one_hot: bool | None = False
) -> tf.data.Dataset:
    """`(features, label, weight)` examples whose weight is `class_weight[label]` (1 for a class it does not name)
    times the example's own sample weight, if it has one: Keras' `fit(class_weight=...)` as per-example weights.

    `label`: class ids (shape [] or [1], or one id per position, e.g. per token), rounded as Keras rounds them;
    `one_hot`: one-hot (or soft) labels over the last axis, whose argmax is the class; None: read as Keras reads
    them (`_class_ids`), for a loss tpukit does not know.
    """

    def weighted(features, label, given=None):
        weight = _class_weight_of(_class_ids(label, one_hot), class_weight)
        if (
            given is not None
        ):  # one weight per example or per position, against the class weights' shape
            given = tf.cast(given, tf.float32)
            while given.shape.rank > weight.shape.rank and given.shape[-1] == 1:
                given = tf.squeeze(given, -1)
            low, high = sorted((weight, given), key=lambda t: t.shape.rank)
            low = tf.reshape(
                low, tf.concat([tf.shape(low), [1] * (high.shape.rank - low.shape.rank)], 0)
            )
            weight = low * high
        return features, label, weight

    return examples.map(weighted, num_parallel_calls=AUTOTUNE)


def distribute(strategy: tf.distribute.Strategy, dataset_fn) -> tf.distribute.DistributedDataset:
    """`strategy.distribute_datasets_from_function(dataset_fn)`: one pipeline per host, per-replica batches."""
    return strategy.distribute_datasets_from_function(dataset_fn)
