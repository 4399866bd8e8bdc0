"""`make_plan` (public as `tpukit.plan`) and `run`: recipe -> plan -> engine -> report. Engine-neutral.

    the_plan = tpukit.plan(recipe, mode="train_and_eval", output_dir="runs/x")   # decisions only, nothing written
    metrics = tpukit.run(recipe, "runs/x")    # build, train, evaluate, export with the plan's engine, then report

Outputs in `output_dir`: `recipe.yaml` (resolved), `checkpoints/`, `logs/` (TensorBoard), `model.keras`,
`metrics.json`, `runs.jsonl` (one line per run started there) and, while a run trains, `tpukit.lock`. Re-running
with the same output directory resumes from the newest checkpoint, with the same recipe (`tpukit.planner.changes`);
one run at a time trains there (`tpukit.rundir`), and every output is written whole (a temporary name, then a
rename).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil

from tpukit import __version__, engines, logs, planner, rundir, task
from tpukit.engines import OutputDirError
from tpukit.environment import engine_choice
from tpukit.planner import MODES, Plan
from tpukit.planner import changes as changes_lib
from tpukit.recipe import Recipe, RecipeError, recipe_text
from tpukit.rundir import RunLockedError

logger = logging.getLogger("tpukit")

__all__ = [
    "MODES",
    "ExportFailedError",
    "OutputDirError",
    "RunLockedError",
    "TrainingInterrupted",
    "make_plan",
    "run",
]

RECIPE_NAME = "recipe.yaml"


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) stopped training after the step in flight, and a checkpoint was saved: running the same
    command (or notebook cell) again resumes. A KeyboardInterrupt, so a script or a notebook stops as it does on
    any Ctrl-C, but shown in one line: IPython prints `_render_traceback_()` instead of a traceback."""

    def __init__(self, metrics: dict, output_dir: str):
        self.metrics = metrics
        self.output_dir = output_dir
        super().__init__(
            f"tpukit: stopped by Ctrl-C at step {metrics['step']}; the checkpoint is saved in {output_dir}. Run "
            "the same command (or cell) again to resume."
        )

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


class ExportFailedError(RuntimeError):
    """The run trained (and evaluated) but an output could not be exported: `metrics` (also written to
    `metrics.json`, with `status: failed` and `outputs_missing` naming each missing output and why) keeps its
    numbers; the trained checkpoint (in `checkpoint_dir`) is kept, and running the same command again exports
    without training again. The message is one paragraph: each missing output by its file name, why and its fix,
    then once the checkpoint kept and the rerun."""

    def __init__(
        self,
        metrics: dict,
        output_dir: str,
        metrics_written: bool = True,
        checkpoint_dir: str | None = None,
    ):
        from tpukit.engines.keras.export import OUTPUT_NAMES

        self.metrics = metrics
        self.output_dir = output_dir
        missing = metrics["outputs_missing"]
        where = (
            f"the metrics are written to {os.path.join(output_dir, 'metrics.json')} (status failed)"
            if metrics_written
            else "metrics.json could not be written either"
        )
        count = "an output" if len(missing) == 1 else f"{len(missing)} outputs"
        names = ", ".join(OUTPUT_NAMES.get(name, name) for name in missing)
        checkpoints = checkpoint_dir or os.path.join(output_dir, "checkpoints")
        super().__init__(
            f"the run reached step {metrics['step']}, but {count} could not be exported ({names}); {where}. "
            + " ".join(_sentence(reason) for reason in missing.values())
            + f" The trained checkpoint is kept (step {metrics['step']} in {checkpoints}): after the fix, run the "
            "same command: it goes on from that checkpoint, and a finished training is not repeated, only "
            "exported again."
        )


def _sentence(reason: str) -> str:
    """A missing output's reason as a sentence of the paragraph ("the SavedModel ..." -> "The SavedModel ...")."""
    reason = reason.rstrip(".") + "."
    return "T" + reason[1:] if reason.startswith("the ") else reason


