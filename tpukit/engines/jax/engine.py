"""The jax engine: a `Plan` executed with Keras' JAX trainer and `keras.distribution`.

    hardware = engine.hardware(recipe, None, output_dir)   # devices, processes, the mesh's sizes
    session = engine.build(the_plan)     # the model, its weights placed on the mesh, restored if resuming
    outcome = engine.train(session)      # fit with checkpoints, SIGTERM, NaN rollback (the shared trainer)
    evaluation = engine.evaluate(session, outcome)
    exported = engine.export(session, outcome)     # model.keras, and a SavedModel exported by the TF backend
    metrics = engine.report(session, outcome, evaluation, exported)

Input: every process reads its own shard of the data (the same tf.data pipelines as the TensorFlow engine, one
input pipeline per process, `InputContext(process_count, process_index)`), and Keras assembles the global batch with
`jax.make_array_from_process_local_data`; Keras' own multi-process dataset sharding (every host reads all of the
data and keeps 1/N) is off (`auto_shard_dataset=False`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from typing import Any

import jax
import keras
import tensorflow as tf

from tpukit import planner, task
from tpukit.engines.jax import checkpoint as checkpoint_lib
from tpukit.engines.jax import compat, compilation_cache, cpu, peers
from tpukit.engines.jax.saved_model import SavedModelExport
from tpukit.engines.keras import callbacks as callbacks_lib
from tpukit.engines.keras import export as export_lib
from tpukit.engines.keras import flops, keras_private, trainer
from tpukit.engines.keras import session as session_lib
from tpukit.engines.keras.checkpoint import CheckpointCorruptError, CheckpointMismatchError
from tpukit.engines.keras.export import (
    SAVED_MODEL_DIRNAME,
    SAVED_MODEL_WHAT,
    ExportWriteError,
    save_keras,
)
from tpukit.engines.keras.session import dtype_policy
from tpukit.logs import first_four, plural
from tpukit.models.layouts import DEFAULT_LAYOUTS, KERAS_HUB_DECODER
from tpukit.planner import CheckpointFacts, Hardware, Plan, RunSettings
from tpukit.planner.layouts import Layouts
from tpukit.recipe import Recipe, RecipeError

logger = logging.getLogger("tpukit")

NAME = "jax"
AXES = ("data", "model")


@dataclasses.dataclass
class Mesh:
    """The plan's `strategy` on this engine: the devices and the mesh's sizes (the distribution is made in
    `build`, where the model's variables are known)."""

    data: int
    model: int
    devices: list = dataclasses.field(repr=False)
    processes: int = 1
    process_index: int = 0
    mesh_from: str | None = (
        None  # what sized it when not runtime.mesh (a Keras LayoutMap's DeviceMesh)
    )

    @property
    def sizes(self) -> dict[str, int]:
        return {"data": self.data, "model": self.model}


def _initialize(recipe: Recipe) -> None:
    """Multi-host: `keras.distribution.initialize()` once, from the TPU environment, or from
    $TPUKIT_COORDINATOR_ADDRESS, $TPUKIT_NUM_PROCESSES and $TPUKIT_PROCESS_ID (a cluster of CPU/GPU hosts)."""
    if jax.distributed.is_initialized() if hasattr(jax.distributed, "is_initialized") else False:
        return
    address = os.environ.get("TPUKIT_COORDINATOR_ADDRESS")
    if address:
        try:
            count = int(os.environ["TPUKIT_NUM_PROCESSES"])
            index = int(os.environ["TPUKIT_PROCESS_ID"])
        except (KeyError, ValueError):
            raise RecipeError(
                f"TPUKIT_COORDINATOR_ADDRESS={address!r} needs TPUKIT_NUM_PROCESSES and TPUKIT_PROCESS_ID (integers); "
                f"received {os.environ.get('TPUKIT_NUM_PROCESSES')!r} and {os.environ.get('TPUKIT_PROCESS_ID')!r}. "
                "Fix: set all three on every process (the same address and count, ids 0..count-1)."
            ) from None
        logger.info("tpukit: joining %d processes at %s as process %d", count, address, index)
        # keras.distribution.initialize's work, with a lost process named instead of a C++ abort.
        peers.join(address, count, index)
    elif os.environ.get("TPU_WORKER_HOSTNAMES", "").count(",") >= 1:
        # A multi-host Cloud TPU slice: JAX finds the coordinator in the TPU environment.
        keras.distribution.initialize()


def _kind(device) -> str:
    return {"tpu": "jax_tpu", "gpu": "jax_gpu", "cuda": "jax_gpu", "rocm": "jax_gpu"}.get(
        device.platform, "jax_cpu"
    )


def hardware(recipe: Recipe, strategy, output_dir: str) -> Hardware:
    """The devices and the mesh `runtime.mesh` asks for: `data` x `model` devices (`data: auto`: all the devices
    not on the model axis). `strategy`: a `Mesh` to use instead (tests). Turns on the persistent compilation
    cache first (`compilation_cache`); applies the CPU tuning where the devices are CPUs (`cpu.tune`)."""
    compilation_cache.use_compilation_cache()
    if strategy is None:
        _initialize(recipe)
        devices = jax.devices()
        connection = planner.connection(recipe)
        requested = connection.mesh
        model = requested["model"]
        if requested["data"] == "auto" and len(devices) % model:
            raise RecipeError(
                f"{recipe.path}: runtime.mesh.model={model} does not divide the {len(devices)} devices here, so "
                f"data: auto cannot use them all. Fix: --set runtime.mesh.model to a divisor of {len(devices)}, or "
                "set runtime.mesh.data too (a mesh smaller than the machine)."
            )
        data_size = len(devices) // model if requested["data"] == "auto" else requested["data"]
        if data_size * model > len(devices):
            raise RecipeError(
                f"{recipe.path}: runtime.mesh {{data: {data_size}, model: {model}}} needs {data_size * model} "
                f"devices; this machine has {len(devices)} ({devices[0].platform}). Fix: --set runtime.mesh.data=auto, "
                "or a smaller mesh (on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=8 makes 8 devices)."
            )
        if data_size * model < len(devices):
            if jax.process_count() > 1:
                raise RecipeError(
                    f"{recipe.path}: runtime.mesh {{data: {data_size}, model: {model}}} uses {data_size * model} of "
                    f"the {len(devices)} devices of {jax.process_count()} processes; every process must take part. "
                    "Fix: --set runtime.mesh.data=auto."
                )
            logger.warning(
                "tpukit: runtime.mesh {data: %d, model: %d} trains on %d of the %d devices here",
                data_size,
                model,
                data_size * model,
                len(devices),
            )
        strategy = Mesh(
            data_size,
            model,
            devices[: data_size * model],
            jax.process_count(),
            jax.process_index(),
            connection.mesh_from,
        )
        logger.info("%s", describe(strategy, requested))
    cpu.tune(strategy.devices)
    worker = f"worker{strategy.process_index}" if strategy.process_index else None
    device = strategy.devices[0]
    capability = getattr(device, "compute_capability", None)
    return Hardware(
        engine=NAME,
        kind=_kind(device),
        replicas=strategy.data,
        input_pipelines=strategy.processes,
        worker=worker,
        gpu_compute_capability=tuple(int(p) for p in str(capability).split(".")[:2])
        if capability
        else None,
        handle=strategy,
        mesh=strategy.sizes,
        shared_checkpoints=True,
    )


def describe(mesh: Mesh, requested: dict | None = None) -> str:
    """tpukit's first line on this engine (the TensorFlow engine's is `strategy.describe`): the engine, the replicas
    (the mesh's data axis), the devices in plain words, the mesh and what asked for it, the JAX and Keras versions:

        tpukit: engine jax, 2 replicas on 2 CPU devices (cpu:0, cpu:1), mesh data 2 x model 1 because
        runtime.mesh is {data: auto, model: 1}; JAX 0.10.2, Keras 3.15.1
    """
    kinds: dict[str, int] = {}
    for device in mesh.devices:
        # A device_kind reads "TPU v4" or "NVIDIA H100 80GB HBM3"; a CPU's is "cpu".
        kind = "CPU" if device.platform == "cpu" else device.device_kind
        kinds[kind] = kinds.get(kind, 0) + 1
    shown = first_four([str(device) for device in mesh.devices])
    on = " and ".join(plural(n, f"{kind} device") for kind, n in kinds.items())
    processes = f" in {mesh.processes} processes" if mesh.processes > 1 else ""
    asked = (
        f" as {mesh.mesh_from} asks"
        if requested and mesh.mesh_from
        else f" because runtime.mesh is {{data: {requested['data']}, model: {requested['model']}}}"
        if requested
        else ""
    )
    return (
        f"tpukit: engine jax, {plural(mesh.data, 'replica')} on {on} ({shown}){processes}, mesh data "
        f"{mesh.data} x model {mesh.model}{asked}; JAX {jax.__version__}, Keras {keras.__version__}"
    )


def remote_files():
    """`tpukit.rundir`'s file operations for gs:// and other `scheme://` output directories."""
    from tpukit.engines.keras.files import GFiles

    return GFiles()


def checkpoints(checkpoint_dir: str, checkpoint: str | None) -> CheckpointFacts:
    """The newest committed checkpoint's step; a directory of the TensorFlow engine's checkpoints, or no Orbax to
    write them with, is a RecipeError."""
    missing = checkpoint_lib.orbax_missing()
    if missing:
        raise RecipeError(missing)
    step = checkpoint_lib.newest_checkpoint_step(checkpoint_dir)
    if not step and tf.io.gfile.glob(os.path.join(checkpoint_dir, "ckpt-*.index")):
        raise RecipeError(
            f"{checkpoint_dir} holds checkpoints of the tensorflow engine, which the jax engine cannot read. Fix: "
            "resume it with --set runtime.engine=tensorflow, or pass another --output_dir (model.keras, exported "
            "by a finished run, can start a jax run: --set model.init_weights=<dir>/model.keras)."
        )
    requested = bool(checkpoint) and checkpoint_lib.requested_path(checkpoint) is not None
    return CheckpointFacts(
        newest_step=step,
        requested_exists=requested,
        expected=f"a step directory named {checkpoint_lib.PREFIX}_<step>, or a ckpt-<step>.npz of tpukit before "
        "issue 39",
        example=f"{checkpoint_lib.PREFIX}_1000",
    )


class _Distribution(keras.distribution.ModelParallel):
    """`ModelParallel` whose variable layouts come from a checked `tpukit.planner.layouts.Layouts`, and whose
    Keras `LayoutMap` holds the same entries, so that Keras' own `get_tensor_layout` lays out the layer outputs
    (activations) that an entry such as `d2/output` names, as plain Keras' `ModelParallel` does."""

    def __init__(self, device_mesh, layouts: Layouts, multi_process: bool):
        layout_map = keras.distribution.LayoutMap(device_mesh)
        for pattern, axes in layouts.layout.items():
            layout_map[pattern] = tuple(axes)
        super().__init__(
            layout_map=layout_map,
            batch_dim_name="data",
            auto_shard_dataset=False,  # each process reads its own shard (see the module docstring)
        )
        self.layouts = layouts
        self._multi_process = multi_process

    def get_variable_layout(self, variable):
        if getattr(variable, "_layout", None) is not None:  # an optimizer slot: its weight's layout
            return variable._layout
        axes = self.layouts.axes_for(variable.path, tuple(variable.shape))
        return keras.distribution.TensorLayout(list(axes), self.device_mesh)

    def get_tensor_layout(self, path):
        layout = super().get_tensor_layout(path)  # Keras' LayoutMap lookup: `<layer path>/output`
        if layout is not None:
            self.layouts.output_seen(path)
        return layout


def check_layouts(layouts: Layouts, model) -> None:
    """Every entry of the layout matches a variable of `model` or a layer's output (`Layouts.check_matched`)."""
    layouts.check_matched([v.path for v in model.weights], compat.layer_paths(model))


def _layouts(settings: RunSettings, mesh: Mesh) -> Layouts:
    if settings.layout is not None:
        return Layouts(settings.layout, mesh.sizes, "runtime.layout", mesh.mesh_from)
    if settings.model_name == HUB_MODEL:
        return _hub_layouts(settings, mesh)
    default = DEFAULT_LAYOUTS.get(settings.model_name)
    if default is None:
        if mesh.model > 1:
            logger.warning(
                "tpukit: model %r has no default layout and runtime.layout is not set: its weights stay whole on "
                "every device (the model axis only repeats the computation). Fix: set runtime.layout.",
                settings.model_name,
            )
        return Layouts({}, mesh.sizes, "runtime.layout")
    return Layouts(default, mesh.sizes, f"the default layout of model {settings.model_name!r}")


# The KerasHub causal LM builder (`tpukit.models.hub`), whose default layout is its family's.
HUB_MODEL = "keras_hub_causal_lm"


def _hub_layouts(settings: RunSettings, mesh: Mesh) -> Layouts:
    """The default layout of a KerasHub preset: its family's `get_layout_map` (e.g. `GemmaBackbone.get_layout_map`,
    which also splits weights over the data axis, FSDP-like) called with tpukit's mesh, else tpukit's rules for
    KerasHub decoder blocks (`KERAS_HUB_DECODER`). Lenient (`Layouts(lenient=True)`): a dimension its axis does not
    divide, such as 2 key/value heads on a model axis of 4, stays whole with a plan line instead of failing as
    plain KerasHub does (`IndivisibleError`). Logs which layout was used."""
    from tpukit.models import hub
    from tpukit.recipe.layout_maps import from_builder

    preset = (settings.keys.get("model arguments") or {}).get("preset")
    builder = hub.layout_map_builder(preset) if isinstance(preset, str) and preset else None
    sizes = f"mesh data {mesh.data} x model {mesh.model}"
    if builder is not None:
        source = f"{getattr(builder, '__qualname__', type(builder).__name__)} (KerasHub)"
        layout, call = from_builder(
            builder, mesh.sizes, f"the default layout of {HUB_MODEL} ({source})"
        )
        how = f"called as {call}"
    else:
        source = (
            "tpukit's rules for KerasHub decoder blocks (tpukit.models.layouts.KERAS_HUB_DECODER)"
        )
        layout = KERAS_HUB_DECODER
        family = hub.backbone_class(preset) if isinstance(preset, str) and preset else None
        how = f"{getattr(family, '__name__', 'the backbone')} has no get_layout_map"
    logger.info(
        "tpukit plan: layout: %s for preset %s, %d entries on %s (%s); a dimension an axis does not divide "
        "stays whole; runtime.layout replaces this layout",
        source,
        preset,
        len(layout),
        sizes,
        how,
    )
    return Layouts(layout, mesh.sizes, source, mesh.mesh_from, lenient=True)


def _distribution(settings: RunSettings, mesh: Mesh) -> _Distribution:
    device_mesh = keras.distribution.DeviceMesh(
        (mesh.data, mesh.model), list(AXES), devices=mesh.devices
    )
    return _Distribution(device_mesh, _layouts(settings, mesh), mesh.processes > 1)


def _input_context(the_plan: Plan) -> tf.distribute.InputContext:
    mesh = the_plan.strategy
    # One pipeline per process, each yielding this process's share of the global batch.
    return tf.distribute.InputContext(mesh.processes, mesh.process_index, mesh.processes)


def _train_dataset(the_plan: Plan, spec=None):
    train_fn, _ = task.input_fns(
        the_plan.recipe, the_plan.eval_examples, the_plan.steps_per_epoch, spec
    )
    context = _input_context(the_plan)
    return lambda position: train_fn(context, skip_steps=position)


def _eval_dataset(the_plan: Plan, spec=None):
    _, eval_fn = task.input_fns(
        the_plan.recipe, the_plan.eval_examples, the_plan.steps_per_epoch, spec
    )
    context = _input_context(the_plan)
    return lambda: eval_fn(context)


@dataclasses.dataclass
class Session(session_lib.Session):
    """The shared session, with the mesh's distribution, the variables split on the model axis and the
    SavedModel's exporting process."""

    distribution: Any = None
    sharded: dict = dataclasses.field(default_factory=dict)
    saved_model: SavedModelExport | None = None  # the exporting process, started by `build` on CPUs


def _compiled(
    the_plan: Plan, distribution, steps_per_execution: int, total_steps: int, resuming=False
):
    recipe = the_plan.recipe
    # One device in one process: built as plain Keras builds it (`_needs_mesh`), no layouts to place; the values
    # are the same either way.
    mesh = _needs_mesh(the_plan.strategy)
    # Named as in a new process (`keras_private.fresh_names`): the checkpoint matches variables by path.
    # Weights read from files (a KerasHub preset, model.init_weights) go from the host straight to their shards.
    with (
        distribution.scope() if mesh else contextlib.nullcontext(),
        keras_private.fresh_names(),
        compat.sharded_assign(),
    ):
        try:
            model = task.build_model(
                recipe,
                total_steps,
                the_plan.jit_compile,
                steps_per_execution,
                resuming=resuming,
                labels=the_plan.labels,
            )
        except RecipeError:
            raise
        except ValueError as error:  # builder or optimizer arguments that do not fit together
            raise RecipeError(f"{recipe.path}: {error}") from None
    if not mesh:  # the layout is checked against every variable all the same
        for variable in model.weights:
            distribution.layouts.axes_for(variable.path, tuple(variable.shape))
    check_layouts(distribution.layouts, model)
    for line in distribution.layouts.leniency_lines():  # what a default layout left whole, and why
        logger.info("tpukit plan: %s", line)
    return model


def _check_shared(the_plan: Plan) -> None:
    """Every process of a multi-host run must see the one checkpoint directory they all write into."""
    if the_plan.strategy.processes == 1:
        return
    unshared = checkpoint_lib.unshared_processes(the_plan.checkpoint_dir)
    if unshared:
        raise RecipeError(
            f"process(es) {', '.join(map(str, unshared))} of {the_plan.strategy.processes} cannot see the checkpoint "
            f"directory {the_plan.checkpoint_dir} that process 0 writes: on the jax engine every process writes "
            "its own shards into one directory, so each host's own disk cannot hold the checkpoints. Fix: pass an "
            "--output_dir that every host shares (a gs:// bucket on a TPU slice, or a shared file system), the "
            "same on every process."
        )


def _restore(the_plan: Plan, checkpointer) -> int:
    # Every process restores the same step (`Checkpointer.restore` agrees on it before assigning anything).
    try:
        step = checkpointer.restore(the_plan.checkpoint if the_plan.mode == "eval" else None)
    except (CheckpointMismatchError, CheckpointCorruptError) as error:
        raise RecipeError(str(error)) from None
    if the_plan.training and step != the_plan.resume_step:
        planner.check_resume(
            the_plan.recipe,
            the_plan.steps_per_epoch,
            the_plan.total_steps,
            the_plan.steps_per_execution,
            step,
        )
    return step


def build(the_plan: Plan) -> Session:
    """Seeds, builds and compiles the model with its weights placed on the mesh (the layout checked: every entry
    matches a variable, every split divides), decides `steps_per_execution: auto` from the model's FLOPs and the
    devices' peak (`session.decide_steps_per_execution`: nothing is trained or timed, so the model is built once
    and initialized as with a fixed value), and restores the newest readable checkpoint. Call it under
    `dtype_policy`."""
    # The SavedModel's exporting process imports while this one builds and compiles (`saved_model`).
    saved_model = _start_saved_model_export(the_plan)
    try:
        return _build(the_plan, saved_model)
    except BaseException:
        _close_saved_model_export(saved_model)
        raise


def _build(the_plan: Plan, saved_model: SavedModelExport | None) -> Session:
    keras.utils.set_random_seed(the_plan.settings.seed)
    distribution = _distribution(the_plan.settings, the_plan.strategy)
    auto = the_plan.steps_per_execution == "auto"
    model = _compiled(
        the_plan,
        distribution,
        1 if auto else the_plan.steps_per_execution,
        the_plan.total_steps,
        resuming=the_plan.resume_step > 0,
    )
    flops_per_example = _flops_per_example(model)
    peak_flops, peak_source = (None, "")
    if the_plan.training:
        peak_flops, peak_source = _peak_flops(the_plan)
        logger.info("tpukit: %s", peak_source)
    the_plan, decision = session_lib.decide_steps_per_execution(
        the_plan, model, flops_per_example, peak_flops
    )
    mesh = the_plan.strategy
    # fit, evaluate and save read it; `explained` restores. One device in one process: none (see `_needs_mesh`).
    keras.distribution.set_distribution(distribution if _needs_mesh(mesh) else None)
    sharded = distribution.layouts.sharded()
    outputs = distribution.layouts.outputs()
    logger.info(
        "tpukit plan: mesh data %d x model %d over %d %s device(s) in %d process(es); %s%s",
        mesh.data,
        mesh.model,
        len(mesh.devices),
        mesh.devices[0].platform,
        mesh.processes,
        f"{len(sharded)} variable(s) split on the mesh ({distribution.layouts.source}): "
        + ", ".join(f"{p} {a}" for p, a in list(sharded.items())[:6])
        + (", ..." if len(sharded) > 6 else "")
        if sharded
        else "every variable whole on every device",
        f"; layer outputs laid out: {', '.join(f'{p} {a}' for p, a in outputs.items())}"
        if outputs
        else "",
    )
    _check_shared(the_plan)
    checkpointer = checkpoint_lib.Checkpointer(
        the_plan.checkpoint_dir, model, model.optimizer, the_plan.settings.max_checkpoints_to_keep
    )
    start_step = _restore(the_plan, checkpointer)
    return Session(
        plan=the_plan,
        model=model,
        checkpointer=checkpointer,
        start_step=start_step,
        flops_per_example=flops_per_example,
        peak_flops=peak_flops,
        peak_source=peak_source,
        throughput=callbacks_lib.Throughput(the_plan.global_batch_size),
        decision=decision,
        remeasure_peak=None
        if the_plan.strategy_kind == "jax_tpu"
        else functools.partial(_peak_flops, the_plan),
        distribution=distribution,
        sharded=sharded,
        saved_model=saved_model,
    )


# The exporting processes started by `build` and not closed yet: `explained` ends those of a run that stopped on an
# error before `export` (when this process is killed, the kernel ends them: `saved_model._end_with_parent`).
_STARTED_EXPORTS: list[SavedModelExport] = []


def _start_saved_model_export(the_plan: Plan) -> SavedModelExport | None:
    """The process that will export the SavedModel, started now (its imports overlap the build and the first
    step's compilation): on the chief of a training run on CPUs only (`cpu.export_starts_early`); None where nothing
    will be exported or `export` starts it."""
    if (
        not the_plan.training
        or not the_plan.chief
        or not cpu.export_starts_early(the_plan.strategy_kind)
    ):
        return None
    try:
        started = SavedModelExport.start()
    except OSError as error:  # `export` starts one then, and says why if it fails again
        logger.info("tpukit: the SavedModel export process did not start early (%s)", error)
        return None
    _STARTED_EXPORTS.append(started)
    return started


def _close_saved_model_export(export: SavedModelExport | None) -> None:
    if export is not None:
        export.close()
        if export in _STARTED_EXPORTS:
            _STARTED_EXPORTS.remove(export)


def _needs_mesh(mesh: Mesh) -> bool:
    """Whether fit and evaluate run under the distribution: not on one device in one process, where Keras' JAX
    trainer then runs as plain Keras does (no `out_shardings`, each batch handed to the step as it is). Under a
    distribution of one device Keras 3.15 recompiled the train step twice: the variables stay uncommitted arrays
    (`distribute_tensor` finds them equivalent to the one-device layout and leaves them), while the step's
    outputs are committed to the layout's sharding, so the second execution of a fit, and the first of every
    epoch after it (its reset metrics uncommitted again), met new input shardings. The variables keep the layouts
    they were built with either way: the model, its initial values and the checkpoints are the same."""
    return len(mesh.devices) > 1 or mesh.processes > 1


def train(session: Session, callbacks: list | None = None):
    """Trains from `session.start_step` to the plan's last step with the trainer both engines share. A process of
    the run lost meanwhile ends this one with a message (`peers`), not a collective's traceback."""
    the_plan = session.plan
    peers.watch_checkpoints(
        functools.partial(checkpoint_lib.newest_checkpoint_step, the_plan.checkpoint_dir),
        the_plan.checkpoint_dir,
    )
    progress = peers.Progress(session.start_step, the_plan.steps_per_execution)
    try:
        outcome = session_lib.fit_session(
            session,
            _train_dataset,
            _eval_dataset,
            _callbacks(session) + [progress] + list(callbacks or []),
            saved_model_from_keras=True,  # `export`: a TensorFlow-backend process loads model.keras
        )
    except Exception as error:
        peers.check_lost(error)  # returns unless a process was lost
        with contextlib.suppress(Exception):  # the error that stopped training is the one to report
            session.checkpointer.close()
        raise
    session.checkpointer.close()  # Orbax's threads end with training (the last save is committed already)
    return outcome


class InOrder(keras.callbacks.Callback):
    """Keeps Keras from handing batch-end work to a thread pool. Keras 3.15's `CallbackList` converts each
    batch's logs on a `ThreadPoolExecutor` when no callback overrides the batch-end hook
    (`keras/src/callbacks/callback_list.py`, `_configure_async_dispatch`); on a mesh those conversions are
    multi-device programs, and running them beside the main thread's (the metrics' results at the end of an
    evaluation) deadlocked XLA's CPU collectives here ("Termination timeout for all reduce ... only 3 arrived",
    then SIGABRT, in the 400-step textfiles_char_lm on a 2x4 mesh). Overriding the hooks keeps every program on the
    main thread, in one order, as every host must launch them. Public API only; no upstream issue found."""

    def on_train_batch_end(self, batch, logs=None):
        pass

    def on_test_batch_end(self, batch, logs=None):
        pass

    def on_predict_batch_end(self, batch, logs=None):
        pass


def _callbacks(session: Session) -> list:
    """The shared callbacks (`session.standard_callbacks`), run by every process: on several hosts each JAX computation (a
    learning-rate read for TensorBoard included) is one program that all of them must run, so no callback may be
    the chief's alone. Each process writes its summaries into its own task directory (`worker1/logs`, ...)."""
    the_plan = session.plan
    result = session_lib.standard_callbacks(
        session_lib.exact_loss_terms(session.model),
        the_plan.settings,
        the_plan.output_dir,
        session.throughput,
        the_plan.steps_per_execution,
        False,
        session.checkpointer.state,
        chief=True,
    )
    result.append(InOrder())
    if session.saved_model is not None:
        result.append(cpu.ExportWaitsWhileTraining(session.saved_model))
    if the_plan.strategy.processes > 1 and the_plan.settings.export_best_by:
        logger.warning(
            "tpukit: train.export_best_by is not supported on a multi-host jax run yet (best.keras would need every "
            "host's shards at each epoch end); the final model.keras is exported"
        )
        result = [c for c in result if not isinstance(c, callbacks_lib.ResumableModelCheckpoint)]
    return result


def evaluate(session: Session, outcome) -> dict[str, float]:
    """One exact pass over the eval split (the last batch completed with zero-weight examples); {} without
    evaluation."""
    return session_lib.evaluate_session(session, outcome, _eval_dataset, [InOrder()])


def export(session: Session, outcome) -> dict[str, str]:
    """`model.keras` (written here, whole: a temporary name, then a rename; `model.weights.h5` for a model without
    a config) and the SavedModel `serve` endpoint, which a TensorFlow-backend process exports from that file
    (`saved_model`: on CPUs started by `build`, so it has imported TensorFlow while this one trained, elsewhere
    started here; it runs `tpukit.engines.keras.export`'s command): TF 2.21 cannot load SavedModels that
    jax >= 0.11 exports through jax2tf. {} in eval mode or when stopped by a signal. An output that fails (a full
    disk, a model TensorFlow cannot export) is recorded on the session (`session.exporting`): the run fails once
    its metrics are written."""
    try:
        return session_lib.exporting(session, lambda: _export(session, outcome))
    finally:
        _close_saved_model_export(session.saved_model)


def _export(session: Session, outcome) -> dict[str, str]:
    the_plan = session.plan
    if not the_plan.training or outcome.status in trainer.STOPPED.values():
        return {}
    # The KerasHub task a plain model was made from; a model without a config (found before training, in
    # `session.outputs_skipped`) has its weights saved instead.
    model = export_lib.exported_model(session.model)
    weights_only = "keras" in session.outputs_skipped
    name = "weights" if weights_only else "keras"
    try:
        if the_plan.strategy.processes > 1:
            model = _host_copy(model)  # every process takes part in gathering the shards
    except Exception as error:  # noqa: BLE001 - a missing output: the run fails after its report
        raise export_lib.OutputsMissing({}, {name: error}) from error
    if not the_plan.chief:
        return {}
    # Written whole (a temporary name, then a rename); a full disk raises ExportWriteError.
    with _without_distribution() if the_plan.strategy.processes > 1 else contextlib.nullcontext():
        try:
            if weights_only:
                return {"weights": export_lib.save_weights(model, the_plan.output_dir)}
            keras_path = save_keras(model, the_plan.output_dir)
        except Exception as error:  # noqa: BLE001 - a missing output: the run fails after its report
            missing = {name: error}
            if not weights_only and "saved_model" not in session.outputs_skipped:
                missing["saved_model"] = RuntimeError(
                    "it is made from model.keras, which is missing"
                )
            raise export_lib.OutputsMissing({}, missing) from error
    exported = {"keras": keras_path}
    if "saved_model" not in session.outputs_skipped:  # else warned of before training
        exported["saved_model"] = _export_saved_model(session, keras_path, exported)
    return exported


def _export_saved_model(session: Session, keras_path: str, exported: dict) -> str:
    """The SavedModel of `keras_path`, exported by a TensorFlow-backend process; its path. Raises OutputsMissing
    (with `exported`, what was written) when that process fails."""
    output_dir = session.plan.output_dir
    saved_model = os.path.join(output_dir, SAVED_MODEL_DIRNAME)
    started = time.time()
    exporting = session.saved_model
    if exporting is None:
        exporting = session.saved_model = SavedModelExport.start()
    failure = exporting.run(keras_path, output_dir)
    if failure is not None and export_lib.LOAD_MARK in failure:
        # The file written is what fails (its config does not rebuild with its weights): model.keras is missing.
        why = failure.split(export_lib.LOAD_MARK, 1)[1]
        raise export_lib.OutputsMissing(
            {},
            {
                "keras": export_lib.BrokenOutput(
                    f"the model.keras written at {keras_path} does not load in another process ({why})"
                ),
                "saved_model": RuntimeError("it is made from model.keras, which does not load"),
            },
        )
    if failure is not None:
        unwritten = ExportWriteError.from_line(failure, SAVED_MODEL_WHAT, saved_model)
        if (
            unwritten is None
            and "Could not locate class" in failure
            and "could not import" not in failure
        ):
            failure += (
                ". Fix: define the model's own layers in a module of yours that the script imports (the "
                "exporting process imports it; it cannot import the script you run), or train with "
                "runtime.engine=tensorflow, which exports in the training process"
            )
        cause = unwritten or RuntimeError(
            f"a TensorFlow-backend process exports it from model.keras, and it failed: {failure}"
        )
        raise export_lib.OutputsMissing(exported, {"saved_model": cause})
    logger.info(
        "tpukit: exported %s with the TensorFlow backend in %.1fs",
        saved_model,
        time.time() - started,
    )
    return saved_model


@contextlib.contextmanager
def _without_distribution():
    """Keras' global distribution off: variables made inside (Keras' saving makes some) live on this process's
    default device alone, so no other process needs to take part."""
    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(previous)


def _host_copy(model):
    """On several hosts no process holds every shard, and Keras saves a variable by reading it whole: a copy of
    the model with the gathered values on this host (its architecture and weights; not compiled)."""
    values = [
        checkpoint_lib.host_value(v.value) for v in model.weights
    ]  # a collective: every process
    with _without_distribution():
        copy = keras.models.clone_model(model)
        copy.set_weights(values)
    return copy


def _flops_per_example(model) -> float | None:
    """Training FLOPs per example: 3 x the forward pass's FLOPs as XLA counts them (every op, from the
    unpartitioned program of one example), or None when they cannot be counted."""
    try:
        inputs = model.inputs
        specs = [jax.ShapeDtypeStruct((1, *t.shape[1:]), t.dtype) for t in inputs]
        if any(None in s.shape for s in specs):
            return None
        trainable = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.trainable_variables]
        other = [jax.ShapeDtypeStruct(v.shape, v.dtype) for v in model.non_trainable_variables]
        names = [t.name for t in inputs]
        keyed = (
            isinstance(model._inputs_struct, dict) if hasattr(model, "_inputs_struct") else False
        )

        def forward(trainable, other, xs):
            x = (
                dict(zip(names, xs, strict=True))
                if keyed
                else (xs[0] if len(xs) == 1 else list(xs))
            )
            return model.stateless_call(trainable, other, x, training=False)[0]

        cost = jax.jit(forward).lower(trainable, other, specs).cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        flops_forward = float(cost.get("flops", 0.0)) if cost else 0.0
        return 3.0 * flops_forward if flops_forward > 0 else None
    except Exception as error:  # noqa: BLE001 - MFU is a report: it must never stop a run
        logger.info(
            "tpukit: no FLOP count, so no MFU (%s: %s)", type(error).__name__, str(error)[:200]
        )
        return None


