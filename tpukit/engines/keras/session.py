"""What both engines do the same way around Keras' `fit` and `evaluate`: the session `build` returns, the
callbacks, fit with recovery over a session (`fit_session`), the exact evaluation (`evaluate_session`), the report
(`report`), and the errors a run's failures become (`explained`). An engine supplies its input pipelines, its
checkpointer and what is its own (the TensorFlow engine's XLA fallback, the jax engine's mesh)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tpukit import data, task
from tpukit.engines import OutputDirError
from tpukit.engines.keras import callbacks as callbacks_lib
from tpukit.engines.keras import export, flops, keras_private, trainer
from tpukit.environment import diagnose
from tpukit.planner import Plan, RunSettings
from tpukit.planner import steps as steps_lib
from tpukit.recipe import RecipeError

logger = logging.getLogger("tpukit")


@contextlib.contextmanager
def dtype_policy(name: str):
    """Sets Keras' global dtype policy for a run and restores the caller's when it ends."""

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


@dataclasses.dataclass
class Session:
    """What `build` made from a plan: the compiled model, its checkpointer and the numbers the report needs."""

    plan: Plan
    model: Any
    checkpointer: Any
    start_step: int
    flops_per_example: float | None
    peak_flops: float | None
    peak_source: str
    throughput: Any
    decision: dict = dataclasses.field(default_factory=dict)  # why this steps_per_execution
    # Times a measured peak again, given the FLOP/s training reached (`flops.checked_mfu`); None: a table's peak.
    remeasure_peak: Callable[[float], tuple[float | None, str]] | None = None
    # Outputs the model cannot have, found before training (name -> why: `export.skipped_outputs`), and those an
    # export failed to write (name -> the one-paragraph reason: `exporting`); the latter fail the run.
    outputs_skipped: dict = dataclasses.field(default_factory=dict)
    outputs_missing: dict = dataclasses.field(default_factory=dict)
    # `train.sample_prompts`: the last generations ({"prompt", "generation"} each: `callbacks.SampleGenerations`).
    samples: list | None = None


def _decision_text(why: dict) -> str:
    if "estimated_step_seconds" not in why:
        return why["rule"]
    return (
        f"{why['flops_per_step'] / 1e9:.3g} GFLOP per step at {why['assumed_utilization']:g} of "
        f"{why['peak_flops'] / 1e9:.4g} GFLOP/s: ~{why['estimated_step_seconds'] * 1e3:.3g} ms per step; "
        f"{why['rule']}"
    )


def decide_steps_per_execution(
    the_plan: Plan, model, flops_per_example: float | None, peak_flops: float | None
) -> tuple[Plan, dict]:
    """The plan with `steps_per_execution: auto` decided by `tpukit.planner.steps.decide_steps_per_execution`
    (a cost model over the built model's FLOPs and the devices' peak: nothing is timed, so the same recipe on the
    same hardware always gets the same value), set on `model` before its train function is made; and why, for
    `metrics.json`. A value from the recipe is kept as it is. Both engines use it."""
    setting = the_plan.steps_per_execution
    if setting != "auto":
        if the_plan.settings.steps_per_execution == "auto":  # the planner's choice in eval mode
            return the_plan, {
                "setting": "auto",
                "rule": "mode eval: nothing trains, one step per call",
            }
        return the_plan, {"setting": setting, "rule": "set in the recipe"}
    steps_per_epoch = the_plan.steps_per_epoch
    flops_per_step = flops_per_example * the_plan.global_batch_size if flops_per_example else None
    chosen, why = steps_lib.decide_steps_per_execution(
        flops_per_step=flops_per_step,
        flops_per_second=peak_flops,
        steps_per_epoch=steps_per_epoch,
        steps_left_in_epoch=steps_per_epoch - the_plan.resume_step % steps_per_epoch,
        target_seconds=the_plan.settings.steps_per_execution_target_seconds,
    )
    # Read by Keras when it makes the train and test functions (at the first fit/evaluate), as compile's argument;
    # and kept in the compile config that model.keras saves.
    model.steps_per_execution = chosen
    keras_private.record_steps_per_execution(model, chosen)
    logger.info("tpukit: steps_per_execution auto -> %d (%s)", chosen, _decision_text(why))
    return the_plan.resolved(chosen), why


def verbose(setting) -> int:
    """Keras' progress bar redraws with \\r and colour codes even into a pipe; logs get one line per epoch."""
    if setting == "auto":
        return 1 if sys.stdout.isatty() or "ipykernel" in sys.modules else 2
    return setting


