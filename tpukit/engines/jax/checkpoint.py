"""Checkpoints of the jax engine, through Orbax (`orbax-checkpoint`): one committed directory `ckpt_N/` per saved
step, holding every variable of the model and the optimizer as (sharded) arrays (`state/`) and the trainer's run
state with the variables' paths, shapes and dtypes (`run/`, JSON).

Each process writes only the shards it owns, asynchronously: `save` returns once the values are copied off the
devices, and the next save, a restore and the end of training wait for the write (`wait`). Orbax writes a step into
a temporary directory and commits it (a rename, or `commit_success.txt` on object stores) once every process has
written, so a SIGKILL at any moment leaves committed steps only; the next start clears the temporary. A restore
reads onto the shardings of the variables as built now, so a run resumes on another mesh, device count or process
count. Every process restores the same step: the steps committed for all processes are agreed, and a step is
assigned only once every process has read it. All processes share one directory, the chief's `checkpoints/` (on a
multi-host slice: a `gs://` output_dir). Directories of `ckpt-N.npz` files (tpukit before issue 39) still resume.

The interface is `tpukit.engines.keras.checkpoint.Checkpointer`, which `trainer.fit_with_recovery` drives.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import math
import os
import re
import sys
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

PREFIX = "ckpt"  # Orbax step directories: ckpt_<step>
RUN_STATE = "tpukit_run_state.json"  # the run state of a step saved again at its epoch end (it wins over run/)
SUFFIX = ".npz"  # the whole-value files of tpukit before issue 39, still read
COMMITTED = (
    "commit_success.txt"  # Orbax's commit marker (the one proof of a commit on object stores)
)
_ORBAX = re.compile(r"ckpt_(\d+)")
_LEGACY = re.compile(r"ckpt-(\d+)\.npz")
_STATE_KEY = "__run_state__"
_PATHS_KEY = "__paths__"


class CheckpointReadError(OSError):
    """A checkpoint that another process could not read: every process skips it."""


def _read_errors() -> tuple:
    return (
        OSError,
        EOFError,
        ValueError,
        KeyError,
        TypeError,
        zipfile.BadZipFile,
        tf.errors.OpError,
        json.JSONDecodeError,
    )


def orbax():
    """`orbax.checkpoint`, imported when first needed (it brings tensorstore: ~1 s)."""
    import orbax.checkpoint as ocp

    return ocp


def orbax_missing() -> str | None:
    """Why Orbax cannot be imported (the fix included), or None."""
    try:
        orbax()
    except ImportError as error:
        return (
            f"the jax engine's checkpoints need orbax-checkpoint, which cannot be imported here ({error}). Fix: "
            "pip install 'tpukit[jax]' (or pip install orbax-checkpoint)."
        )
    return None


class Value:
    """One run-state value with the two methods the trainer's callbacks use (`numpy()`, `assign()`)."""

    def __init__(self, value):
        self.value = value

    def numpy(self):
        return np.asarray(self.value)

    def assign(self, value) -> None:
        self.value = value.item() if hasattr(value, "item") else value


class RunState:
    """What the TensorFlow engine's `checkpoint.RunState` holds, as plain values saved in each checkpoint."""

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

    def to_dict(self) -> dict:
        return {name: _plain(getattr(self, name).value) for name in self.NAMES}

    def load(self, values: dict) -> None:
        for name, value in values.items():
            getattr(self, name).assign(math.nan if value is None else value)


def _plain(value):
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def _number(path: str) -> int:
    name = os.path.basename(path.rstrip("/"))
    match = _ORBAX.fullmatch(name) or _LEGACY.fullmatch(name)
    return int(match.group(1)) if match else -1


