"""An output directory that fills up or turns read-only mid-run (issue 13): a clear error, exit non-zero, and the
checkpoints written before stay loadable. Real file systems: a small tmpfs mounted for the test (root in this
sandbox and in CI may mount; where mounting is refused the tests skip and say so)."""

import glob
import os
import subprocess

import faults
import pytest
import tensorflow as tf
from helpers import mounted_tmpfs, run_cli

# Mounts a small tmpfs (root only; where mounting is refused the fixture skips and says why).
pytestmark = pytest.mark.root


@pytest.fixture
def small_disk(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", "12m") as mount:
        yield mount


def _loadable(checkpoint_dir):
    found = sorted(glob.glob(os.path.join(checkpoint_dir, "ckpt-*.index")))
    assert found, checkpoint_dir
    for index in found:
        reader = tf.train.load_checkpoint(index[: -len(".index")])
        assert reader.get_variable_to_shape_map()
    return found


def test_a_full_disk_stops_with_a_clear_error_and_keeps_the_checkpoints(small_disk):
    # Every 10 steps a ~1 MB checkpoint, 50 kept: the 12 MB disk fills up before step 132.
    output_dir = str(small_disk / "run")
    result = run_cli(
        "recipes/digits_cnn.yaml",
        "--output_dir",
        output_dir,
        "--set",
        "train.epochs=3",
        "--set",
        "data.global_batch_size=32",
        "--set",
        "runtime.checkpoint_every_steps=10",
        "--set",
        "runtime.max_checkpoints_to_keep=50",
        "--set",
        "runtime.verbose=0",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert (
        "No space left on device" in result.stderr
        and "checkpoints written before are kept" in result.stderr
    )
    assert "Traceback" not in result.stderr
    _loadable(os.path.join(output_dir, "checkpoints"))


def test_a_disk_that_turned_read_only_stops_the_rerun_cleanly_and_keeps_the_checkpoints(small_disk):
    # Read-only between two runs: a file system cannot be remounted read-only while the run holds files open for
    # writing (its TensorBoard event files), so the fault is made after a SIGTERM stop, before the rerun.
    output_dir = str(small_disk / "run")
    args = [
        "recipes/digits_cnn.yaml",
        "--output_dir",
        output_dir,
        "--set",
        "train.epochs=2",
        "--set",
        "data.global_batch_size=32",
        "--set",
        "runtime.checkpoint_every_steps=10",
        "--set",
        "runtime.verbose=0",
    ]
    env = dict(os.environ, **faults.env(signals_at_step=25))
    assert run_cli(*args, env=env).returncode == 143
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    before = {
        p: os.path.getsize(p) for p in glob.glob(os.path.join(output_dir, "checkpoints", "*"))
    }
    result = run_cli(*args)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Read-only file system" in result.stderr and "newest: step 25" in result.stderr
    assert "Traceback" not in result.stderr
    assert {
        p: os.path.getsize(p) for p in glob.glob(os.path.join(output_dir, "checkpoints", "*"))
    } == before
    _loadable(os.path.join(output_dir, "checkpoints"))
    subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=True)
    again = run_cli(*args)  # writable again: the same command resumes and finishes
    assert again.returncode == 0, again.stderr[-3000:]