def standard_callbacks(
    exact_loss: dict | None,
    settings: RunSettings,
    output_dir: str,
    throughput,
    steps_per_execution: int,
    remote_io: bool,
    state,
    chief: bool = True,
):
    """tpukit's callbacks for a fit: the exact validation loss, throughput, TensorBoard scalars (and the profiler),
    sample generations (`train.sample_prompts`), resumable early stopping and `best.keras`. `chief=False`: no
    summaries, samples or `best.keras` (the chief writes them)."""
    result = [callbacks_lib.ExactValidationLoss(exact_loss), throughput]
    scalars = None
    if not chief:
        pass  # only the chief writes summaries and best.keras (every worker writes its checkpoints)
    elif remote_io:
        # Summary writers are eager ops on the remote TPU host, which cannot reach this machine's disk.
        logger.warning(
            "tpukit: remote TPU with a local output dir: TensorBoard logs are off (checkpoints and exports are "
            "routed through /job:localhost). Fix: use a gs:// --output_dir to get TensorBoard logs."
        )
    else:
        log_dir = os.path.join(output_dir, "logs")
        profile = 0
        if settings.profile_steps:
            # Keras' TensorBoard counts host calls (each runs steps_per_execution optimizer steps).
            first, last = settings.profile_steps
            profile = (
                math.ceil(first / steps_per_execution),
                math.ceil(last / steps_per_execution),
            )
        scalars = callbacks_lib.TensorBoardScalars(log_dir, throughput)
        result.append(scalars)
        if profile:
            result.append(callbacks_lib.ProfilingTensorBoard(log_dir, profile_batch=profile))
    prompts = settings.keys.get("train.sample_prompts")
    if prompts and chief:
        result.append(
            callbacks_lib.SampleGenerations(
                prompts, settings.keys.get("train.sample_max_length"), scalars
            )
        )
    if settings.early_stopping_patience is not None:
        result.append(
            callbacks_lib.ResumableEarlyStopping(
                state,
                monitor=settings.early_stopping_metric,
                patience=settings.early_stopping_patience,
                verbose=1,
            )
        )
    if settings.export_best_by and chief:
        result.append(
            callbacks_lib.ResumableModelCheckpoint(
                state, os.path.join(output_dir, "best.keras"), monitor=settings.export_best_by
            )
        )
    return result


def fit_session(
    session,
    train_dataset,
    eval_dataset,
    callbacks: list,
    on_compile_failure=None,
    *,
    saved_model_from_keras: bool = False,
):
    """`trainer.fit_with_recovery` over a session of either engine: `train_dataset(plan, spec)(position)` and
    `eval_dataset(plan, spec)()` make the engine's pipelines; the moving averages (`train.ema_momentum`) become
    the weights once training is done. `on_compile_failure(error) -> bool`: the engine's retry of a step that failed
    to compile (the trainer's argument). First, the outputs the model cannot have are warned of (`check_outputs`;
    `saved_model_from_keras`: the engine exports the SavedModel from `model.keras`), and `train.sample_prompts` on a
    model that cannot generate is refused; the samples of the trained model end the training
    (`session.samples`)."""
    the_plan, settings = session.plan, session.plan.settings
    if not the_plan.training:
        use_averages(session.model)
        return trainer.Outcome("done", {}, 0)
    check_outputs(session, saved_model_from_keras=saved_model_from_keras)
    samplers = [c for c in callbacks if isinstance(c, callbacks_lib.SampleGenerations)]
    for sampler in samplers:
        sampler.check(session.model, the_plan.recipe.path)
    if session.start_step >= the_plan.total_steps:
        logger.info(
            "tpukit: all %d epochs are done already (step %d)",
            settings.epochs,
            session.start_step,
        )
    started = time.time()
    spec = task.spec_of(session.model)
    outcome = trainer.fit_with_recovery(
        session.model,
        train_dataset(the_plan, spec),
        checkpointer=session.checkpointer,
        steps_per_epoch=the_plan.steps_per_epoch,
        epochs=settings.epochs,
        callbacks=callbacks,
        checkpoint_every_steps=settings.checkpoint_every_steps,
        checkpoint_max_overhead=settings.checkpoint_max_overhead,
        max_nan_retries=settings.max_nan_retries,
        validation_data=eval_dataset(the_plan, spec) if the_plan.evaluating else None,
        validation_steps=the_plan.eval_steps,
        validation_freq=settings.eval_every_epochs,
        verbose=verbose(settings.verbose),
        on_compile_failure=on_compile_failure,
    )
    if outcome.status not in trainer.STOPPED.values():
        use_averages(session.model)
        for sampler in samplers:
            sampler.at_end(session.model)
    for sampler in samplers:
        session.samples = sampler.last
    if session.checkpointer.step > session.start_step:
        logger.info(
            "tpukit: trained steps %d..%d in %.1fs (%s)",
            session.start_step,
            session.checkpointer.step,
            time.time() - started,
            outcome.status,
        )
    return outcome


