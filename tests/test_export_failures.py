"""Every output failure is a failure (issue 39, item 4): an export that meets a full disk, a read-only or a
quota-exceeded output fails the run (exit 1, one paragraph naming what, where, why and the fix, the trained
checkpoint kept), and the same command re-exports; what killed saves left in the checkpoint directories is cleared
at the next start. The runs' faults are injected with `tests/faults.py` (`faults.env(oserror=...)`)."""

import errno
import json
import os
import subprocess
from types import SimpleNamespace

import faults
import keras
import pytest
import tensorflow as tf
from helpers import mounted_tmpfs, run_cli

from tpukit import rundir
from tpukit.engines import OutputDirError
from tpukit.engines.keras import callbacks as callbacks_lib
from tpukit.engines.keras import export
from tpukit.engines.keras import session as session_lib
from tpukit.rundir import LocalFiles

SAVED_MODEL_WRITE = "tpukit.engines.keras.export:_write_serving_module"
KERAS_WRITE = "tpukit.engines.keras.export:_save_keras_file"


def _model():
    inputs = keras.Input((3,), name="x")
    return keras.Model(inputs, keras.layers.Dense(2)(inputs))


def _raising(code):
    def write(*args, **kwargs):
        raise OSError(code, os.strerror(code), "somewhere")

    return write


@pytest.mark.parametrize(
    "error, code",
    [
        (OSError(errno.ENOSPC, "No space left on device", "/r/x"), errno.ENOSPC),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), errno.EDQUOT),
        # TensorFlow's and h5py's errors carry the errno as text only.
        (
            tf.errors.ResourceExhaustedError(
                None, None, "/r/saved_model/x.tempstate; No space left on device"
            ),
            errno.ENOSPC,
        ),
        (tf.errors.FailedPreconditionError(None, None, "/r/x; Read-only file system"), errno.EROFS),
        (
            RuntimeError("Unable to synchronously create file (errno = 13, Permission denied)"),
            errno.EACCES,
        ),
        (ValueError("untracked resource"), None),
        (OSError(errno.ENOENT, "No such file or directory"), None),
    ],
)
def test_an_output_that_takes_no_writes_is_named_by_its_errno(error, code):
    failure = export.output_write_error(error, "the SavedModel", "/r/saved_model")
    assert (failure and failure.code) == code


def test_the_message_names_the_export_the_path_the_errno_the_checkpoint_kept_and_the_fix():
    error = export.ExportWriteError(
        "the SavedModel",
        "/r/saved_model",
        errno.ENOSPC,
        "OSError: [Errno 28] No space left on device",
    )
    plan = SimpleNamespace(checkpoint_dir="/r/checkpoints")
    with pytest.raises(OutputDirError) as raised:
        with session_lib.explained(plan, lambda directory: 22):
            raise error
    message = str(raised.value)
    for part in (
        "the SavedModel could not be written to /r/saved_model",
        "No space left on device (ENOSPC: the disk is full",
        "trained checkpoint is kept (step 22 in /r/checkpoints)",
        "Fix: free space on that disk",
        "run the same command",
        "not repeated, only exported again",
    ):
        assert part in message, message
    assert "\n" not in message


def test_an_exporting_process_line_reads_back_as_the_same_failure():
    error = export.ExportWriteError("the SavedModel", "/child/path", errno.EROFS, "x" * 1000)
    line = "tpukit: could not import mylayers: ImportError: no; " + error.to_line()
    assert len(error.to_line()) < 500  # `SavedModelExport.run` keeps 500 characters of it
    back = export.ExportWriteError.from_line(line, "the SavedModel", "/r/saved_model")
    assert (back.code, back.what, back.path) == (errno.EROFS, "the SavedModel", "/r/saved_model")
    # An exporting process that died on its own: its traceback's last line names the errno.
    died = export.ExportWriteError.from_line(
        "OSError: [Errno 122] Disk quota exceeded: '/r/saved_model.tpukit-tmp-1'",
        "the SavedModel",
        "/r/s",
    )
    assert died.code == errno.EDQUOT
    assert (
        export.ExportWriteError.from_line("ValueError: Could not locate class 'X'", "a", "b")
        is None
    )


def test_a_full_disk_at_either_export_raises_and_leaves_no_temporary(tmp_path, monkeypatch):
    model = _model()
    monkeypatch.setattr(export, "_write_serving_module", _raising(errno.ENOSPC))
    with pytest.raises(
        export.ExportWriteError, match="the SavedModel could not be written"
    ) as raised:
        export.export_model(model, str(tmp_path))
    assert raised.value.path == str(tmp_path / "saved_model")
    assert sorted(os.listdir(tmp_path)) == ["model.keras"]  # whole; no SavedModel and no temporary
    monkeypatch.setattr(export, "_save_keras_file", _raising(errno.EDQUOT))
    with pytest.raises(export.ExportWriteError, match="model.keras could not be written"):
        export.export_model(model, str(tmp_path / "again"))
    assert os.listdir(tmp_path / "again") == []


