"""What both engines' checkpointers share: the `Checkpointer` interface the trainer drives (`trainer.
fit_with_recovery`), the run state it carries, the errors a restore raises, and the newest-first fallback over damaged
checkpoints (`restore_first_readable`). Each engine writes its own format: `tf.train.Checkpoint` files (the
tensorflow engine), Orbax step directories `ckpt_N/` (the jax engine)."""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol, runtime_checkable

logger = logging.getLogger("tpukit")


class CheckpointMismatchError(ValueError):
    """The checkpoint in the output directory does not fit the model the recipe builds."""


class CheckpointCorruptError(ValueError):
    """No checkpoint in the directory could be read (all are incomplete or damaged)."""


@runtime_checkable
class RunStateValue(Protocol):
    """One value of the run state: read with `numpy()`, written with `assign()` (a `tf.Variable` has both)."""

    def numpy(self) -> Any: ...

    def assign(self, value) -> Any: ...


class RunState(Protocol):
    """What the trainer carries across restarts besides the weights, saved in every checkpoint: the data skipped
    after NaN rollbacks, early stopping's best value, wait count and stop flag, and the best value `best.keras` was
    exported at."""

    skipped_steps: RunStateValue
    early_stopping_best: RunStateValue
    early_stopping_wait: RunStateValue
    stopped_early: RunStateValue
    export_best: RunStateValue


@runtime_checkable
class Checkpointer(Protocol):
    """The checkpointer `trainer.fit_with_recovery` drives on either engine.

    `step` is the batches the optimizer has taken; `data_position` adds the batches skipped after NaN rollbacks.
    `save()` writes `ckpt-<step>` whole or not at all and returns its path (it may go on writing in the
    background: `wait()` returns once it is committed, and raises its error); `restore(path)` restores `path` or, with
    None, the newest readable checkpoint (falling back past damaged ones), and returns the step (0: none);
    `save_is_due(max_overhead)` says whether a periodic save keeps checkpointing under `max_overhead` of the time.
    `manager.latest_checkpoint` is the newest checkpoint's path or None; `agreement(model)` returns `agree(flag) ->
    bool` across workers or processes (a stop signal seen by any stops all), or None on one.
    """

    directory: str
    state: RunState
    manager: Any
    last_saved_step: int  # the step of the checkpoint the model holds or last wrote
    saved_at: float  # `time.perf_counter()` at the end of the last save (or at creation)
    save_seconds: float  # how long the last save took (before the first: an estimate)
    seconds_saving: float  # every save of this process, for the run's phase timings

    @property
    def step(self) -> int: ...

    @property
    def data_position(self) -> int: ...

    def all_finite(self, variables) -> bool: ...

    def agreement(self, model): ...

    def save(self) -> str: ...

    def wait(self) -> None: ...

    def restore(self, path: str | None = None) -> int: ...

    def save_is_due(self, max_overhead: float | None) -> bool: ...


def restore_first_readable(checkpointer, candidates: list[str], read_errors: tuple) -> int:
    """Restores the first of `candidates` (newest first) that `checkpointer._restore_one` can read, saying which
    were skipped and why, and returns its step (0 without candidates). Both engines' checkpointers use it.

    Raises:
        CheckpointMismatchError: a readable checkpoint does not fit the model.
        CheckpointCorruptError: no candidate can be read.
    """
    if not candidates:
        return 0
    failures = []
    for candidate in candidates:
        try:
            checkpointer._restore_one(candidate)
        except CheckpointMismatchError:
            raise
        except read_errors as error:
            failures.append(
                f"{candidate} ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
            )
            logger.warning(
                "tpukit: checkpoint %s is incomplete or damaged (%s)%s",
                candidate,
                type(error).__name__,
                "; trying the previous one" if candidate != candidates[-1] else "",
            )
            continue
        if failures:
            logger.warning(
                "tpukit: resumed from %s (step %d) because the newer checkpoint(s) could not be read: %s",
                candidate,
                checkpointer.step,
                "; ".join(failures),
            )
        else:
            logger.info("tpukit: restored %s at step %d", candidate, checkpointer.step)
        checkpointer.last_saved_step = checkpointer.step
        return checkpointer.step
    raise CheckpointCorruptError(
        f"no checkpoint in {os.path.dirname(candidates[0])} could be read: {'; '.join(failures)}. Fix: restore "
        "the files from a backup, or delete that directory (or pass a new --output_dir) to start over."
    )