def check_outputs(session, *, saved_model_from_keras: bool = False) -> None:
    """Before training: the outputs the model cannot have (`export.skipped_outputs`: a model without a config, or
    whose config does not rebuild, gets `model.weights.h5` instead of `model.keras`, and no `best.keras`) recorded
    on the session for the report, each with a warning."""
    skipped = export.skipped_outputs(session.model, saved_model_from_keras=saved_model_from_keras)
    best_by = session.plan.settings.export_best_by
    if "keras" in skipped and best_by:
        skipped["keras"] += f"; and no best.keras either (train.export_best_by={best_by})"
    if (
        getattr(session.plan.strategy, "processes", 1) > 1
        and export.text_causal_lm(session.model) is not None
    ):
        for name in ("preset", "safetensors"):
            skipped[name] = (
                "not exported from a run on several hosts yet (no host holds every shard of the task); "
                "model.keras holds the trained task (Fix: keras_hub.models.CausalLM from model.keras, then "
                "save_to_preset and export_to_transformers)"
            )
    session.outputs_skipped = skipped
    for name, why in skipped.items():
        logger.warning("tpukit: output %s will not be written: %s", name, why)


def exporting(session, write: Callable[[], dict]) -> dict[str, str]:
    """`write()`'s outputs (name -> path). An output it could not write (`export.OutputsMissing`) is recorded in
    `session.outputs_missing` with its reason (what, where, why, the fix; `missing_reason`): the report then says
    `status: failed`, and the runner fails the run after writing the metrics (its error says once that the
    checkpoint is kept and how to export again: `tpukit.runner.ExportFailedError`).

    A KerasHub causal LM's preset and safetensors (`export.export_hub_outputs`) come with `model.keras`: written
    here where `write()` wrote `model.keras` (or failed to) without them (the jax engine's export)."""
    try:
        exported, missing = write(), {}
    except export.OutputsMissing as incomplete:
        exported, missing = dict(incomplete.exported), dict(incomplete.missing)
    if (
        ("keras" in exported or "keras" in missing)
        and not {"preset", "safetensors"} & (exported.keys() | missing.keys())
        and export.text_causal_lm(session.model) is not None
        and getattr(session.plan.strategy, "processes", 1) == 1
    ):
        written, failed = export.export_hub_outputs(
            session.model, session.plan.output_dir, session.outputs_skipped
        )
        exported.update(written)
        missing.update(failed)
    for name, error in missing.items():
        session.outputs_missing[name] = missing_reason(session, error, name)
    return exported


def missing_reason(session, error: BaseException, name: str) -> str:
    """Why output `name` is missing: what failed, where and why, whether the file at its path is an earlier
    export's (`export.earlier_output`), and the fix."""
    earlier = (
        ""
        if isinstance(error, export.BrokenOutput)
        else export.earlier_output(name, session.plan.output_dir)
    )
    if isinstance(error, export.ExportWriteError):
        return error.reason(earlier)
    text = " ".join(str(error).split())[:300]
    return (
        f"{export.OUTPUT_NAMES.get(name, name)} could not be exported ({type(error).__name__}: {text}){earlier}. "
        "Fix: correct what the error names"
    )


