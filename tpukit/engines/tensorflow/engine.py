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

import dataclasses
import functools
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable

import keras
import tensorflow as tf

from tpukit import __version__, data, planner, task
from tpukit.engines.keras import callbacks as callbacks_lib
from tpukit.engines.keras import flops, keras_private, trainer
from tpukit.engines.keras import session as session_lib
from tpukit.engines.keras.export import export_outputs, io_device_for
from tpukit.engines.keras.session import Session, decide_steps_per_execution, dtype_policy
from tpukit.engines.tensorflow import checkpoint as checkpoint_lib
from tpukit.engines.tensorflow import cluster, cpu, loop, sparse
from tpukit.engines.tensorflow import flops as tf_flops
from tpukit.engines.tensorflow import strategy as strategy_lib
from tpukit.planner import CheckpointFacts, Hardware, Plan
from tpukit.planner import hardware as hardware_choices
from tpukit.recipe import Recipe, RecipeError

logger = logging.getLogger("tpukit")

NAME = "tensorflow"


def _gpu_compute_capability() -> tuple[int, int] | None:
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    return tf.config.experimental.get_device_details(gpus[0]).get("compute_capability")


def hardware(recipe: Recipe, strategy, output_dir: str) -> Hardware:
    """Connects (`strategy` defaults to `tpukit.connect(runtime.tpu)`, waiting at most
    `runtime.tpu_timeout_seconds` for a TPU and `runtime.workers_timeout_seconds` for a cluster's workers) and
    returns what the planner needs. A malformed $TF_CONFIG is a `RecipeError` (bad input: exit 2)."""
    connection = planner.connection(recipe)
    if strategy is None:
        try:
            strategy = strategy_lib.connect(
                connection.tpu,
                tpu_timeout_seconds=connection.tpu_timeout_seconds,
                workers_timeout_seconds=connection.workers_timeout_seconds,
            )
        except strategy_lib.TFConfigError as error:
            raise RecipeError(str(error)) from None
    kind = strategy_lib.kind_of(strategy)
    cpu.tune(kind)  # the CPU-only tuning, where the devices are CPUs
    worker = strategy_lib.worker_subdir(strategy)
    task_dir = planner.worker_output_dir(worker, output_dir)
    if worker:
        logger.info(
            "tpukit: this is multi-worker task %s (not the chief): its outputs go to %s",
            worker,
            task_dir,
        )
    value = connection.steps_per_execution
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
    from tpukit.engines.keras.files import GFiles

    return GFiles()


def checkpoints(checkpoint_dir: str, checkpoint: str | None) -> CheckpointFacts:
    """The newest checkpoint's step in `checkpoint_dir`, and whether `checkpoint` (a path) exists."""
    step = checkpoint_lib.newest_checkpoint_step(checkpoint_dir)
    if not step and (
        tf.io.gfile.glob(os.path.join(checkpoint_dir, "ckpt-*.npz"))
        or tf.io.gfile.glob(os.path.join(checkpoint_dir, "ckpt_*"))  # the jax engine's Orbax steps
    ):
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
    with strategy.scope(), keras_private.fresh_names():  # the names of a new process, rerun or not
        return task.build_model(
            recipe, total_steps, jit, steps_per_execution, resuming=resuming, labels=labels
        )


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
    if the_plan.settings.loop == "tpukit":
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
        and session.plan.settings.jit_compile == "auto"
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
    cluster.check_same_recipe(the_plan.strategy, the_plan.settings.keys, recipe.path, __version__)
    keras.utils.set_random_seed(the_plan.settings.seed)
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
    flops_per_example = tf_flops.model_flops_per_example(model)
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
    # dense where the step is compiled with XLA (see sparse.py). train.combine_repeated_ids: false keeps Keras'.
    if the_plan.settings.combine_repeated_ids:
        sparse.combine_repeated_ids(
            model.optimizer, dense=the_plan.jit_compile is True or the_plan.strategy_kind == "tpu"
        )
        sparse.watch_sparse_gradients(model.optimizer, _repeated_ids_line())
    the_plan, decision = decide_steps_per_execution(the_plan, model, flops_per_example, peak_flops)
    # Keras 3.15's own train function fails with steps_per_execution > 1 on 2+ Mirrored replicas
    # (keras-team/keras#19246) and on every MultiWorkerMirroredStrategy; see loop.py.
    loop.use_multi_step_loop(model, the_plan.settings.loop)
    checkpointer = checkpoint_lib.Checkpointer(
        the_plan.checkpoint_dir,
        model,
        model.optimizer,
        the_plan.settings.max_checkpoints_to_keep,
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
        callbacks_lib.Throughput(the_plan.global_batch_size),
        decision,
        _remeasure_peak(the_plan),
    )


