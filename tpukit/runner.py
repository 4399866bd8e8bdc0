"""`make_plan` (public as `tpukit.plan`) and `run`: recipe -> plan -> engine -> report. Engine-neutral.

    the_plan = tpukit.plan(recipe, mode="train_and_eval", output_dir="runs/x")   # decisions only, nothing written
    metrics = tpukit.run(recipe, "runs/x")    # build, train, evaluate, export with the plan's engine, then report

Outputs in `output_dir`: `recipe.yaml` (resolved), `checkpoints/`, `logs/` (TensorBoard), `model.keras`,
`metrics.json`. Re-running with the same output directory resumes from the newest checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

from tpukit import engines, planner, task
from tpukit.engines import OutputDirError
from tpukit.planner import MODES, Plan
from tpukit.recipe import Recipe, RecipeError, save_recipe

logger = logging.getLogger("tpukit")

__all__ = ["MODES", "OutputDirError", "make_plan", "run"]


def make_plan(
    recipe: Recipe,
    strategy=None,
    mode: str = "train_and_eval",
    output_dir: str = "runs/run",
    checkpoint: str | None = None,
) -> Plan:
    """Validates `recipe` against the hardware, the data and `output_dir`, and returns every decision of the run.

    Nothing is built and nothing is written. `strategy` defaults to `tpukit.connect(recipe.runtime.tpu)`. Raises
    `RecipeError` (the message names the key, the value and the fix) for anything the run would reject that needs
    no model; the engine's `build` raises the rest (the model against its data and checkpoint, the cluster's
    agreement) before anything is written. The cheap checks run first, then the engine connects, then the data is
    counted; `tpukit.planner.decide` makes the decisions from what was found.
    """
    engine = engines.get("tensorflow")
    recipe.validate()
    evaluating = planner.check_request(recipe, mode, checkpoint)
    hardware = engine.hardware(recipe, strategy, output_dir)
    output_dir = planner.worker_output_dir(hardware.worker, output_dir)
    checkpoint_dir = os.path.join(output_dir, "checkpoints")
    found = engine.checkpoints(checkpoint_dir, checkpoint)
    planner.check_checkpoint(mode, checkpoint, checkpoint_dir, found)  # before counting the data
    planner.check_input_paths(recipe, hardware)
    data = task.count_data(recipe, evaluating)
    return planner.decide(recipe, hardware, data, found, mode, output_dir, checkpoint)


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
        checkpoint: for mode "eval" only: a checkpoint path (default: the newest one in `output_dir/checkpoints`).
        callbacks: extra Keras callbacks for `fit`.

    Raises:
        RecipeError: the recipe does not fit this hardware (batch sizes) or the data; nothing is written then.
        OutputDirError: the output directory stopped taking writes; earlier checkpoints are kept.
        tpukit.engines.tensorflow.trainer.TrainingDivergedError: the loss stayed non-finite after
            `train.max_nan_retries` rollbacks.
    """
    the_plan = make_plan(recipe, strategy, mode, output_dir, checkpoint)
    engine = engines.get(the_plan.engine)
    logger.info("%s", the_plan.describe())
    new = the_plan.training and not os.path.exists(the_plan.output_dir)
    try:
        return _run(the_plan, engine, recipe, callbacks)
    except RecipeError:
        if new:
            _remove_untrained(the_plan, engine)
        raise


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


def _run(the_plan: Plan, engine, recipe: Recipe, callbacks) -> dict:
    with engine.dtype_policy(the_plan.precision), engine.explained(the_plan):
        session = engine.build(the_plan)
        # Validation is over: from here on the output directory is written.
        os.makedirs(session.plan.output_dir, exist_ok=True)
        if session.plan.training and session.plan.chief:
            save_recipe(recipe, os.path.join(session.plan.output_dir, "recipe.yaml"))
        outcome = engine.train(session, callbacks)
        evaluation = engine.evaluate(session, outcome)
        exported = engine.export(session, outcome)
        metrics = engine.report(session, outcome, evaluation, exported)
        return write_metrics(session.plan, metrics)


def write_metrics(the_plan: Plan, metrics: dict) -> dict:
    """Writes `metrics.json` (`eval_metrics.json` in eval mode; the chief only) and returns what it wrote. A call
    that trained nothing (the run was complete) keeps what the training run measured."""
    path = os.path.join(
        the_plan.output_dir, "eval_metrics.json" if the_plan.mode == "eval" else "metrics.json"
    )
    if (
        the_plan.training
        and metrics["step"] == metrics["resumed_from_step"]
        and os.path.isfile(path)
    ):
        with open(path, encoding="utf-8") as f:
            previous = json.load(f)
        for key in (
            "train",
            "validation",
            "examples_per_second",
            "steps_per_second",
            "time_to_first_step_seconds",
            "mfu",
        ):
            if not metrics[key] and previous.get(key):
                metrics[key] = previous[key]
    if (
        the_plan.chief
    ):  # the other workers' metrics are the chief's (one model, one eval over all shards)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
    return metrics
