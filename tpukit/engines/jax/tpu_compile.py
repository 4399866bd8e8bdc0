"""The jax engine's training step compiled for a TPU topology by libtpu's compiler, on a machine with no TPU.

    devices = topology_devices(topology)                  # abstract TPU devices (jax.experimental.topologies)
    step = abstract_step(recipe, devices, data=4, model=2)  # the model built abstractly: no variable allocated
    compiled = compile_step(step)                          # fits? bytes per chip, FLOPs, collectives

The step is Keras' own `train_step(state, data)` (what `make_train_function` jits: Keras' JAX trainer runs
`steps_per_execution` such calls per execution, so one step is the program), with the recipe's model, loss,
optimizer and dtype policy, its variables laid out over a `data` x `model` mesh as the engine lays them out
(`engine._distribution`). The model and its optimizer are built inside `jax.eval_shape`, so every variable is a
shape and a sharding, never an array: a model of billions of parameters is checked in host memory far below its size.
MaxText's `train_compile.py` does the same for its own models; an out-of-memory answer is the one the chip would give.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

import jax
import keras
import numpy as np
import tensorflow as tf

from tpukit import planner, task
from tpukit.engines.jax import engine
from tpukit.engines.jax.hlo_text import collectives, gathered, out_of_memory, per_chip_memory
from tpukit.recipe import Recipe, RecipeError

if TYPE_CHECKING:
    from tpukit.planner.topologies import Topology


MXU = 128  # a TPU matrix unit multiplies 128 x 128 tiles (v6e's are 256 x 256: 128 still pads less)


class TPUCompilerUnavailable(RuntimeError):
    """libtpu (the TPU compiler) is not installed here; the message says how to install it."""


def topology_devices(topology: Topology) -> list:
    """The abstract TPU devices of `topology` (libtpu describes them; nothing is attached or started)."""
    from jax.experimental import topologies

    try:
        described = topologies.get_topology_desc(
            platform="tpu",
            topology_name=topology.topology_name,
            chip_config_name=topology.chip_config_name,
            chips_per_host_bounds=topology.chips_per_host_bounds,
            num_slices=1,
        )
    except Exception as error:  # noqa: BLE001 - jax raises RuntimeError or ValueError by version
        text = str(error)
        if "libtpu" in text.lower() or "tpu" in text.lower() and "not" in text.lower():
            raise TPUCompilerUnavailable(
                f"libtpu, the TPU compiler, is not available here ({text.splitlines()[0][:200]}). Fix: pip install "
                '"tpukit[tpu-check]" (it brings jax[tpu], whose libtpu compiles for TPUs on any x86-64 Linux '
                "machine without one)."
            ) from None
        raise
    return list(described.devices)


@dataclasses.dataclass
class AbstractStep:
    """Everything `compile_step` lowers: the model (built abstractly), the state's and the batch's shapes with
    their shardings, and what the plan needs to know about them."""

    model: Any
    mesh: jax.sharding.Mesh
    state: tuple
    data: Any
    weight_bytes: (
        int  # per chip: trainable and non-trainable variables, each divided over its split axes
    )
    optimizer_bytes: int
    parameters: int
    policy: str
    # The full shapes of the variables split over the model axis, and the paths of the variables of each.
    split_shapes: dict[tuple[int, ...], list[str]]
    variables_split: int
    # Weights whose two last dimensions (a kernel's inputs and outputs) are not multiples of the 128 x 128 matrix
    # units: "path [shape]"; XLA pads them, so part of each matmul is wasted (Cloud TPU performance guide).
    unaligned: list[str] = dataclasses.field(default_factory=list)


def _sharding(mesh, layout) -> jax.sharding.NamedSharding:
    axes = tuple(layout.axes) if layout is not None else ()
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes))


def _per_chip(shape, dtype, sharding) -> int:
    """Bytes one chip holds of a variable: its size over the product of the axes it is split on."""
    size = math.prod(shape) * np.dtype(dtype).itemsize
    parts = 1
    for axis in sharding.spec:
        for name in (axis,) if isinstance(axis, str) else axis or ():
            parts *= sharding.mesh.shape[name]
    return size // parts


def _spec(value, sharding):
    dtype = (
        value.dtype if not isinstance(value.dtype, tf.dtypes.DType) else value.dtype.as_numpy_dtype
    )
    return jax.ShapeDtypeStruct(tuple(value.shape), np.dtype(dtype), sharding=sharding)


def abstract_step(
    recipe: Recipe,
    devices: list,
    data: int,
    model: int,
    policy: str,
    total_steps: int,
) -> AbstractStep:
    """The recipe's model, optimizer and batch as shapes on a `data` x `model` mesh of `devices`, under the dtype
    `policy`: built inside `jax.eval_shape` with the engine's distribution (its layouts checked as in a run)."""
    mesh_handle = engine.Mesh(data, model, list(devices[: data * model]))
    distribution = engine._distribution(planner.run_settings(recipe), mesh_handle)
    jax_mesh = distribution.device_mesh.backend_mesh
    built: dict[str, Any] = {}

    def build():
        with distribution.scope(), engine.dtype_policy(policy):
            model_ = task.build_model(recipe, total_steps, True, 1)
            train_fn, _ = task.input_fns(recipe, 0, None, task.spec_of(model_))
            batch = train_fn(tf.distribute.InputContext(1, 0, 1)).element_spec
            data_specs = tf.nest.map_structure(lambda s: _spec(s, None), batch)
            model_._symbolic_build(data_batch=data_specs)
        built.update(model=model_, data=data_specs)
        return [v.value for v in model_.variables]

    try:
        jax.eval_shape(build)
    except RecipeError:
        raise
    except ValueError as error:  # builder or optimizer arguments that do not fit together
        raise RecipeError(f"{recipe.path}: {error}") from None
    model_ = built["model"]
    engine.check_layouts(distribution.layouts, model_)
    replicated = jax.sharding.NamedSharding(jax_mesh, jax.sharding.PartitionSpec())
    batch_sharding = jax.sharding.NamedSharding(jax_mesh, jax.sharding.PartitionSpec("data"))

    def specs(variables, sharded=True):
        return [
            _spec(v, _sharding(jax_mesh, getattr(v, "_layout", None)) if sharded else replicated)
            for v in variables
        ]

    state = (
        specs(model_.trainable_variables),
        specs(model_.non_trainable_variables),
        specs(model_.optimizer.variables),
        specs(model_.metrics_variables, sharded=False),
    )
    weights = [*state[0], *state[1]]
    split: dict[tuple[int, ...], list[str]] = {}
    for v in model_.weights:
        axes = getattr(getattr(v, "_layout", None), "axes", ()) or ()
        if model > 1 and "model" in axes:
            split.setdefault(tuple(v.shape), []).append(v.path)
    return AbstractStep(
        model=model_,
        mesh=jax_mesh,
        state=state,
        data=jax.tree.map(lambda s: _spec(s, batch_sharding), built["data"]),
        weight_bytes=sum(_per_chip(s.shape, s.dtype, s.sharding) for s in weights),
        optimizer_bytes=sum(_per_chip(s.shape, s.dtype, s.sharding) for s in state[2]),
        parameters=sum(math.prod(v.shape) for v in model_.weights),
        policy=policy,
        split_shapes=split,
        variables_split=sum(len(paths) for paths in split.values()),
        unaligned=[
            f"{v.path} {list(v.shape)}"
            for v in model_.trainable_variables
            if len(v.shape) >= 2 and any(d % MXU for d in v.shape[-2:])
        ],
    )