def use_averages(model) -> None:
    """With `train.ema_momentum`: the moving averages become the model's weights for evaluation and export. The
    checkpoints keep the trained weights and the averages apart (`keras_private.averages_kept_apart`), so a resume
    goes on from the trained weights, as an uninterrupted run does."""
    optimizer = model.optimizer
    if getattr(optimizer, "use_ema", False):
        optimizer.finalize_variable_values(model.trainable_variables)


def evaluate_session(
    session, outcome, eval_dataset, callbacks: list = (), fall_back=None
) -> dict[str, float]:
    """`evaluate` for a session of either engine: `eval_dataset(plan, spec)()` makes its pipeline; `callbacks`
    run beside the one that reports the exact loss; `fall_back(error) -> bool`: whether to evaluate once more after
    `error` (the engine changed what failed)."""
    the_plan = session.plan
    if not the_plan.evaluating or outcome.status in trainer.STOPPED.values():
        return {}

    exact_loss = exact_loss_terms(session.model)

    def evaluate():
        return session.model.evaluate(
            eval_dataset(the_plan, task.spec_of(session.model))(),  # a fresh, whole pass each time
            steps=the_plan.eval_steps,
            return_dict=True,
            verbose=verbose(the_plan.settings.verbose),
            # the printed `loss` over the real examples
            callbacks=[callbacks_lib.ExactValidationLoss(exact_loss), *callbacks],
        )

    try:
        results = evaluate()
    except Exception as error:
        # A run that trains nothing here (already done, or mode eval) meets an XLA it cannot compile in evaluate.
        if fall_back is None or not fall_back(error):
            raise
        results = evaluate()
    # The returned dict too (Keras' CallbackList hands callbacks a copy of the logs).
    return callbacks_lib.with_aliases(
        {k: float(v) for k, v in results.items()}, exact_loss=exact_loss
    )


def exact_loss_terms(model) -> dict | None:
    """The logged metrics whose weighted sum is the exact loss (`tpukit.task.spec_of`); None: the default."""
    spec = task.spec_of(model)
    return spec.exact_loss if spec is not None and spec.exact_loss else None


def features(session: Session):
    spec = task.spec_of(session.model)
    return spec.features if spec is not None else None


def report(session: Session, outcome, evaluation: dict, exported: dict, engine: str) -> dict:
    """The run's metrics (the runner writes them to `metrics.json`, or `eval_metrics.json` in eval mode)."""

    the_plan, settings, throughput = session.plan, session.plan.settings, session.throughput
    step = session.checkpointer.step
    mfu, peak_flops, peak_source = flops.checked_mfu(
        session.flops_per_example,
        throughput.examples_per_second,
        session.peak_flops,
        session.peak_source,
        session.remeasure_peak,
    )
    metrics = {
        "recipe": the_plan.recipe.path,
        "engine": engine,
        "mode": the_plan.mode,
        "status": outcome.status,
        "strategy": type(the_plan.strategy).__name__,
        "replicas": the_plan.replicas,
        "precision": the_plan.precision,
        "jit_compile": the_plan.jit_compile,
        "jit_compile_reason": the_plan.jit_compile_reason,
        "steps_per_execution": the_plan.steps_per_execution,
        "steps_per_execution_decision": session.decision,
        "global_batch_size": the_plan.global_batch_size,
        "steps_per_epoch": the_plan.steps_per_epoch,
        "step": step,
        "resumed_from_step": session.start_step,
        "nan_rollbacks": outcome.nan_rollbacks,
        # Data skipped after NaN rollbacks (the window from the restored checkpoint to the step that diverged).
        "nan_skipped_examples": outcome.skipped_steps * the_plan.global_batch_size,
        "train": {k: v[-1] for k, v in outcome.history.items() if not k.startswith("val_")},
        "validation": {k: v[-1] for k, v in outcome.history.items() if k.startswith("val_")},
        "eval": evaluation,
        "eval_examples": (
            the_plan.corrupt[settings.eval_split].examples(the_plan.eval_examples)
            if settings.eval_split in the_plan.corrupt
            else the_plan.eval_examples
        ),
        "skipped_corrupt": {split: report.to_json() for split, report in the_plan.corrupt.items()},
        "examples_per_second": throughput.examples_per_second,
        "steps_per_second": throughput.steps_per_second,
        "time_to_first_step_seconds": throughput.time_to_first_step,
        "flops_per_example": session.flops_per_example,
        "peak_flops": peak_flops,
        "peak_flops_dtype": flops.peak_dtype(the_plan.precision, the_plan.strategy_kind),
        "peak_flops_source": peak_source,
        "mfu": mfu,
        "exported": exported,
    }
    if session.samples is not None:  # train.sample_prompts: the trained model's generations
        metrics["samples"] = list(session.samples)
    if session.outputs_skipped:  # found before training, and warned of then
        metrics["outputs_skipped"] = dict(session.outputs_skipped)
    if session.outputs_missing:  # an export failed: never `done` with an output missing
        metrics["status"] = "failed"
        metrics["training_status"] = outcome.status  # how training ended ("done", "early_stopped")
        metrics["outputs_missing"] = dict(session.outputs_missing)
    if settings.baseline and evaluation:
        metrics["baseline"] = task.score_baseline(the_plan.recipe, task.spec_of(session.model))
    return metrics


