"""The plan: every decision of a run, validated, with nothing built or written. Pure: no TensorFlow, no Keras.

`decide(recipe, hardware, data, checkpoints, mode, output_dir, checkpoint)` turns a recipe and the facts an engine
and the data found (`Hardware`, `DataFacts`, `CheckpointFacts`) into a frozen, printable `Plan`: the strategy kind
and replicas, global and per-replica batches, steps per epoch and eval steps, `steps_per_execution`, precision and
XLA with their reasons, the paths and the step a run resumes at. Every `RecipeError` a run can raise about the
recipe, the hardware or the output directory is raised here, before the slow work (Model Garden validates and
locks its params before `run_experiment`; this is tpukit's version). `tpukit.plan` (`tpukit.runner.make_plan`)
gathers the facts and calls `decide`; the engine reads only the `Plan` (the recipe's settings it acts on as they
are: `Plan.settings`, `tpukit.planner.settings`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Any

from tpukit.environment import versions
from tpukit.planner import hardware as hardware_choices
from tpukit.planner import steps as steps_lib
from tpukit.planner.output_dir import check_output_dir as check_output_dir
from tpukit.planner.rules import Target, input_paths_rule
from tpukit.planner.settings import Connection as Connection
from tpukit.planner.settings import RunSettings, run_settings
from tpukit.planner.settings import connection as connection
from tpukit.recipe import Recipe, RecipeError

MODES = ("train_and_eval", "train", "eval")


@dataclasses.dataclass(frozen=True)
class Hardware:
    """What an engine found on this machine: everything the planner needs to know about it."""

    engine: str  # the engine that found it ("tensorflow")
    # tensorflow: "tpu", "multi_worker", "mirrored", "one_device" or "default"; jax: "jax_tpu", "jax_gpu", "jax_cpu"
    kind: str
    replicas: int
    input_pipelines: int  # hosts that each run an input pipeline
    worker: str | None = (
        None  # a non-chief multi-worker task ("worker1"): its outputs go under output_dir/worker1
    )
    io_device: str | None = None  # remote TPU + local output dir: file I/O through this device
    gpu_compute_capability: tuple[int, int] | None = None
    keras_loop_failure: str | None = (
        None  # why Keras' own train loop fails here at the recipe's steps_per_execution
    )
    handle: Any = dataclasses.field(
        default=None, repr=False, compare=False
    )  # the engine's strategy object
    # The device mesh the engine trains on: {"data": n, "model": m} (the jax engine; None: a tf.distribute strategy)
    mesh: dict | None = None
    # Every process reads and writes the chief's checkpoints/ (the jax engine's Orbax checkpoints: each process
    # writes its own shards there); False: each task its own, under its task directory (tf.distribute)
    shared_checkpoints: bool = False


@dataclasses.dataclass(frozen=True)
class DataFacts:
    """What the recipe's data source holds (counted by `tpukit.task.count_data`)."""

    train_examples: int
    eval_examples: int = 0
    # data.skip_corrupt: {split: tpukit.data.CorruptReport} of the records the pipeline will drop
    corrupt: dict = dataclasses.field(default_factory=dict, compare=False)
    # The labels' shapes, dtypes and sampled values (`tpukit.task.targets.LabelFacts`, a dict or tuple of them for
    # several outputs); None: not read yet (`tpukit.task.build_model` reads them then)
    labels: Any = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True)