def checkpoint_paths(directory: str) -> list[str]:
    """The committed checkpoints in `directory`, newest first: Orbax steps (`ckpt_N/`; on object stores only those
    with Orbax's commit marker) and `ckpt-N.npz` files (an Orbax step first where both have one step)."""
    try:
        names = [name.rstrip("/") for name in tf.io.gfile.listdir(directory)]
    except tf.errors.NotFoundError:
        return []
    remote = "://" in directory
    found = []
    for name in names:
        path = os.path.join(directory, name)
        if _ORBAX.fullmatch(name):
            if not remote or tf.io.gfile.exists(os.path.join(path, COMMITTED)):
                found.append((int(_ORBAX.fullmatch(name).group(1)), 1, path))
        elif _LEGACY.fullmatch(name):
            found.append((int(_LEGACY.fullmatch(name).group(1)), 0, path))
    return [path for _, _, path in sorted(found, reverse=True)]


def newest_checkpoint_step(directory: str) -> int:
    paths = checkpoint_paths(directory)
    return _number(paths[0]) if paths else 0


def requested_path(checkpoint: str) -> str | None:
    """The checkpoint `--checkpoint` names, if it exists: an Orbax step directory, or `ckpt-N` / `ckpt-N.npz`."""
    for path in (checkpoint, checkpoint + SUFFIX):
        if _number(path) >= 0 and tf.io.gfile.exists(path):
            return path
    return None


class _Manager:
    """What the trainer reads of a `tf.train.CheckpointManager`."""

    def __init__(self, checkpointer: Checkpointer):
        self.checkpointer = checkpointer

    @property
    def latest_checkpoint(self) -> str | None:
        self.checkpointer.wait()
        paths = checkpoint_paths(self.checkpointer.directory)
        return paths[0] if paths else None


def host_value(value) -> np.ndarray:
    """The whole value of a (possibly sharded, possibly multi-host) array on this host."""
    if getattr(value, "is_fully_addressable", True):
        return np.asarray(value)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(value, tiled=True))


def _gathered(values: list[int], width: int = 64) -> np.ndarray:
    """Every process's `values` (at most `width` integers): an array of shape (processes, width), padded with -1."""
    from jax.experimental import multihost_utils

    row = np.full((width,), -1, np.int64)
    row[: min(len(values), width)] = values[:width]
    return np.asarray(multihost_utils.process_allgather(row)).reshape(-1, width)


@contextlib.contextmanager
def _as_os_errors(directory: str):
    """Orbax's write errors as `OSError`s with their errno where the text names a full disk, a quota or a
    read-only or forbidden directory (tensorstore raises `ValueError: RESOURCE_EXHAUSTED: ... [os_error_code='28']`),
    so that the run stops with the output-directory message, as a full disk at any other write does."""
    try:
        yield
    except OSError:
        raise
    except Exception as error:
        text = " ".join(str(error).split())
        code = next(
            (
                c
                for c in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
                if os.strerror(c) in text
            ),
            errno.EACCES
            if "PERMISSION_DENIED" in text
            else None,  # tensorstore's status for a bucket's 403
        )
        if code is None:
            raise
        raise OSError(
            code, f"{os.strerror(code)}: writing a checkpoint in {directory} ({text[:300]})"
        ) from error


