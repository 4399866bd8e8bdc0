"""Engines execute a `tpukit.planner.Plan`: connect to the hardware, build the task's model under the engine's
distribution, train, evaluate, export. Only engines touch `tf.distribute`, `keras.distribution` or private
Keras/TensorFlow internals (import-linter contracts in setup.cfg).

Two: `tensorflow` (tf.distribute strategies and Keras' TensorFlow trainer) and `jax` (Keras on JAX with
`keras.distribution`: data and model parallelism over a device mesh). Both implement the same functions; the
recipe's `runtime.engine` picks one, and Keras' backend (fixed when Keras is first imported) must be that engine's.
"""

from __future__ import annotations

import functools
import gc
import importlib
import os

# name -> (the check that runs first, as "module:function", importing nothing heavy itself; the engine module)
ENGINES = {
    "tensorflow": (
        "tpukit.engines.tensorflow.compat:check_tensorflow",
        "tpukit.engines.tensorflow.engine",
    ),
    "jax": ("tpukit.engines.jax.compat:check_jax", "tpukit.engines.jax.engine"),
}


class OutputDirError(RuntimeError):
    """The output directory stopped taking writes (full, read-only, no permission). Earlier checkpoints are kept."""


class EngineUnavailableError(ImportError):
    """The engine's libraries are missing or outside the tested range; the message holds the install command."""


@functools.cache  # the checks pass once per process (a failure is not cached: it raises)
def get(name: str = "tensorflow"):
    """The engine module `name`, after its environment checks (versions, Keras backend) pass.

    Raises EngineUnavailableError (an ImportError) naming the fix when the engine's libraries are missing or out of
    the tested range, before any of them is imported by the engine, and ValueError listing the engines when `name`
    is unknown.
    """
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; valid engines: {', '.join(sorted(ENGINES))}.")
    check, engine = ENGINES[name]
    module, function = check.split(":")
    try:
        getattr(importlib.import_module(module), function)()
    except EngineUnavailableError:
        raise
    except ImportError as error:
        raise EngineUnavailableError(str(error)) from None
    module = importlib.import_module(engine)
    _freeze_the_imports()
    return module


FREEZE_ENV = "TPUKIT_GC_FREEZE"


def _freeze_the_imports() -> None:
    """`gc.freeze()` once the engine's libraries are imported: the cyclic garbage collector skips what is alive now.

    Python's last collection at interpreter exit walks and frees TensorFlow's, Keras' and JAX's import-time objects
    (modules, API wrappers, protobuf descriptors): 1.0-1.3 s of every such process's exit on this project's 2-core
    x86 CPU, in plain Keras as in tpukit; frozen, the exit takes ~0.15 s, and the collections during training
    skip them too. Objects made later (models, graphs, a user's objects) are collected as before, so a user's
    file left open in a reference cycle is still flushed at exit. What is frozen is never collected as cyclic
    garbage: objects alive before the engine loaded that end up in an unreachable cycle stay in memory, and a file
    among them would be left unflushed at exit. `TPUKIT_GC_FREEZE=0` turns it off. The same idea as CPython's
    documented use of `gc.freeze()` (https://docs.python.org/3/library/gc.html#gc.freeze)."""
    if os.environ.get(FREEZE_ENV, "").strip().lower() not in ("0", "off", "false", "no"):
        gc.freeze()


def unavailable(name: str = "tensorflow") -> str | None:
    """Why engine `name` cannot run here (its libraries missing or out of range, with the install command), or
    None. The command-line tools call it first, so such an environment gets that message and exit status 1 before
    anything imports TensorFlow or Keras."""
    try:
        get(name)
    except EngineUnavailableError as error:
        return str(error)
    return None