class CheckpointFacts:
    """What the output directory holds: the newest checkpoint's step (0: none) and whether `--checkpoint` exists."""

    newest_step: int = 0
    requested_exists: bool = False
    # What `--checkpoint` names, in this engine's format (for the message when it names nothing)
    expected: str = "{path}.index"
    example: str = "ckpt-1000, without the .index/.data suffix"


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
    """Every decision of one run, made by `decide(...)` (`tpukit.plan` gathers the facts); `describe()` is the
    log block."""

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
    )  # "auto": decided by the engine from the built model (`build`), then `resolved(...)`
    eval_steps: int | None  # global steps of one pass over the eval split; None without evaluation
    precision: str
    precision_reason: str
    jit_compile: bool | str  # "auto": decided by the engine once the model is built (a CPU)
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
    engine: str = "tensorflow"
    # Why this engine: the recipe's runtime.engine, or what `auto` found (`tpukit.environment.engine_choice`)
    engine_reason: str = ""
    labels: Any = dataclasses.field(default=None, repr=False, compare=False)  # `DataFacts.labels`
    # Keys whose change since the run's recipe.yaml was accepted on resume: {key: (old, new)} (`changes.py`)
    accepted_changes: dict = dataclasses.field(default_factory=dict, compare=False)
    mesh: dict | None = None  # `Hardware.mesh`

    @functools.cached_property
    def settings(self) -> RunSettings:
        """The recipe's settings the engine reads (`tpukit.planner.settings`): it reads no recipe field itself."""
        return run_settings(self.recipe)

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
        """This plan with `steps_per_execution` fixed (`auto` decided by the engine)."""
        return dataclasses.replace(self, steps_per_execution=steps_per_execution)

    def describe(self) -> str:
        """The plan as the block the CLI logs once."""
        lines = [
            f"recipe {self.recipe.path}, mode {self.mode}, engine {self.engine}"
            + (f" ({self.engine_reason})" if self.engine_reason else ""),
            f"strategy {self.strategy_kind}: {self.replicas} replica(s), {self.input_pipelines} input pipeline(s)"
            + (
                f", mesh data {self.mesh['data']} x model {self.mesh['model']}" if self.mesh else ""
            ),
            f"global batch {self.global_batch_size} = {self.replicas} replica(s) x {self.per_replica_batch_size} "
            f"per replica; eval global batch {self.eval_global_batch_size}",
            f"{self.steps_per_epoch} steps per epoch over {self.train_examples} examples, {self.total_steps} steps in all; "
            + (
                f"{self.eval_steps} eval steps over {self.eval_examples} examples"
                if self.evaluating
                else "no evaluation"
            ),
            f"steps_per_execution {self.steps_per_execution}"
            + (
                " (decided when the model is built, from its FLOPs per step)"
                if self.steps_per_execution == "auto"
                else ""
            ),
            f"precision {self.precision} ({self.precision_reason})",
            f"jit_compile {self.jit_compile} ({self.jit_compile_reason})",
            f"output {self.output_dir}"
            + (f", resuming at step {self.resume_step}" if self.resume_step else "")
            + (f", evaluating {self.checkpoint}" if self.checkpoint else "")
            + (f", file I/O through {self.io_device}" if self.io_device else ""),
        ]
        if self.accepted_changes:
            changed = ", ".join(
                f"{k} {a!r} -> {b!r}" for k, (a, b) in self.accepted_changes.items()
            )
            lines.append(f"resuming with accepted recipe changes: {changed}")
        return "\n".join(f"tpukit plan: {line}" for line in lines)


def check_resume(
    recipe: Recipe, steps_per_epoch: int, total_steps: int, steps_per_execution: int, step: int
) -> None:
    """A resumed run must keep whole executions in the epoch it resumes in, or it would overshoot its epochs."""
    left = steps_per_epoch - step % steps_per_epoch
    if step < total_steps and left % steps_per_execution:
        valid = steps_lib.divisors(
            math.gcd(steps_per_epoch, left)
        )  # fit the rest of this epoch and every later one
        raise RecipeError(
            f"{recipe.path}: runtime.steps_per_execution={steps_per_execution} does not divide the {left} steps left "
            f"in the epoch this run resumes at (step {step}), so the run would overshoot its epochs. Fix: --set "
            f"runtime.steps_per_execution=N with N one of {', '.join(map(str, valid))}."
        )


def _check_mode(recipe: Recipe, mode: str, evaluating: bool) -> None:
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


