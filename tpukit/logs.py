"""tpukit's log lines ("tpukit: ...") go to the `tpukit` logger; this makes them visible in scripts and notebooks."""

from __future__ import annotations

import logging
import sys


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
