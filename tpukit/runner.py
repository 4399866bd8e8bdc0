"""`run(recipe, output_dir)`: the one place that wires strategy -> data -> model -> fit -> outputs.

Outputs in `output_dir`: `recipe.yaml` (resolved), `checkpoints/`, `logs/` (TensorBoard), `model.keras`,
`metrics.json`. Re-running with the same output directory resumes from the newest checkpoint.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import sys
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


def _input_fns(recipe: Recipe, eval_examples: int, steps_per_epoch: int):
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

    def train_fn(input_context, skip_steps=0):
        """Training batches positioned after `skip_steps` steps of data, each epoch in its own seeded order."""
        examples, cache = examples_and_cache(config.train_split, input_context, training=True)
        return data.training_batches(
            examples,
            config.global_batch_size,
            input_context,
            shuffle_buffer=config.shuffle_buffer,
            seed=recipe.train.seed,
            cache=cache,
            deterministic=config.deterministic,
            skip_steps=skip_steps,
            steps_per_epoch=steps_per_epoch,
            **pipeline_knobs,
        )

    def eval_fn(input_context, steps):
        examples, cache = examples_and_cache(config.eval_split, input_context, training=False)
        return data.eval_batches(
            examples, eval_examples, eval_batch_size(recipe), input_context, cache=cache, repeat=True, steps=steps,
            **pipeline_knobs,
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


def _build_and_compile(recipe: Recipe, strategy, total_steps: int, jit_compile: bool, steps_per_execution: int):
    import keras

    from tpukit.losses import build_loss
    from tpukit.models import MODELS
    from tpukit.optim import build_optimizer

    with strategy.scope():
        model = MODELS[recipe.model.name](**recipe.model.kwargs)
        optimizer = build_optimizer(recipe.train, total_steps, global_batch_size=recipe.data.global_batch_size)
        model.compile(
            optimizer=optimizer,
            # Mean over the real examples only: eval batches carry zero-weight padding (see data.eval_batches).
            loss=build_loss(recipe.train),
            # Weighted means over the real examples, exact on any number of replicas. Keras' own `loss` weights each
            # replica's batch by its size, so padded eval batches pull it down slightly on multi-replica runs.
            weighted_metrics=[
                keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
                keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="cross_entropy"),
            ],
            jit_compile=jit_compile,
            steps_per_execution=steps_per_execution,
        )
    return model


def _probe_steps_per_execution(recipe: Recipe, strategy, make_dataset, steps_per_epoch: int, jit: bool, start_step: int) -> int:
    """Times a few steps of a throwaway copy of the model (one step per call) and returns `loop.auto_...`'s pick.

    The pick also divides the steps left in an interrupted epoch, so a resumed run keeps whole executions.
    """
    import keras

    from tpukit import loop

    class Timer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times = []

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    probe_steps = min(steps_per_epoch, 8)
    model = _build_and_compile(recipe, strategy, steps_per_epoch, jit, steps_per_execution=1)
    timer = Timer()
    model.fit(make_dataset(0), epochs=1, steps_per_epoch=probe_steps, verbose=0, callbacks=[timer], shuffle=False)
    gaps = sorted(b - a for a, b in itertools.pairwise(timer.times))  # the first call (compilation) is left out
    seconds = gaps[len(gaps) // 2] if gaps else max(timer.times[-1] - timer.times[0], 1e-6)
    left = steps_per_epoch - start_step % steps_per_epoch
    chosen = loop.auto_steps_per_execution(
        max(seconds, 1e-6), math.gcd(steps_per_epoch, left), recipe.runtime.steps_per_execution_target_seconds
    )
    logger.info(
        "tpukit: steps_per_execution auto -> %d (one step took %.2f ms; target %.2f s per call; %d steps per epoch)",
        chosen, seconds * 1e3, recipe.runtime.steps_per_execution_target_seconds, steps_per_epoch,
    )
    return chosen


def _verbose(setting) -> int:
    """Keras' progress bar redraws with \\r and colour codes even into a pipe; logs get one line per epoch."""
    if setting == "auto":
        return 1 if sys.stdout.isatty() or "ipykernel" in sys.modules else 2
    return setting