def _peak_flops(the_plan: Plan, at_least: float | None = None) -> tuple[float | None, str]:
    """Peak FLOP/s of the mesh's devices: the TPU table (bf16, per chip; a JAX device is a chip from v4 on, a core
    on v2/v3), else a matmul's rate in the compute dtype times the devices (GPU) or the processes (CPU, whose
    virtual devices share one host's cores). The matmul is timed once per machine and cached
    (`flops.measured_peak_flops`; a CPU shares the TensorFlow engine's entry), so machine load cannot move it,
    nor the `steps_per_execution: auto` decision made from it. `at_least`: FLOP/s that training reached on all
    the devices; a measured peak below it is timed again (`flops.checked_mfu`)."""
    mesh = the_plan.strategy
    devices = len(mesh.devices)
    kind = mesh.devices[0].device_kind
    if the_plan.strategy_kind == "jax_tpu":
        generation = flops.tpu_generation(kind)
        if generation is None:
            return None, f"unknown TPU device kind {kind!r}; no peak FLOP/s, so no MFU"
        per_device = flops.PEAK_BF16_FLOPS_PER_CHIP[generation] / (
            2 if generation in ("v2", "v3") else 1
        )
        return per_device * devices, (
            f"TPU {generation} bfloat16 peak {flops.PEAK_BF16_FLOPS_PER_CHIP[generation] / 1e12:g} TFLOP/s per chip "
            f"x {devices} JAX device(s)"
        )
    dtype = flops.peak_dtype(the_plan.precision, "default")
    size = 2048
    gpu = the_plan.strategy_kind == "jax_gpu"
    units = devices if gpu else mesh.processes
    unit_name = "GPU(s)" if gpu else "host(s)"
    # A GPU is timed with JAX: TensorFlow's CPU build, which the jax engine reads data with, sees no GPU.
    label = f"GPU {kind} (jax)" if gpu else flops.detect_device_kind("default")
    return flops.units_peak_flops(
        label,
        None,
        size,
        dtype,
        units,
        unit_name,
        at_least=at_least,
        measure=_jax_matmul_flops if gpu else None,
        shown=kind if gpu else label,
    )


