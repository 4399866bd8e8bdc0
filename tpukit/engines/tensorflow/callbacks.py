"""Keras callbacks tpukit's trainer adds: throughput and TensorBoard scalars Keras does not write (learning rate,
examples/s, steps/s). Steps are counted with `optimizer.iterations`, so they stay right when
`steps_per_execution` > 1 and when a run resumes mid-epoch."""

from __future__ import annotations

import math
import os
import time

import keras
import tensorflow as tf

from tpukit import rundir
from tpukit.engines.tensorflow import keras_private


def _step(model) -> int:
    return keras_private.batch_step(model.optimizer)


class _ExcludesValidation(keras.callbacks.Callback):
    """Adds up the time `fit` spends validating, so rates can leave it out (it is not training time)."""

    def __init__(self):
        super().__init__()
        self._validating_since = None
        self._validation_seconds = 0.0

    def on_test_begin(self, logs=None):
        self._validating_since = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._validating_since is not None:
            self._validation_seconds += time.perf_counter() - self._validating_since
        self._validating_since = None


class Throughput(_ExcludesValidation):
    """Time to the first step (dominated by tracing and XLA compilation) and examples/s after it.

    One instance spans every `fit` segment of a run: the first segment's first step is the compile time, and the
    rate is over all steps after that first execution of each segment.
    """

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.time_to_first_step = None
        self.examples_per_second = None
        self.steps_per_second = None
        self._steps = 0
        self._seconds = 0.0
        self._start = None
        self._first = None  # (time, step) after the first execution of this segment

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()
        self._first = None
        self._validation_seconds = 0.0  # validation inside this segment

    def on_train_batch_end(self, batch, logs=None):
        if self._first is None:
            now = time.perf_counter()
            if self.time_to_first_step is None:
                self.time_to_first_step = now - self._start
            self._first = (now, _step(self.model))

    def rate_since_first(self) -> tuple[int, float]:
        """(steps, seconds) since this segment's first execution."""
        if self._first is None:
            return 0, 0.0
        seconds = time.perf_counter() - self._first[0] - self._validation_seconds
        return _step(self.model) - self._first[1], seconds

    def on_train_end(self, logs=None):
        steps, seconds = self.rate_since_first()
        self._steps += steps
        self._seconds += seconds
        if self._steps > 0 and self._seconds > 0:
            self.steps_per_second = self._steps / self._seconds
            self.examples_per_second = self.steps_per_second * self.global_batch_size


class TrainingScalars(_ExcludesValidation):
    """Writes learning_rate, examples_per_second and steps_per_second to `log_dir/train` at every epoch end,
    at the optimizer step (Keras' TensorBoard callback writes the metrics, not these)."""

    def __init__(self, log_dir: str, throughput: Throughput):
        super().__init__()
        self.log_dir = os.path.join(log_dir, "train")
        self.throughput = throughput
        self._writer = None
        self._last = None  # (time, step) at the previous epoch end

    def on_train_begin(self, logs=None):
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        self._last = (time.perf_counter(), _step(self.model))
        self._validation_seconds = 0.0

    def _learning_rate(self, step: int) -> float:
        rate = self.model.optimizer.learning_rate
        return float(keras.ops.convert_to_numpy(rate(step) if callable(rate) else rate))

    def on_epoch_end(self, epoch, logs=None):
        import tensorflow as tf

        now, step = time.perf_counter(), _step(self.model)
        with self._writer.as_default(step=step):
            tf.summary.scalar("learning_rate", self._learning_rate(step))
            # on_epoch_end comes after the epoch's validation: its time is not training time.
            steps, seconds = step - self._last[1], now - self._last[0] - self._validation_seconds
            if steps > 0 and seconds > 0:
                tf.summary.scalar("steps_per_second", steps / seconds)
                tf.summary.scalar(
                    "examples_per_second", steps * self.throughput.global_batch_size / seconds
                )
        self._writer.flush()
        self._last = (now, step)
        self._validation_seconds = 0.0


