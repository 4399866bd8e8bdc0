"""tpukit's log lines ("tpukit: ...") go to the `tpukit` logger; this makes them visible in scripts and notebooks."""

from __future__ import annotations

import logging
import sys


def enable_logging(level: int = logging.INFO) -> None:
    """Prints tpukit's INFO lines to stderr once, without duplicating them through absl's root handler."""
    logger = logging.getLogger("tpukit")
    logger.setLevel(level)
    if not any(getattr(h, "_tpukit", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._tpukit = True
        logger.addHandler(handler)
    logger.propagate = False
