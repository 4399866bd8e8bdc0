"""Checkpoints of the jax engine: every variable of the model and the optimizer (the step counter, the moments,
the dropout seeds' state) and the trainer's run state, one `ckpt-N.npz` file per saved step.

Each file is whole or absent: it is written under a temporary name, flushed and renamed into place, so a process
killed at any instruction leaves the previous checkpoints and at most a temporary that the next run clears. A file
damaged on disk is skipped for the previous one, with a warning, as the TensorFlow engine's checkpoints are. Arrays
are saved as their full (gathered) values with the variables' paths and shapes, so a run may resume on another mesh
(more or fewer devices, another `model` split): restoring places each value with its variable's layout.

The interface is the TensorFlow engine's `Checkpointer` (`step`, `data_position`, `state`, `save`, `restore`,
`save_is_due`, `manager.latest_checkpoint`), which `tpukit.engines.keras.trainer.fit_with_recovery` drives on
both engines. Multi-host: every process gathers (a collective), process 0 writes.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import time
import zipfile

import jax
import numpy as np
import tensorflow as tf

from tpukit import rundir
from tpukit.engines.keras import keras_private
from tpukit.engines.keras.checkpoint import (
    CheckpointMismatchError,
    restore_first_readable,
)

logger = logging.getLogger("tpukit")

SUFFIX = ".npz"
_STATE_KEY = "__run_state__"
_PATHS_KEY = "__paths__"
_READ_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, tf.errors.OpError)


class Value:
    """One run-state value with the two methods the trainer's callbacks use (`numpy()`, `assign()`)."""

    def __init__(self, value):
        self.value = value

    def numpy(self):
        return np.asarray(self.value)

    def assign(self, value) -> None:
        self.value = value.item() if hasattr(value, "item") else value


class RunState:
    """What the TensorFlow engine's `checkpoint.RunState` holds, as plain values saved in each `.npz`."""

    NAMES = (
        "skipped_steps",
        "early_stopping_best",
        "early_stopping_wait",
        "stopped_early",
        "export_best",
    )

    def __init__(self):
        self.skipped_steps = Value(0)
        self.early_stopping_best = Value(math.nan)
        self.early_stopping_wait = Value(0)
        self.stopped_early = Value(False)
        self.export_best = Value(math.nan)

    def to_json(self) -> str:
        return json.dumps({name: _plain(getattr(self, name).value) for name in self.NAMES})

    def load(self, text: str) -> None:
        for name, value in json.loads(text).items():
            getattr(self, name).assign(math.nan if value is None else value)


def _plain(value):
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def _number(path: str) -> int:
    match = re.search(r"ckpt-(\d+)\.npz$", path)
    return int(match.group(1)) if match else -1


def checkpoint_paths(directory: str) -> list[str]:
    """The `ckpt-N.npz` files in `directory`, newest first."""
    found = tf.io.gfile.glob(os.path.join(directory, "ckpt-*" + SUFFIX))
    return sorted((p for p in found if _number(p) >= 0), key=_number, reverse=True)


def newest_checkpoint_step(directory: str) -> int:
    paths = checkpoint_paths(directory)
    return _number(paths[0]) if paths else 0


class _Manager:
    """What the trainer reads of a `tf.train.CheckpointManager`."""

    def __init__(self, directory: str):
        self.directory = directory

    @property
    def latest_checkpoint(self) -> str | None:
        paths = checkpoint_paths(self.directory)
        return paths[0] if paths else None


def host_value(value) -> np.ndarray:
    """The whole value of a (possibly sharded, possibly multi-host) array on this host."""
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