def make_plan(
    recipe: Recipe,
    strategy=None,
    mode: str = "train_and_eval",
    output_dir: str = "runs/run",
    checkpoint: str | None = None,
    *,
    accept_changes: tuple[str, ...] | list[str] = (),
    _on_task_dir=None,
) -> Plan:
    """Validates `recipe` against the hardware, the data and `output_dir`, and returns every decision of the run.

    Nothing is built and nothing is written. `strategy` defaults to `tpukit.connect(recipe.runtime.tpu)`. Raises
    `RecipeError` (the message names the key, the value and the fix) for anything the run would reject that needs
    no model; the engine's `build` raises the rest (the model against its data and checkpoint, the cluster's
    agreement) before anything is written. The cheap checks run first, then the engine connects, then the data is
    counted; `tpukit.planner.decide` makes the decisions from what was found.

    A directory that holds a trained run is resumed only with the recipe it was trained with, apart from the keys
    named in `accept_changes` (and those that change nothing trained: `tpukit.planner.changes.FREE`).
    """
    recipe.validate()
    # `auto` resolved once, for this process and machine; the plan, the task and the engine read the result.
    choice = engine_choice.resolve(recipe.runtime.engine, tpu_address=recipe.runtime.tpu)
    recipe = recipe.with_engine(choice.engine)
    engine = engines.get(choice.engine)
    evaluating = planner.check_request(recipe, mode, checkpoint)
    planner.check_output_dir(output_dir, mode)
    changes_lib.check_accepted_names(accept_changes)
    planner.check_model_axis(recipe)  # before connecting: waiting for a TPU can take minutes
    hardware = engine.hardware(recipe, strategy, output_dir)
    planner.check_mesh(recipe, hardware)  # before the data is counted: it needs only the engine
    output_dir = planner.worker_output_dir(hardware.worker, output_dir)
    if _on_task_dir is not None:
        _on_task_dir(
            output_dir
        )  # the runner locks an existing directory before reading its checkpoints
    checkpoint_dir = planner.checkpoint_dir(hardware, output_dir)
    found = engine.checkpoints(checkpoint_dir, checkpoint)
    planner.check_checkpoint(mode, checkpoint, checkpoint_dir, found)  # before counting the data
    planner.check_input_paths(recipe, hardware)
    data = task.count_data(recipe, evaluating)
    the_plan = planner.decide(recipe, hardware, data, found, mode, output_dir, checkpoint)
    # Last: a recipe that is wrong in itself (a batch larger than the data) gets that message, not this one.
    accepted = _recipe_changes(engine, recipe, the_plan, found, accept_changes)
    the_plan = _padded_as_trained(engine, the_plan, found)
    task.builder_kwargs(
        the_plan.recipe
    )  # refuses what the builder cannot take on this engine, before any write
    return dataclasses.replace(the_plan, engine_reason=choice.reason, accepted_changes=accepted)


def _padded_as_trained(engine, the_plan: Plan, found) -> Plan:
    """A run whose tables tpukit padded for a model axis (`vocabulary_multiple`, from `runtime.mesh.model` on the
    jax engine) resumes, or is evaluated, with the padding it was trained with, recorded in `runs.jsonl`: the
    checkpoint's tables have those shapes, and `runtime` stays free to change (another mesh after a preemption)."""
    recipe = the_plan.recipe
    if not found.newest_step or "vocabulary_multiple" in recipe.model.kwargs:
        return the_plan
    files = _files(engine, the_plan.output_dir)
    trained = next(
        (
            r["vocabulary_multiple"]
            for r in reversed(rundir.history(files, the_plan.output_dir))
            if r.get("vocabulary_multiple")
        ),
        None,
    )
    now = task.builder_kwargs(recipe).get("vocabulary_multiple", 1)
    if trained is None or trained == now:
        return the_plan
    logger.info(
        "tpukit: the tables keep the padding this run was trained with (a multiple of %d rows; "
        "runtime.mesh.model=%s would pad to %d)",
        trained,
        recipe.runtime.mesh["model"],
        now,
    )
    kwargs = {**recipe.model.kwargs, "vocabulary_multiple": trained}
    model = dataclasses.replace(recipe.model, kwargs=kwargs)
    return dataclasses.replace(the_plan, recipe=dataclasses.replace(recipe, model=model))


