"""tpukit: train Keras 3 models on Cloud TPUs with TPUStrategy; the same recipes run on GPUs and CPUs.

import tpukit
strategy = tpukit.connect()              # TPU -> TF_CONFIG cluster -> GPUs -> CPU
recipe = tpukit.load_recipe("digits_cnn", ["train.epochs=3"])
print(tpukit.plan(recipe, output_dir="runs/digits").describe())   # every decision, nothing built
metrics = tpukit.run(recipe, "runs/digits")
metrics = tpukit.fit(build_my_model, x, y, epochs=3, batch_size=256, output_dir="runs/mine")  # your own model
"""

from tpukit import compat as _compat  # (sets KERAS_BACKEND=tensorflow before Keras loads)
from tpukit import (  # registers serializable classes for keras.saving.load_model
    data,
    losses,
    models,
    optim,
)
from tpukit.fit import fit
from tpukit.logs import enable_logging
from tpukit.planner import Plan, plan
from tpukit.recipe import Recipe, RecipeError, load_recipe
from tpukit.registry import register_model, register_source
from tpukit.strategy import TPUConnectionError, connect, cpu_mirrored_strategy, describe

__version__ = "0.1.0"

_compat.check_tensorflow()  # TensorFlow and Keras in the tested ranges, or an ImportError saying what to install

enable_logging()


def run(recipe, output_dir, strategy=None, mode="train_and_eval", checkpoint=None, callbacks=None):
    """Trains, evaluates and exports `recipe` into `output_dir` (see `tpukit.runner.run`)."""
    from tpukit.runner import run as _run

    return _run(
        recipe, output_dir, strategy=strategy, mode=mode, checkpoint=checkpoint, callbacks=callbacks
    )


__all__ = [
    "Plan",
    "Recipe",
    "RecipeError",
    "TPUConnectionError",
    "connect",
    "cpu_mirrored_strategy",
    "data",
    "describe",
    "losses",
    "enable_logging",
    "fit",
    "load_recipe",
    "models",
    "optim",
    "plan",
    "register_model",
    "register_source",
    "run",
]
