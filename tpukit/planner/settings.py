"""The recipe's settings an engine acts on as they are: the engine reads them from the `Plan` (`Plan.settings`) and
the connection (`connection`), never from the recipe, so a Plan is all an engine needs to know about a run.

`Connection` is what an engine needs before there is a plan (`engine.hardware` connects and counts the devices);
`RunSettings` the rest: the build, the fit loop, its callbacks, the checkpoints, the report and the errors it
explains. The recipe stays in the Plan for `tpukit.task`, which builds the model and the pipelines from it. Pure.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tpukit.recipe import Recipe


@dataclasses.dataclass(frozen=True)
class Connection:
    """How an engine connects and what it needs to describe its hardware (`runtime.*` of the recipe)."""

    tpu: str | None
    tpu_timeout_seconds: float
    workers_timeout_seconds: float
    steps_per_execution: int | str  # as the recipe says ("auto": decided once the model is built)
    mesh: dict[str, Any]  # {"data": n or "auto", "model": m}
    mesh_from: str | None = (
        None  # what sized `mesh` when not runtime.mesh (a Keras LayoutMap's DeviceMesh)
    )


def connection(recipe: Recipe) -> Connection:
    runtime = recipe.runtime
    return Connection(
        tpu=runtime.tpu,
        tpu_timeout_seconds=runtime.tpu_timeout_seconds,
        workers_timeout_seconds=runtime.workers_timeout_seconds,
        steps_per_execution=runtime.steps_per_execution,
        mesh=runtime.mesh,
        mesh_from=runtime.mesh_from,
    )


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """The recipe's keys an engine reads (the Plan holds what the planner decided from the others)."""

    seed: int
    epochs: int
    max_nan_retries: int
    eval_every_epochs: int
    early_stopping_patience: int | None
    early_stopping_metric: str | None  # None: val_loss
    export_best_by: str | None
    baseline: bool
    checkpoint_every_steps: int | None
    checkpoint_max_overhead: float | None
    max_checkpoints_to_keep: int
    profile_steps: tuple[int, ...] | None
    verbose: int | str
    loop: str
    combine_repeated_ids: bool  # the tensorflow engine: sum repeated ids' sparse gradients (engines/tensorflow/sparse.py)
    jit_compile: bool | str  # as the recipe says (`Plan.jit_compile` is the decision)
    steps_per_execution: int | str  # as the recipe says (`Plan.steps_per_execution`: the decision)
    steps_per_execution_target_seconds: float | None
    layout: dict[str, Any] | None  # the jax engine's weight layout; None: the model's default
    model_name: str
    source: str
    source_options: dict[str, Any]
    train_split: str
    eval_split: str | None
    # Every key the recipe decides, flattened ("train.seed", "model arguments", ...): the workers of a cluster
    # compare them before training (`tpukit.engines.tensorflow.cluster.check_same_recipe`).
    keys: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)


def run_settings(recipe: Recipe) -> RunSettings:
    train, runtime, data = recipe.train, recipe.runtime, recipe.data
    return RunSettings(
        seed=train.seed,
        epochs=train.epochs,
        max_nan_retries=train.max_nan_retries,
        eval_every_epochs=train.eval_every_epochs,
        early_stopping_patience=train.early_stopping_patience,
        early_stopping_metric=train.early_stopping_metric,
        export_best_by=train.export_best_by,
        baseline=train.baseline,
        checkpoint_every_steps=runtime.checkpoint_every_steps,
        checkpoint_max_overhead=runtime.checkpoint_max_overhead,
        max_checkpoints_to_keep=runtime.max_checkpoints_to_keep,
        profile_steps=runtime.profile_steps,
        verbose=runtime.verbose,
        loop=runtime.loop,
        combine_repeated_ids=train.combine_repeated_ids,
        jit_compile=runtime.jit_compile,
        steps_per_execution=runtime.steps_per_execution,
        steps_per_execution_target_seconds=runtime.steps_per_execution_target_seconds,
        layout=runtime.layout,
        model_name=recipe.model.name,
        source=data.source,
        source_options=data.options,
        train_split=data.train_split,
        eval_split=data.eval_split,
        keys=recipe_keys(recipe),
    )


def recipe_keys(recipe: Recipe) -> dict[str, Any]:
    """Every key a recipe decides, flattened to the same list on every worker of a cluster (dataclass fields, plus
    one entry each for the model's and the source's own arguments, whose keys differ between models and sources).
    `runtime.tpu` is left out: the TPU address may differ by host."""
    values = {"model.name": recipe.model.name, "model arguments": recipe.model.kwargs}
    for section, config in (
        ("data", recipe.data),
        ("train", recipe.train),
        ("runtime", recipe.runtime),
    ):
        for field in dataclasses.fields(config):
            if field.name == "options":
                values["data source arguments"] = config.options
            elif (section, field.name) != ("runtime", "tpu"):
                values[f"{section}.{field.name}"] = getattr(config, field.name)
    return values