_OUTPUT_FAILURES = (
    "No space left on device",
    "Read-only file system",
    "Permission denied",
    "Disk quota exceeded",
)


def _output_failure(
    the_plan: Plan, error: BaseException, newest_step: Callable[[str], int]
) -> OutputDirError | None:
    text = f"{error}"
    reason = next((r for r in _OUTPUT_FAILURES if r in text), None)
    if reason is None:
        return None
    step = newest_step(the_plan.checkpoint_dir)
    return OutputDirError(
        f"cannot write to {the_plan.output_dir}: {reason} ({type(error).__name__}: {text.splitlines()[0][:200]}). "
        f"The checkpoints written before are kept (newest: step {step}). Fix: free space or make the directory "
        "writable (or pass another --output_dir holding a copy of it), then run the same command to resume."
    )


def _label_range(the_plan: Plan, error: BaseException) -> RecipeError | None:
    """Keras' 'label value outside the valid range' (more classes in the data than the model has) as a RecipeError."""

    found = re.search(
        r"Received a label value of (-?\d+) which is outside the valid range of \[0, (\d+)\)",
        str(error),
    )
    if not found:
        return None
    label, classes = int(found.group(1)), int(found.group(2))
    fix = task.compiling.class_count_fix(the_plan.recipe, "output", classes, label + 1)
    return RecipeError(
        f"{the_plan.recipe.path}: data.source={the_plan.settings.source!r} has label {label} (beyond the "
        f"labels read before training), but model {the_plan.settings.model_name!r} outputs {classes} classes. "
        f"Fix: {fix}, or check the labels."
    )


@contextlib.contextmanager
def explained(the_plan: Plan, newest_step: Callable[[str], int]):
    """Errors met while building, training and evaluating: a corrupt record becomes a RecipeError naming the file
    and record (checkpoints stay as they are); a known environment error gets its cause and fix attached.
    `newest_step(checkpoint_dir)`: the engine's newest checkpoint, named when the output directory fails."""

    try:
        yield
    except Exception as error:
        failure = _recipe_or_output_failure(the_plan, error, newest_step)
        if failure is not None:
            raise failure from None
        diagnose.annotate(error)
        raise


def _recipe_or_output_failure(
    the_plan: Plan, error: BaseException, newest_step: Callable[[str], int]
) -> Exception | None:
    """The tpukit error that `error` means, or None: a corrupt record or a label beyond the model's classes
    (RecipeError), or an output directory that stopped taking writes (OutputDirError)."""

    # An export that found the output full or read-only: the checkpoint is kept, the rerun re-exports.
    if isinstance(error, export.ExportWriteError):
        step = newest_step(the_plan.checkpoint_dir)
        return OutputDirError(error.explained(step, the_plan.checkpoint_dir))
    if isinstance(error, tf.errors.OpError):
        settings = the_plan.settings
        splits = [s for s in (settings.train_split, settings.eval_split) if s]
        corrupt = data.explain_data_error(error, settings.source, splits, settings.source_options)
        if corrupt is not None:
            return RecipeError(f"{the_plan.recipe.path}: data: {corrupt}")
        return _output_failure(the_plan, error, newest_step) or _label_range(the_plan, error)
    if isinstance(error, OSError):
        return _output_failure(the_plan, error, newest_step)
    return None
