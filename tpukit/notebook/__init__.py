"""Notebook helpers: the Colab/Kaggle install cell (`colab`), what a notebook decides before training
(`choose_small`, `first_available`, `has_accelerator`, `output_dir`, from `helpers`), plots of a run (`plots`) and
text sampling (`sampling`). The core never imports this package.

    import tpukit.notebook.plots
    small = tpukit.notebook.choose_small(SMALL, strategy)
    name, recipe = tpukit.notebook.first_available({"mnist_cnn": [...], "digits_cnn": [...]}, strategy)
    output_dir = tpukit.notebook.output_dir(OUTPUT_ROOT, name)
    tpukit.notebook.plots.learning_curves(output_dir)

Like `import tpukit`, importing this package loads no TensorFlow: the helpers are loaded on first use (PEP 562),
so `python -m tpukit.notebook.colab` (which prints the install cell) stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # for type checkers and the API reference; at run time __getattr__ loads them
    from tpukit.notebook.helpers import choose_small, first_available, has_accelerator, output_dir

__all__ = ["choose_small", "first_available", "has_accelerator", "output_dir"]
_HELPERS = frozenset(__all__)


def __getattr__(name: str):
    if name not in _HELPERS:
        raise AttributeError(f"module 'tpukit.notebook' has no attribute {name!r}")
    value = getattr(importlib.import_module("tpukit.notebook.helpers"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HELPERS))
