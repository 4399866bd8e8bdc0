"""The import-time heap frozen for Python's cyclic garbage collector (`gc.freeze()`), for both engines' CPU tuning.

Python's last collection at interpreter exit walks and frees TensorFlow's, Keras' and JAX's import-time objects
(modules, API wrappers, protobuf descriptors), about a second of every such process's exit; frozen, the collectors
skip them, at exit and during training. Objects made later are collected as before. Only the engines' `cpu.py`
modules call `freeze_the_imports`, once they know the run's devices are CPUs (benchmarks/README.md has the
measurements). CPython documents this use (https://docs.python.org/3/library/gc.html#gc.freeze).

What is frozen is never collected as cyclic garbage, so for the user's objects alive at that moment: every file
then open for writing is flushed at exit (a file held in a reference cycle would otherwise lose its buffer), and an
interactive process (a notebook kernel, IPython, `python -i`), which lives on and would keep a model built before
its first fit, is not frozen at all. `TPUKIT_GC_FREEZE=0` turns it off.
"""

from __future__ import annotations

import _io
import atexit
import contextlib
import dataclasses
import gc
import os
import sys
import weakref

FREEZE_ENV = "TPUKIT_GC_FREEZE"
_OFF = ("0", "off", "false", "no")


@dataclasses.dataclass(frozen=True)
class Freeze:
    """Whether this process's heap was frozen, and why (not)."""

    frozen: bool
    reason: str

    def as_dict(self) -> dict:
        return {"frozen": self.frozen, "reason": self.reason}


_done: Freeze | None = None  # the process's: frozen once


def freeze_the_imports() -> Freeze:
    """`gc.freeze()` once per process, unless it is interactive or $TPUKIT_GC_FREEZE is off; the files open for
    writing now are flushed at exit (`_flush_at_exit`). Returns what was done, the first call's answer after it."""
    global _done
    if _done is not None and _done.frozen:
        return _done
    switch = os.environ.get(FREEZE_ENV, "").strip()
    if switch.lower() in _OFF:
        return Freeze(False, f"not frozen: {FREEZE_ENV}={switch}")
    if _interactive():
        return Freeze(False, "not frozen: an interactive process (its objects live on)")
    writing = []
    for candidate in gc.get_objects():
        if _open_for_writing(candidate):
            with contextlib.suppress(TypeError):  # a file type without weak references: not watched
                writing.append(weakref.ref(candidate))
    gc.freeze()
    atexit.register(_flush_at_exit, writing)
    _done = Freeze(True, "the heap alive once the devices were known: the collectors skip it")
    return _done


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
    # The C base class of every file object (io.IOBase derives from it): a plain isinstance check, several times
    # faster over the whole heap than io.IOBase's ABC check.
    if not isinstance(candidate, _io._IOBase):
        return False
    try:
        return not candidate.closed and candidate.writable()
    except Exception:  # noqa: BLE001 - a file object of the user's own kind: not ours to judge
        return False


def _flush_at_exit(files: list) -> None:
    """Flushes the files that were open for writing when the heap was frozen."""
    for reference in files:
        file = reference()
        if file is not None:
            with contextlib.suppress(Exception):
                if not file.closed:
                    file.flush()
