"""Fault injection for tests: real signals delivered to a training process at a chosen step, and short progress
lines for the bounded waits. Test code only: production code has no hook for either.

In this process (a run started by the test itself):

    with faults.signals_at_step(5):                 # SIGTERM once the step counter reaches 5
        run(recipe, output_dir)
    with faults.signals_at_step(8, "SIGINT,SIGINT"):  # two Ctrl-C, each handled before the next
        ...
    with faults.wait_log_seconds(0.2):              # a bounded wait logs its progress every 0.2 s
        ...

    env = faults.env(oserror="tpukit.engines.keras.export:_write_serving_module:ENOSPC")
    # that function raises OSError(ENOSPC) (a full disk) naming its first str argument, in every process of the run

In a subprocess (`python -m tpukit.train`, a cluster's workers), `faults.env(...)` gives the environment that does
the same: `tests/faults_site` on PYTHONPATH, whose `sitecustomize` reads the variables below and patches the
modules when the child imports them.

The signals are sent by wrapping `TrainingGuard.on_train_batch_end` (the callback that saves and stops on a
signal): once per fit segment, at the first batch end whose step counter reaches the step and whose loss is finite,
the signals are sent to this process, then the guard handles them at that same batch end, as it would a signal
that arrived during the step.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import signal
import sys
import time

SIGNALS_AT_STEP_ENV = "TPUKIT_FAULT_SIGNALS_AT_STEP"  # "STEP" or "STEP:SIGINT,SIGINT"
OSERROR_ENV = "TPUKIT_FAULT_OSERROR"  # "module:function:ERRNO_NAME"
WAIT_LOG_SECONDS_ENV = "TPUKIT_FAULT_WAIT_LOG_SECONDS"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults_site")

TRAINER = "tpukit.engines.keras.trainer"
WAITING = "tpukit.engines.tensorflow.waiting"


def _signal_names(signals: str) -> list[str]:
    names = [name.strip() for name in signals.split(",") if name.strip()]
    for name in names:
        signal.Signals[name]  # KeyError on a misspelt name, before anything runs
    return names


def patch_trainer(trainer, step: int, signals: str = "SIGTERM"):
    """Makes `trainer.TrainingGuard` send `signals` to this process at `step`; returns the function that undoes it."""
    names = _signal_names(signals)
    guard = trainer.TrainingGuard
    original = guard.on_train_batch_end

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        finite = loss is None or math.isfinite(float(loss))
        if finite and not getattr(self, "_fault_sent", False) and self.checkpointer.step >= step:
            self._fault_sent = True
            for name in names:
                os.kill(os.getpid(), signal.Signals[name])
                time.sleep(
                    0.01
                )  # Python runs the handler at the next instruction, before the next signal
        return original(self, batch, logs)

    guard.on_train_batch_end = on_train_batch_end
    return lambda: setattr(guard, "on_train_batch_end", original)


def patch_oserror(module, function: str, code_name: str):
    """Makes `module.function` raise `OSError(errno.<code_name>)` naming its first str argument (a path), as a
    write on a full disk (ENOSPC), a read-only file system (EROFS) or over a quota (EDQUOT) does; returns the
    function that undoes it."""
    code = getattr(errno, code_name)
    original = getattr(module, function)

    def failing(*args, **kwargs):
        path = next((a for a in (*args, *kwargs.values()) if isinstance(a, str)), None)
        raise OSError(code, os.strerror(code), path)

    setattr(module, function, failing)
    return lambda: setattr(module, function, original)


def patch_waiting(waiting, seconds: float):
    """Makes the bounded waits log their progress every `seconds`; returns the function that undoes it."""
    before = waiting.LOG_INTERVAL_SECONDS
    waiting.LOG_INTERVAL_SECONDS = float(seconds)
    return lambda: setattr(waiting, "LOG_INTERVAL_SECONDS", before)


@contextlib.contextmanager
def signals_at_step(step: int, signals: str = "SIGTERM"):
    """In this process: a training run sends itself `signals` (comma-separated names) once its step counter reaches
    `step` (each fit segment once, as a signal that arrived while the step ran)."""
    import importlib

    undo = patch_trainer(importlib.import_module(TRAINER), step, signals)
    try:
        yield
    finally:
        undo()


@contextlib.contextmanager
def wait_log_seconds(seconds: float):
    """In this process: the bounded waits log their progress every `seconds` instead of every 30 s."""
    import importlib

    undo = patch_waiting(importlib.import_module(WAITING), seconds)
    try:
        yield
    finally:
        undo()


def env(
    signals_at_step: int | None = None,
    signals: str = "SIGTERM",
    wait_log_seconds: float | None = None,
    base: dict | None = None,
    oserror: str | None = None,
) -> dict[str, str]:
    """The environment variables that inject these faults into a `python` subprocess: `base` (default: none, for
    `dict(os.environ, **faults.env(...))`) plus PYTHONPATH with `tests/faults_site` first and the faults' settings.
    `oserror`: "module:function:ERRNO_NAME" (`patch_oserror`), in every process the run starts too."""
    base = dict(base or {})
    path = base.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE_DIR, path]))
    if signals_at_step is not None:
        _signal_names(signals)
        base[SIGNALS_AT_STEP_ENV] = f"{int(signals_at_step)}:{signals}"
    if wait_log_seconds is not None:
        base[WAIT_LOG_SECONDS_ENV] = str(float(wait_log_seconds))
    if oserror is not None:
        # AttributeError on a misspelt errno, before anything runs.
        getattr(errno, oserror.rsplit(":", 1)[1])
        base[OSERROR_ENV] = oserror
    return base


def install_from_env() -> None:
    """In a subprocess started with `env(...)` (called by `tests/faults_site/sitecustomize.py`): patches the trainer
    and the waits when the process imports them, as the variables say. Imports nothing of tpukit itself."""
    patches = {}
    value = os.environ.get(SIGNALS_AT_STEP_ENV)
    if value:
        step, _, signals = value.partition(":")
        patches[TRAINER] = lambda module: patch_trainer(module, int(step), signals or "SIGTERM")
    seconds = os.environ.get(WAIT_LOG_SECONDS_ENV)
    if seconds:
        patches[WAITING] = lambda module: patch_waiting(module, float(seconds))
    failing = os.environ.get(OSERROR_ENV)
    if failing:
        name, function, code_name = failing.split(":")
        patches[name] = lambda module: patch_oserror(module, function, code_name)
    if patches:
        sys.meta_path.insert(0, _AfterImport(patches))


class _AfterImport:
    """A meta path finder that lets the other finders find a module, then runs `patches[name](module)` once the
    module has executed (its first import only)."""

    def __init__(self, patches: dict):
        self.patches = patches

    def find_spec(self, name, path=None, target=None):
        if name not in self.patches:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        spec.loader = _PatchingLoader(spec.loader, self.patches.pop(name))
        return spec


class _PatchingLoader:
    """Runs the module as its own loader does, then the patch; everything else (source for tracebacks) is the
    original loader's."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):
        return getattr(self._loader, name)
