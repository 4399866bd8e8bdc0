"""The Keras backend, which Keras fixes when it is first imported (`KERAS_BACKEND`; `keras.config.set_backend`
cannot change it for modules already imported).

tpukit's models and pipelines import Keras, so `tpukit.data` and `tpukit.models` call `use_default()` first:
unless the user chose a backend, the TensorFlow engine's backend is the one Keras loads.
"""

from __future__ import annotations

import os

DEFAULT = "tensorflow"


def use_default() -> str:
    """Sets `KERAS_BACKEND` to tpukit's default unless the user set it; returns the backend Keras will use."""
    return os.environ.setdefault("KERAS_BACKEND", DEFAULT)


def require(name: str, engine: str) -> None:
    """Raises ImportError with the fix when the backend is not `name` (the backend `engine` trains with)."""
    backend = os.environ.get("KERAS_BACKEND", DEFAULT)
    if backend != name:
        raise ImportError(
            f"tpukit's {engine} engine trains with the Keras {name!r} backend; received KERAS_BACKEND={backend!r}. "
            f"Fix: set KERAS_BACKEND={name} before importing keras (in a notebook: restart the runtime, then set "
            "it in the first cell)."
        )
