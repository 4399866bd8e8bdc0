"""The interface an engine implements, written in code: `tpukit.runner` calls these functions of the engine module
that `tpukit.engines.get(name)` returns, and `tests/engines/test_protocols.py` checks each engine against it.

    hardware = engine.hardware(recipe, strategy, output_dir)   # connect; what the planner needs to know
    session = engine.build(the_plan)     # the model, built and restored under the plan's distribution
    outcome = engine.train(session)      # fit with checkpoints, SIGTERM, NaN rollback (`trainer.py`)
    evaluation = engine.evaluate(session, outcome)
    exported = engine.export(session, outcome)
    metrics = engine.report(session, outcome, evaluation, exported)

The checkpointer each engine's `build` makes is `tpukit.engines.keras.checkpoint.Checkpointer`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol, runtime_checkable

from tpukit.engines.keras.checkpoint import Checkpointer

__all__ = ["Checkpointer", "Engine"]


@runtime_checkable
class Engine(Protocol):
    """An engine module (`tpukit.engines.tensorflow.engine`, `tpukit.engines.jax.engine`)."""

    NAME: str

    def hardware(self, recipe, strategy, output_dir: str):
        """Connects (or uses `strategy`, a test's) and returns the `tpukit.planner.Hardware` the planner needs."""

    def checkpoints(self, checkpoint_dir: str, checkpoint: str | None):
        """The `tpukit.planner.CheckpointFacts` of `checkpoint_dir` (the newest step, whether `checkpoint` exists);
        a RecipeError where the directory holds the other engine's checkpoints."""

    def remote_files(self) -> Any:
        """`tpukit.rundir`'s file operations for `scheme://` output directories."""

    def dtype_policy(self, name: str) -> contextlib.AbstractContextManager:
        """Keras' global dtype policy `name` for the run, the caller's restored after."""

    def explained(self, the_plan) -> contextlib.AbstractContextManager:
        """Errors of building, training and evaluating, as tpukit's RecipeError / OutputDirError where they mean
        one, known environment errors annotated with their fix."""

    def build(self, the_plan) -> Any:
        """The session (`tpukit.engines.keras.session.Session`): the model compiled, its checkpointer, restored."""

    def train(self, session, callbacks: list | None = None) -> Any:
        """Trains from `session.start_step` to the plan's last step; returns a `trainer.Outcome`."""

    def evaluate(self, session, outcome) -> dict[str, float]:
        """One exact pass over the eval split; {} without evaluation."""

    def export(self, session, outcome) -> dict[str, str]:
        """`model.keras` and the SavedModel; {} in eval mode or when stopped by a signal."""

    def report(self, session, outcome, evaluation: dict, exported: dict) -> dict:
        """The run's metrics (`metrics.json`)."""
