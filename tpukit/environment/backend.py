"""The Keras backend, which Keras fixes when it is first imported (`KERAS_BACKEND`; `keras.config.set_backend`
cannot change it for modules already imported).

Every tpukit package whose modules import Keras or TensorFlow (`tpukit.data`, `tpukit.models`, `tpukit.task`,
`tpukit.engines.tensorflow`) calls `use_default()` before any of them loads; TensorFlow counts, since importing
it (2.21) imports `keras.src.backend.config`, which fixes the backend then: unless the user chose a backend
(`KERAS_BACKEND`), Keras loads the TensorFlow engine's, whatever `~/.keras/keras.json` names (the variable wins over
the file in Keras).
"""

from __future__ import annotations

import os
import sys

DEFAULT = "tensorflow"


def use_default() -> str:
    """Sets `KERAS_BACKEND` to tpukit's default unless the user set it; returns the backend Keras will use."""
    return os.environ.setdefault("KERAS_BACKEND", DEFAULT)


def require(name: str, engine: str) -> None:
    """Raises ImportError with the fix when the backend is not `name` (the backend `engine` trains with): the one
    Keras loaded if it is imported already, else the one it will load."""
    keras = sys.modules.get("keras")
    config = getattr(keras, "config", None)
    if config is not None and hasattr(config, "backend"):
        backend, source = config.backend(), "keras.config.backend()"
    else:
        backend, source = os.environ.get("KERAS_BACKEND", DEFAULT), "KERAS_BACKEND"
    if backend != name:
        raise ImportError(
            f"tpukit's {engine} engine trains with the Keras {name!r} backend; received {source}={backend!r}. "
            f"Fix: set KERAS_BACKEND={name} before importing keras (in a notebook: restart the runtime, then set "
            "it in the first cell)."
        )
