"""Notebook helpers: the Colab/Kaggle install cell (`colab`), what a notebook decides before training
(`choose_small`, `first_available`, `output_dir`), plots of a run (`plots`) and text sampling (`sampling`).
The core never imports this package.

    small = tpukit.notebook.choose_small(SMALL, strategy)
    name, recipe = tpukit.notebook.first_available({"mnist_cnn": [...], "digits_cnn": [...]}, strategy)
    output_dir = tpukit.notebook.output_dir(OUTPUT_ROOT, name)
"""

from tpukit.notebook.helpers import choose_small, first_available, has_accelerator, output_dir

__all__ = ["choose_small", "first_available", "has_accelerator", "output_dir"]
