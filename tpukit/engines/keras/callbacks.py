"""Keras callbacks tpukit's trainer adds: throughput, TensorBoard scalars written off the step loop (Keras'
metrics, learning rate, examples/s, steps/s), and a KerasHub causal LM's sample generations. Steps are counted with `optimizer.iterations`, so they stay right when
`steps_per_execution` > 1 and when a run resumes mid-epoch."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time

import keras
import tensorflow as tf

from tpukit import rundir
from tpukit.engines.keras import export, keras_private

logger = logging.getLogger("tpukit")


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
    rate is over all steps after that first execution of each segment. `first_step_seconds` and
    `validation_seconds_total` add up every segment's first execution and validation (the run's phases).
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
        self.first_step_seconds = 0.0
        self.validation_seconds_total = 0.0

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()
        self._first = None
        self._validation_seconds = 0.0  # validation inside this segment

    def on_train_batch_end(self, batch, logs=None):
        if self._first is None:
            now = time.perf_counter()
            if self.time_to_first_step is None:
                self.time_to_first_step = now - self._start
            self.first_step_seconds += now - self._start
            self._first = (now, _step(self.model))

    def rate_since_first(self) -> tuple[int, float]:
        """(steps, seconds) since this segment's first execution."""
        if self._first is None:
            return 0, 0.0
        seconds = time.perf_counter() - self._first[0] - self._validation_seconds
        return _step(self.model) - self._first[1], seconds

    def on_train_end(self, logs=None):
        self.validation_seconds_total += self._validation_seconds
        steps, seconds = self.rate_since_first()
        self._steps += steps
        self._seconds += seconds
        if self._steps > 0 and self._seconds > 0:
            self.steps_per_second = self._steps / self._seconds
            self.examples_per_second = self.steps_per_second * self.global_batch_size


class _SummaryThread:
    """Writes TensorBoard scalars on a thread of its own, so the step loop never waits for them: `write(split,
    tag, value, step)` queues a Python float, `flush()` waits until every queued scalar is in its file. The
    scalars are the protocol buffers `tf.summary.scalar` writes (a float32 tensor with the "scalars" plugin's
    metadata), made by TensorBoard's own `scalar_pb` and written with its `EventFileWriter` (one file per split,
    `log_dir/<split>`): no TensorFlow op runs, where `tf.summary` traces and runs TensorFlow functions on the
    step loop's CPU (docs/performance.md)."""

    def __init__(self, log_dir: str):
        import queue
        import threading

        self.log_dir = log_dir
        self._queue: queue.Queue = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="tpukit-summaries", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        writers = {}
        while True:
            item = self._queue.get()
            try:
                if item in ("flush", "close"):
                    for writer in writers.values():
                        writer.flush() if item == "flush" else writer.close()
                else:
                    split, tag, value, step = item
                    if split not in writers:
                        writers[split] = EventFileWriter(os.path.join(self.log_dir, split))
                    summary = (
                        scalar_pb(tag, value) if isinstance(value, float) else text_pb(tag, value)
                    )
                    event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
                    writers[split].add_event(event)
            except Exception as error:  # noqa: BLE001 - a log is not worth stopping a run for
                if self._error is None:
                    self._error = error
            finally:
                self._queue.task_done()
            if item == "close":
                return

    def write(self, split: str, tag: str, value: float, step: int) -> None:
        self._queue.put((split, tag, float(value), int(step)))

    def write_text(self, split: str, tag: str, table, step: int) -> None:
        """Queues a text summary (`tf.summary.text`'s protocol buffer): `table`, a string or a numpy array of
        strings (TensorBoard's Text tab shows a 2-D one as a table)."""
        self._queue.put((split, tag, table, int(step)))

    def flush(self) -> None:
        """Asks for the queued scalars to be written to their files, without waiting."""
        self._queue.put("flush")

    def close(self) -> None:
        """Writes every queued scalar, closes the files and ends the thread; logs a failure to write."""
        self._queue.put("close")
        self._queue.join()
        self._thread.join()
        if self._error is not None:
            logger.warning(
                "tpukit: TensorBoard scalars under %s may be incomplete: %s: %s",
                self.log_dir,
                type(self._error).__name__,
                self._error,
            )


