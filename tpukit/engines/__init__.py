"""Engines execute a `tpukit.planner.Plan`: connect to the hardware, build the task's model under the engine's
distribution, train, evaluate, export. Only engines touch `tf.distribute`, `keras.distribution` or private
Keras/TensorFlow internals (import-linter contracts in setup.cfg).

Today there is one: `tensorflow` (tf.distribute strategies and Keras' TensorFlow trainer). A second engine (Keras
on JAX with `keras.distribution`) implements the same functions as `tpukit.engines.tensorflow` and is named here.
"""

from __future__ import annotations

import importlib

ENGINES = {"tensorflow": "tpukit.engines.tensorflow.engine"}


class OutputDirError(RuntimeError):
    """The output directory stopped taking writes (full, read-only, no permission). Earlier checkpoints are kept."""


def get(name: str = "tensorflow"):
    """The engine module `name`, after its environment checks (versions, Keras backend) pass.

    Raises ImportError naming the fix when the engine's libraries are missing or out of the tested range, and
    ValueError listing the engines when `name` is unknown.
    """
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; valid engines: {', '.join(sorted(ENGINES))}.")
    engine = importlib.import_module(ENGINES[name])
    engine.check_environment()
    return engine
