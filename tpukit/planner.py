"""`plan(recipe, strategy, mode, output_dir)`: every decision of a run, validated, with nothing built or written.

A `Plan` is frozen and printable: the strategy kind and replicas, global and per-replica batches, steps per epoch and
eval steps, `steps_per_execution`, precision and XLA with their reasons, the paths and the step a run resumes at.
Every `RecipeError` a run can raise about the recipe, the hardware or the output directory is raised here, before
the slow work (Model Garden validates and locks its params before `run_experiment`; this is tpukit's version).
The CLI logs the plan once; `tpukit.run` builds, trains, evaluates, exports and reports from it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from typing import Any

from tpukit import compat
from tpukit.recipe import Recipe, RecipeError

logger = logging.getLogger("tpukit")

MODES = ("train_and_eval", "train", "eval")
# The engine that executes a plan. Only "tensorflow" (tf.distribute strategies + Keras' TensorFlow trainer) exists;
# a second one (e.g. Keras on JAX with keras.distribution) would implement `runner.ENGINES`' interface.
ENGINE = "tensorflow"


def count_examples(recipe: Recipe, split: str) -> int:
    """Examples in a split of the recipe's source (its fast counter, else its cardinality, else one pass)."""
    import tensorflow as tf

    from tpukit.data import EXAMPLE_COUNTS, SOURCES, run_args

    skip = {"skip_corrupt": True} if recipe.data.skip_corrupt else {}
    counter = EXAMPLE_COUNTS.get(
        recipe.data.source
    )  # fast path: metadata or raw records, nothing decoded
    count = counter(split=split, **skip, **recipe.data.options) if counter else None
    if count is not None:
        return count
    source = SOURCES[recipe.data.source]
    skip = {
        k: v
        for k, v in run_args(source, False, False, recipe.data.skip_corrupt).items()
        if k == "skip_corrupt"
    }
    dataset = source(split=split, input_context=None, **skip, **recipe.data.options)
    if not isinstance(dataset, tf.data.Dataset):
        raise RecipeError(
            f"{recipe.path}: data.source={recipe.data.source!r} returned a {type(dataset).__name__} for split "
            f"{split!r}, not a tf.data.Dataset. Fix: return an unbatched tf.data.Dataset of (features, label), e.g. "
            "tf.data.Dataset.from_tensor_slices((x, y)) (tpukit batches it)."
        )
    count = int(dataset.cardinality())
    if count < 0:  # unknown or infinite: count once
        count = int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))
    return count


def eval_batch_size(recipe: Recipe) -> int:
    return recipe.data.eval_global_batch_size or recipe.data.global_batch_size


def check_batch_sizes(recipe: Recipe, replicas: int, train_examples: int) -> int:
    """Validates the global batch sizes against the replica count and dataset; returns steps per epoch."""
    for key, value in (
        ("global_batch_size", recipe.data.global_batch_size),
        ("eval_global_batch_size", eval_batch_size(recipe)),
    ):
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


