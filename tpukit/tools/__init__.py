"""Tools around the training core: `doctor` (can this environment train?), `check` (would this recipe run on a
given TPU?) and `smoke` (a few real steps on this machine). They import the core; the core never imports them.
Run them as `python -m tpukit.doctor`, `python -m tpukit.check`, `python -m tpukit.smoke`."""

import os

from tpukit import engines
from tpukit.logs import enable_logging


def start_tool() -> str | None:
    """What `check` and `smoke` do once their flags parse: TensorFlow's C++ INFO lines off (a user's
    TF_CPP_MIN_LOG_LEVEL wins), tpukit's own lines on, and the engine's environment checked before anything
    imports TensorFlow or Keras. Returns why the engine cannot run here (print it and exit 1), or None."""
    os.environ.setdefault(
        "TF_CPP_MIN_LOG_LEVEL", "2"
    )  # the C++ start-up lines would bury the report
    enable_logging()
    return engines.unavailable("tensorflow")