def check_request(recipe: Recipe, mode: str, checkpoint: str | None) -> bool:
    """The run's mode and flags against the recipe; returns whether the run evaluates. Cheap: call it first."""
    if mode not in MODES:
        raise RecipeError(
            f"mode must be one of {', '.join(MODES)}; received {mode!r}. Fix: pick one of those."
        )
    if checkpoint and mode != "eval":
        raise RecipeError(
            f"--checkpoint {checkpoint!r} applies to mode eval only; received mode {mode!r}, which resumes from the "
            "newest checkpoint in the output directory. Fix: drop --checkpoint, or add --mode eval to evaluate it."
        )
    evaluating = mode != "train" and recipe.data.eval_split is not None
    _check_mode(recipe, mode, evaluating)
    return evaluating


def check_checkpoint(
    mode: str, checkpoint: str | None, checkpoint_dir: str, found: CheckpointFacts
) -> None:
    """`--checkpoint` names an existing checkpoint, and mode eval has something to evaluate."""
    if checkpoint and not found.requested_exists:
        raise RecipeError(
            f"--checkpoint {checkpoint!r}: no such checkpoint (expected {found.expected.format(path=checkpoint)}). "
            f"Fix: pass a path like {os.path.join(checkpoint_dir, found.example)}."
        )
    if mode == "eval" and not checkpoint and not found.newest_step:
        raise RecipeError(
            f"mode eval: no checkpoint in {checkpoint_dir}. Fix: train first, or pass the checkpoint path."
        )


