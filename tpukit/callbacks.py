"""Keras callbacks tpukit's trainer adds: checkpoints and a throughput report. They count steps with
`optimizer.iterations`, so they stay right when `steps_per_execution` > 1."""

from __future__ import annotations

import time

import keras


class CheckpointEveryEpoch(keras.callbacks.Callback):
    def __init__(self, checkpointer):
        super().__init__()
        self.checkpointer = checkpointer

    def on_epoch_end(self, epoch, logs=None):
        self.checkpointer.save()


class Throughput(keras.callbacks.Callback):
    """Time to the first step (dominated by tracing and XLA compilation) and examples/s after it."""

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.time_to_first_step = None
        self.examples_per_second = None
        self.steps_per_second = None
        self._start = None
        self._first = None  # (time, step) after the first execution

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()
        self._first = None

    def on_train_batch_end(self, batch, logs=None):
        if self._first is None:
            now = time.perf_counter()
            self.time_to_first_step = now - self._start
            self._first = (now, self._step())

    def on_train_end(self, logs=None):
        if self._first is None:
            return
        seconds = time.perf_counter() - self._first[0]
        steps = self._step() - self._first[1]
        if steps > 0 and seconds > 0:
            self.steps_per_second = steps / seconds
            self.examples_per_second = self.steps_per_second * self.global_batch_size