@dataclasses.dataclass
class Compiled:
    """libtpu's answer for one step: per-chip memory (bytes), FLOPs and bytes accessed per chip, collectives."""

    fits: bool
    seconds: float
    argument_bytes: int = 0
    output_bytes: int = 0
    alias_bytes: int = 0
    temp_size_bytes: int = (
        0  # memory_analysis' temp_size: 0 on libtpu 0.0.42.1 for most steps (see below)
    )
    peak_bytes: int = (
        0  # memory_analysis' peak_memory_in_bytes: arguments, outputs and temporaries at the peak
    )
    code_bytes: int = 0
    flops: float | None = None
    bytes_accessed: float | None = None
    collectives: dict = dataclasses.field(default_factory=dict)
    gathered_weights: list = dataclasses.field(default_factory=list)
    required_bytes: int | None = None  # the compiler's out-of-memory figure
    available_bytes: int | None = None
    error: str | None = None

    @property
    def total_bytes(self) -> int:
        """HBM per chip at the step's peak, code included (`hlo_text.per_chip_memory`); libtpu's own figure when
        it ran out of memory."""
        if self.required_bytes is not None:
            return self.required_bytes
        return self._memory[0]

    @property
    def temporary_bytes(self) -> int:
        """What the step holds beyond its arguments, its new outputs and its code: activations, gradients, buffers."""
        return self._memory[1]

    @property
    def _memory(self) -> tuple[int, int]:
        return per_chip_memory(
            self.argument_bytes,
            self.output_bytes,
            self.alias_bytes,
            self.temp_size_bytes,
            self.peak_bytes,
            self.code_bytes,
        )


