"""tpukit: train Keras 3 models on Cloud TPUs; the same recipes run on GPUs and CPUs.

    import tpukit
    strategy = tpukit.connect()              # TPU -> TF_CONFIG cluster -> GPUs -> CPU
    recipe = tpukit.load_recipe("digits_cnn", ["train.epochs=3"])
    print(tpukit.plan(recipe, output_dir="runs/digits").describe())   # every decision, nothing built
    metrics = tpukit.run(recipe, "runs/digits")
    metrics = tpukit.fit(build_my_model, x, y, epochs=3, batch_size=256, output_dir="runs/mine")
    report = tpukit.check(build_my_model, x, y, topology="v5e-8", batch_size=256)   # libtpu, no TPU

`import tpukit` imports neither TensorFlow nor Keras: every name below is loaded on first use (PEP 562), so
`python -m tpukit.doctor` can diagnose an environment where TensorFlow is missing or broken. The engine's version
checks run when an engine is first used (`tpukit.connect`, `tpukit.plan`, `tpukit.run`, `tpukit.fit`).
"""

from __future__ import annotations

import importlib
import logging

__version__ = "0.1.0"

# name -> (module, attribute or None for the module itself)
_LAZY = {
    "Plan": ("tpukit.planner", "Plan"),
    "Recipe": ("tpukit.recipe", "Recipe"),
    "RecipeError": ("tpukit.recipe", "RecipeError"),
    "load_recipe": ("tpukit.recipe", "load_recipe"),
    "register_model": ("tpukit.recipe.registry", "register_model"),
    "register_source": ("tpukit.recipe.registry", "register_source"),
    "plan": ("tpukit.runner", "make_plan"),
    "run": ("tpukit.runner", "run"),
    "fit": ("tpukit.user_model", "fit"),
    "check": ("tpukit.check", "check"),
    "load_model": ("tpukit.task", "load_model"),
    "TPUConnectionError": ("tpukit.engines.tensorflow.strategy", "TPUConnectionError"),
    "RunLockedError": ("tpukit.rundir", "RunLockedError"),
    "ClusterUnreachableError": ("tpukit.engines.tensorflow.strategy", "ClusterUnreachableError"),
    "TFConfigError": ("tpukit.engines.tensorflow.strategy", "TFConfigError"),
    "TrainingInterrupted": ("tpukit.runner", "TrainingInterrupted"),
    "ExportFailedError": ("tpukit.runner", "ExportFailedError"),
    "connect": ("tpukit.engines.tensorflow.strategy", "connect"),
    "cpu_mirrored_strategy": ("tpukit.engines.tensorflow.strategy", "cpu_mirrored_strategy"),
    "describe": ("tpukit.engines.tensorflow.strategy", "describe"),
    "enable_logging": ("tpukit.logs", "enable_logging"),
    "use_engine": ("tpukit.environment.backend", "use_engine"),
    "data": ("tpukit.data", None),
    "models": ("tpukit.models", None),
    "losses": ("tpukit.task.losses", None),
    "optim": ("tpukit.task.optim", None),
}

__all__ = sorted(_LAZY)

logging.getLogger("tpukit").addHandler(logging.NullHandler())


def __getattr__(name: str):
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tpukit' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    if attribute is not None:
        from tpukit.logs import enable_logging

        enable_logging()  # tpukit's INFO lines reach scripts and notebooks once the API is used
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