class TensorBoardScalars(_ExcludesValidation):
    """TensorBoard scalars at every epoch end, at the optimizer step, written off the step loop (`_SummaryThread`):
    Keras' metrics as `epoch_<name>` under `log_dir/train` and `log_dir/validation` (the tags of Keras' own
    TensorBoard callback), and learning_rate, examples_per_second and steps_per_second under `log_dir/train`.
    Each epoch's scalars are flushed to their files as they are written; every scalar of a `fit` is in its file,
    and the thread has ended, when `fit` returns."""

    def __init__(self, log_dir: str, throughput: Throughput):
        super().__init__()
        self.log_dir = log_dir
        self.throughput = throughput
        self._thread = None
        self._last = None  # (time, step) at the previous epoch end

    def write_text(self, tag: str, table, step: int) -> None:
        """A text summary under `log_dir/train`, on this fit's thread (flushed with the epoch's scalars), or,
        outside a fit, on a thread of its own closed once it is written."""
        if self._thread is not None:
            self._thread.write_text("train", tag, table, step)
            return
        thread = _SummaryThread(self.log_dir)
        thread.write_text("train", tag, table, step)
        thread.close()

    def on_train_begin(self, logs=None):
        if self._thread is None:
            self._thread = _SummaryThread(self.log_dir)
        self._last = (time.perf_counter(), _step(self.model))
        self._validation_seconds = 0.0

    def _learning_rate(self, step: int) -> float:
        rate = self.model.optimizer.learning_rate
        return float(keras.ops.convert_to_numpy(rate(step) if callable(rate) else rate))

    def on_epoch_end(self, epoch, logs=None):
        now, step = time.perf_counter(), _step(self.model)
        write = self._thread.write
        for name, value in (logs or {}).items():
            split, tag = ("validation", name[4:]) if name.startswith("val_") else ("train", name)
            write(split, f"epoch_{tag}", value, step)
        write("train", "learning_rate", self._learning_rate(step), step)
        # on_epoch_end comes after the epoch's validation: its time is not training time.
        steps, seconds = step - self._last[1], now - self._last[0] - self._validation_seconds
        if steps > 0 and seconds > 0:
            write("train", "steps_per_second", steps / seconds, step)
            write(
                "train",
                "examples_per_second",
                steps * self.throughput.global_batch_size / seconds,
                step,
            )
        self._last = (now, step)
        self._validation_seconds = 0.0
        self._thread.flush()  # in the files at each epoch end, as Keras' callback does, without waiting

    def on_train_end(self, logs=None):
        if self._thread is not None:
            self._thread.close()  # each fit segment's scalars whole in their files when fit returns
            self._thread = None