@dataclasses.dataclass(frozen=True)
class Plan:
    """Every decision of one run. Build it with `plan(...)`; `describe()` is the log block."""

    recipe: Recipe
    mode: str
    strategy: Any = dataclasses.field(repr=False, compare=False)
    strategy_kind: str
    replicas: int
    input_pipelines: int
    global_batch_size: int
    per_replica_batch_size: int
    eval_global_batch_size: int
    train_examples: int
    eval_examples: int
    steps_per_epoch: int
    total_steps: int
    steps_per_execution: (
        int | str
    )  # "auto": decided by `runner.build`'s probe, then `resolved(...)`
    eval_steps: int | None  # global steps of one pass over the eval split; None without evaluation
    precision: str
    precision_reason: str
    jit_compile: bool
    jit_compile_reason: str
    output_dir: str
    checkpoint_dir: str
    checkpoint: str | None  # mode eval: the checkpoint to evaluate (None: the newest)
    resume_step: int  # from the newest checkpoint's name; 0 for a new run
    io_device: str | None  # remote TPU + local output dir: file I/O through this device
    worker: str | None = (
        None  # a non-chief multi-worker task ("worker1"): checkpoints only, under output_dir
    )
    # data.skip_corrupt: {split: tpukit.data.CorruptReport} of the records the pipeline will drop
    corrupt: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    engine: str = ENGINE

    @property
    def evaluating(self) -> bool:
        return self.eval_steps is not None

    @property
    def chief(self) -> bool:
        """The task that writes summaries, the model, best.keras and metrics.json (every task writes checkpoints)."""
        return self.worker is None

    @property
    def training(self) -> bool:
        return self.mode != "eval"

    def resolved(self, steps_per_execution: int) -> Plan:
        """This plan with `steps_per_execution` fixed (after the auto probe)."""
        return dataclasses.replace(self, steps_per_execution=steps_per_execution)

    def describe(self) -> str:
        """The plan as the block the CLI logs once."""
        lines = [
            f"recipe {self.recipe.path}, mode {self.mode}, engine {self.engine}",
            f"strategy {self.strategy_kind}: {self.replicas} replica(s), {self.input_pipelines} input pipeline(s)",
            f"global batch {self.global_batch_size} = {self.replicas} replica(s) x {self.per_replica_batch_size} "
            f"per replica; eval global batch {self.eval_global_batch_size}",
            f"{self.steps_per_epoch} steps per epoch over {self.train_examples} examples, {self.total_steps} steps in all; "
            + (
                f"{self.eval_steps} eval steps over {self.eval_examples} examples"
                if self.evaluating
                else "no evaluation"
            ),
            f"steps_per_execution {self.steps_per_execution}",
            f"precision {self.precision} ({self.precision_reason})",
            f"jit_compile {self.jit_compile} ({self.jit_compile_reason})",
            f"output {self.output_dir}"
            + (f", resuming at step {self.resume_step}" if self.resume_step else "")
            + (f", evaluating {self.checkpoint}" if self.checkpoint else "")
            + (f", file I/O through {self.io_device}" if self.io_device else ""),
        ]
        return "\n".join(f"tpukit plan: {line}" for line in lines)


def newest_checkpoint_step(checkpoint_dir: str) -> int:
    """The step of the newest `ckpt-N` in `checkpoint_dir` (tpukit numbers checkpoints by step), 0 when none."""
    import tensorflow as tf

    steps = [
        int(m.group(1))
        for p in tf.io.gfile.glob(os.path.join(checkpoint_dir, "ckpt-*.index"))
        if (m := re.search(r"ckpt-(\d+)\.index$", p))
    ]
    return max(steps, default=0)


def check_resume(
    recipe: Recipe, steps_per_epoch: int, total_steps: int, steps_per_execution: int, step: int
) -> None:
    """A resumed run must keep whole executions in the epoch it resumes in, or it would overshoot its epochs."""
    from tpukit import loop

    left = steps_per_epoch - step % steps_per_epoch
    if step < total_steps and left % steps_per_execution:
        valid = loop.divisors(
            math.gcd(steps_per_epoch, left)
        )  # fit the rest of this epoch and every later one
        raise RecipeError(
            f"{recipe.path}: runtime.steps_per_execution={steps_per_execution} does not divide the {left} steps left "
            f"in the epoch this run resumes at (step {step}), so the run would overshoot its epochs. Fix: --set "
            f"runtime.steps_per_execution=N with N one of {', '.join(map(str, valid))}."
        )


def _check_mode(recipe: Recipe, mode: str, evaluating: bool) -> None:
    if mode not in MODES:
        raise RecipeError(
            f"mode must be one of {', '.join(MODES)}; received {mode!r}. Fix: pick one of those."
        )
    if mode == "eval" and not evaluating:
        raise RecipeError(
            f"{recipe.path}: mode eval needs data.eval_split; received null. Fix: set data.eval_split."
        )
    watched = [recipe.train.export_best_by]
    if recipe.train.early_stopping_patience is not None:
        watched.append(recipe.train.early_stopping_metric)
    for key in filter(None, watched):
        if key.startswith("val_") and not evaluating:
            raise RecipeError(
                f"{recipe.path}: {key!r} (train.early_stopping_metric / train.export_best_by) is a validation metric, "
                f"but mode {mode!r} with data.eval_split={recipe.data.eval_split!r} never validates. Fix: use mode "
                "train_and_eval with an eval_split, or a training metric such as 'loss'."
            )