def _stored(variable) -> float | None:
    value = float(variable.numpy())
    return None if math.isnan(value) else value


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """`EarlyStopping` whose best value, wait count and stop flag live in the checkpoint's `RunState`.

    Keras resets them in `on_train_begin`, i.e. at every `fit` segment (each resume, NaN rollback or mid-epoch
    restart): patience would restart and a finished early-stopped run would train again when rerun.
    """

    def __init__(self, state, **kwargs):
        super().__init__(**kwargs)
        self.state = state

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        best = _stored(self.state.early_stopping_best)
        if best is not None:
            self.best = best
        self.wait = int(self.state.early_stopping_wait.numpy())

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if self.best is not None and math.isfinite(self.best):
            self.state.early_stopping_best.assign(self.best)
        self.state.early_stopping_wait.assign(self.wait)
        if self.stopped_epoch == epoch and self.model.stop_training:
            self.state.stopped_early.assign(True)


class ResumableModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """`ModelCheckpoint(save_best_only=True)` whose best value is restored from the checkpoint's `RunState`, so the
    first epoch after a restart cannot overwrite `best.keras` with a worse model."""

    def __init__(self, state, filepath, **kwargs):
        super().__init__(filepath, save_best_only=True, **kwargs)
        self.state = state
        self.final_path = filepath

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        best = _stored(self.state.export_best)
        if best is not None:
            self.best = best

    def on_epoch_end(self, epoch, logs=None):
        # Written whole: Keras saves to a temporary name (still ending in .keras), renamed over best.keras after,
        # so a SIGKILL or a full disk mid-save leaves the previous best.keras intact.
        temporary = rundir.temporary_name(self.final_path)
        self.filepath = temporary
        try:
            super().on_epoch_end(epoch, logs)
        finally:
            self.filepath = self.final_path
        if tf.io.gfile.exists(temporary):
            tf.io.gfile.rename(temporary, self.final_path, overwrite=True)
        if self.best is not None and math.isfinite(self.best):
            self.state.export_best.assign(self.best)


class StepTensorBoard(keras_private.tensorboard_at_step()):
    """Keras' TensorBoard with its epoch scalars at the optimizer step (Keras writes them at the epoch index), so
    they line up with `TrainingScalars` and stay right across resumes and any `steps_per_execution`."""

    def epoch_summary_step(self, epoch: int) -> int:
        return _step(self.model)


def _exact_loss(logs: dict, prefix: str = "", terms: dict | None = None) -> float | None:
    """The exact loss over the real examples from the logged metrics: with `terms` (metric name -> loss weight,
    `tpukit.task.spec_of(model).exact_loss`) their weighted sum; else `weighted_loss`
    (`tpukit.task.losses.WeightedLoss`, compiled with label smoothing) or `cross_entropy` (the loss without
    smoothing). None if the logs lack them."""
    if terms:
        if all(prefix + name in logs for name in terms):
            return float(sum(weight * float(logs[prefix + name]) for name, weight in terms.items()))
        return None
    for name in ("weighted_loss", "cross_entropy"):
        if prefix + name in logs:
            return logs[prefix + name]
    return None


class ExactValidationLoss(keras.callbacks.Callback):
    """Reports the exact loss (`_exact_loss`) as `loss` in the logs the other callbacks see (progress bar,
    TensorBoard, early stopping, best.keras): `val_loss` at each epoch end, and `loss` at the end of an evaluation
    (what `evaluate` prints; its return value is a separate dict). Keras' own loss weights every eval batch by its
    size, so the zero-weight examples that complete the last batch pull it down."""

    def __init__(self, exact_loss: dict | None = None):
        super().__init__()
        self.exact_loss = exact_loss

    def on_test_end(self, logs=None):
        with_aliases(logs, exact_loss=self.exact_loss)

    def on_epoch_end(self, epoch, logs=None):
        # Training batches have no padding: Keras' own loss is right there.
        with_aliases(logs, set_loss=False, exact_loss=self.exact_loss)
        with_aliases(logs, prefix="val_", exact_loss=self.exact_loss)


def with_aliases(
    logs: dict | None, prefix: str = "", set_loss: bool = True, exact_loss: dict | None = None
) -> dict | None:
    """Sets `loss` to the exact loss (`_exact_loss`) and logs it as `weighted_loss` where no metric of that name was
    compiled (no label smoothing: the cross-entropy is the loss), so recipes that monitor `val_weighted_loss`
    (early stopping, best.keras) and readers of `metrics.json` find it as before. Returns `logs`."""
    exact = _exact_loss(logs or {}, prefix, exact_loss)
    if exact is not None:
        if set_loss:
            logs[prefix + "loss"] = exact
        logs.setdefault(prefix + "weighted_loss", exact)
    return logs