def _recipe_changes(engine, recipe, the_plan: Plan, found, accept_changes) -> dict:
    """The accepted changes since the run's `recipe.yaml`, and in the precision its history records (raises
    for the others; see `planner.changes`)."""
    mode, worker, output_dir = the_plan.mode, the_plan.worker, the_plan.output_dir
    if mode == "eval" or worker or not found.newest_step:
        # Evaluating reads a checkpoint and trains nothing; a non-chief worker's recipe is the chief's (compared
        # across the cluster by the engine); a run that trained nothing may start over with another recipe.
        return {}
    files = _files(engine, output_dir)
    path = os.path.join(output_dir, RECIPE_NAME)
    saved = rundir.read_yaml(files, path)
    if saved is None:
        if not files.exists(path):
            logger.warning(
                "tpukit: %s has checkpoints (step %d) but no %s, so this recipe cannot be compared with the one "
                "it was trained with; resuming with this one",
                output_dir,
                found.newest_step,
                RECIPE_NAME,
            )
        return {}
    current = json.loads(
        json.dumps(recipe.to_dict(), default=str)
    )  # tuples as lists, as YAML reads them back
    changes = changes_lib.recipe_changes(saved, current)
    trained = next(
        (r["precision"] for r in reversed(rundir.history(files, output_dir)) if r.get("precision")),
        None,
    )
    changes.update(changes_lib.precision_change(trained, the_plan.precision))
    changes_lib.check_precision(changes, output_dir)  # first: accepting it would not help
    return changes_lib.check_changes(changes, accept_changes, output_dir, found.newest_step)


def _files(engine, output_dir: str):
    """This machine's file systems for a local path; the engine's for gs:// and other `scheme://` paths."""
    return engine.remote_files() if rundir.is_remote(output_dir) else rundir.LocalFiles()


def run(
    recipe: Recipe,
    output_dir: str,
    strategy=None,
    mode: str = "train_and_eval",
    checkpoint: str | None = None,
    callbacks: list | None = None,
    *,
    accept_changes: tuple[str, ...] | list[str] = (),
    break_lock: bool = False,
) -> dict:
    """Trains (resuming if `output_dir` has checkpoints), evaluates and exports; returns the metrics written.

    Args:
        recipe: a validated `Recipe` (see `tpukit.load_recipe`).
        output_dir: where checkpoints, logs, the model and `metrics.json` go.
        strategy: a `tf.distribute.Strategy` to use instead of `tpukit.connect(recipe.runtime.tpu)`.
        mode: "train_and_eval" (validate every `train.eval_every_epochs`, evaluate at the end), "train"
            (no evaluation), or "eval" (evaluate `checkpoint`, default the newest in `output_dir`, and nothing else).
        checkpoint: for mode "eval" only: a checkpoint path (default: the newest one in `output_dir`).
        callbacks: extra Keras callbacks for `fit`.
        accept_changes: recipe keys (`"train.learning_rate"`) whose values may differ from those the run in
            `output_dir` was trained with; recorded in `output_dir/runs.jsonl`. Others are refused on resume.
        break_lock: take over a lease-guarded directory (gs://) whose holder is known to be gone
            (`tpukit.rundir`); local directories need no such thing (a crashed run's lock is released by the OS).

    Raises:
        RecipeError: the recipe does not fit this hardware (batch sizes), the data or the run already in
            `output_dir`; nothing is written then.
        RunLockedError: another run is training into `output_dir` (the message names it).
        OutputDirError: the output directory stopped taking writes; earlier checkpoints are kept.
        ExportFailedError: an output could not be exported (`model.keras`, the SavedModel): its `metrics` are
            written to `metrics.json` with `status: failed` and `outputs_missing`; the checkpoint is kept, and
            the same call again exports without training again.
        TrainingInterrupted: Ctrl-C stopped training after saving a checkpoint (a KeyboardInterrupt; its
            `metrics` were written). SIGTERM instead returns, with status "preempted".
        tpukit.engines.keras.trainer.TrainingDivergedError: the loss stayed non-finite after
            `train.max_nan_retries` rollbacks.
    """
    phases = logs.Phases()
    with phases.timed("plan"):
        recipe.validate()
        # `make_plan` resolves `auto` again, to the same engine (`engine_choice.resolve` keeps its first decision).
        choice = engine_choice.resolve(recipe.runtime.engine, tpu_address=recipe.runtime.tpu)
        engine = engines.get(choice.engine)
        files = _files(engine, output_dir)
    lock: rundir.RunLock | None = None

    def lock_existing(task_dir: str) -> None:
        nonlocal lock
        if mode != "eval" and files.isdir(task_dir):
            lock = _locked(engine, files, task_dir, break_lock)

    try:
        with phases.timed("plan"):
            the_plan = make_plan(
                recipe,
                strategy,
                mode,
                output_dir,
                checkpoint,
                accept_changes=accept_changes,
                _on_task_dir=lock_existing,
            )
            logger.info("%s", the_plan.describe())
            new = the_plan.training and not files.exists(the_plan.output_dir)
            if the_plan.training:
                if lock is None:  # a new directory: created now, with the lock in it
                    lock = _locked(engine, files, the_plan.output_dir, break_lock)
                _start(engine, files, the_plan, lock)
        try:
            return _run(the_plan, engine, recipe, callbacks, files, phases)
        except RecipeError:
            if new:
                lock.release()
                _remove_untrained(the_plan, engine)
            raise
    finally:
        if lock is not None:
            lock.release()