class SampleGenerations(keras.callbacks.Callback):
    """`train.sample_prompts`: what a KerasHub causal LM (`export.text_causal_lm`) generates for each prompt after
    each evaluation of `fit` and once training ends (`at_end`): a log line per prompt, a text summary `samples` (a
    table of prompt and generation) beside the scalars (`TensorBoardScalars`, under `log_dir/train`), and `last`
    for `metrics.json`. `generate` with the task's own sampler (greedy by default: no random draw) and at most
    `max_length` tokens (None: the preprocessor's sequence length); it reads the weights and writes none, so
    training, its checkpoints and a resume are the same with samples or without."""

    def __init__(self, prompts, max_length: int | None = None, scalars=None):
        super().__init__()
        self.prompts = list(prompts)
        self.max_length = max_length
        self.scalars = scalars  # the TensorBoardScalars callback whose files take the text; None: no TensorBoard
        self.last: list[dict] | None = None

    def check(self, model, where: str) -> None:
        """Before training: a RecipeError naming the key and the fix when `model` cannot generate text."""
        from tpukit.recipe import RecipeError

        if export.text_causal_lm(model) is None:
            built = type(export.exported_model(model)).__name__
            raise RecipeError(
                f"{where}: train.sample_prompts={self.prompts!r} needs a model that generates text (a KerasHub "
                f"causal LM with its preprocessor, e.g. model.name: keras_hub_causal_lm); received a {built}. Fix: "
                "remove train.sample_prompts (or set it to null), or train a KerasHub causal LM."
            )

    def on_epoch_end(self, epoch, logs=None):
        if any(name.startswith("val_") for name in logs or {}):  # this epoch was evaluated
            self.sample(f"after epoch {epoch + 1}", _step(self.model))

    def at_end(self, model) -> None:
        """The samples of the trained model (its moving averages, with `train.ema_momentum`), once `fit` is done."""
        self.set_model(model)
        self.sample("at the end of training", _step(model))

    def sample(self, when: str, step: int) -> list[dict]:
        task = export.text_causal_lm(self.model)
        prompts = self.prompts + self.prompts[-1:] * _batch_padding(len(self.prompts))
        outputs = task.generate(
            prompts,
            max_length=self.max_length or task.preprocessor.sequence_length,
            strip_prompt=True,
        )
        generations = [str(text) for text in outputs[: len(self.prompts)]]
        self.last = [
            {"prompt": prompt, "generation": generation}
            for prompt, generation in zip(self.prompts, generations, strict=True)
        ]
        for prompt, generation in zip(self.prompts, generations, strict=True):
            logger.info("tpukit: sample %s: %r -> %r", when, prompt, generation)
        if self.scalars is not None:
            import numpy as np

            table = np.array(
                [["prompt", "generation"], *([s["prompt"], s["generation"]] for s in self.last)],
                dtype=object,
            )
            self.scalars.write_text("samples", table, step)
        return self.last


def _batch_padding(count: int) -> int:
    """Prompts to add so that `count` divides over the data axis of Keras' distribution (the jax engine's mesh:
    KerasHub's `generate` lays the batch out over it); 0 without one."""
    distribution = keras.distribution.distribution()
    mesh = getattr(distribution, "device_mesh", None)
    axis = getattr(distribution, "batch_dim_name", None)
    if mesh is None or axis not in mesh.axis_names:
        return 0
    size = mesh.shape[mesh.axis_names.index(axis)]
    return -count % size


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

    def set_model(self, model):
        # What model.keras holds (the KerasHub task a plain model was made from: `export.exported_model`); a model
        # without a config has no best.keras (`export.skipped_outputs` warned of it before training).
        target = export.exported_model(model)
        self.unsaved = export.unserializable(target)
        super().set_model(target)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        best = _stored(self.state.export_best)
        if best is not None:
            self.best = best

    def on_epoch_end(self, epoch, logs=None):
        if getattr(self, "unsaved", None):
            return
        # Written whole: Keras saves to a temporary name (still ending in .keras), renamed over best.keras after,
        # so a SIGKILL or a full disk mid-save leaves the previous best.keras intact.
        # A full disk or a read-only directory stops the run (ExportWriteError), with the checkpoints kept.
        temporary = rundir.temporary_name(self.final_path)
        self.filepath = temporary
        with export.writing(os.path.basename(self.final_path), self.final_path):
            try:
                super().on_epoch_end(epoch, logs)
            except BaseException:
                with contextlib.suppress(Exception):  # what a full disk left of it
                    if tf.io.gfile.exists(temporary):
                        tf.io.gfile.remove(temporary)
                raise
            finally:
                self.filepath = self.final_path
            if tf.io.gfile.exists(temporary):
                tf.io.gfile.rename(temporary, self.final_path, overwrite=True)
        if self.best is not None and math.isfinite(self.best):
            self.state.export_best.assign(self.best)


class ProfilingTensorBoard(keras_private.tensorboard_without_scalars()):
    """Keras' TensorBoard callback for `runtime.profile_steps` only: its profiler trace under `log_dir/train`;
    the scalars are `TensorBoardScalars`'."""


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
