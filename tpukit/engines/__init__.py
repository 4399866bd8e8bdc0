"""Engines execute a `tpukit.planner.Plan`: connect to the hardware, build the task's model under the engine's
distribution, train, evaluate, export. Only engines touch `tf.distribute`, `keras.distribution` or private
Keras/TensorFlow internals (import-linter contracts in setup.cfg).

Two: `tensorflow` (tf.distribute strategies and Keras' TensorFlow trainer) and `jax` (Keras on JAX with
`keras.distribution`: data and model parallelism over a device mesh). Each engine module implements `Engine` and
its checkpointer `Checkpointer` (`tpukit.engines.keras.protocols`, re-exported here), on the shared layer
`tpukit.engines.keras`; the engines never import each other. The recipe's `runtime.engine` picks one (`auto`:
`tpukit.environment.engine_choice`), and Keras' backend (fixed when Keras is first imported) must be that engine's.
Each engine's `cpu.py` holds the tuning that only a run on CPUs gets; nothing of it acts on a TPU or GPU.
"""

from __future__ import annotations

import functools
import importlib

from tpukit.engines.keras.protocols import Checkpointer, Engine

__all__ = [
    "ENGINES",
    "Checkpointer",
    "Engine",
    "EngineUnavailableError",
    "OutputDirError",
    "get",
    "unavailable",
]

# name -> (the check that runs first, as "module:function", importing nothing heavy itself; the engine module; what
# must run after them and before the engine's devices are known, as "module:function", or None: the jax engine's
# XLA:CPU flags, which XLA reads once, when JAX's backends start)
ENGINES = {
    "tensorflow": (
        "tpukit.engines.tensorflow.compat:check_tensorflow",
        "tpukit.engines.tensorflow.engine",
        None,
    ),
    "jax": (
        "tpukit.engines.jax.compat:check_jax",
        "tpukit.engines.jax.engine",
        "tpukit.engines.jax.cpu:before_backends",
    ),
}


class OutputDirError(RuntimeError):
    """The output directory stopped taking writes (full, read-only, no permission). Earlier checkpoints are kept."""


class EngineUnavailableError(ImportError):
    """The engine's libraries are missing or outside the tested range; the message holds the install command."""


@functools.cache  # the checks pass once per process (a failure is not cached: it raises)
def get(name: str = "tensorflow"):
    """The engine module `name`, after its environment checks (versions, Keras backend) pass, with what must precede
    its devices done (the jax engine's XLA:CPU flags, where the devices will be CPUs: `tpukit.engines.jax.cpu`).

    Raises EngineUnavailableError (an ImportError) naming the fix when the engine's libraries are missing or out of
    the tested range, before any of them is imported by the engine, and ValueError listing the engines when `name`
    is unknown.
    """
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; valid engines: {', '.join(sorted(ENGINES))}.")
    check, engine, before_devices = ENGINES[name]
    try:
        _call(check)
    except EngineUnavailableError:
        raise
    except ImportError as error:
        raise EngineUnavailableError(str(error)) from None
    module = importlib.import_module(engine)
    if before_devices is not None:
        _call(before_devices)
    return module


def _call(target: str):
    """Calls `target`, a "module:function" string."""
    module, function = target.split(":")
    return getattr(importlib.import_module(module), function)()


def unavailable(name: str = "tensorflow") -> str | None:
    """Why engine `name` cannot run here (its libraries missing or out of range, with the install command), or
    None. The command-line tools call it first, so such an environment gets that message and exit status 1 before
    anything imports TensorFlow or Keras."""
    try:
        get(name)
    except EngineUnavailableError as error:
        return str(error)
    return None