def _start(engine, files, the_plan, lock: rundir.RunLock) -> None:
    """A training run's start, in its locked directory: what a killed run left cleared, the start recorded."""
    with _writes_to(engine, the_plan.output_dir):
        _clear_leftovers(files, the_plan)
        _record_start(files, the_plan, lock.holder)


def _locked(engine, files, directory: str, break_lock: bool) -> rundir.RunLock:
    lock = rundir.RunLock(directory, files, break_lock=break_lock)
    with _writes_to(engine, directory):
        lock.acquire()
    return lock


@contextlib.contextmanager
def _writes_to(engine, directory: str):
    """An output directory that takes no writes (read-only, full, no permission) as an OutputDirError naming the
    checkpoints kept, as the engine reports the same faults met while training."""
    try:
        yield
    except OSError as error:
        step = engine.checkpoints(os.path.join(directory, "checkpoints"), None).newest_step
        raise OutputDirError(
            f"cannot write to {directory}: {error.strerror or error} ({type(error).__name__} on "
            f"{error.filename or directory}). The checkpoints written before are kept (newest: step {step}). Fix: "
            "free space or make the directory writable (or pass another --output_dir holding a copy of it), then "
            "run the same command to resume."
        ) from None


def _clear_leftovers(files, the_plan: Plan) -> None:
    """What killed writers left, at the start before anything is written: temporaries of the outputs, and
    unfinished checkpoint saves in the checkpoint directories this process answers for."""
    rundir.clear_temporaries(files, the_plan.output_dir)
    rundir.clear_unfinished_saves(
        files, the_plan.output_dir, the_plan.checkpoint_dir, chief=the_plan.chief
    )


def _record_start(files, the_plan: Plan, holder: rundir.Holder) -> None:
    rundir.append_history(
        files,
        the_plan.output_dir,
        {
            "started": holder.started,
            "host": holder.host,
            "pid": holder.pid,
            "command": holder.command,
            "tpukit": __version__,
            "mode": the_plan.mode,
            "engine": the_plan.engine,
            "precision": the_plan.precision,
            "resumed_from_step": the_plan.resume_step,
            "accepted_changes": {k: list(v) for k, v in the_plan.accepted_changes.items()},
            # The padding of embedding tables (`tpukit.task.builder_kwargs`), which a resume keeps.
            "vocabulary_multiple": task.builder_kwargs(the_plan.recipe).get("vocabulary_multiple"),
        },
    )


def _remove_untrained(the_plan: Plan, engine) -> None:
    """A new run that a data or model error stopped before its first trained step (a label beyond those read
    before training) leaves no directory behind: rerunning with the fix then starts afresh instead of meeting a
    checkpoint of another model. The directory is removed only if this run created it and trained nothing."""
    found = engine.checkpoints(the_plan.checkpoint_dir, None)
    if found.newest_step == 0 and os.path.isdir(the_plan.output_dir):
        shutil.rmtree(the_plan.output_dir, ignore_errors=True)
        logger.info(
            "tpukit: removed %s: the run stopped before its first step", the_plan.output_dir
        )


