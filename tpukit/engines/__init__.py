"""Engines execute a `tpukit.planner.Plan`: connect to the hardware, build the task's model under the engine's
distribution, train, evaluate, export. Only engines touch `tf.distribute`, `keras.distribution` or private
Keras/TensorFlow internals (import-linter contracts in setup.cfg).

Two: `tensorflow` (tf.distribute strategies and Keras' TensorFlow trainer) and `jax` (Keras on JAX with
`keras.distribution`: data and model parallelism over a device mesh). Both implement the same functions; the
recipe's `runtime.engine` picks one, and Keras' backend (fixed when Keras is first imported) must be that engine's.
"""

from __future__ import annotations

import _io
import atexit
import contextlib
import functools
import gc
import importlib
import os
import sys
import weakref

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
_frozen = False


def _freeze_the_imports() -> None:
    """`gc.freeze()` once the engine's libraries are imported: the cyclic garbage collector skips what is alive now.

    Python's last collection at interpreter exit walks and frees TensorFlow's, Keras' and JAX's import-time objects
    (modules, API wrappers, protobuf descriptors): 1.0-1.3 s of every such process's exit on this project's 2-core
    x86 CPU, in plain Keras as in tpukit; frozen, the exit takes 0.1-0.2 s, and the collections during training
    skip them too. Objects made later are collected as before. What is frozen is never collected as cyclic
    garbage, so two things are done for the user's objects alive at this moment (created before the first
    `tpukit.run`/`fit`): every file then open for writing is flushed at exit (`_flush_at_exit`: a file held in a
    reference cycle would otherwise lose its buffer), and an interactive process (a notebook kernel, IPython,
    `python -i`), which lives on and would keep a model built before the first fit, is not frozen at all: its exit
    is not waited for. Left: in a script, such an object that later becomes cyclic garbage stays in memory until the
    process ends. Once per process; `TPUKIT_GC_FREEZE=0` turns it off. CPython documents this use of `gc.freeze()`
    (https://docs.python.org/3/library/gc.html#gc.freeze)."""
    global _frozen
    if _frozen or os.environ.get(FREEZE_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return
    if _interactive():
        return
    _frozen = True
    # Before TensorFlow is imported the heap is small; after (a script that imported Keras itself) this walk
    # takes ~0.1 s on the 2-core CPU, a tenth of the exit it saves.
    writing = []
    for candidate in gc.get_objects():
        if _open_for_writing(candidate):
            with contextlib.suppress(TypeError):  # a file type without weak references: not watched
                writing.append(weakref.ref(candidate))
    gc.freeze()
    atexit.register(_flush_at_exit, writing)


def _interactive() -> bool:
    """A notebook kernel, an IPython shell or `python -i` (IPython itself is imported by plain scripts too)."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", lambda: None)() if ipython is not None else None
    return (
        hasattr(sys, "ps1")
        or bool(sys.flags.interactive)
        or "ipykernel" in sys.modules
        or shell is not None
    )


def _open_for_writing(candidate) -> bool:
    # The C base class of every file object (io.IOBase derives from it): a plain isinstance check, ~5x faster over
    # ~430,000 objects than io.IOBase's ABC check (0.1 s against 0.5 s with Keras and TensorFlow imported).
    if not isinstance(candidate, _io._IOBase):
        return False
    try:
        return not candidate.closed and candidate.writable()
    except Exception:  # noqa: BLE001 - a file object of the user's own kind: not ours to judge
        return False


def _flush_at_exit(files: list) -> None:
    """Flushes the files that were open for writing when the heap was frozen (see `_freeze_the_imports`)."""
    for reference in files:
        file = reference()
        if file is not None:
            with contextlib.suppress(Exception):
                if not file.closed:
                    file.flush()


def unavailable(name: str = "tensorflow") -> str | None:
    """Why engine `name` cannot run here (its libraries missing or out of range, with the install command), or
    None. The command-line tools call it first, so such an environment gets that message and exit status 1 before
    anything imports TensorFlow or Keras."""
    try:
        get(name)
    except EngineUnavailableError as error:
        return str(error)
    return None