def compile_step(step: AbstractStep) -> Compiled:
    """Lowers and compiles `step.model.train_step` for the step's mesh with libtpu; an out-of-memory answer is a
    `Compiled` with `fits=False` and the compiler's figures, any other compiler error raises."""
    model = step.model
    state_shardings = jax.tree.map(lambda s: s.sharding, step.state)
    replicated = jax.sharding.NamedSharding(step.mesh, jax.sharding.PartitionSpec())
    jitted = jax.jit(
        model.train_step, donate_argnums=0, out_shardings=(replicated, state_shardings)
    )
    started = time.perf_counter()
    try:
        with _quiet_keras():
            compiled = jitted.lower(step.state, step.data).compile()
    except Exception as error:  # noqa: BLE001 - jax's XlaRuntimeError; only out-of-memory is an answer
        found = out_of_memory(str(error))
        if found is None:
            raise
        return Compiled(
            fits=False,
            seconds=time.perf_counter() - started,
            required_bytes=found[0],
            available_bytes=found[1],
            error=_first_line(str(error)),
        )
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = (cost[0] if isinstance(cost, list) else cost) or {}
    hlo = compiled.as_text()
    return Compiled(
        fits=True,
        seconds=seconds,
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        temp_size_bytes=int(memory.temp_size_in_bytes),
        peak_bytes=int(getattr(memory, "peak_memory_in_bytes", 0) or 0),
        code_bytes=int(memory.generated_code_size_in_bytes),
        flops=float(cost["flops"]) if cost.get("flops") else None,
        bytes_accessed=float(cost["bytes accessed"]) if cost.get("bytes accessed") else None,
        collectives=collectives(hlo),
        gathered_weights=gathered(hlo, step.split_shapes),
    )


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if "RESOURCE_EXHAUSTED" in line or "memory" in line:
            return line.strip()[:400]
    return text.strip().splitlines()[0][:400] if text.strip() else ""


@contextlib.contextmanager
def _quiet_keras():
    """Keras' own tracing messages stay out of the report."""
    previous = keras.config.is_interactive_logging_enabled()
    keras.config.disable_interactive_logging()
    try:
        yield
    finally:
        if previous:
            keras.config.enable_interactive_logging()


__all__ = [
    "AbstractStep",
    "Compiled",
    "TPUCompilerUnavailable",
    "abstract_step",
    "compile_step",
    "topology_devices",
]
