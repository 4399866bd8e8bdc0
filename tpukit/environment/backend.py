"""The Keras backend, which Keras fixes when it is first imported (`KERAS_BACKEND`; `keras.config.set_backend`
cannot change it for modules already imported).

Every tpukit package whose modules import Keras or TensorFlow (`tpukit.data`, `tpukit.models`, `tpukit.task`,
`tpukit.engines.tensorflow`) calls `use_default()` before any of them loads; TensorFlow counts, since importing
it (2.21) imports `keras.src.backend.config`, which fixes the backend then: unless the user chose a backend
(`KERAS_BACKEND`), Keras loads the backend of the engine `runtime.engine: auto` chooses here
(`tpukit.environment.engine_choice`), whatever `~/.keras/keras.json` names (the variable wins over the file in
Keras).
"""

from __future__ import annotations

import os
import sys

from tpukit.environment import engine_choice

DEFAULT = "tensorflow"  # the backend Keras itself loads when nothing names one
_defaulted: str | None = None  # the KERAS_BACKEND `use_default` set (not the user)


def use_default() -> str:
    """Sets `KERAS_BACKEND` to the backend of the engine `auto` chooses here unless the user set it; returns the
    backend Keras will use."""
    global _defaulted
    if "KERAS_BACKEND" not in os.environ:
        _defaulted = BACKENDS[engine_choice.resolve(engine_choice.AUTO).engine]
        os.environ["KERAS_BACKEND"] = _defaulted
    return os.environ["KERAS_BACKEND"]


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
            f"Fix: call tpukit.use_engine({engine.lower()!r}) (or set KERAS_BACKEND={name}) before anything imports "
            "keras; in a notebook: restart the runtime, then do it in the first cell. One process trains with one "
            "engine."
        )


# Each engine's Keras backend.
BACKENDS = {"tensorflow": "tensorflow", "jax": "jax"}


def use_engine(engine: str, tpu_address: str | None = None) -> str:
    """Makes Keras load `engine`'s backend (`runtime.engine`: "auto", "tensorflow" or "jax"), and returns the
    engine: `engine`, or the one `auto` chooses here (`tpukit.environment.engine_choice.resolve`).

    Call it before anything imports Keras (`tpukit.use_engine("auto")` in a notebook's first cell; the CLI does it
    from the recipe). Once Keras is imported its backend cannot change: a different one raises ImportError with
    the fix (restart the process, or the notebook's runtime). `tpu_address`: the recipe's `runtime.tpu`, which
    `auto` reads. A `KERAS_BACKEND` set for another backend is
    replaced, with a warning: the recipe's engine decides.
    """
    if engine != engine_choice.AUTO and engine not in BACKENDS:
        raise ValueError(
            f"unknown engine {engine!r}; valid engines: {engine_choice.AUTO}, {', '.join(BACKENDS)}."
        )
    engine = engine_choice.resolve(engine, tpu_address=tpu_address).engine
    name = BACKENDS[engine]
    if "keras" in sys.modules:
        require(name, engine)
        return engine
    current = os.environ.get("KERAS_BACKEND")
    if current and current != name and current != _defaulted:
        import logging

        logging.getLogger("tpukit").warning(
            "tpukit: runtime.engine=%s: using the Keras %r backend instead of KERAS_BACKEND=%r",
            engine,
            name,
            current,
        )
    os.environ["KERAS_BACKEND"] = name
    return engine