def _check_checkpoint(mode: str, checkpoint: str | None, checkpoint_dir: str) -> None:
    import tensorflow as tf

    if checkpoint and not tf.io.gfile.exists(checkpoint + ".index"):
        raise RecipeError(
            f"--checkpoint {checkpoint!r}: no such checkpoint (expected {checkpoint}.index). Fix: pass a path like "
            f"{os.path.join(checkpoint_dir, 'ckpt-1000')}, without the .index/.data suffix."
        )
    if mode == "eval" and not checkpoint and not newest_checkpoint_step(checkpoint_dir):
        raise RecipeError(
            f"mode eval: no checkpoint in {checkpoint_dir}. Fix: train first, or pass the checkpoint path."
        )


def _check_steps_per_execution(recipe: Recipe, kind: str, steps_per_epoch: int) -> None:
    from tpukit import loop

    value = recipe.runtime.steps_per_execution
    if value == "auto" and kind == "multi_worker":
        raise RecipeError(
            f"{recipe.path}: runtime.steps_per_execution=auto is not supported on a multi-worker cluster (each worker "
            "would time its own steps and could pick a different value). Fix: --set runtime.steps_per_execution=N."
        )
    if value != "auto":
        try:
            loop.check_steps_per_execution(value, steps_per_epoch)
        except ValueError as error:
            raise RecipeError(f"{recipe.path}: runtime.{error}") from None


def _check_loop(recipe: Recipe, strategy) -> None:
    from tpukit import loop

    value = recipe.runtime.steps_per_execution
    why = loop.keras_loop_fails(strategy, 2 if value == "auto" else value)
    if recipe.runtime.loop == "keras" and why:
        raise RecipeError(
            f"{recipe.path}: runtime.loop=keras on this strategy: {why}. Fix: --set runtime.loop=auto (tpukit's loop "
            "where Keras' fails) or runtime.loop=tpukit."
        )


def _scan_corrupt(recipe: Recipe, evaluating: bool) -> dict:
    """With data.skip_corrupt: one pass per split that counts and names the records the pipeline will drop."""
    from tpukit import data

    if not recipe.data.skip_corrupt:
        return {}
    reports = {}
    for split in filter(
        None, (recipe.data.train_split, recipe.data.eval_split if evaluating else None)
    ):
        report = data.scan_corrupt(recipe.data.source, split, recipe.data.options)
        if report is not None:
            (logger.warning if report.skipped else logger.info)("tpukit: %s", report.summary())
            reports[split] = report
    return reports


