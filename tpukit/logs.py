"""tpukit's log lines ("tpukit: ...") go to the `tpukit` logger; this makes them visible in scripts and notebooks."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time


class _CurrentStderr(logging.StreamHandler):
    """Writes to `sys.stderr` as it is when a line is logged, not as it was when the handler was made: notebook
    kernels and `contextlib.redirect_stderr` replace it, and a handler holding the old one writes to a closed
    stream ("--- Logging error ---")."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(
        self, value
    ):  # StreamHandler.__init__ and setStream assign it; the current stderr always wins
        pass


def enable_logging(level: int = logging.INFO) -> None:
    """Prints tpukit's INFO lines to stderr once, without duplicating them through absl's root handler."""
    logger = logging.getLogger("tpukit")
    logger.setLevel(level)
    if not any(getattr(h, "_tpukit", False) for h in logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._tpukit = True
        logger.addHandler(handler)
    logger.propagate = False


def process_seconds() -> float | None:
    """Seconds since this process started (Linux: `/proc/self/stat` against `/proc/uptime`, 10 ms resolution), or
    None where that cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            # The name (field 2) may hold spaces: the fields after its closing parenthesis are fixed.
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


# The phases of a run, in order, as `metrics.json` "phases_seconds" names them.
PHASES = (
    "before_run",  # process start to the first `tpukit.run` of the process: Python, imports, the caller's code
    "plan",  # check the recipe, connect, count the data, read its labels, check the output directory
    "build",  # build and compile the model, count its FLOPs, decide steps_per_execution, restore a checkpoint
    "first_step",  # the first execution of each fit segment: input pipeline start, tracing, XLA compilation
    "training",  # the other training steps, with the callbacks between executions
    "validation",  # validation passes inside fit
    "checkpoints",  # checkpoint saves (the step-0 save before fit and the last one after it included)
    "evaluation",  # the final exact evaluation
    "export",  # model.keras and the SavedModel
    "report",  # metrics, the baseline score
)

_timed_a_run = (
    False  # whether this process has timed a run already (its later runs have no before_run)
)


class Phases:
    """Wall seconds of each phase of one run (`PHASES`), for `metrics.json` and the benchmarks: where every second
    of a whole run goes. `timed(name)` times a block; `split(name, **parts)` moves parts of a timed phase (the
    first step, validation and checkpoint saves inside `fit`) into their own entries. `before_run` is the
    process's age at its first run only (Linux; None elsewhere): a notebook's or a script's later runs start from
    their own call."""

    def __init__(self):
        global _timed_a_run
        self._started = time.perf_counter()
        self.seconds: dict[str, float | None] = {
            "before_run": None if _timed_a_run else process_seconds()
        }
        _timed_a_run = True

    @contextlib.contextmanager
    def timed(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = (self.seconds.get(name) or 0.0) + time.perf_counter() - start

    def split(self, name: str, **parts: float | None) -> None:
        for part, seconds in parts.items():
            if seconds:
                self.seconds[part] = (self.seconds.get(part) or 0.0) + seconds
                self.seconds[name] = (self.seconds.get(name) or 0.0) - seconds

    def to_json(self) -> dict:
        """The phases in order (rounded to ms; absent ones left out) and `total`: `before_run` plus the time since
        this run started."""
        out = {k: round(self.seconds[k], 3) for k in PHASES if self.seconds.get(k) is not None}
        since = time.perf_counter() - self._started
        out["total"] = round((self.seconds.get("before_run") or 0.0) + since, 3)
        return out


def plural(count: int, word: str) -> str:
    """`1 replica`, `2 replicas`: the start line is read by people new to distributed training."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def first_four(names: list[str]) -> str:
    """`a, b, c, d, ... (8 in all)`: the names a start line shows."""
    return ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
