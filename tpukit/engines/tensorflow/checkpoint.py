"""Checkpoints of the model, optimizer, step, RNG and run state with `tf.train.Checkpoint` + `CheckpointManager`.

The optimizer's step counter (`optimizer.iterations`) is the step: restoring it is what lets a re-run of the
same command resume where the last one stopped. Keras 3 keeps each Dropout's `SeedGenerator` state in
`non_trainable_variables` but not in the object graph `tf.train.Checkpoint(model=...)` walks, so without saving it
explicitly a resumed run draws different dropout masks than an uninterrupted one, and its weights drift from it.

`RunState` holds what the trainer must carry across restarts besides the weights: the data skipped after NaN
rollbacks, early stopping's best value, wait count and stop flag, and the best value `best.keras` was exported at.

A process can die at any instruction (SIGKILL, out of memory, a lost VM), and a disk can hand back a damaged file:
`restore` tries the newest checkpoint first and falls back to the previous complete one, saying so; it never
silently starts from scratch over a directory that holds checkpoints.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import re
import time

import tensorflow as tf

from tpukit.engines.keras import keras_private
from tpukit.engines.keras.checkpoint import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    restore_first_readable,
)

logger = logging.getLogger("tpukit")

__all__ = [
    "CheckpointCorruptError",
    "CheckpointMismatchError",
    "Checkpointer",
    "RunState",
    "newest_checkpoint_step",
    "restore_first_readable",
]


# What a damaged or truncated checkpoint raises on restore (TF 2.19-2.21: a truncated .data file raises
# DataLossError or OutOfRangeError, a truncated .index a bare OpError "file is too short to be an sstable" or
# "IndexError: Read less bytes than requested"). A model that does not fit raises AssertionError or ValueError.
_READ_ERRORS = (tf.errors.OpError, IndexError, OSError)


def rng_variables(model) -> list:
    return [v for v in model.non_trainable_variables if "seed_generator" in v.path]


def io_options(device: str | None) -> tf.train.CheckpointOptions | None:
    """Checkpoint options for `export.io_device_for(strategy, directory)`'s answer.

    On a remote TPU (TPU Node, grpc:// workers) file ops run on the TPU host, which cannot see this machine's
    disk ("File system scheme '[local]' not implemented"): they go through the local job unless it is gs://."""
    if device is None:
        return None
    logger.info(
        "tpukit: remote TPU and a local output dir: checkpoint and export I/O go through %s", device
    )
    return tf.train.CheckpointOptions(experimental_io_device=device)


class RunState(tf.Module):
    """Trainer state saved with every checkpoint (plain host variables, created outside any strategy scope)."""

    def __init__(self):
        super().__init__(name="tpukit_run_state")
        with tf.init_scope(), tf.device("/cpu:0"):
            # Steps of data skipped after NaN rollbacks: the data position is `step + skipped_steps`.
            self.skipped_steps = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="skipped_steps"
            )
            # NaN: nothing recorded yet.
            self.early_stopping_best = tf.Variable(
                math.nan, dtype=tf.float64, trainable=False, name="es_best"
            )
            self.early_stopping_wait = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="es_wait"
            )
            self.stopped_early = tf.Variable(False, trainable=False, name="stopped_early")
            self.export_best = tf.Variable(
                math.nan, dtype=tf.float64, trainable=False, name="export_best"
            )


def all_finite(variables) -> bool:
    """True when every floating-point variable holds only finite values (checked on its device, one bool back)."""
    checks = [
        tf.reduce_all(tf.math.is_finite(v)) for v in variables if tf.as_dtype(v.dtype).is_floating
    ]
    return bool(tf.reduce_all(checks)) if checks else True


# Before the first save of a process: a fixed cost (mostly tf.train.Checkpoint's object-graph walk; see
# docs/performance.md) plus the bytes at 200 MB/s (a conservative rate for a local disk or GCS).
_SAVE_FIXED_SECONDS = 0.05
_SAVE_BYTES_PER_SECOND = 200e6


def estimated_save_seconds(variables) -> float:
    size = sum(math.prod(v.shape) * tf.as_dtype(v.dtype).size for v in variables)
    return _SAVE_FIXED_SECONDS + size / _SAVE_BYTES_PER_SECOND


def _number(path: str) -> int:
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else -1