def check_input_paths(recipe: Recipe, kind: str, replicas: int, hosts: int, remote: bool) -> None:
    """On a TPU whose input runs on other hosts (a multi-host slice, or a remote TPU Node's host), a source that
    reads local files is a recipe error before training (the rule of `tpukit.check`)."""
    from tpukit import check

    if kind != "tpu" or not (hosts > 1 or remote):
        return
    target = check.Target("this TPU", replicas, hosts, max(replicas // hosts, 1), 0.0, remote)
    rule = check.input_paths_rule(recipe, target)
    if rule.status == "fail":
        raise RecipeError(f"{recipe.path}: {rule.message} Fix: {rule.fix}.")


def _choose_hardware(recipe: Recipe, kind: str, replicas: int):
    """(jit_compile, precision) decisions with their reasons (`tpukit.performance`)."""
    from tpukit import performance

    try:
        jit = performance.choose_jit_compile(recipe.runtime.jit_compile, kind, replicas)
    except ValueError as error:
        raise RecipeError(f"{recipe.path}: {error}") from None
    return jit, performance.choose_precision(recipe.runtime.precision, kind)


def _count_data(recipe: Recipe, evaluating: bool) -> tuple[int, int, dict]:
    """(train examples, eval examples, corrupt-record reports); a source's ValueError becomes a RecipeError."""
    try:
        train_examples = count_examples(recipe, recipe.data.train_split)
        eval_examples = count_examples(recipe, recipe.data.eval_split) if evaluating else 0
        return train_examples, eval_examples, _scan_corrupt(recipe, evaluating)
    except (
        ValueError
    ) as error:  # the source rejects a split or an argument, or a record is corrupt (named)
        raise RecipeError(f"{recipe.path}: data: {error}") from None


def _connect(recipe: Recipe, strategy):
    from tpukit.strategy import connect

    if strategy is not None:
        return strategy
    try:
        return connect(recipe.runtime.tpu)
    except ValueError as error:  # a malformed $TF_CONFIG
        raise RecipeError(str(error)) from None


def plan(
    recipe: Recipe,
    strategy=None,
    mode: str = "train_and_eval",
    output_dir: str = "runs/run",
    checkpoint: str | None = None,
) -> Plan:
    """Validates `recipe` against the strategy, the data and `output_dir`, and returns every decision of the run.

    Nothing is built and nothing is written. `strategy` defaults to `tpukit.connect(recipe.runtime.tpu)`. Raises
    `RecipeError` (the message names the key, the value and the fix) for anything the run would reject that needs
    no model; `runner.build` raises the rest (the model against its data and checkpoint, the cluster's agreement)
    before anything is written.
    """
    from tpukit import data as data_lib
    from tpukit.export import io_device_for
    from tpukit.strategy import kind_of, num_input_pipelines, worker_subdir

    compat.check_tensorflow()
    recipe.validate()
    evaluating = mode != "train" and recipe.data.eval_split is not None
    _check_mode(recipe, mode, evaluating)
    strategy = _connect(recipe, strategy)
    kind, replicas = kind_of(strategy), strategy.num_replicas_in_sync
    subdir = worker_subdir(strategy)
    if subdir:
        output_dir = os.path.join(output_dir, subdir)
        logger.info(
            "tpukit: this is multi-worker task %s (not the chief): its outputs go to %s",
            subdir,
            output_dir,
        )
    checkpoint_dir = os.path.join(output_dir, "checkpoints")
    _check_checkpoint(mode, checkpoint, checkpoint_dir)  # cheap checks before counting the data
    check_input_paths(
        recipe,
        kind,
        replicas,
        num_input_pipelines(strategy),
        io_device_for(strategy, output_dir) is not None,
    )
    train_examples, eval_examples, corrupt = _count_data(recipe, evaluating)
    steps_per_epoch = check_batch_sizes(recipe, replicas, train_examples)
    total_steps = steps_per_epoch * recipe.train.epochs
    _check_steps_per_execution(recipe, kind, steps_per_epoch)
    _check_loop(recipe, strategy)
    jit, precision = _choose_hardware(recipe, kind, replicas)
    resume_step = newest_checkpoint_step(checkpoint_dir) if mode != "eval" else 0
    steps_per_execution = recipe.runtime.steps_per_execution
    if steps_per_execution == "auto" and mode == "eval":
        steps_per_execution = (
            1  # nothing trains: no probe (it would build and train a throwaway model)
        )
    if steps_per_execution != "auto" and mode != "eval":
        check_resume(recipe, steps_per_epoch, total_steps, steps_per_execution, resume_step)
    result = Plan(
        recipe=recipe,
        mode=mode,
        strategy=strategy,
        strategy_kind=kind,
        replicas=replicas,
        input_pipelines=num_input_pipelines(strategy),
        global_batch_size=recipe.data.global_batch_size,
        per_replica_batch_size=recipe.data.global_batch_size // replicas,
        eval_global_batch_size=eval_batch_size(recipe),
        train_examples=train_examples,
        eval_examples=eval_examples,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        steps_per_execution=steps_per_execution,
        # One pass, not padded to whole executions: Keras' loop ends an execution early when a finite dataset runs
        # out (`get_next_as_optional`), so padding batches would only cost time.
        eval_steps=(
            data_lib.eval_steps(
                eval_examples, eval_batch_size(recipe), num_input_pipelines(strategy)
            )
            if evaluating
            else None
        ),
        precision=precision.value,
        precision_reason=precision.reason,
        jit_compile=jit.value,
        jit_compile_reason=jit.reason,
        output_dir=output_dir,
        checkpoint_dir=checkpoint_dir,
        checkpoint=checkpoint,
        resume_step=resume_step,
        io_device=io_device_for(strategy, output_dir),
        corrupt=corrupt,
        worker=subdir,
    )
    return result