class _OrbaxErrorsRaised(logging.Filter):
    """Drops Orbax's error records that carry a traceback (each failing background thread logs one, and asyncio
    logs "Task exception was never retrieved" for each of a failed save's other writes): the same error is raised
    to tpukit at `wait` or the next save, which reports it once, as the fault it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.exc_info:
            return True
        if f"{os.sep}orbax{os.sep}" in (record.pathname or ""):
            return False
        trace = record.exc_info[2]
        while trace is not None:
            if f"{os.sep}orbax{os.sep}" in trace.tb_frame.f_code.co_filename:
                return False
            trace = trace.tb_next
        return True


def _quiet_orbax_errors() -> None:
    for name in (
        "absl",
        "asyncio",
    ):  # Orbax logs through absl.logging; asyncio its tasks' unretrieved errors
        log = logging.getLogger(name)
        if not any(isinstance(f, _OrbaxErrorsRaised) for f in log.filters):
            log.addFilter(_OrbaxErrorsRaised())
    if not isinstance(sys.unraisablehook, _LateWriteCallbacks):
        sys.unraisablehook = _LateWriteCallbacks(sys.unraisablehook)


class _LateWriteCallbacks:
    """`sys.unraisablehook` that drops tensorstore's late callbacks of a failed save: when one write of a save
    fails (a full disk), Orbax's event loop ends with the error while the save's other tensorstore writes are still
    under way; each of them then completes into the closed loop (`call_soon_threadsafe`: `RuntimeError: Event loop
    is closed`), which tensorstore reports as an unraisable exception, a traceback each. The failure itself is
    raised to tpukit at `wait` or the next save; every other unraisable exception reaches the previous hook."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, unraisable) -> None:
        error, trace = unraisable.exc_value, unraisable.exc_traceback
        while trace is not None and trace.tb_next is not None:
            trace = trace.tb_next
        if (
            isinstance(error, RuntimeError)
            and str(error) == "Event loop is closed"
            and unraisable.object is None
            and trace is not None
            and os.path.basename(trace.tb_frame.f_code.co_filename) == "base_events.py"
        ):
            logger.debug(
                "tpukit: a write of a failed checkpoint save ended after Orbax's event loop"
            )
            return
        self.previous(unraisable)


def _write_whole(path: str, text: str) -> None:
    """Writes `path` whole or not at all: a temporary beside it, flushed, then renamed over it (one object write on
    an object store, where a write is atomic)."""
    if "://" in path:
        with tf.io.gfile.GFile(path, "w") as handle:
            handle.write(text)
        return
    temporary = rundir.temporary_name(path)  # this process, thread and host: never another writer's
    try:
        with open(temporary, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)


def unshared_processes(directory: str) -> list[int]:
    """The processes that cannot see a file process 0 writes in `directory` ([] on one process, or when all can):
    every process writes its shards into one checkpoint directory, so a local path on each host of a slice (each
    its own disk) cannot hold a checkpoint."""
    if jax.process_count() == 1:
        return []
    token = int(_gathered([int.from_bytes(os.urandom(6), "big")], width=1)[0][0])  # process 0's
    marker = os.path.join(directory, f".tpukit-shared-{token}")
    if jax.process_index() == 0:
        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(marker, "w") as handle:
            handle.write(
                "written by process 0 to see whether every process shares this directory\n"
            )
    _gathered([0], width=1)  # every process waits for the write
    flags = _gathered([1 if tf.io.gfile.exists(marker) else 0], width=1).ravel()
    if jax.process_index() == 0:
        tf.io.gfile.remove(marker)
    return [int(i) for i in np.flatnonzero(flags == 0)]


