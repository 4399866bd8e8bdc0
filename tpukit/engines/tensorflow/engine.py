"""The TensorFlow engine: a `Plan` executed with tf.distribute and Keras' TensorFlow trainer.

    hardware = engine.hardware(recipe, strategy, output_dir)   # connect; what the planner needs to know
    session = engine.build(the_plan)     # the model, compiled under the strategy, restored if resuming
    outcome = engine.train(session)      # fit with checkpoints, SIGTERM, NaN rollback (trainer.py)
    evaluation = engine.evaluate(session, outcome)
    exported = engine.export(session, outcome)
    metrics = engine.report(session, outcome, evaluation, exported)

`tpukit.runner.run` composes these; a second engine (Keras on JAX) provides the same functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tpukit import __version__, data, planner, task
from tpukit.engines import OutputDirError
from tpukit.engines.tensorflow import callbacks as callbacks_lib
from tpukit.engines.tensorflow import checkpoint as checkpoint_lib
from tpukit.engines.tensorflow import cluster, flops, keras_private, loop, sparse, trainer
from tpukit.engines.tensorflow import strategy as strategy_lib
from tpukit.engines.tensorflow.export import export_model, io_device_for
from tpukit.environment import diagnose
from tpukit.planner import CheckpointFacts, Hardware, Plan
from tpukit.planner import hardware as hardware_choices
from tpukit.planner import steps as steps_lib
from tpukit.recipe import Recipe, RecipeError

logger = logging.getLogger("tpukit")

NAME = "tensorflow"


def _gpu_compute_capability() -> tuple[int, int] | None:
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    return tf.config.experimental.get_device_details(gpus[0]).get("compute_capability")


def hardware(recipe: Recipe, strategy, output_dir: str) -> Hardware:
    """Connects (`strategy` defaults to `tpukit.connect(recipe.runtime.tpu)`, waiting at most
    `runtime.tpu_timeout_seconds` for a TPU and `runtime.workers_timeout_seconds` for a cluster's workers) and
    returns what the planner needs. A malformed $TF_CONFIG is a `RecipeError` (bad input: exit 2)."""
    if strategy is None:
        try:
            strategy = strategy_lib.connect(
                recipe.runtime.tpu,
                tpu_timeout_seconds=recipe.runtime.tpu_timeout_seconds,
                workers_timeout_seconds=recipe.runtime.workers_timeout_seconds,
            )
        except strategy_lib.TFConfigError as error:
            raise RecipeError(str(error)) from None
    kind = strategy_lib.kind_of(strategy)
    worker = strategy_lib.worker_subdir(strategy)
    task_dir = planner.worker_output_dir(worker, output_dir)
    if worker:
        logger.info(
            "tpukit: this is multi-worker task %s (not the chief): its outputs go to %s",
            worker,
            task_dir,
        )
    value = recipe.runtime.steps_per_execution
    return Hardware(
        engine=NAME,
        kind=kind,
        replicas=strategy.num_replicas_in_sync,
        input_pipelines=strategy_lib.num_input_pipelines(strategy),
        worker=worker,
        io_device=io_device_for(strategy, task_dir),
        gpu_compute_capability=(
            _gpu_compute_capability()
            if kind in ("one_device", "mirrored", "multi_worker")
            else None
        ),
        keras_loop_failure=loop.keras_loop_fails(strategy, 2 if value == "auto" else value),
        handle=strategy,
    )


def remote_files():
    """`tpukit.rundir`'s file operations for gs:// and other `scheme://` output directories."""
    from tpukit.engines.tensorflow.files import GFiles

    return GFiles()


def checkpoints(checkpoint_dir: str, checkpoint: str | None) -> CheckpointFacts:
    """The newest checkpoint's step in `checkpoint_dir`, and whether `checkpoint` (a path) exists."""
    step = checkpoint_lib.newest_checkpoint_step(checkpoint_dir)
    if not step and tf.io.gfile.glob(os.path.join(checkpoint_dir, "ckpt-*.npz")):
        raise RecipeError(
            f"{checkpoint_dir} holds checkpoints of the jax engine, which the tensorflow engine cannot read. Fix: "
            "resume it with --set runtime.engine=jax, or pass another --output_dir (model.keras, exported by a "
            "finished run, can start a tensorflow run: --set model.init_weights=<dir>/model.keras)."
        )
    return CheckpointFacts(
        newest_step=step,
        requested_exists=bool(checkpoint) and tf.io.gfile.exists(checkpoint + ".index"),
    )


def _compiled(
    recipe: Recipe,
    strategy,
    total_steps: int,
    jit: bool,
    steps_per_execution: int,
    resuming: bool = False,
    labels=None,
):
    with strategy.scope():
        return task.build_model(
            recipe, total_steps, jit, steps_per_execution, resuming=resuming, labels=labels
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
        if (
            the_plan.recipe.runtime.steps_per_execution == "auto"
        ):  # the planner's choice in eval mode
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
        target_seconds=the_plan.recipe.runtime.steps_per_execution_target_seconds,
    )
    # Read by Keras when it makes the train and test functions (at the first fit/evaluate), as compile's argument;
    # and kept in the compile config that model.keras saves.
    model.steps_per_execution = chosen
    keras_private.record_steps_per_execution(model, chosen)
    logger.info("tpukit: steps_per_execution auto -> %d (%s)", chosen, _decision_text(why))
    return the_plan.resolved(chosen), why


def decide_jit_compile(
    the_plan: Plan,
    model,
    flops_per_example: float | None = None,
    read_peak: Callable[[], float | None] | None = None,
) -> Plan:
    """The plan with `jit_compile: "auto"` (a CPU) decided from the built model's layers and the run's estimated
    length (`tpukit.planner.hardware.choose_cpu_jit_compile`: the whole run's steps, the model's FLOPs, the
    measured peak, which `read_peak` returns and is called for only where it can change the choice), set on `model`
    before its train function is made, and kept in the compile config `model.keras` saves. Any other plan is
    returned as it is."""
    if the_plan.jit_compile != "auto":
        return the_plan
    if the_plan.recipe.runtime.loop == "tpukit":
        decision = hardware_choices.Decision(
            False, "runtime.loop: tpukit runs its own step loop, which is not compiled with XLA"
        )
    else:
        classes = keras_private.layer_classes(model)
        # the peak only where it can change the choice: an attention model whose FLOPs were counted
        needed = read_peak and flops_per_example and hardware_choices.attention_layers(classes)
        decision = hardware_choices.choose_cpu_jit_compile(
            classes,
            flops_per_step=(
                flops_per_example * the_plan.global_batch_size if flops_per_example else None
            ),
            peak_flops=read_peak() if needed else None,
            train_steps=the_plan.total_steps,
        )
    reason = decision.reason
    if decision.value:
        # Keras' setter turns it off, with a warning, where the model cannot compile.
        model.jit_compile = True
        if not model.jit_compile:
            reason = f"{reason}; but Keras says this model cannot be compiled with XLA"
    keras_private.record_jit_compile(model, bool(model.jit_compile))
    logger.info("tpukit: jit_compile auto -> %s (%s)", bool(model.jit_compile), reason)
    return dataclasses.replace(
        the_plan, jit_compile=bool(model.jit_compile), jit_compile_reason=reason
    )


# What TensorFlow raises when XLA cannot compile an op of the step (measured: a `tf.py_function` in a layer, TF 2.21:
# "Detected unsupported operations when trying to compile graph ... on XLA_CPU_JIT: EagerPyFunc").
_XLA_CANNOT_COMPILE = re.compile(
    r"Detected unsupported operations when trying to compile graph|XLA compilation requires"
)


def _xla_fallback(session) -> Callable[[BaseException], bool] | None:
    """Where this engine chose XLA itself (`jit_compile: auto` on a CPU, for attention layers), a step that XLA
    cannot compile (an op with no XLA kernel, such as `tf.py_function`) trains without XLA, as it did before tpukit
    chose it, with a warning; the plan, `metrics.json` and `model.keras` say so. None elsewhere: an XLA the recipe
    asked for fails as it is."""
    if not (
        session.plan.jit_compile is True
        and session.plan.strategy_kind == "default"
        and session.plan.recipe.runtime.jit_compile == "auto"
    ):
        return None

    def fall_back(error: BaseException) -> bool:
        the_plan = session.plan
        if the_plan.jit_compile is not True:
            return False  # fell back already
        text = f"{type(error).__name__}: {error}"
        if not isinstance(error, tf.errors.OpError) or not _XLA_CANNOT_COMPILE.search(text):
            return False
        model = session.model
        model.jit_compile = False
        # Made again, without XLA, by the next fit or evaluate.
        model.train_function = model.test_function = model.predict_function = None
        keras_private.record_jit_compile(model, False)
        first = next((line for line in str(error).splitlines() if "unsupported" in line), "")
        what = first.strip()[:200] or type(error).__name__
        reason = (
            f"{the_plan.jit_compile_reason}; but XLA could not compile this model's step ({what}), so it "
            "trains without XLA"
        )
        session.plan = dataclasses.replace(the_plan, jit_compile=False, jit_compile_reason=reason)
        logger.warning(
            "tpukit: XLA could not compile the train step (%s); training without XLA. Set "
            "runtime.jit_compile: false (tpukit.fit(jit_compile=False)) to skip this attempt",
            what,
        )
        return True

    return fall_back


def _decision_text(why: dict) -> str:
    if "estimated_step_seconds" not in why:
        return why["rule"]
    return (
        f"{why['flops_per_step'] / 1e9:.3g} GFLOP per step at {why['assumed_utilization']:g} of "
        f"{why['peak_flops'] / 1e9:.4g} GFLOP/s: ~{why['estimated_step_seconds'] * 1e3:.3g} ms per step; "
        f"{why['rule']}"
    )


def _verbose(setting) -> int:
    """Keras' progress bar redraws with \\r and colour codes even into a pipe; logs get one line per epoch."""
    if setting == "auto":
        return 1 if sys.stdout.isatty() or "ipykernel" in sys.modules else 2
    return setting


def _callbacks(
    exact_loss: dict | None,
    recipe: Recipe,
    output_dir: str,
    throughput,
    steps_per_execution: int,
    remote_io: bool,
    state,
    chief: bool = True,
):

    result = [callbacks_lib.ExactValidationLoss(exact_loss), throughput]
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
        if recipe.runtime.profile_steps:
            # Keras' TensorBoard counts host calls (each runs steps_per_execution optimizer steps).
            first, last = recipe.runtime.profile_steps
            profile = (
                math.ceil(first / steps_per_execution),
                math.ceil(last / steps_per_execution),
            )
        result.append(callbacks_lib.TensorBoardScalars(log_dir, throughput))
        if profile:
            result.append(callbacks_lib.ProfilingTensorBoard(log_dir, profile_batch=profile))
    if recipe.train.early_stopping_patience is not None:
        result.append(
            callbacks_lib.ResumableEarlyStopping(
                state,
                monitor=recipe.train.early_stopping_metric,
                patience=recipe.train.early_stopping_patience,
                verbose=1,
            )
        )
    if recipe.train.export_best_by and chief:
        result.append(
            callbacks_lib.ResumableModelCheckpoint(
                state, os.path.join(output_dir, "best.keras"), monitor=recipe.train.export_best_by
            )
        )
    return result


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


@contextlib.contextmanager
def dtype_policy(name: str):
    """Sets Keras' global dtype policy for a run and restores the caller's when it ends."""

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _train_dataset(the_plan: Plan, spec=None):

    train_fn, _ = task.input_fns(
        the_plan.recipe, the_plan.eval_examples, the_plan.steps_per_epoch, spec
    )

    def make(position):
        # Each epoch's order depends only on (seed, epoch): a resume reads just the batches already trained in its
        # epoch (`data.training_batches`), and with data.deterministic sees exactly an uninterrupted run's data.
        return data.distribute(the_plan.strategy, lambda ctx: train_fn(ctx, skip_steps=position))

    return make


def _eval_dataset(the_plan: Plan, spec=None):

    _, eval_fn = task.input_fns(
        the_plan.recipe, the_plan.eval_examples, the_plan.steps_per_epoch, spec
    )
    # A finite dataset read with `steps=plan.eval_steps`: Keras makes a new iterator for every evaluation, and its
    # loop ends the last execution where the data ends, so an evaluation is one exact pass at any
    # steps_per_execution (tests/engines/tensorflow/test_recovery.py counts the examples against the exported model).
    return lambda: data.distribute(the_plan.strategy, eval_fn)


def _restore(the_plan: Plan, checkpointer) -> int:
    """Restores the newest readable checkpoint (on a cluster: the one every worker has); returns its step."""

    try:
        with the_plan.strategy.scope():
            step = checkpointer.restore(the_plan.checkpoint if the_plan.mode == "eval" else None)
            agreed = (
                cluster.agree_resume_step(the_plan.strategy, step) if the_plan.training else step
            )
            if agreed != step and not agreed:
                raise RecipeError(
                    f"another worker has no checkpoint while this one resumes at step {step} "
                    f"({the_plan.checkpoint_dir}). Fix: give every worker the same checkpoints (a shared file "
                    "system), or delete every worker's checkpoints to start over."
                )
            if agreed != step:
                step = checkpointer.restore(os.path.join(the_plan.checkpoint_dir, f"ckpt-{agreed}"))
    except (checkpoint_lib.CheckpointMismatchError, checkpoint_lib.CheckpointCorruptError) as error:
        raise RecipeError(str(error)) from None
    if (
        the_plan.training and step != the_plan.resume_step
    ):  # fell back past a damaged newest checkpoint
        planner.check_resume(
            the_plan.recipe,
            the_plan.steps_per_epoch,
            the_plan.total_steps,
            the_plan.steps_per_execution,
            step,
        )
    return step


def build(the_plan: Plan) -> Session:
    """Seeds, builds and compiles the model under the plan's strategy, decides `steps_per_execution: auto` from
    its FLOPs (`decide_steps_per_execution`), and restores the newest readable checkpoint. Call it under
    `dtype_policy`."""

    recipe = the_plan.recipe
    cluster.check_same_recipe(the_plan.strategy, recipe, __version__)
    keras.utils.set_random_seed(recipe.train.seed)
    auto = the_plan.steps_per_execution == "auto"
    try:
        model = _compiled(
            recipe,
            the_plan.strategy,
            the_plan.total_steps,
            the_plan.jit_compile is True,
            1 if auto else the_plan.steps_per_execution,
            resuming=the_plan.resume_step > 0,
            labels=the_plan.labels,
        )
    except RecipeError:
        raise
    except ValueError as error:  # builder or optimizer arguments that do not fit together
        raise RecipeError(f"{recipe.path}: {error}") from None
    flops_per_example = flops.model_flops_per_example(model)
    device_peak = functools.partial(  # this plan's devices (decide_jit_compile returns a new plan)
        flops.device_peak_flops,
        the_plan.strategy_kind,
        None,
        the_plan.replicas,
        precision=the_plan.precision,
    )
    peak_flops, peak_source = (None, "")
    if the_plan.training:
        peak_flops, peak_source = device_peak()
        logger.info("tpukit: %s", peak_source)
    the_plan = decide_jit_compile(
        the_plan,
        model,
        flops_per_example,
        # mode eval makes the choice the recipe's training made (the estimate is of the whole training run), so
        # it reads the peak too where the choice needs it
        (lambda: peak_flops) if the_plan.training else (lambda: device_peak()[0]),
    )
    # Keras' TensorFlow optimizers apply a repeated embedding id's gradient once per occurrence
    # (tensorflow/tensorflow#28090): one summed gradient per row, as the optimizer's definition (and JAX) says;
    # dense where the step is compiled with XLA (see sparse.py).
    sparse.combine_repeated_ids(
        model.optimizer, dense=the_plan.jit_compile is True or the_plan.strategy_kind == "tpu"
    )
    the_plan, decision = decide_steps_per_execution(the_plan, model, flops_per_example, peak_flops)
    # Keras 3.15's own train function fails with steps_per_execution > 1 on 2+ Mirrored replicas
    # (keras-team/keras#19246) and on every MultiWorkerMirroredStrategy; see loop.py.
    loop.use_multi_step_loop(model, recipe.runtime.loop)
    checkpointer = checkpoint_lib.Checkpointer(
        the_plan.checkpoint_dir,
        model,
        model.optimizer,
        recipe.runtime.max_checkpoints_to_keep,
        options=checkpoint_lib.io_options(the_plan.io_device),
    )
    start_step = _restore(the_plan, checkpointer)
    return Session(
        the_plan,
        model,
        checkpointer,
        start_step,
        flops_per_example,
        peak_flops,
        peak_source,
        callbacks_lib.Throughput(recipe.data.global_batch_size),
        decision,
        _remeasure_peak(the_plan),
    )


def _remeasure_peak(the_plan: Plan) -> Callable[[float], tuple[float | None, str]] | None:
    """`device_peak_flops` again with the rate training reached, for `flops.checked_mfu`; None on a TPU."""
    if the_plan.strategy_kind == "tpu":
        return None

    def remeasure(achieved: float) -> tuple[float | None, str]:
        return flops.device_peak_flops(
            the_plan.strategy_kind,
            None,
            the_plan.replicas,
            precision=the_plan.precision,
            at_least=achieved,
        )

    return remeasure


def train(session: Session, callbacks: list | None = None):
    """Trains from `session.start_step` to the plan's last step (see `tpukit.engines.tensorflow.trainer.fit_with_recovery`)."""
    the_plan, recipe = session.plan, session.plan.recipe
    own = _callbacks(
        _exact_loss(session.model),
        recipe,
        the_plan.output_dir,
        session.throughput,
        the_plan.steps_per_execution,
        the_plan.io_device is not None,
        session.checkpointer.state,
        chief=the_plan.chief,
    )
    return fit_session(session, _train_dataset, _eval_dataset, own + list(callbacks or []))


def fit_session(session, train_dataset, eval_dataset, callbacks: list):
    """`trainer.fit_with_recovery` over a session of either engine: `train_dataset(plan, spec)(position)` and
    `eval_dataset(plan, spec)()` make the engine's pipelines; the moving averages (`train.ema_momentum`) become
    the weights once training is done."""
    the_plan, recipe = session.plan, session.plan.recipe
    if not the_plan.training:
        _use_averages(session.model)
        return trainer.Outcome("done", {}, 0)
    if session.start_step >= the_plan.total_steps:
        logger.info(
            "tpukit: all %d epochs are done already (step %d)",
            recipe.train.epochs,
            session.start_step,
        )
    started = time.time()
    spec = task.spec_of(session.model)
    outcome = trainer.fit_with_recovery(
        session.model,
        train_dataset(the_plan, spec),
        checkpointer=session.checkpointer,
        steps_per_epoch=the_plan.steps_per_epoch,
        epochs=recipe.train.epochs,
        callbacks=callbacks,
        checkpoint_every_steps=recipe.runtime.checkpoint_every_steps,
        checkpoint_max_overhead=recipe.runtime.checkpoint_max_overhead,
        max_nan_retries=recipe.train.max_nan_retries,
        validation_data=eval_dataset(the_plan, spec) if the_plan.evaluating else None,
        validation_steps=the_plan.eval_steps,
        validation_freq=recipe.train.eval_every_epochs,
        verbose=_verbose(recipe.runtime.verbose),
        on_compile_failure=_xla_fallback(session),
    )
    if outcome.status not in trainer.STOPPED.values():
        _use_averages(session.model)
    if session.checkpointer.step > session.start_step:
        logger.info(
            "tpukit: trained steps %d..%d in %.1fs (%s)",
            session.start_step,
            session.checkpointer.step,
            time.time() - started,
            outcome.status,
        )
    return outcome


def _use_averages(model) -> None:
    """With `train.ema_momentum`: the moving averages become the model's weights for evaluation and export. The
    checkpoints keep the trained weights and the averages apart (`keras_private.averages_kept_apart`), so a resume
    goes on from the trained weights, as an uninterrupted run does."""
    optimizer = model.optimizer
    if getattr(optimizer, "use_ema", False):
        optimizer.finalize_variable_values(model.trainable_variables)


def evaluate(session: Session, outcome) -> dict[str, float]:
    """One exact pass over the eval split (the last batch completed with zero-weight examples); {} without
    evaluation."""
    return evaluate_session(session, outcome, _eval_dataset)


def evaluate_session(session, outcome, eval_dataset, callbacks: list = ()) -> dict[str, float]:
    """`evaluate` for a session of either engine: `eval_dataset(plan, spec)()` makes its pipeline; `callbacks`
    run beside the one that reports the exact loss."""
    the_plan = session.plan
    if not the_plan.evaluating or outcome.status in trainer.STOPPED.values():
        return {}

    exact_loss = _exact_loss(session.model)

    def evaluate():
        return session.model.evaluate(
            eval_dataset(the_plan, task.spec_of(session.model))(),  # a fresh, whole pass each time
            steps=the_plan.eval_steps,
            return_dict=True,
            verbose=_verbose(the_plan.recipe.runtime.verbose),
            # the printed `loss` over the real examples
            callbacks=[callbacks_lib.ExactValidationLoss(exact_loss), *callbacks],
        )

    fall_back = _xla_fallback(session)
    try:
        results = evaluate()
    except tf.errors.OpError as error:
        # A run that trains nothing here (already done, or mode eval) meets an XLA it cannot compile in evaluate.
        if fall_back is None or not fall_back(error):
            raise
        results = evaluate()
    # The returned dict too (Keras' CallbackList hands callbacks a copy of the logs).
    return callbacks_lib.with_aliases(
        {k: float(v) for k, v in results.items()}, exact_loss=exact_loss
    )


def _exact_loss(model) -> dict | None:
    """The logged metrics whose weighted sum is the exact loss (`tpukit.task.spec_of`); None: the default."""
    spec = task.spec_of(model)
    return spec.exact_loss if spec is not None and spec.exact_loss else None


def export(session: Session, outcome) -> dict[str, str]:
    """`model.keras` and the SavedModel `serve` endpoint (see `tpukit.engines.tensorflow.export`); {} in eval mode
    or when stopped by a signal."""

    if not session.plan.training or outcome.status in trainer.STOPPED.values():
        return {}
    if not session.plan.chief:
        # Every worker takes part (SavedModel saving may read distributed variables collectively, as in TF's
        # multi-worker guide); only the chief keeps the files.
        with tempfile.TemporaryDirectory(prefix="tpukit-export-") as scratch:
            export_model(
                session.model,
                scratch,
                io_device=session.plan.io_device,
                features=_features(session),
            )
        return {}
    return export_model(
        session.model,
        session.plan.output_dir,
        io_device=session.plan.io_device,
        features=_features(session),
    )


def _features(session: Session):
    spec = task.spec_of(session.model)
    return spec.features if spec is not None else None


def report(session: Session, outcome, evaluation: dict, exported: dict) -> dict:
    """The run's metrics (the runner writes them to `metrics.json`, or `eval_metrics.json` in eval mode)."""

    the_plan, recipe, throughput = session.plan, session.plan.recipe, session.throughput
    step = session.checkpointer.step
    mfu, peak_flops, peak_source = flops.checked_mfu(
        session.flops_per_example,
        throughput.examples_per_second,
        session.peak_flops,
        session.peak_source,
        session.remeasure_peak,
    )
    metrics = {
        "recipe": recipe.path,
        "engine": NAME,
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
            the_plan.corrupt[recipe.data.eval_split].examples(the_plan.eval_examples)
            if recipe.data.eval_split in the_plan.corrupt
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
    if recipe.train.baseline and evaluation:
        metrics["baseline"] = task.score_baseline(recipe, task.spec_of(session.model))
    return metrics


_OUTPUT_FAILURES = (
    "No space left on device",
    "Read-only file system",
    "Permission denied",
    "Disk quota exceeded",
)


def _output_failure(
    the_plan: Plan, error: BaseException, newest_step=checkpoint_lib.newest_checkpoint_step
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
        f"{the_plan.recipe.path}: data.source={the_plan.recipe.data.source!r} has label {label} (beyond the "
        f"labels read before training), but model {the_plan.recipe.model.name!r} outputs {classes} classes. "
        f"Fix: {fix}, or check the labels."
    )


@contextlib.contextmanager
def explained(the_plan: Plan, newest_step=checkpoint_lib.newest_checkpoint_step):
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
    the_plan: Plan, error: BaseException, newest_step=checkpoint_lib.newest_checkpoint_step
) -> Exception | None:
    """The tpukit error that `error` means, or None: a corrupt record or a label beyond the model's classes
    (RecipeError), or an output directory that stopped taking writes (OutputDirError)."""

    if isinstance(error, tf.errors.OpError):
        config = the_plan.recipe.data
        splits = [s for s in (config.train_split, config.eval_split) if s]
        corrupt = data.explain_data_error(error, config.source, splits, config.options)
        if corrupt is not None:
            return RecipeError(f"{the_plan.recipe.path}: data: {corrupt}")
        return _output_failure(the_plan, error, newest_step) or _label_range(the_plan, error)
    if isinstance(error, OSError):
        return _output_failure(the_plan, error, newest_step)
    return None