def _repeated_ids_line() -> Callable[[list[str]], None]:
    """`sparse.combine_repeated_ids`' `on_sparse`: the plan line, once, saying that this model trains differently
    from plain Keras-TF (where a row is looked up twice in a batch), why, and how to turn it off. Called when the
    train step is traced: only then are the sparse gradients known (an Embedding tied to an output matmul has a
    dense one, and no difference)."""
    said = threading.Lock()

    def announce(paths: list[str]) -> None:
        if not said.acquire(blocking=False):
            return  # said already (another replica, the inner optimizer, a retrace)
        shown = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
        logger.info(
            "tpukit plan: repeated ids summed before the optimizer for %d variable(s) with sparse gradients (%s): "
            "one update per row per step, as the optimizer's definition and the jax engine say, where plain "
            "Keras-TF updates a row once per lookup in the batch (tensorflow/tensorflow#28090), so this model "
            "trains differently from plain Keras-TF fit. To reproduce plain Keras-TF: --set "
            "train.combine_repeated_ids=false (tpukit.fit(combine_repeated_ids=False))",
            len(paths),
            shown,
        )

    return announce


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
    """Trains from `session.start_step` to the plan's last step (see `tpukit.engines.keras.trainer.fit_with_recovery`)."""
    the_plan = session.plan
    own = session_lib.standard_callbacks(
        session_lib.exact_loss_terms(session.model),
        the_plan.settings,
        the_plan.output_dir,
        session.throughput,
        the_plan.steps_per_execution,
        the_plan.io_device is not None,
        session.checkpointer.state,
        chief=the_plan.chief,
    )
    return session_lib.fit_session(
        session,
        _train_dataset,
        _eval_dataset,
        own + list(callbacks or []),
        on_compile_failure=_xla_fallback(session),
    )


def evaluate(session: Session, outcome) -> dict[str, float]:
    """One exact pass over the eval split (the last batch completed with zero-weight examples); {} without
    evaluation."""
    return session_lib.evaluate_session(
        session, outcome, _eval_dataset, fall_back=_xla_fallback(session)
    )


def export(session: Session, outcome) -> dict[str, str]:
    """`model.keras` (`model.weights.h5` for a model without a config) and the SavedModel `serve` endpoint (see
    `tpukit.engines.keras.export`); {} in eval mode or when stopped by a signal. An output that fails is recorded
    on the session (`session.exporting`): the run fails once its metrics are written."""

    if not session.plan.training or outcome.status in trainer.STOPPED.values():
        return {}
    if not session.plan.chief:
        # Every worker takes part (SavedModel saving may read distributed variables collectively, as in TF's
        # multi-worker guide); only the chief keeps the files.
        with tempfile.TemporaryDirectory(prefix="tpukit-export-") as scratch:
            session_lib.exporting(
                session,
                lambda: export_outputs(
                    session.model,
                    scratch,
                    io_device=session.plan.io_device,
                    features=session_lib.features(session),
                ),
            )
        return {}
    return session_lib.exporting(
        session,
        lambda: export_outputs(
            session.model,
            session.plan.output_dir,
            io_device=session.plan.io_device,
            features=session_lib.features(session),
        ),
    )


def report(session: Session, outcome, evaluation: dict, exported: dict) -> dict:
    """The run's metrics (the runner writes them to `metrics.json`, or `eval_metrics.json` in eval mode), with what
    the CPU tuning did (`cpu.report`)."""
    return {**session_lib.report(session, outcome, evaluation, exported, NAME), **cpu.report()}


def explained(the_plan: Plan):
    """Errors met while building, training and evaluating, as tpukit's (`tpukit.engines.keras.session.explained`)."""
    return session_lib.explained(the_plan, checkpoint_lib.newest_checkpoint_step)


__all__ = [
    "NAME",
    "build",
    "checkpoints",
    "dtype_policy",
    "evaluate",
    "explained",
    "export",
    "hardware",
    "remote_files",
    "report",
    "train",
]