class Checkpointer:
    def __init__(self, directory: str, model, optimizer, max_to_keep: int = 3):
        self.directory = directory
        self.model = model
        self.optimizer = optimizer
        self.max_to_keep = max_to_keep
        self.state = RunState()
        self.manager = _Manager(self)
        self.saved_at = time.perf_counter()
        self.last_saved_step = 0
        size = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in self._variables())
        self.save_seconds = (
            0.05 + size / 200e6
        )  # training's wait at the first save, as the TF engine estimates
        self.seconds_saving = (
            0.0  # wall seconds training waited for saves over the run (the phase timings)
        )
        self._orbax = None  # the ocp.CheckpointManager, made at the first save
        self._saves = 0

    def _variables(self) -> list:
        # Model variables (weights, BatchNorm statistics, dropout seed states), then the optimizer's.
        return list(self.model.variables) + list(self.optimizer.variables)

    def _sync(self) -> None:
        # Keras' JAX trainer keeps the state of a running `fit` outside the variables until asked for it.
        sync = getattr(self.model, "jax_state_sync", None)
        if sync is not None:
            sync()

    def _writer(self):
        if self._orbax is None:
            _quiet_orbax_errors()
            ocp = orbax()
            options = ocp.CheckpointManagerOptions(
                max_to_keep=self.max_to_keep,
                step_prefix=PREFIX,
                enable_async_checkpointing=True,
                create=True,
                cleanup_tmp_directories=True,
            )
            self._orbax = ocp.CheckpointManager(
                self.directory, options=options, item_names=("state", "run")
            )
        return self._orbax

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

        def agree(flag: bool) -> bool:
            return bool((_gathered([1 if flag else 0], width=1) > 0).any())

        return agree

    def save(self) -> str:
        """Starts writing this step (each process its own shards) and returns its path once the values are off the
        devices; the write goes on in the background until `wait` (called by the next save and at the end)."""
        started = time.perf_counter()
        try:
            return self._save(started)
        finally:
            self.seconds_saving += time.perf_counter() - started

    def _save(self, started: float) -> str:
        ocp = orbax()
        self._sync()
        step = self.step
        writer = self._writer()
        with _as_os_errors(self.directory):
            writer.wait_until_finished()  # the previous save (its error, if any, is raised here)
        path = os.path.join(self.directory, f"{PREFIX}_{step}")
        if step in writer.all_steps():
            if step == self.last_saved_step:
                # The same step again, with its epoch end's run state: the arrays are the ones this process just
                # saved or restored, so only the run state is written, whole, beside them (process 0 writes it;
                # never a moment without the committed step).
                if jax.process_index() == 0:
                    _write_whole(os.path.join(path, RUN_STATE), json.dumps(self.state.to_dict()))
                return path
            writer.delete(
                step
            )  # a step this run did not restore (damaged, skipped): written afresh
        variables = self._variables()
        run = {
            "run_state": self.state.to_dict(),
            "paths": [v.path for v in variables],
            "shapes": [list(v.shape) for v in variables],
            "dtypes": [str(np.dtype(v.value.dtype)) for v in variables],
        }
        arrays = {f"v{i:05d}": v.value for i, v in enumerate(variables)}
        with _as_os_errors(self.directory):
            writer.save(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardSave(arrays), run=ocp.args.JsonSave(run)
                ),
                force=True,
            )
        self.last_saved_step = step
        self.saved_at = time.perf_counter()
        # The first save starts Orbax's threads and tensorstore (0.2-0.3 s on a CPU): not a cost of each save.
        if self._saves:
            self.save_seconds = self.saved_at - started
        self._saves += 1
        logger.debug(
            "tpukit: saving checkpoint %s (training waited %.1f ms)", path, self.save_seconds * 1e3
        )
        return path

    def wait(self) -> None:
        """Waits until the save in flight is committed (raising its error, if any)."""
        if self._orbax is None:
            return
        started = time.perf_counter()
        try:
            with _as_os_errors(self.directory):
                self._orbax.wait_until_finished()
        finally:
            self.seconds_saving += time.perf_counter() - started

    def close(self) -> None:
        """Waits for the save in flight (raising its error) and ends Orbax's background threads, also when the
        save failed (a full disk): threads left running are ended at interpreter exit, noisily."""
        if self._orbax is None:
            return
        writer, self._orbax = self._orbax, None
        try:
            with _as_os_errors(self.directory):
                writer.wait_until_finished()
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def save_is_due(self, max_overhead: float | None) -> bool:
        # Not `manager.latest_checkpoint`: that waits for the save in flight.
        if max_overhead is None or (self._orbax is None and not checkpoint_paths(self.directory)):
            return True
        return time.perf_counter() - self.saved_at >= self.save_seconds / max_overhead

    def restore(self, path: str | None = None) -> int:
        """Restores `path`, else the newest checkpoint that every process has and can read; returns its step (0
        when there is none).

        Raises CheckpointMismatchError (another model) or CheckpointCorruptError (nothing readable)."""
        self.optimizer.build(self.model.trainable_variables)
        self.wait()
        if path:
            candidates = [requested_path(path) or path]
        else:
            candidates = self._agreed(checkpoint_paths(self.directory))
        return restore_first_readable(self, candidates, _read_errors())

    def _agreed(self, candidates: list[str]) -> list[str]:
        """The candidates every process has (on one directory they all list the same; a step some process cannot
        see is skipped by all, so no process assigns a step the others do not)."""
        if jax.process_count() == 1:
            return candidates
        everywhere = _gathered([_number(p) for p in candidates])
        common = set(everywhere[0][everywhere[0] >= 0])
        for row in everywhere[1:]:
            common &= set(row[row >= 0])
        return [p for p in candidates if _number(p) in common]

    def _restore_one(self, path: str) -> None:
        """Reads `path` onto the variables' current shardings, checks it fits the model, and assigns it once every
        process has read its step (multi-host: a step one process cannot read is skipped by all)."""
        variables = self._variables()
        try:
            arrays, run_state = self._read(path, variables)
            failed = None
        except CheckpointMismatchError:
            raise
        except _read_errors() as error:
            arrays, run_state, failed = None, None, error
        if jax.process_count() > 1:
            flags = _gathered([0 if failed is None else 1], width=1).ravel()
            if failed is None and flags.any():
                failed = CheckpointReadError(
                    f"process {int(np.flatnonzero(flags)[0])} could not read it"
                )
        if failed is not None:
            raise failed
        for variable, value in zip(variables, arrays, strict=True):
            variable.assign(value)
        self.state.load(run_state)

    def _read(self, path: str, variables: list) -> tuple[list, dict]:
        if path.endswith(SUFFIX):
            return _read_npz(path, variables)
        ocp = orbax()
        reader = ocp.Checkpointer(ocp.CompositeCheckpointHandler())
        run = reader.restore(path, args=ocp.args.Composite(run=ocp.args.JsonRestore())).run
        _check_fits(path, variables, run["paths"], [tuple(s) for s in run["shapes"]])
        target = {
            f"v{i:05d}": jax.ShapeDtypeStruct(
                tuple(v.shape), v.value.dtype, sharding=v.value.sharding
            )
            for i, v in enumerate(variables)
        }
        state = reader.restore(
            path, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))
        ).state
        run_state = run["run_state"]
        again = os.path.join(path, RUN_STATE)
        if tf.io.gfile.exists(again):  # the step saved again at its epoch end
            with tf.io.gfile.GFile(again) as handle:
                run_state = json.load(handle)
        return [state[f"v{i:05d}"] for i in range(len(variables))], run_state


