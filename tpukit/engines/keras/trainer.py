"""The fit loop around `model.fit`: step checkpoints, SIGTERM preemption, NaN rollback, mid-epoch resume.

Keras' `fit` resumes only at epoch boundaries and stops at nothing but callbacks' `stop_training`. Model
Garden's trainer adds what long TPU runs need (recovery from NaN with a bounded number of retries, checkpoints
every N steps); this module adds the same around an unmodified `model.fit`:

* the loop calls `fit` in segments: a partial epoch first when a checkpoint is mid-epoch, then whole epochs, so a
  run interrupted at step k continues at step k, and the dataset skips the k batches already seen;
* `TrainingGuard` (a callback) saves every `checkpoint_every_steps`, at epoch ends (skipping those where saving
  would take more than `checkpoint_max_overhead` of the time since the last save), at the last step (once `fit`
  returns, like the other outputs of a finished run), and on SIGTERM (Colab disconnects, preemptible TPU VMs) or
  SIGINT (Ctrl-C; a notebook's stop button) before stopping cleanly: the step in flight finishes, a checkpoint is
  saved, and a second Ctrl-C stops at once without saving; it stops at the first non-finite loss without saving;
* a new run saves its initial weights (step 0) before training, so a rollback always has a checkpoint;
* after a NaN the loop restores the newest checkpoint, skips the batches from that checkpoint to the step that
  diverged (a retry on the same data with the same dropout draws would diverge again), and retries, up to
  `max_nan_retries` times; weights that are not finite are never checkpointed, even when the loss was finite;
* early stopping's state and a finished early stop are kept in the checkpoint (`checkpoint.RunState`), so a
  restarted or re-run command neither restarts patience nor trains again.

Both engines use it: the checkpointer (`checkpoint.Checkpointer` here, `tpukit.engines.jax.checkpoint.Checkpointer`
there) says whether weights are finite and how the hosts of a cluster agree on a stop.

All counting is in batches (`keras_private.batch_step`: `optimizer.iterations` counts updates under gradient
accumulation), so it stays right when `steps_per_execution` > 1.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import signal
import threading
import time
from collections.abc import Callable

import keras

from tpukit import rundir
from tpukit.engines.keras import keras_private

logger = logging.getLogger("tpukit")


class TrainingDivergedError(RuntimeError):
    """The loss stayed non-finite after every allowed rollback."""


# Outcome statuses of a run stopped by a signal after saving: SIGTERM -> "preempted", SIGINT -> "interrupted".
STOPPED = {"SIGTERM": "preempted", "SIGINT": "interrupted"}


class TrainingGuard(keras.callbacks.Callback):
    """Checkpoint cadence, SIGTERM/SIGINT handling and NaN detection for one `fit` segment."""

    def __init__(
        self,
        checkpointer,
        checkpoint_every_steps: int | None,
        max_overhead: float | None = None,
        last_step: int | None = None,
    ):
        super().__init__()
        self.checkpointer = checkpointer
        self.every = checkpoint_every_steps
        self.max_overhead = max_overhead  # see checkpoint.Checkpointer.save_is_due
        self.last_step = last_step
        self.diverged_at: int | None = None
        self.preempted = False
        self.stopped_by: str | None = None  # "SIGTERM" or "SIGINT" once stopped by a signal
        self._sigterm = (
            False  # a stop signal arrived (either one); named so for the cluster agreement below
        )
        self._signal: str | None = None
        self._previous_handlers: dict = {}
        self._agree = None

    # -- signals ---------------------------------------------------------------------------------------------------
    def _on_signal(self, signum, frame):
        # Only set a flag: the step in flight finishes, then on_train_batch_end saves and stops.
        name = signal.Signals(signum).name
        if name == "SIGINT" and self._signal == "SIGINT":
            # The second Ctrl-C: stop at once, as Python does, without saving.
            self._restore_handlers()
            raise KeyboardInterrupt
        if self._signal is None:
            self._signal = name
        self._sigterm = True
        if name == "SIGINT":
            logger.warning(
                "tpukit: Ctrl-C: finishing the step in flight, then saving a checkpoint and stopping (press Ctrl-C "
                "again to stop at once, without saving)"
            )

    def on_train_begin(self, logs=None):
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGTERM, signal.SIGINT):
                if signal.getsignal(number) is signal.SIG_IGN:
                    continue  # ignored on purpose (`nohup`, a job started with `&`): it stays ignored
                self._previous_handlers[number] = signal.signal(number, self._on_signal)
        self._agree = self.checkpointer.agreement(self.model)

    def on_train_end(self, logs=None):
        self._restore_handlers()

    def _restore_handlers(self) -> None:
        for number, handler in self._previous_handlers.items():
            signal.signal(number, handler)
        self._previous_handlers = {}

    # -- per execution ----------------------------------------------------------------------------------------------
    def _save(self, again: bool = False) -> bool:
        """Saves unless this step is saved already (`again`: save it once more, with the epoch-end state of the other
        callbacks); returns False (and stops) when the weights are not finite."""
        if self.checkpointer.step == self.checkpointer.last_saved_step and not again:
            return True
        if not self.checkpointer.all_finite(self.model.weights):
            # The loss of this execution was finite, but the update that followed it was not.
            self.diverged_at = self.checkpointer.step
            self.model.stop_training = True
            return False
        self.checkpointer.save()
        return True

    def save_final(self) -> None:
        """The last step's checkpoint, with the run state of its epoch end, unless that is saved already; called
        after `fit` returns."""
        self._save()

    def on_train_batch_end(self, batch, logs=None):
        # A lease taken over by another run (gs://, shared mounts): stop at once, writing nothing more there.
        rundir.check_leases()
        step = self.checkpointer.step
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.diverged_at = step
            self.model.stop_training = True
            return
        if self._agree is not None:
            # A preempted host gets SIGTERM alone while the others wait in its collectives: every worker learns of
            # it at the same execution, so all save the same step and stop together.
            self._sigterm = self._agree(self._sigterm)
        if self._sigterm:
            self._stop_for_signal(step)
            return
        # Counted from the last checkpoint written or restored, so a resumed segment keeps the cadence even when the
        # step it resumed at was never saved (its epoch-end save was skipped).
        if self.every and step - self.checkpointer.last_saved_step >= self.every:
            self._save()

    def _stop_for_signal(self, step: int) -> None:
        if not self._save():
            return
        self.preempted = True
        self.stopped_by = self._signal or "SIGTERM"  # None: another worker of the cluster got it
        self.model.stop_training = True
        logger.warning(
            "tpukit: %s received%s: saved step %d and stopped; run the same command to resume",
            self.stopped_by,
            "" if self._signal else " by another worker",
            step,
        )

    def on_epoch_end(self, epoch, logs=None):
        if self.diverged_at is not None or self.preempted:
            return
        step = self.checkpointer.step
        if self._sigterm and self._agree is None:
            # Arrived during the epoch's validation: stop here rather than after the next epoch's first step.
            self._stop_for_signal(step)
            return
        if step == self.checkpointer.last_saved_step:
            # A periodic save wrote this step before the epoch-end callbacks (early stopping, best.keras) updated
            # the run state: write it again so the state is in the checkpoint.
            self._save(again=True)
            return
        if self.last_step is not None and step >= self.last_step:
            return  # saved by `fit_with_recovery` once `fit` returns: an output of the finished run, like the export
        due = self.model.stop_training or self.checkpointer.save_is_due(self.max_overhead)
        if self._agree is not None:
            # Every worker keeps the same steps: a resume needs a checkpoint they all have.
            due = self._agree(due)
        if due:
            self._save()
        else:
            logger.debug(
                "tpukit: no checkpoint at step %d: a save takes ~%.1f ms and the last was %.1f s ago (max overhead %g)",
                step,
                self.checkpointer.save_seconds * 1e3,
                time.perf_counter() - self.checkpointer.saved_at,
                self.max_overhead,
            )


class FreshValidationPass(keras.callbacks.Callback):
    """Starts every validation of `fit` on a fresh iterator over the finite eval dataset.

    Keras 3.15's `fit` caches one eval `EpochIterator` (backend/tensorflow/trainer.py, `_eval_epoch_iterator`), and
    under a strategy `evaluate` first draws a batch from its current iterator to build the model
    (`_maybe_symbolic_build`) before resetting it. Where Keras sizes the distributed dataset by its per-replica batch
    count (2+ replicas per input pipeline) it keeps the exhausted iterator of the previous pass, so the second
    validation stopped with StopIteration. Resetting at the end of each pass makes the next one start fresh."""

    def on_test_end(self, logs=None):
        keras_private.reset_eval_epoch_iterator(self.model)


@dataclasses.dataclass
class Outcome:
    status: str  # "done", "preempted" (SIGTERM), "interrupted" (SIGINT), "early_stopped"
    history: dict[str, list[float]]
    nan_rollbacks: int
    skipped_steps: int = (
        0  # steps of data skipped after NaN rollbacks, over the whole run (all restarts)
    )


def fit_with_recovery(
    model,
    make_dataset,
    *,
    checkpointer,
    steps_per_epoch: int,
    epochs: int,
    callbacks: list,
    checkpoint_every_steps: int | None = None,
    checkpoint_max_overhead: float | None = None,
    max_nan_retries: int = 3,
    validation_data=None,
    validation_steps: int | None = None,
    validation_freq: int = 1,
    verbose=1,
    on_compile_failure: Callable[[BaseException], bool] | None = None,
) -> Outcome:
    """Trains until `epochs * steps_per_epoch` optimizer steps, resuming from `checkpointer.step`.

    Args:
        make_dataset: `make_dataset(position)` returns the training dataset positioned after `position` steps of
            data (the step plus the steps skipped after NaN rollbacks, `checkpointer.data_position`).
        callbacks: run in this order, before the `TrainingGuard` that saves (so their state is in the checkpoint).
        checkpoint_every_steps: also save every this many steps (None: not by step count).
        checkpoint_max_overhead: skip an epoch-end save while saving would take more than this fraction of the time
            since the last save (`Checkpointer.save_is_due`); None saves at every epoch end. A rollback after a NaN
            goes back to the newest checkpoint, so a bound also widens the data window it skips.
        validation_data: a zero-argument callable returning the evaluation dataset (fresh for each segment).
        on_compile_failure: called with the error when a segment's `fit` fails before its first step; True when it
            changed the model so that the segment can run again (the engine turning off an XLA it chose itself).
    """
    total = steps_per_epoch * epochs
    history: dict[str, list[float]] = {}
    rollbacks = 0
    state = checkpointer.state

    def outcome(status):
        return _committed(
            checkpointer, Outcome(status, history, rollbacks, int(state.skipped_steps.numpy()))
        )

    if not _ready(checkpointer, total):
        return outcome("early_stopped")
    while checkpointer.step < total:
        guard = TrainingGuard(
            checkpointer, checkpoint_every_steps, checkpoint_max_overhead, last_step=total
        )
        step_before = checkpointer.step
        try:
            result = _fit_segment(
                model,
                make_dataset(checkpointer.data_position),
                guard,
                _span(checkpointer.step, steps_per_epoch, epochs),
                callbacks=[*callbacks, FreshValidationPass(), guard],
                validation_data=validation_data() if validation_data else None,
                validation_steps=validation_steps,
                validation_freq=validation_freq,
                verbose=verbose,
            )
        except BaseException as error:  # re-raised unless the engine can run the segment otherwise
            guard._restore_handlers()  # Keras ends `fit` on an error without `on_train_end`
            if not _runs_again(error, on_compile_failure, checkpointer.step != step_before):
                raise
            on_compile_failure = None  # once
            continue
        for key, values in result.history.items():
            history.setdefault(key, []).extend(float(v) for v in values)
        _finish(guard, checkpointer, total)
        if guard.diverged_at is not None:
            rollbacks += 1
            _roll_back(checkpointer, guard.diverged_at, rollbacks, max_nan_retries)
            continue
        if guard.preempted:
            return outcome(STOPPED.get(guard.stopped_by, "preempted"))
        if model.stop_training:  # a callback (early stopping) ended the run
            return outcome("early_stopped")
    return outcome("done")


def _committed(checkpointer, outcome: Outcome) -> Outcome:
    """`outcome` once the save in flight is committed (a run never reports an outcome its checkpoint lacks)."""
    checkpointer.wait()
    return outcome


def _ready(checkpointer, total: int) -> bool:
    """False when the run stopped early already (nothing left to train). Else a new run saves its initial weights
    before fit: a NaN rollback always has a checkpoint to go back to, and with checkpoint_max_overhead the first
    epoch-end save need not happen inside the training loop."""
    if bool(checkpointer.state.stopped_early.numpy()):
        logger.info(
            "tpukit: this run stopped early at step %d; nothing left to train", checkpointer.step
        )
        return False
    if checkpointer.step < total and checkpointer.manager.latest_checkpoint is None:
        checkpointer.save()
        # Committed before the input pipeline is built: the write of an asynchronous checkpointer (the jax engine's)
        # then never overlaps building the datasets, which TFDS's `testing.mock_data` does with the file system
        # patched for every thread (a rollback before the next save has this step either way).
        checkpointer.wait()
    return True


def _runs_again(
    error: BaseException, on_compile_failure: Callable[[BaseException], bool] | None, trained: bool
) -> bool:
    """Whether a segment that raised `error` runs again: an `Exception` before its first step (`trained`: it took
    one) that the engine's `on_compile_failure` answered by changing the model."""
    return (
        isinstance(error, Exception)
        and on_compile_failure is not None
        and not trained
        and on_compile_failure(error)
    )