def check_input_paths(recipe: Recipe, hardware: Hardware) -> None:
    """On a TPU whose input runs on other hosts (a multi-host slice, or a remote TPU Node's host), a source that
    reads local files is a recipe error before training (the rule `python -m tpukit.check` reports)."""
    remote = hardware.io_device is not None
    if hardware.kind not in ("tpu", "jax_tpu") or not (hardware.input_pipelines > 1 or remote):
        return
    per_host = max(hardware.replicas // hardware.input_pipelines, 1)
    target = Target("this TPU", hardware.replicas, hardware.input_pipelines, per_host, 0.0, remote)
    rule = input_paths_rule(recipe, target)
    if rule.status == "fail":
        raise RecipeError(f"{recipe.path}: {rule.message} Fix: {rule.fix}.")


def _check_steps_per_execution(recipe: Recipe, hardware: Hardware, steps_per_epoch: int) -> None:
    value = recipe.runtime.steps_per_execution
    # Several hosts decide from peaks measured on each (CPU, GPU; a TPU's comes from a table): they could pick
    # different values, and a JAX program that differs between processes hangs.
    several_hosts = hardware.kind == "multi_worker" or (
        hardware.kind in ("jax_cpu", "jax_gpu") and hardware.input_pipelines > 1
    )
    if value == "auto" and several_hosts:
        raise RecipeError(
            f"{recipe.path}: runtime.steps_per_execution=auto is not supported on a multi-worker cluster (each worker "
            "would decide from the peak FLOP/s measured on its own host and could pick a different value). Fix: "
            "--set runtime.steps_per_execution=N (a single-host run logs and records the value auto picks)."
        )
    if value != "auto":
        try:
            steps_lib.check_steps_per_execution(value, steps_per_epoch)
        except ValueError as error:
            raise RecipeError(f"{recipe.path}: runtime.{error}") from None
    if recipe.runtime.loop == "keras" and hardware.keras_loop_failure:
        raise RecipeError(
            f"{recipe.path}: runtime.loop=keras on this strategy: {hardware.keras_loop_failure}. Fix: --set "
            "runtime.loop=auto (tpukit's loop where Keras' fails) or runtime.loop=tpukit."
        )


def _choose_hardware(recipe: Recipe, hardware: Hardware):
    """(jit_compile, precision) decisions with their reasons (`tpukit.planner.hardware`)."""
    try:
        jit = hardware_choices.choose_jit_compile(
            recipe.runtime.jit_compile, hardware.kind, hardware.replicas
        )
    except ValueError as error:
        raise RecipeError(f"{recipe.path}: {error}") from None
    precision = hardware_choices.choose_precision(
        recipe.runtime.precision, hardware.kind, hardware.gpu_compute_capability
    )
    return jit, precision


def eval_steps(examples: int, eval_global_batch_size: int, input_pipelines: int) -> int:
    """Global steps of one pass over `examples`: every pipeline reads its shard in batches of its share of the
    global batch, the last one completed with zero-weight examples. The same arithmetic as `tpukit.data.eval_steps`
    (which users call in their own loops; tests/planner/test_plan.py checks they agree), kept here without
    TensorFlow."""
    per_pipeline = eval_global_batch_size // input_pipelines
    return math.ceil(math.ceil(examples / input_pipelines) / per_pipeline)


def check_accumulation(recipe: Recipe, hardware: Hardware) -> None:
    """`train.gradient_accumulation_steps` on 2+ mirrored replicas is refused: Keras 3.15 chooses between applying
    and accumulating with `ops.cond` in the replica context (keras/src/optimizers/base_optimizer.py
    `_backend_apply_gradients`), and both branches synchronize the replicas through `merge_call`, which
    MirroredStrategy refuses inside control flow ("`merge_call` called while defining a new graph or a
    tf.function"), in Keras' loop and tpukit's alike. Its accumulators would also add each replica's gradient
    into that replica's own copy, so a checkpoint taken mid-cycle would not resume exactly."""
    steps = recipe.train.gradient_accumulation_steps
    if (
        steps
        and steps > 1
        and hardware.kind in ("mirrored", "multi_worker")
        and hardware.replicas > 1
    ):
        raise RecipeError(
            f"{recipe.path}: train.gradient_accumulation_steps={steps} does not work on {hardware.replicas} "
            f"{hardware.kind} replicas (Keras' accumulation synchronizes replicas inside a conditional, which "
            "tf.distribute refuses). Fix: multiply data.global_batch_size by "
            f"{steps} instead (the replicas are the accumulation), or train on one device."
        )


def check_mesh(recipe: Recipe, hardware: Hardware) -> None:
    """`runtime.mesh` against the engine: a `model` axis needs the jax engine (TensorFlow cannot shard a Keras 3
    model's weights: `keras.distribution.ModelParallel` is ignored on its backend), and on the tensorflow engine a
    `data` size must be the strategy's replica count."""
    check_model_axis(recipe)
    mesh = recipe.runtime.mesh
    if hardware.engine == "jax":
        return  # the jax engine sized its mesh from this key (`Hardware.mesh`)
    if mesh["data"] != "auto" and mesh["data"] != hardware.replicas:
        raise RecipeError(
            f"{recipe.path}: runtime.mesh.data={mesh['data']}, but the {hardware.engine} engine's {hardware.kind} "
            f"strategy has {hardware.replicas} replica(s) and uses them all. Fix: --set runtime.mesh.data=auto, or "
            "--set runtime.engine=jax to train on a chosen number of devices."
        )


def check_model_axis(recipe: Recipe) -> None:
    """A `model` axis above 1, or a layout, on the tensorflow engine: refused before it connects (a TPU can take
    minutes)."""
    mesh = recipe.runtime.mesh
    if recipe.runtime.engine == "tensorflow" and recipe.runtime.layout is not None:
        raise RecipeError(
            f"{recipe.path}: runtime.layout (a weight layout, from a dict or a Keras LayoutMap) is a jax-engine "
            "feature: on the tensorflow engine Keras ignores layouts and model parallelism, so the weights would "
            'stay whole on every device. Fix: train with the jax engine (engine="jax" in tpukit.fit, --set '
            f'runtime.engine=jax; `pip install "{versions.tpukit_requirement("jax")}"`), or remove runtime.layout.'
        )
    if recipe.runtime.engine == "tensorflow" and mesh["model"] > 1:
        raise RecipeError(
            f"{recipe.path}: runtime.mesh.model={mesh['model']} splits weights over {mesh['model']} devices, which "
            "only the jax engine can do (on the tensorflow engine Keras ignores model parallelism: the weights "
            "would stay whole on every device). Fix: --set runtime.engine=jax (`pip install "
            f'"{versions.tpukit_requirement("jax")}"`), or '
            "--set runtime.mesh.model=1."
        )


def worker_output_dir(worker: str | None, output_dir: str) -> str:
    """Where this task writes: `output_dir`, or `output_dir/workerN` for a non-chief multi-worker task (`worker`,
    `Hardware.worker`)."""
    return os.path.join(output_dir, worker) if worker else output_dir


def checkpoint_dir(hardware: Hardware, task_output_dir: str) -> str:
    """This task's checkpoint directory: `checkpoints/` in its task directory (`worker_output_dir`), or the chief's
    where the engine's processes share one (`Hardware.shared_checkpoints`)."""
    if hardware.worker and hardware.shared_checkpoints:
        return os.path.join(os.path.dirname(task_output_dir.rstrip("/")), "checkpoints")
    return os.path.join(task_output_dir, "checkpoints")


def decide(
    recipe: Recipe,
    hardware: Hardware,
    data: DataFacts,
    checkpoints: CheckpointFacts,
    mode: str = "train_and_eval",
    output_dir: str = "runs/run",
    checkpoint: str | None = None,
) -> Plan:
    """Every decision of the run, from a validated recipe and the facts found; raises `RecipeError` (the message
    names the key, the value and the fix) for anything the run would reject. `output_dir` is this task's
    (`worker_output_dir`)."""
    evaluating = check_request(recipe, mode, checkpoint)
    checkpoints_in = checkpoint_dir(hardware, output_dir)
    check_checkpoint(mode, checkpoint, checkpoints_in, checkpoints)
    check_input_paths(recipe, hardware)
    check_mesh(recipe, hardware)
    steps_per_epoch = check_batch_sizes(recipe, hardware.replicas, data.train_examples)
    total_steps = steps_per_epoch * recipe.train.epochs
    _check_steps_per_execution(recipe, hardware, steps_per_epoch)
    check_accumulation(recipe, hardware)
    jit, precision = _choose_hardware(recipe, hardware)
    resume_step = checkpoints.newest_step if mode != "eval" else 0
    steps_per_execution = recipe.runtime.steps_per_execution
    if steps_per_execution == "auto" and mode == "eval":
        steps_per_execution = 1  # nothing trains: nothing to decide
    if steps_per_execution != "auto" and mode != "eval":
        check_resume(recipe, steps_per_epoch, total_steps, steps_per_execution, resume_step)
    return Plan(
        recipe=recipe,
        mode=mode,
        strategy=hardware.handle,
        strategy_kind=hardware.kind,
        replicas=hardware.replicas,
        input_pipelines=hardware.input_pipelines,
        global_batch_size=recipe.data.global_batch_size,
        per_replica_batch_size=recipe.data.global_batch_size // hardware.replicas,
        eval_global_batch_size=eval_batch_size(recipe),
        train_examples=data.train_examples,
        eval_examples=data.eval_examples,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        steps_per_execution=steps_per_execution,
        # One pass, not padded to whole executions: Keras' loop ends an execution early when a finite dataset runs
        # out (`get_next_as_optional`), so padding batches would only cost time.
        eval_steps=(
            eval_steps(data.eval_examples, eval_batch_size(recipe), hardware.input_pipelines)
            if evaluating
            else None
        ),
        precision=precision.value,
        precision_reason=precision.reason,
        jit_compile=jit.value,
        jit_compile_reason=jit.reason,
        output_dir=output_dir,
        checkpoint_dir=checkpoints_in,
        checkpoint=checkpoint,
        resume_step=resume_step,
        io_device=hardware.io_device,
        corrupt=data.corrupt,
        worker=hardware.worker,
        engine=hardware.engine,
        labels=data.labels,
        mesh=hardware.mesh,
    )