def _jax_matmul_flops(size: int, dtype: str) -> float:
    """FLOP/s of one `dtype` `size`-square matmul on JAX's default device: the best of five after a warm-up,
    as `flops.measure_matmul_flops`."""
    a = jax.numpy.ones((size, size), dtype)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / max(best, 1e-9)


def report(session: Session, outcome, evaluation: dict, exported: dict) -> dict:
    """The run's metrics; the TensorFlow engine's keys, with the mesh and the split variables."""
    metrics = session_lib.report(session, outcome, evaluation, exported, NAME)
    metrics.update(
        strategy="ModelParallel" if session.plan.mesh["model"] > 1 else "DataParallel",
        peak_flops_dtype=flops.peak_dtype(
            session.plan.precision, "tpu" if session.plan.strategy_kind == "jax_tpu" else "default"
        ),
        mesh=session.plan.mesh,
        sharded=session.sharded,
        steps_per_execution_decision=session.decision,
        **cpu.report(),
    )
    peers.succeeded()  # at exit this process tells the others it finished, not that it failed
    return metrics


@contextlib.contextmanager
def explained(the_plan: Plan):
    """As the TensorFlow engine's (data errors as RecipeErrors, full disks as OutputDirErrors, known environment
    errors annotated), and Keras' global distribution restored when the run ends."""
    previous = keras.distribution.distribution()
    exports = len(_STARTED_EXPORTS)
    try:
        with session_lib.explained(the_plan, checkpoint_lib.newest_checkpoint_step):
            yield
    finally:
        keras.distribution.set_distribution(previous)
        for started in _STARTED_EXPORTS[exports:]:  # a run that stopped before `export`
            _close_saved_model_export(started)


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
