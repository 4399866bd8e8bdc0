"""Notebook helpers: the Colab/Kaggle install cell and the engine choice (`colab`, `choose_engine`), what a
notebook decides before training (`connect`, `choose_small`, `first_available`, `has_accelerator`, `output_dir`,
`scope`, from `helpers`), plots of a run (`plots`), text sampling (`sampling`) and the LoRA notebook's steps
(`llm`). The core never imports this package.

    import tpukit.notebook
    ENGINE = tpukit.notebook.start(tpukit.notebook.choose_engine())   # first: before anything imports Keras
    import tpukit.notebook.plots
    strategy = tpukit.notebook.connect(ENGINE)     # a tf.distribute strategy, or None for the jax engine
    small = tpukit.notebook.choose_small(SMALL, strategy)
    name, recipe = tpukit.notebook.first_available({"mnist_cnn": [...], "digits_cnn": [...]}, strategy)
    output_dir = tpukit.notebook.output_dir(OUTPUT_ROOT, name)
    tpukit.notebook.plots.learning_curves(output_dir)

Like `import tpukit`, importing this package loads no TensorFlow: the helpers are loaded on first use (PEP 562),
so `python -m tpukit.notebook.colab` (which prints the install cell) stays quick, and `choose_engine` (from
`colab`, standard library only) can run before `tpukit.use_engine`, which must precede any import of Keras.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers and the API reference; at run time __getattr__ loads them
    from tpukit.notebook.colab import choose_engine
    from tpukit.notebook.helpers import (
        choose_small,
        connect,
        first_available,
        has_accelerator,
        output_dir,
        scope,
    )

__all__ = [
    "start",
    "choose_engine",
    "choose_small",
    "connect",
    "first_available",
    "has_accelerator",
    "output_dir",
    "scope",
]
# The module that defines each name: colab imports nothing beyond the standard library (no Keras).
_MODULES = {name: "tpukit.notebook.helpers" for name in __all__} | {
    "choose_engine": "tpukit.notebook.colab"
}
_HELPERS = frozenset(__all__) - {"start"}


def start(engine: str = "auto") -> str:
    """A notebook's first call: `tpukit.use_engine(engine)`, then the engine's libraries imported and TensorFlow's
    devices listed with their C++ start-up lines hidden (`tpukit.environment.quiet`: warnings and errors are kept;
    `TPUKIT_VERBOSE=1` shows everything). Returns the engine: `engine`, or the one "auto" chooses here (jax on a
    TPU without tensorflow-tpu, as Colab's and Kaggle's; `tpukit.environment.engine_choice`).

    Raises:
        tpukit.engines.EngineUnavailableError: the engine's libraries are missing or out of range (the message
            holds the install command).
        ImportError: Keras is imported already with another backend (restart the runtime).
    """
    from tpukit import engines
    from tpukit.environment import quiet
    from tpukit.environment.backend import use_engine

    engine = use_engine(engine)
    quiet.configure()
    with quiet.start_up():
        engines.get(engine)  # TensorFlow, Keras (and JAX)
        from tpukit.engines.tensorflow import strategy

        # As `tpukit.tools.start_tool`: not on a TPU VM, where connecting starts the TPU.
        if not strategy.tpu_vm_present():
            import tensorflow as tf

            tf.config.list_physical_devices("GPU")
    return engine


def __getattr__(name: str):
    if name not in _HELPERS:
        raise AttributeError(f"module 'tpukit.notebook' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULES[name]), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HELPERS))