def _run(the_plan: Plan, engine, recipe: Recipe, callbacks, files, phases: logs.Phases) -> dict:
    with engine.dtype_policy(the_plan.precision), engine.explained(the_plan):
        with phases.timed("build"):
            session = engine.build(the_plan)
            # Validation is over: from here on the output directory is written.
            files.makedirs(session.plan.output_dir)
            if session.plan.training and session.plan.chief:
                rundir.write_text(
                    files, os.path.join(session.plan.output_dir, RECIPE_NAME), recipe_text(recipe)
                )
        with phases.timed("training"):
            outcome = engine.train(session, callbacks)
        throughput = session.throughput
        phases.split(
            "training",
            first_step=throughput.first_step_seconds,
            validation=throughput.validation_seconds_total,
            checkpoints=session.checkpointer.seconds_saving,
        )
        with phases.timed("evaluation"):
            evaluation = engine.evaluate(session, outcome)
        with phases.timed("export"):
            exported = engine.export(session, outcome)
        with phases.timed("report"):
            metrics = _with_engine_reason(
                engine.report(session, outcome, evaluation, exported), the_plan
            )
        metrics["phases_seconds"] = phases.to_json()
        _log_phases(metrics["phases_seconds"])
        if metrics.get("outputs_missing"):
            failed = _failed_export(session.plan, metrics, files)
        else:
            metrics, failed = write_metrics(session.plan, metrics, files), None
    if failed is not None:
        raise failed
    if metrics["status"] == "interrupted":
        raise TrainingInterrupted(metrics, session.plan.output_dir)
    return metrics


def _failed_export(the_plan: Plan, metrics: dict, files) -> ExportFailedError:
    """A run whose export failed: its metrics written all the same (the numbers are not lost), and the
    ExportFailedError, carrying them, that the run raises."""
    try:
        metrics = write_metrics(the_plan, metrics, files)
    except (
        OSError
    ):  # the disk that refused the export may refuse this too: the error still says why
        written = False
    else:
        written = True
    return ExportFailedError(
        metrics,
        the_plan.output_dir,
        metrics_written=written,
        checkpoint_dir=the_plan.checkpoint_dir,
    )


def _with_engine_reason(metrics: dict, the_plan: Plan) -> dict:
    """`metrics` with `engine_reason` (why the plan's engine: `runtime.engine`, or what `auto` found) after
    `engine`."""
    if "engine" not in metrics:
        return {**metrics, "engine_reason": the_plan.engine_reason}
    ordered = {}
    for key, value in metrics.items():
        ordered[key] = value
        if key == "engine":
            ordered["engine_reason"] = the_plan.engine_reason
    return ordered


def _log_phases(seconds: dict) -> None:
    logger.info(
        "tpukit: %.1f s in all: %s",
        seconds["total"],
        ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items() if k != "total"),
    )


_KEPT_FROM_TRAINING = (
    "train",
    "validation",
    "examples_per_second",
    "steps_per_second",
    "time_to_first_step_seconds",
    "mfu",
)


def write_metrics(the_plan: Plan, metrics: dict, files=None) -> dict:
    """Writes `metrics.json` (`eval_metrics.json` in eval mode; the chief only), whole, and returns what it wrote.
    A call that trained nothing (the run was complete) keeps what the training run measured; a damaged file from
    before is ignored with a warning."""
    files = files or rundir.LocalFiles()
    path = os.path.join(
        the_plan.output_dir, "eval_metrics.json" if the_plan.mode == "eval" else "metrics.json"
    )
    if the_plan.training and metrics["step"] == metrics["resumed_from_step"]:
        previous = rundir.read_json(files, path) or {}
        for key in _KEPT_FROM_TRAINING:
            if not metrics[key] and previous.get(key):
                metrics[key] = previous[key]
    if (
        the_plan.chief
    ):  # the other workers' metrics are the chief's (one model, one eval over all shards)
        rundir.write_text(files, path, json.dumps(metrics, indent=2))
    return metrics
