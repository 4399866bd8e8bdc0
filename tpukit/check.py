"""`python -m tpukit.check`: would this recipe run on a given TPU (the rules, `tpukit.tools.check`), or, with
`--topology`, does its training step compile and fit there (libtpu, `tpukit.tools.tpu_check`).

From Python, `tpukit.check(...)` compiles a recipe or your own model for a TPU topology:

    tpukit.use_engine("jax")                                  # before anything imports Keras
    report = tpukit.check(build_model, x, y, topology="v5e-8", batch_size=1024, optimizer="adamw")
    report["fits"], report["per_chip_bytes"]["total"]
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

from tpukit.tools.check import main


def check(
    model_fn: Callable | Any,
    x=None,
    y=None,
    *,
    topology: str,
    batch_size: int | None = None,
    dataset_fn: Callable | None = None,
    epochs: int = 1,
    price_per_chip_hour: float | None = None,
    fixes: bool = True,
    largest_batch: bool = False,
    **settings: Any,
) -> dict:
    """Compiles a training step for `topology` (e.g. "v5e-8") with libtpu, the TPU compiler, and returns the report
    `tpukit check --topology` prints as JSON (`fits`, `per_chip_bytes`, `flops_per_step`, `step_seconds_bound`, ...;
    `fixes` that were compiled and fit when it does not).

    Args:
        model_fn: what `tpukit.fit` takes (a function returning a `keras.Model`), or a recipe (a `tpukit.Recipe`,
            a recipe file or a packaged recipe's name, which then needs no other argument).
        x, y, dataset_fn, epochs, batch_size, **settings: as in `tpukit.fit` (`batch_size` is the global batch;
            `mesh={"model": 2}`, `layout=...`, `optimizer=...`, `precision=...` and any other recipe key).
        topology, price_per_chip_hour, fixes, largest_batch: as `--topology`, `--price-per-chip-hour`, not
            `--no-fixes` and `--largest-batch`.

    Needs Keras' JAX backend (call `tpukit.use_engine("jax")` before Keras is imported) and libtpu (`pip install
    "tpukit[tpu-check]"`); no TPU. Nothing is allocated for the model's variables.
    """
    from tpukit.environment.backend import use_engine
    from tpukit.recipe import Recipe, load_recipe
    from tpukit.tools.tpu_check import check_topology

    if "keras" not in sys.modules:
        use_engine("jax")  # else tpu_check says how to switch, if Keras loaded another backend

    options = {
        "price_per_chip_hour": price_per_chip_hour,
        "fixes": fixes,
        "largest_batch": largest_batch,
    }
    if isinstance(model_fn, (str, Recipe)):
        recipe = load_recipe(model_fn) if isinstance(model_fn, str) else model_fn
        return check_topology(recipe, topology, **options)
    from tpukit.user_model import as_recipe

    if batch_size is None:
        from tpukit.recipe import RecipeError

        raise RecipeError(
            "tpukit.check: batch_size (the global batch, as in tpukit.fit) is required with a model function. Fix: "
            "e.g. tpukit.check(build_model, x, y, topology='v5e-8', batch_size=1024)."
        )
    settings.setdefault("engine", "jax")
    with as_recipe(
        model_fn, x, y, dataset_fn=dataset_fn, epochs=epochs, batch_size=batch_size, **settings
    ) as recipe:
        return check_topology(recipe, topology, **options)


class _CallableModule(types.ModuleType):
    """`tpukit.check(...)` is this module's `check` also where `import tpukit.check` made the name the module."""

    def __call__(self, *args, **kwargs):
        return check(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

if __name__ == "__main__":
    sys.exit(main())
