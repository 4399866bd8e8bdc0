"""The check both engines run when first used: Keras 3 in the tested range (`tpukit.environment.versions.
KERAS_TESTED`), since tpukit touches private Keras internals (`keras_private`)."""

from __future__ import annotations

import logging
import os

from tpukit.environment import versions
from tpukit.environment.versions import KERAS_TESTED

ALLOW_UNTESTED_KERAS = "TPUKIT_ALLOW_UNTESTED_KERAS"


def check_keras() -> str:
    """Returns Keras' version; raises ImportError outside `KERAS_TESTED` unless $TPUKIT_ALLOW_UNTESTED_KERAS=1."""
    try:
        import keras
    except ImportError as error:
        raise ImportError(
            f"tpukit needs Keras 3 (received: {error}). Fix: `{versions.keras_install_command()}` and restart the "
            "runtime."
        ) from error
    version = keras.__version__
    low, high = (".".join(map(str, v)) for v in KERAS_TESTED)
    if KERAS_TESTED[0] <= versions.minor(version) < KERAS_TESTED[1]:
        return version
    message = (
        f"tpukit was tested with Keras >= {low} and < {high} (it patches private Keras internals); received keras "
        f"{version}. Fix: `{versions.keras_install_command()}` and restart the runtime"
    )
    allow_untested(message, ALLOW_UNTESTED_KERAS)
    return version


def allow_untested(message: str, switch: str) -> None:
    """A library outside its tested range: a warning where `$switch` is "1" (the user chose to try it), else
    ImportError with `message` and that way out. Both engines' version checks end here."""
    if os.environ.get(switch) == "1":
        logging.getLogger("tpukit").warning("tpukit: %s (continuing: %s=1).", message, switch)
        return
    raise ImportError(f"{message}, or set {switch}=1 to try it anyway.")
