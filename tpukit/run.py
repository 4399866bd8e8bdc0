"""`run(recipe, output_dir)`: the one place that wires strategy -> data -> model -> fit -> outputs.

Outputs in `output_dir`: `recipe.yaml` (resolved), `checkpoints/`, `logs/` (TensorBoard), `model.keras`,
`metrics.json`. Re-running with the same output directory resumes from the newest checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import time

from tpukit import compat
from tpukit.recipe import Recipe, RecipeError, save_recipe

logger = logging.getLogger("tpukit")


def count_examples(recipe: Recipe, split: str) -> int:
    """Examples in a split of the recipe's source (its fast counter, else its cardinality, else one pass)."""
    import tensorflow as tf

    from tpukit.data import EXAMPLE_COUNTS, SOURCES

    counter = EXAMPLE_COUNTS.get(recipe.data.source)  # fast path: metadata or raw records, nothing decoded
    count = counter(split=split, **recipe.data.options) if counter else None
    if count is not None:
        return count
    dataset = SOURCES[recipe.data.source](split=split, input_context=None, **recipe.data.options)
    count = int(dataset.cardinality())
    if count < 0:  # unknown or infinite: count once
        count = int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    return count


def _input_fns(recipe: Recipe, eval_examples: int):
    import keras

    from tpukit import data

    source = data.SOURCES[recipe.data.source]
    config = recipe.data
    # Float features travel in the compute dtype (bfloat16 under mixed_bfloat16: half the infeed bytes).
    feature_dtype = keras.mixed_precision.global_policy().compute_dtype if config.cast_to_compute_dtype else None
    pipeline_knobs = dict(
        feature_dtype=feature_dtype,
        prefetch_batches=config.prefetch_batches,
        private_threadpool_size=config.private_threadpool_size,
    )

    def examples_and_cache(split, input_context, training):
        # Sources that augment at random cache before augmenting, so they take `cache` themselves.
        reserved = data.run_args(source, training=training, cache=config.cache)
        examples = source(split=split, input_context=input_context, **reserved, **config.options)
        return examples, config.cache and "cache" not in reserved

    def train_fn(input_context):
        examples, cache = examples_and_cache(config.train_split, input_context, training=True)
        return data.training_batches(
            examples,
            config.global_batch_size,
            input_context,
            shuffle_buffer=config.shuffle_buffer,
            seed=recipe.train.seed,
            cache=cache,
            deterministic=config.deterministic,
            **pipeline_knobs,
        )

    def eval_fn(input_context):
        examples, cache = examples_and_cache(config.eval_split, input_context, training=False)
        return data.eval_batches(
            examples, eval_examples, eval_batch_size(recipe), input_context, cache=cache, **pipeline_knobs
        )

    return train_fn, eval_fn


def eval_batch_size(recipe: Recipe) -> int:
    return recipe.data.eval_global_batch_size or recipe.data.global_batch_size