def _callbacks(recipe: Recipe, output_dir: str, throughput, steps_per_execution: int, remote_io: bool, state):
    import keras

    from tpukit import callbacks

    result = [throughput]
    if remote_io:
        # Summary writers are eager ops on the remote TPU host, which cannot reach this machine's disk.
        logger.warning(
            "tpukit: remote TPU with a local output dir: TensorBoard logs are off (checkpoints and exports are "
            "routed through /job:localhost). Fix: use a gs:// --output_dir to get TensorBoard logs."
        )
    else:
        log_dir = os.path.join(output_dir, "logs")
        profile = 0
        if recipe.runtime.profile_steps:
            # Keras' TensorBoard counts host calls (each runs steps_per_execution optimizer steps).
            first, last = recipe.runtime.profile_steps
            profile = (math.ceil(first / steps_per_execution), math.ceil(last / steps_per_execution))
        result.append(callbacks.TrainingScalars(log_dir, throughput))
        result.append(keras.callbacks.TensorBoard(log_dir, profile_batch=profile))
    if recipe.train.early_stopping_patience is not None:
        result.append(
            callbacks.ResumableEarlyStopping(
                state, monitor=recipe.train.early_stopping_metric, patience=recipe.train.early_stopping_patience,
                verbose=1,
            )
        )
    if recipe.train.export_best_by:
        result.append(
            callbacks.ResumableModelCheckpoint(
                state, os.path.join(output_dir, "best.keras"), monitor=recipe.train.export_best_by
            )
        )
    return result


MODES = ("train_and_eval", "train", "eval")