def _read_npz(path: str, variables: list) -> tuple[list, dict]:
    """A `ckpt-N.npz` of tpukit before issue 39: whole values, placed by `assign` with each variable's layout."""
    with tf.io.gfile.GFile(path, "rb") as handle:
        loaded = np.load(io.BytesIO(handle.read()), allow_pickle=False)
        saved_paths = [str(p) for p in loaded[_PATHS_KEY]]
        arrays = [loaded[f"v{i}"] for i in range(len(saved_paths))]
        state = json.loads(str(loaded[_STATE_KEY]))
    _check_fits(path, variables, saved_paths, [tuple(a.shape) for a in arrays])
    return arrays, state


def _check_fits(path: str, variables: list, saved_paths: list, saved_shapes: list) -> None:
    expected = [(_unnumbered(v.path), tuple(v.shape)) for v in variables]
    found = [(_unnumbered(p), tuple(s)) for p, s in zip(saved_paths, saved_shapes, strict=True)]
    if expected == found:
        return
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


def _unnumbered(path: str) -> str:
    """A variable path without the `_N` Keras appends to a default name already used in this process
    (`seed_generator_1/seed_generator_state` in a process's second model is `seed_generator/...` in a new one):
    variables are matched in order, by these paths and their shapes."""
    return re.sub(r"_\d+(?=/|$)", "", path)