class Checkpointer:
    def __init__(self, directory: str, model, optimizer, max_to_keep: int = 3, chief: bool = True):
        self.directory = directory
        self.model = model
        self.optimizer = optimizer
        self.max_to_keep = max_to_keep
        self.chief = chief
        self.state = RunState()
        self.manager = _Manager(directory)
        self.saved_at = time.perf_counter()
        self.last_saved_step = 0
        size = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in self._variables())
        self.save_seconds = 0.05 + size / 200e6  # as the TensorFlow engine estimates its first save
        self.seconds_saving = 0.0  # wall seconds inside `save` over the run (the phase timings)

    def _variables(self) -> list:
        # Model variables (weights, BatchNorm statistics, dropout seed states), then the optimizer's.
        return list(self.model.variables) + list(self.optimizer.variables)

    def _sync(self) -> None:
        # Keras' JAX trainer keeps the state of a running `fit` outside the variables until asked for it.
        sync = getattr(self.model, "jax_state_sync", None)
        if sync is not None:
            sync()

    @property
    def step(self) -> int:
        self._sync()
        return keras_private.batch_step(self.optimizer)

    @property
    def data_position(self) -> int:
        return self.step + int(self.state.skipped_steps.numpy())

    def all_finite(self, variables) -> bool:
        """Whether every floating-point variable holds only finite values: each process reads its own shards
        (no collective program: on a CPU, JAX may run several enqueued multi-process programs at once, and their
        collectives then meet in different orders on different hosts, which hangs), then one flag is shared."""
        self._sync()
        finite = all(
            bool(np.isfinite(np.asarray(shard.data)).all())
            for v in variables
            if jax.numpy.issubdtype(v.value.dtype, jax.numpy.floating)
            for shard in v.value.addressable_shards
        )
        agree = self.agreement(self.model)
        return not agree(not finite) if agree is not None else finite

    def agreement(self, model):
        """`agree(flag) -> bool`: True when the flag is set in any process (multi-host); None on one host."""
        if jax.process_count() == 1:
            return None
        from jax.experimental import multihost_utils

        def agree(flag: bool) -> bool:
            flags = multihost_utils.process_allgather(np.array([1 if flag else 0], np.int32))
            return bool(np.asarray(flags).any())

        return agree

    def save(self) -> str:
        started = time.perf_counter()
        try:
            return self._save(started)
        finally:
            self.seconds_saving += time.perf_counter() - started

    def _save(self, started: float) -> str:
        self._sync()
        step = self.step
        variables = self._variables()
        arrays = {f"v{i}": host_value(v.value) for i, v in enumerate(variables)}
        path = os.path.join(self.directory, f"ckpt-{step}{SUFFIX}")
        if self.chief:
            arrays[_PATHS_KEY] = np.array([v.path for v in variables])
            arrays[_STATE_KEY] = np.array(self.state.to_json())
            buffer = io.BytesIO()
            np.savez(buffer, **arrays)
            tf.io.gfile.makedirs(self.directory)
            temporary = rundir.temporary_name(path)
            try:
                with tf.io.gfile.GFile(temporary, "wb") as handle:
                    handle.write(buffer.getvalue())
                    if hasattr(handle, "flush"):
                        handle.flush()
                _fsync(temporary)
                tf.io.gfile.rename(temporary, path, overwrite=True)
            except BaseException:
                if tf.io.gfile.exists(temporary):
                    tf.io.gfile.remove(temporary)
                raise
            for old in checkpoint_paths(self.directory)[self.max_to_keep :]:
                tf.io.gfile.remove(old)
        self.last_saved_step = step
        self.saved_at = time.perf_counter()
        self.save_seconds = self.saved_at - started
        logger.debug("tpukit: saved checkpoint %s in %.1f ms", path, self.save_seconds * 1e3)
        return path

    def save_is_due(self, max_overhead: float | None) -> bool:
        if max_overhead is None or self.manager.latest_checkpoint is None:
            return True
        return time.perf_counter() - self.saved_at >= self.save_seconds / max_overhead

    def restore(self, path: str | None = None) -> int:
        """Restores `path`, else the newest readable checkpoint; returns its step (0 when there is none).

        Raises CheckpointMismatchError (another model) or CheckpointCorruptError (nothing readable)."""
        self.optimizer.build(self.model.trainable_variables)
        if path and not path.endswith(SUFFIX):
            path += SUFFIX
        return restore_first_readable(
            self, [path] if path else checkpoint_paths(self.directory), _READ_ERRORS
        )

    def _restore_one(self, path: str) -> None:
        with tf.io.gfile.GFile(path, "rb") as handle:
            loaded = np.load(io.BytesIO(handle.read()), allow_pickle=False)
            saved_paths = [str(p) for p in loaded[_PATHS_KEY]]
            arrays = [loaded[f"v{i}"] for i in range(len(saved_paths))]
            state = str(loaded[_STATE_KEY])
        variables = self._variables()
        expected = [(_unnumbered(v.path), tuple(v.shape)) for v in variables]
        found = [(_unnumbered(p), tuple(a.shape)) for p, a in zip(saved_paths, arrays, strict=True)]
        if expected != found:
            difference = next(
                (
                    f"{e} here, {f} in the checkpoint"
                    for e, f in zip(expected, found, strict=False)
                    if e != f
                ),
                f"{len(expected)} variables here, {len(found)} in the checkpoint",
            )
            raise CheckpointMismatchError(
                f"the checkpoint {path} does not match the model this recipe builds ({difference}). Fix: use a new "
                "--output_dir for a changed model, or delete that directory to start over."
            )
        for variable, value in zip(variables, arrays, strict=True):
            variable.assign(value)
        self.state.load(state)


def _unnumbered(path: str) -> str:
    """A variable path without the `_N` Keras appends to a default name already used in this process
    (`seed_generator_1/seed_generator_state` in a process's second model is `seed_generator/...` in a new one):
    variables are matched in order, by these paths and their shapes."""
    return re.sub(r"_\d+(?=/|$)", "", path)


def _fsync(path: str) -> None:
    if "://" in path:
        return  # object stores commit on close
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