def _finish(guard: TrainingGuard, checkpointer, total: int) -> None:
    """After a segment that reached the last step: its checkpoint (weights that are not finite set `diverged_at`,
    rolled back by the caller), and a signal that came after the last step stops the run before it evaluates."""
    if checkpointer.step < total or guard.diverged_at is not None or guard.preempted:
        return
    guard.save_final()
    if guard._sigterm and guard.diverged_at is None:
        # Training is saved; the run stops before evaluating.
        guard.preempted, guard.stopped_by = True, guard._signal or "SIGTERM"


def _span(step: int, steps_per_epoch: int, epochs: int) -> dict:
    """`fit`'s epoch arguments from `step`: the rest of an interrupted epoch first, then whole epochs."""
    epoch, offset = divmod(step, steps_per_epoch)
    if not offset:
        return {"initial_epoch": epoch, "epochs": epochs, "steps_per_epoch": steps_per_epoch}
    left = steps_per_epoch - offset
    logger.info(
        "tpukit: resuming mid-epoch at step %d: %d steps left in epoch %d", step, left, epoch + 1
    )
    return {"initial_epoch": epoch, "epochs": epoch + 1, "steps_per_epoch": left}


def _fit_segment(model, dataset, guard, span: dict, **fit_kwargs):
    """One `model.fit` call. After a SIGTERM or a NaN Keras would still run the epoch's validation before `fit`
    returns: on a preemptible VM that can outlast the notice, and on NaN weights it is wasted and pollutes the logs."""
    with (
        keras_private.validation_only_while(
            model, lambda: not guard.preempted and guard.diverged_at is None
        ),
        keras_private.averages_kept_apart(model.optimizer),
    ):
        # shuffle=False: the pipeline shuffles; Keras cannot shuffle a dataset.
        return model.fit(dataset, shuffle=False, **span, **fit_kwargs)