def check_batch_sizes(recipe: Recipe, replicas: int, train_examples: int) -> int:
    """Validates the global batch sizes against the replica count and dataset; returns steps per epoch."""
    for key, value in (("global_batch_size", recipe.data.global_batch_size), ("eval_global_batch_size", eval_batch_size(recipe))):
        if value % replicas:
            lower = max(replicas, value // replicas * replicas)
            raise RecipeError(
                f"{recipe.path}: data.{key}={value} does not divide by the {replicas} replicas of this strategy. "
                f"Fix: use a multiple of {replicas}, e.g. --set data.{key}={lower}."
            )
    if recipe.train.steps_per_epoch:
        return recipe.train.steps_per_epoch
    steps = train_examples // recipe.data.global_batch_size
    if steps < 1:
        raise RecipeError(
            f"{recipe.path}: data.global_batch_size={recipe.data.global_batch_size} is larger than the "
            f"{train_examples} examples of split {recipe.data.train_split!r}, so an epoch has no full batch. "
            f"Fix: use a global batch of at most {train_examples}, or set train.steps_per_epoch."
        )
    return steps


def _build_and_compile(recipe: Recipe, strategy, total_steps: int, jit_compile: bool):
    import keras

    from tpukit.models import MODELS
    from tpukit.optim import build_optimizer

    with strategy.scope():
        model = MODELS[recipe.model.name](**recipe.model.kwargs)
        optimizer = build_optimizer(recipe.train, total_steps)
        model.compile(
            optimizer=optimizer,
            # Mean over the real examples: eval batches carry zero-weight padding (see data.eval_batches).
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight"),
            weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            jit_compile=jit_compile,
            steps_per_execution=recipe.runtime.steps_per_execution,
        )
    return model


def run(recipe: Recipe, output_dir: str, strategy=None) -> dict:
    """Trains (resuming if `output_dir` has checkpoints), evaluates, exports; returns the metrics written.

    Args:
        recipe: a validated `Recipe` (see `tpukit.load_recipe`).
        output_dir: where checkpoints, logs, the model and `metrics.json` go.
        strategy: a `tf.distribute.Strategy` to use instead of `tpukit.connect(recipe.runtime.tpu)`.

    Raises:
        RecipeError: the recipe does not fit this hardware (batch sizes) or the data; nothing is written then.
    """
    compat.check_tensorflow()
    import keras

    from tpukit import callbacks, checkpoint, data, performance
    from tpukit.strategy import connect, kind_of

    if strategy is None:
        strategy = connect(recipe.runtime.tpu)
    kind, replicas = kind_of(strategy), strategy.num_replicas_in_sync
    train_examples = count_examples(recipe, recipe.data.train_split)
    steps_per_epoch = check_batch_sizes(recipe, replicas, train_examples)
    eval_examples = count_examples(recipe, recipe.data.eval_split) if recipe.data.eval_split else 0
    if recipe.runtime.steps_per_execution > 1 and kind in ("mirrored", "multi_worker") and replicas > 1:
        raise RecipeError(
            f"{recipe.path}: runtime.steps_per_execution={recipe.runtime.steps_per_execution} fails in Keras 3 with "
            f"a {kind} strategy over {replicas} replicas. Fix: --set runtime.steps_per_execution=1."
        )
    try:
        jit = performance.choose_jit_compile(recipe.runtime.jit_compile, kind, replicas)
    except ValueError as error:
        raise RecipeError(f"{recipe.path}: {error}") from None
    precision = performance.choose_precision(recipe.runtime.precision, kind, jit.value)
    per_replica = recipe.data.global_batch_size // replicas
    logger.info(
        "tpukit: global batch %d = %d replica(s) x %d per replica; %d steps per epoch over %d examples",
        recipe.data.global_batch_size, replicas, per_replica, steps_per_epoch, train_examples,
    )
    logger.info("tpukit: precision %s (%s); jit_compile=%s (%s)", precision.value, precision.reason, jit.value, jit.reason)

    # Validation is over: from here on the output directory is written.
    os.makedirs(output_dir, exist_ok=True)
    save_recipe(recipe, os.path.join(output_dir, "recipe.yaml"))
    keras.utils.set_random_seed(recipe.train.seed)
    keras.mixed_precision.set_global_policy(precision.value)
    total_steps = steps_per_epoch * recipe.train.epochs
    model = _build_and_compile(recipe, strategy, total_steps, jit.value)
    checkpointer = checkpoint.Checkpointer(
        os.path.join(output_dir, "checkpoints"), model, model.optimizer, recipe.runtime.max_checkpoints_to_keep
    )
    with strategy.scope():
        start_step = checkpointer.restore_latest()
    initial_epoch = min(start_step // steps_per_epoch, recipe.train.epochs)

    train_fn, eval_fn = _input_fns(recipe, eval_examples)
    throughput = callbacks.Throughput(recipe.data.global_batch_size)
    fit_callbacks = [
        throughput,
        callbacks.CheckpointEveryEpoch(checkpointer),
        keras.callbacks.TensorBoard(os.path.join(output_dir, "logs")),
    ]
    history = {}
    if initial_epoch < recipe.train.epochs:
        started = time.time()
        result = model.fit(
            data.distribute(strategy, train_fn),
            epochs=recipe.train.epochs,
            initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch,
            callbacks=fit_callbacks,
            shuffle=False,  # the pipeline shuffles; Keras cannot shuffle a dataset
            verbose=recipe.runtime.verbose,
        )
        history = {k: [float(v) for v in values] for k, values in result.history.items()}
        logger.info("tpukit: trained epochs %d..%d in %.1fs", initial_epoch + 1, recipe.train.epochs, time.time() - started)
    else:
        logger.info("tpukit: all %d epochs are done already (step %d); evaluating only", recipe.train.epochs, start_step)

    evaluation = {}
    if recipe.data.eval_split:
        # Every input pipeline yields the same number of full, padded batches, so running to the end of the
        # data is exact and never leaves a replica waiting.
        evaluation = model.evaluate(data.distribute(strategy, eval_fn), return_dict=True, verbose=recipe.runtime.verbose)
        evaluation = {k: float(v) for k, v in evaluation.items()}

    model.save(os.path.join(output_dir, "model.keras"))
    metrics = {
        "recipe": recipe.path,
        "strategy": type(strategy).__name__,
        "replicas": replicas,
        "precision": precision.value,
        "jit_compile": jit.value,
        "global_batch_size": recipe.data.global_batch_size,
        "steps_per_epoch": steps_per_epoch,
        "step": checkpointer.step,
        "resumed_from_step": start_step,
        "train": {k: v[-1] for k, v in history.items()},
        "eval": evaluation,
        "eval_examples": eval_examples,
        "examples_per_second": throughput.examples_per_second,
        "steps_per_second": throughput.steps_per_second,
        "time_to_first_step_seconds": throughput.time_to_first_step,
    }
    with open(os.path.join(output_dir, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    return metrics