def test_the_exporting_command_prints_one_line_and_exits_1(tmp_path, monkeypatch, capsys):
    model = _model()
    model.save(str(tmp_path / "model.keras"))
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(export, "_write_serving_module", _raising(errno.ENOSPC))
    assert export.main([str(tmp_path / "model.keras"), str(tmp_path)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert export.ExportWriteError.from_line(last, "the SavedModel", "p").code == errno.ENOSPC


def test_a_full_disk_at_best_keras_raises(tmp_path):
    model = _model()
    state = SimpleNamespace(export_best=tf.Variable(float("nan")))
    final = str(tmp_path / "best.keras")
    callback = callbacks_lib.ResumableModelCheckpoint(state, final, monitor="val_loss")
    callback.set_model(model)
    callback.on_train_begin()
    model.save = _raising(errno.ENOSPC)
    with pytest.raises(export.ExportWriteError, match="best.keras could not be written"):
        callback.on_epoch_end(0, {"val_loss": 1.0})
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------------------------
# What killed saves left in the checkpoint directories.


def _leftovers(checkpoints, committed=True):
    checkpoints.mkdir(parents=True, exist_ok=True)
    if committed:
        (checkpoints / "ckpt_2").mkdir()  # a committed Orbax step
        (checkpoints / "ckpt_2" / "state").write_text("whole")
        (checkpoints / "ckpt-2.npz").write_text(
            "whole"
        )  # a committed checkpoint of the earlier format
    (checkpoints / "ckpt-4.tpukit-tmp-abc.npz").write_text("half")
    (checkpoints / "ckpt_4.orbax-checkpoint-tmp-123").mkdir()
    (checkpoints / "ckpt_4.orbax-checkpoint-tmp-123" / "state").write_text("half")
    # Another host's killed save: no save runs while a run starts under the lock.
    (checkpoints / f"ckpt-6{rundir.TEMPORARY_MARK}999999-1-abcdef.npz").write_text("half")


KEPT = ["ckpt-2.npz", "ckpt_2"]


def test_the_chief_clears_killed_saves_in_every_checkpoint_directory(tmp_path):
    _leftovers(tmp_path / "checkpoints")
    _leftovers(tmp_path / "worker1" / "checkpoints")
    removed = rundir.clear_unfinished_saves(
        LocalFiles(), str(tmp_path), str(tmp_path / "checkpoints"), chief=True
    )
    assert len(removed) == 6
    assert sorted(os.listdir(tmp_path / "checkpoints")) == KEPT
    assert sorted(os.listdir(tmp_path / "worker1" / "checkpoints")) == KEPT


def test_another_process_clears_only_a_checkpoint_directory_of_its_own(tmp_path):
    _leftovers(tmp_path / "checkpoints")
    worker = tmp_path / "worker1"
    _leftovers(worker / "checkpoints")
    # The jax engine's processes share the chief's checkpoints/: the chief clears it.
    shared = str(tmp_path / "checkpoints")
    assert rundir.clear_unfinished_saves(LocalFiles(), str(worker), shared, chief=False) == []
    # The tensorflow engine's worker saves into its own.
    own = str(worker / "checkpoints")
    assert len(rundir.clear_unfinished_saves(LocalFiles(), str(worker), own, chief=False)) == 3
    assert sorted(os.listdir(worker / "checkpoints")) == KEPT
    assert len(os.listdir(tmp_path / "checkpoints")) == 5


def test_a_live_writers_temporary_is_kept(tmp_path):
    process = subprocess.Popen(["sleep", "60"])
    try:
        live = f"ckpt-4{rundir.TEMPORARY_MARK}{process.pid}-1-{rundir._HOST_TAG}.npz"
        (tmp_path / live).write_text("writing")
        assert rundir.clear_unfinished_checkpoints(LocalFiles(), str(tmp_path)) == []
    finally:
        process.kill()
        process.wait()
    assert rundir.clear_unfinished_checkpoints(LocalFiles(), str(tmp_path)) == [live]


# ---------------------------------------------------------------------------------------------------------------
# Whole runs.

JAX = ["--set", "runtime.engine=jax"]


def _train(output_dir, *extra, env=None):
    return run_cli(
        "recipes/digits_cnn.yaml",
        "--output_dir",
        str(output_dir),
        "--set",
        "train.epochs=1",
        "--set",
        "runtime.verbose=0",
        *extra,
        env=env,
    )


def _failed_cleanly(result, *parts):
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "tpukit: done" not in result.stdout + result.stderr
    for part in parts:
        assert part in result.stderr, result.stderr[-3000:]


def _failed_export(out, *missing):
    """metrics.json written all the same (issue 40), naming the outputs missing."""
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "failed" and sorted(metrics["outputs_missing"]) == sorted(missing)


@pytest.mark.integration
def test_jax_a_full_disk_at_the_saved_model_fails_and_the_rerun_exports(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, **faults.env(oserror=f"{SAVED_MODEL_WRITE}:ENOSPC"))
    failed = _train(out, *JAX, env=env)
    _failed_cleanly(
        failed,
        f"The SavedModel could not be written to {out / 'saved_model'}",
        "No space left on device (ENOSPC",
        "trained checkpoint is kept (step 22",
        "run the same command",
    )
    _failed_export(out, "saved_model")
    assert not (out / "saved_model").exists() and (out / "checkpoints" / "ckpt_22").is_dir()
    assert not [name for name in os.listdir(out) if rundir.TEMPORARY_MARK in name]
    _leftovers(
        out / "checkpoints", committed=False
    )  # saves killed before: cleared at the next start
    again = _train(out, *JAX)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "tpukit: done (done, step 22)" in again.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert (
        metrics["resumed_from_step"] == metrics["step"] == 22
    )  # exported again, not trained again
    assert metrics["exported"]["saved_model"] == str(out / "saved_model")
    assert tf.saved_model.load(str(out / "saved_model")).serve is not None
    assert sorted(os.listdir(out / "checkpoints")) == ["ckpt_0", "ckpt_22"]


@pytest.mark.integration
def test_jax_a_read_only_output_at_model_keras_fails(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, **faults.env(oserror=f"{KERAS_WRITE}:EROFS"))
    failed = _train(out, *JAX, env=env)
    _failed_cleanly(
        failed,
        f"model.keras could not be written to {out / 'model.keras'}",
        "Read-only file system (EROFS",
        "Fix: make it writable",
    )
    _failed_export(out, "keras", "saved_model")  # the SavedModel is made from model.keras there
    assert not (out / "model.keras").exists() and (out / "checkpoints" / "ckpt_22").is_dir()


@pytest.mark.integration
def test_tensorflow_a_quota_at_the_saved_model_fails(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, **faults.env(oserror=f"{SAVED_MODEL_WRITE}:EDQUOT"))
    failed = _train(out, env=env)
    _failed_cleanly(
        failed,
        f"The SavedModel could not be written to {out / 'saved_model'}",
        "Disk quota exceeded (EDQUOT",
        "trained checkpoint is kept (step 22",
    )
    _failed_export(out, "saved_model")
    assert not (out / "saved_model").exists()


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs mounted for the test (root only; where mounting is refused the test skips and says why)."""
    with mounted_tmpfs(tmp_path / "disk", "64m") as mount:
        yield mount


def _resize(mount, size: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount)], check=True)


@pytest.mark.root
@pytest.mark.integration
def test_jax_a_real_full_disk_at_the_saved_model_fails_and_the_rerun_exports(small_disk):
    out = small_disk / "run"
    assert _train(out, *JAX).returncode == 0
    # The disk then holds the checkpoints, and room for model.keras but not for the SavedModel after it.
    keras_bytes = (out / "model.keras").stat().st_size
    (out / "model.keras").unlink()
    subprocess.run(["rm", "-r", str(out / "saved_model")], check=True)
    disk = os.statvfs(small_disk)
    used = (disk.f_blocks - disk.f_bfree) * disk.f_frsize
    _resize(small_disk, used + keras_bytes + 200 * 1024)
    failed = _train(out, *JAX)
    _failed_cleanly(
        failed,
        f"The SavedModel could not be written to {out / 'saved_model'}",
        "No space left on device (ENOSPC",
        "trained checkpoint is kept (step 22",
    )
    assert not (out / "saved_model").exists()
    assert not [name for name in os.listdir(out) if rundir.TEMPORARY_MARK in name]
    _resize(small_disk, 64 * 1024 * 1024)  # space freed: the same command exports
    again = _train(out, *JAX)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "saved_model").is_dir() and "tpukit: done (done, step 22)" in again.stdout


@pytest.mark.root
@pytest.mark.integration
def test_jax_a_real_full_disk_at_a_background_checkpoint_write_fails_cleanly(small_disk):
    # Orbax writes a checkpoint in a background thread and raises tensorstore's ValueError (RESOURCE_EXHAUSTED ...
    # No space left on device) when it is waited for: the run must stop as at any other full disk.
    _resize(small_disk, 1200 * 1024)
    out = small_disk / "run"
    extra = [*JAX, "--set", "train.epochs=2", "--set", "runtime.checkpoint_max_overhead=null"]
    failed = _train(out, *extra)
    _failed_cleanly(failed, "No space left on device", "checkpoints written before are kept")
    assert "Exception ignored" not in failed.stderr, failed.stderr[
        -3000:
    ]  # Orbax's threads were closed
    _resize(small_disk, 64 * 1024 * 1024)
    again = _train(out, *extra)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "tpukit: done (done, step 44)" in again.stdout, again.stdout[-2000:]
    left = os.listdir(out / "checkpoints")
    assert all(name.startswith("ckpt_") and name[5:].isdigit() for name in left), left