def run(
    recipe: Recipe,
    output_dir: str,
    strategy=None,
    mode: str = "train_and_eval",
    checkpoint: str | None = None,
    callbacks: list | None = None,
) -> dict:
    """Trains (resuming if `output_dir` has checkpoints), evaluates and exports; returns the metrics written.

    Args:
        recipe: a validated `Recipe` (see `tpukit.load_recipe`).
        output_dir: where checkpoints, logs, the model and `metrics.json` go.
        strategy: a `tf.distribute.Strategy` to use instead of `tpukit.connect(recipe.runtime.tpu)`.
        mode: "train_and_eval" (validate every `train.eval_every_epochs`, evaluate at the end), "train"
            (no evaluation), or "eval" (evaluate `checkpoint`, default the newest in `output_dir`, and nothing else).
        checkpoint: for mode "eval": a checkpoint path (default: the newest one in `output_dir/checkpoints`).
        callbacks: extra Keras callbacks for `fit`.

    Raises:
        RecipeError: the recipe does not fit this hardware (batch sizes) or the data; nothing is written then.
        tpukit.trainer.TrainingDivergedError: the loss stayed non-finite after `train.max_nan_retries` rollbacks.
    """
    if mode not in MODES:
        raise RecipeError(f"mode must be one of {', '.join(MODES)}; received {mode!r}. Fix: pick one of those.")
    compat.check_tensorflow()
    import keras
    import tensorflow as tf

    from tpukit import callbacks as callbacks_lib
    from tpukit import checkpoint as checkpoint_lib
    from tpukit import data, flops, loop, performance, trainer
    from tpukit.export import export_model, io_device_for
    from tpukit.strategy import connect, kind_of, num_input_pipelines, worker_subdir

    if strategy is None:
        try:
            strategy = connect(recipe.runtime.tpu)
        except ValueError as error:  # a malformed $TF_CONFIG
            raise RecipeError(str(error)) from None
    kind, replicas = kind_of(strategy), strategy.num_replicas_in_sync
    subdir = worker_subdir(strategy)
    if subdir:
        output_dir = os.path.join(output_dir, subdir)
        logger.info("tpukit: this is multi-worker task %s (not the chief): its outputs go to %s", subdir, output_dir)
    evaluating = mode != "train" and recipe.data.eval_split is not None
    try:
        train_examples = count_examples(recipe, recipe.data.train_split)
        eval_examples = count_examples(recipe, recipe.data.eval_split) if evaluating else 0
    except ValueError as error:  # the source rejects a split or an argument (its message names it)
        raise RecipeError(f"{recipe.path}: data: {error}") from None
    steps_per_epoch = check_batch_sizes(recipe, replicas, train_examples)
    for key in filter(None, (recipe.train.early_stopping_metric if recipe.train.early_stopping_patience is not None else None,
                             recipe.train.export_best_by)):
        if key.startswith("val_") and not evaluating:
            raise RecipeError(
                f"{recipe.path}: {key!r} (train.early_stopping_metric / train.export_best_by) is a validation metric, "
                f"but mode {mode!r} with data.eval_split={recipe.data.eval_split!r} never validates. Fix: use mode "
                "train_and_eval with an eval_split, or a training metric such as 'loss'."
            )
    if mode == "eval" and not evaluating:
        raise RecipeError(f"{recipe.path}: mode eval needs data.eval_split; received null. Fix: set data.eval_split.")
    checkpoint_dir = os.path.join(output_dir, "checkpoints")
    # Cheap checks before the slow work (the auto probe, building and compiling the model).
    if checkpoint and not tf.io.gfile.exists(checkpoint + ".index"):
        raise RecipeError(
            f"--checkpoint {checkpoint!r}: no such checkpoint (expected {checkpoint}.index). Fix: pass a path like "
            f"{os.path.join(checkpoint_dir, 'ckpt-1000')}, without the .index/.data suffix."
        )
    if mode == "eval" and not checkpoint and not tf.io.gfile.glob(os.path.join(checkpoint_dir, "ckpt-*.index")):
        raise RecipeError(
            f"mode eval: no checkpoint in {checkpoint_dir}. Fix: train first, or pass the checkpoint path."
        )
    if recipe.runtime.steps_per_execution != "auto":
        try:
            loop.check_steps_per_execution(recipe.runtime.steps_per_execution, steps_per_epoch)
        except ValueError as error:
            raise RecipeError(f"{recipe.path}: runtime.{error}") from None
    try:
        jit = performance.choose_jit_compile(recipe.runtime.jit_compile, kind, replicas)
    except ValueError as error:
        raise RecipeError(f"{recipe.path}: {error}") from None
    precision = performance.choose_precision(recipe.runtime.precision, kind)
    per_replica = recipe.data.global_batch_size // replicas
    logger.info(
        "tpukit: global batch %d = %d replica(s) x %d per replica; %d steps per epoch over %d examples",
        recipe.data.global_batch_size, replicas, per_replica, steps_per_epoch, train_examples,
    )
    logger.info("tpukit: precision %s (%s); jit_compile=%s (%s)", precision.value, precision.reason, jit.value, jit.reason)

    keras.mixed_precision.set_global_policy(precision.value)
    total_steps = steps_per_epoch * recipe.train.epochs
    train_fn, eval_fn = _input_fns(recipe, eval_examples, steps_per_epoch)

    def train_dataset(position):
        # Each epoch's order depends only on (seed, epoch): a resume reads just the batches already trained in its
        # epoch (`data.training_batches`), and with data.deterministic sees exactly an uninterrupted run's data.
        return data.distribute(strategy, lambda ctx: train_fn(ctx, skip_steps=position))

    steps_per_execution = recipe.runtime.steps_per_execution
    if steps_per_execution == "auto" and kind == "multi_worker":
        raise RecipeError(
            f"{recipe.path}: runtime.steps_per_execution=auto is not supported on a multi-worker cluster (each worker "
            "would time its own steps and could pick a different value). Fix: --set runtime.steps_per_execution=N."
        )
    if steps_per_execution == "auto" and mode == "eval":
        steps_per_execution = 1  # nothing trains: no probe (it would build and train a throwaway model)
    if steps_per_execution == "auto":
        # Before seeding, so the model trained below is initialized exactly as with a fixed value.
        latest = tf.train.latest_checkpoint(checkpoint_dir)
        start = int(latest.rsplit("-", 1)[1]) if latest else 0  # tpukit numbers checkpoints by step
        try:
            steps_per_execution = _probe_steps_per_execution(recipe, strategy, train_dataset, steps_per_epoch, jit.value, start)
        except ValueError as error:  # builder or optimizer arguments that do not fit together
            raise RecipeError(f"{recipe.path}: {error}") from None
    keras.utils.set_random_seed(recipe.train.seed)
    try:
        model = _build_and_compile(recipe, strategy, total_steps, jit.value, steps_per_execution)
    except ValueError as error:  # builder or optimizer arguments that do not fit together
        raise RecipeError(f"{recipe.path}: {error}") from None
    # Keras 3.15's own train function fails with steps_per_execution > 1 on 2+ Mirrored replicas
    # (keras-team/keras#19246) and on every MultiWorkerMirroredStrategy; see loop.py.
    loop.use_multi_step_loop(model)
    io_device = io_device_for(strategy, output_dir)  # remote TPU + local dir: I/O through this machine
    checkpointer = checkpoint_lib.Checkpointer(
        checkpoint_dir, model, model.optimizer, recipe.runtime.max_checkpoints_to_keep,
        options=checkpoint_lib.io_options(io_device),
    )
    with strategy.scope():
        try:
            start_step = checkpointer.restore(checkpoint if mode == "eval" else None)
        except (checkpoint_lib.CheckpointMismatchError, checkpoint_lib.CheckpointCorruptError) as error:
            raise RecipeError(str(error)) from None
    left = steps_per_epoch - start_step % steps_per_epoch
    if mode != "eval" and start_step < total_steps and left % steps_per_execution:
        valid = loop.divisors(math.gcd(steps_per_epoch, left))  # fit the rest of this epoch and every later one
        raise RecipeError(
            f"{recipe.path}: runtime.steps_per_execution={steps_per_execution} does not divide the {left} steps left in "
            f"the epoch this run resumes at (step {start_step}), so the run would overshoot its epochs. Fix: --set "
            f"runtime.steps_per_execution=N with N one of {', '.join(map(str, valid))}."
        )

    flops_per_example = flops.model_flops_per_example(model)
    peak_flops, peak_source = flops.device_peak_flops(kind, None, replicas) if mode != "eval" else (None, "")
    if peak_source:
        logger.info("tpukit: %s", peak_source)

    # Validation is over: from here on the output directory is written.
    os.makedirs(output_dir, exist_ok=True)
    if mode != "eval":
        save_recipe(recipe, os.path.join(output_dir, "recipe.yaml"))
    # Rounded up to whole executions: Keras evaluates whole executions only, and the extra batches weigh zero.
    eval_steps = (
        data.padded_eval_steps(eval_examples, eval_batch_size(recipe), num_input_pipelines(strategy), steps_per_execution)
        if evaluating else None
    )

    def eval_dataset():
        return data.distribute(strategy, lambda ctx: eval_fn(ctx, eval_steps))

    throughput = callbacks_lib.Throughput(recipe.data.global_batch_size)
    verbose = _verbose(recipe.runtime.verbose)
    outcome = trainer.Outcome("done", {}, 0)
    if mode != "eval":
        if start_step >= total_steps:
            logger.info("tpukit: all %d epochs are done already (step %d)", recipe.train.epochs, start_step)
        started = time.time()
        outcome = trainer.fit_with_recovery(
            model,
            train_dataset,
            checkpointer=checkpointer,
            steps_per_epoch=steps_per_epoch,
            epochs=recipe.train.epochs,
            callbacks=_callbacks(recipe, output_dir, throughput, steps_per_execution, io_device is not None,
                                 checkpointer.state)
            + list(callbacks or []),
            checkpoint_every_steps=recipe.runtime.checkpoint_every_steps,
            max_nan_retries=recipe.train.max_nan_retries,
            validation_data=eval_dataset if evaluating else None,
            validation_steps=eval_steps,
            validation_freq=recipe.train.eval_every_epochs,
            verbose=verbose,
        )
        if checkpointer.step > start_step:
            logger.info("tpukit: trained steps %d..%d in %.1fs (%s)", start_step, checkpointer.step, time.time() - started, outcome.status)

    evaluation = {}
    if evaluating and outcome.status != "preempted":
        evaluation = model.evaluate(eval_dataset(), steps=eval_steps, return_dict=True, verbose=verbose)
        evaluation = {k: float(v) for k, v in evaluation.items()}
    exported = {}
    if mode != "eval" and outcome.status != "preempted":
        exported = export_model(model, output_dir, io_device=io_device)

    metrics = {
        "recipe": recipe.path,
        "mode": mode,
        "status": outcome.status,
        "strategy": type(strategy).__name__,
        "replicas": replicas,
        "precision": precision.value,
        "jit_compile": jit.value,
        "steps_per_execution": steps_per_execution,
        "global_batch_size": recipe.data.global_batch_size,
        "steps_per_epoch": steps_per_epoch,
        "step": checkpointer.step,
        "resumed_from_step": start_step,
        "nan_rollbacks": outcome.nan_rollbacks,
        # Data skipped after NaN rollbacks (the window from the restored checkpoint to the step that diverged).
        "nan_skipped_examples": outcome.skipped_steps * recipe.data.global_batch_size,
        "train": {k: v[-1] for k, v in outcome.history.items() if not k.startswith("val_")},
        "validation": {k: v[-1] for k, v in outcome.history.items() if k.startswith("val_")},
        "eval": evaluation,
        "eval_examples": eval_examples,
        "examples_per_second": throughput.examples_per_second,
        "steps_per_second": throughput.steps_per_second,
        "time_to_first_step_seconds": throughput.time_to_first_step,
        "flops_per_example": flops_per_example,
        "peak_flops": peak_flops,
        "peak_flops_source": peak_source,
        "mfu": flops.mfu(flops_per_example, throughput.examples_per_second, peak_flops),
        "exported": exported,
    }
    name = "eval_metrics.json" if mode == "eval" else "metrics.json"
    previous_path = os.path.join(output_dir, name)
    if mode != "eval" and checkpointer.step == start_step and os.path.isfile(previous_path):
        # Nothing was trained in this call (the run was complete): keep what the training run measured.
        with open(previous_path, encoding="utf-8") as f:
            previous = json.load(f)
        for key in ("train", "validation", "examples_per_second", "steps_per_second", "time_to_first_step_seconds", "mfu"):
            if not metrics[key] and previous.get(key):
                metrics[key] = previous[key]
    with open(previous_path, "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    return metrics