def _roll_back(checkpointer, diverged_at: int, rollbacks: int, max_nan_retries: int) -> None:
    """Restores the newest checkpoint and skips the data window from it to `diverged_at`; raises when out of
    retries or when there is no checkpoint to go back to."""
    latest = checkpointer.manager.latest_checkpoint
    if rollbacks > max_nan_retries or not latest:
        raise TrainingDivergedError(
            f"the loss became non-finite at step {diverged_at} "
            + (
                f"after {rollbacks - 1} rollback(s) (train.max_nan_retries={max_nan_retries})"
                if latest
                else "before any checkpoint was saved, so there is nothing to roll back to"
            )
            + ". Fix: lower train.learning_rate, add train.warmup_steps, or check the data for NaN/inf "
            "(runtime.checkpoint_every_steps gives a rollback a nearer checkpoint to go back to)."
        )
    state = checkpointer.state
    skipped = int(state.skipped_steps.numpy())  # the restore resets it to the checkpoint's value
    restored = checkpointer.restore()
    window = max(diverged_at - restored, 1)
    state.skipped_steps.assign(skipped + window)
    logger.warning(
        "tpukit: non-finite loss or weights at step %d: rolled back to step %d and skipped the %d batch(es) of data "
        "from there (%d skipped after rollbacks in all; retry %d of %d)",
        diverged_at,
        restored,
        window,
        skipped + window,
        rollbacks,
        max_nan_retries,
    )