class Checkpointer:
    def __init__(self, directory: str, model, optimizer, max_to_keep: int = 3, options=None):
        self.directory = directory
        self.model = model
        self.optimizer = optimizer
        self.options = options
        # For checkpoint_max_overhead: the end of this process's last save and how long it took. Before the first
        # save, the time this object was made and an estimate from the checkpoint's size.
        self.saved_at = time.perf_counter()
        # The step of the checkpoint the model holds or last wrote (0 for a new run): periodic saves count from it.
        self.last_saved_step = 0
        self.save_seconds = estimated_save_seconds(
            list(model.weights) + list(getattr(optimizer, "variables", []))
        )
        self.seconds_saving = 0.0  # every save of this process (the run's "checkpoints" phase)
        self.state = RunState()
        self.checkpoint = tf.train.Checkpoint(
            model=model, optimizer=optimizer, rng=rng_variables(model), run_state=self.state
        )
        try:
            self.manager = tf.train.CheckpointManager(
                self.checkpoint, directory, max_to_keep=max_to_keep
            )
        except (tf.errors.OpError, UnicodeDecodeError, ValueError) as error:
            # The manager's state file (`checkpoint`) is damaged. It only lists the checkpoints, which `candidates`
            # finds by name as well: keep the damaged file for inspection and let the manager write a new one.
            state_file = os.path.join(directory, "checkpoint")
            logger.warning(
                "tpukit: %s is damaged (%s); moved it to %s.damaged and listing the checkpoints by file name",
                state_file,
                type(error).__name__,
                state_file,
            )
            tf.io.gfile.rename(state_file, state_file + ".damaged", overwrite=True)
            self.manager = tf.train.CheckpointManager(
                self.checkpoint, directory, max_to_keep=max_to_keep
            )

    @property
    def step(self) -> int:
        return keras_private.batch_step(self.optimizer)

    @property
    def data_position(self) -> int:
        """Steps of data consumed: the step plus the batches skipped after NaN rollbacks."""
        return self.step + int(self.state.skipped_steps.numpy())

    def all_finite(self, variables) -> bool:
        """Whether `variables` hold only finite values (the trainer never checkpoints weights that do not)."""
        return all_finite(variables)

    def agreement(self, model):
        """`agree(flag) -> bool` across a multi-worker cluster's workers (`cluster.any_worker_function`), or None."""
        from tpukit.engines.tensorflow import cluster

        return cluster.any_worker_function(model.distribute_strategy)

    def candidates(self) -> list[str]:
        """Checkpoint prefixes in the directory, newest first: the manager's list, and any other `ckpt-N.index`
        (the manager's state file is itself a file that a crash or a disk can damage)."""
        listed = list(self.manager.checkpoints)
        found = [
            p[: -len(".index")] for p in glob.glob(os.path.join(self.directory, "ckpt-*.index"))
        ]
        return sorted(set(listed) | set(found), key=_number, reverse=True)

    def restore(self, path: str | None = None) -> int:
        """Restores `path`, else the newest readable checkpoint, and returns its step (0 when there is none).

        Raises:
            CheckpointMismatchError: the checkpoint does not fit this model.
            CheckpointCorruptError: `path` (or every checkpoint in the directory) cannot be read.
        """
        # Keras creates optimizer slots lazily; build them (inside the strategy scope, by the caller) so the
        # restore fills them now and a mismatch is reported now, not at the first step.
        self.optimizer.build(self.model.trainable_variables)
        return restore_first_readable(self, [path] if path else self.candidates(), _READ_ERRORS)

    def _restore_one(self, path: str) -> None:
        if not tf.io.gfile.exists(path + ".index"):
            raise OSError(f"{path}.index is missing")
        try:
            self.checkpoint.restore(path, options=self.options).assert_existing_objects_matched()
        except (AssertionError, ValueError) as error:
            raise CheckpointMismatchError(
                f"the checkpoint {path} does not match the model this recipe builds ({type(error).__name__}: "
                f"{str(error)[:300]}). Fix: use a new --output_dir for a changed model, or delete that directory "
                "to start over."
            ) from None

    def save(self) -> str:
        started = time.perf_counter()
        path = self.manager.save(checkpoint_number=self.step, options=self.options)
        self.last_saved_step = self.step
        self.saved_at = time.perf_counter()
        self.save_seconds = self.saved_at - started
        self.seconds_saving += self.save_seconds
        logger.debug("tpukit: saved checkpoint %s in %.1f ms", path, self.save_seconds * 1e3)
        return path

    def wait(self) -> None:
        """Saves here are synchronous: nothing is in flight (the jax engine's Orbax saves are not)."""

    def save_is_due(self, max_overhead: float | None) -> bool:
        """False while one more save would make saving take more than `max_overhead` of the wall time since the
        last save of this process (the last save's duration is the estimate); always True without a bound, and
        while the directory holds no checkpoint (a NaN rollback needs one to go back to; the trainer saves step 0 of a
        new run for that reason)."""
        if max_overhead is None or self.manager.latest_checkpoint is None:
            return True
        return time.perf_counter() - self.saved_at >= self.save_seconds / max_overhead


def newest_checkpoint_step(checkpoint_dir: str) -> int:
    """The step of the newest `ckpt-N` in `checkpoint_dir` (tpukit numbers checkpoints by step), 0 when none."""
    steps = [
        int(m.group(1))
        for p in tf.io.gfile.glob(os.path.join(checkpoint_dir, "ckpt-*.index"))
        if (m := re.search(r"ckpt-(\d+)\.index$", p))
    ]
    return max(steps, default=0)
