"""A multi-process jax run (2 processes x 4 virtual CPU devices on 127.0.0.1, `tpukit.engines.jax.peers`): a
process that never joins is named while the other waits, and SIGTERM ends that wait; the lost-process message. A
process killed mid-training (the survivor's message, then a rerun) is in test_jax_multihost.py."""

import json
import signal
import subprocess
import sys
import time

import pytest
from helpers import JAX_CHILD, REPO, free_ports, jax_cluster_env

from tpukit.engines.jax import peers

SMALL_LM = [
    "data.shuffle_buffer=1",
    "train.epochs=3",
    "train.steps_per_epoch=3",
    "train.warmup_steps=2",
    "data.max_bytes=100000",
    "runtime.checkpoint_every_steps=2",
    "runtime.verbose=0",
    "runtime.mesh.data=2",
    "runtime.mesh.model=4",
]


def _start(tmp_path, port: int, index: int, config: dict, name: str):
    """tests/engines/jax/child.py as process `index` of 2 (4 virtual devices); returns (process, log path)."""
    env = jax_cluster_env(port, index)
    path = tmp_path / f"{name}{index}.log"
    with open(path, "w") as log:
        command = [sys.executable, JAX_CHILD, json.dumps(config)]
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    return process, path


def _end(process, timeout: float) -> int | None:
    """The exit code within `timeout` seconds, or None (the process is killed then)."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


@pytest.mark.cluster
@pytest.mark.parametrize("present", [0, 1])
def test_a_process_that_never_joins_is_named_and_sigterm_ends_the_wait(present, tmp_path):
    (port,) = free_ports(1)
    config = {
        "recipe": "textfiles_char_lm",
        "overrides": SMALL_LM,
        "output_dir": str(tmp_path / "out"),
    }
    process, log = _start(tmp_path, port, present, config, "alone")
    wanted = (
        f"waiting for process 1 of 2 to join at 127.0.0.1:{port}"
        if present == 0
        else f"waiting for process 0 (the coordinator) of 2 to join at 127.0.0.1:{port}"
    )
    try:
        deadline = time.monotonic() + 120
        while wanted not in log.read_text() and process.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        assert process.poll() is None, log.read_text()[-3000:]
        process.send_signal(signal.SIGTERM)
        code = _end(process, 30)
    finally:
        _end(process, 0.1) if process.poll() is None else None
    output = log.read_text()
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "stopped by SIGTERM" in output and "nothing was trained" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_the_lost_process_message_names_it_the_checkpoint_and_the_fix():
    text = peers.lost_message([1], 2, 5, 4, "/out/checkpoints", "closed its connection")
    assert text == (
        "tpukit: lost process 1 of 2 (it closed its connection during training step ~5). The checkpoints are "
        "kept: newest ckpt step 4 in /out/checkpoints. Fix: restart every process with the same command; the run "
        "resumes from step 4."
    )
    text = peers.lost_message([2, 3], 4, None, None, "/c")
    assert text.startswith(
        "tpukit: lost processes 2, 3 of 4 (they stopped answering). No checkpoint"
    )
    assert text.endswith(
        "restart every process with the same command; the run starts from the beginning."
    )
    text = peers.lost_message([1], 2, 3, 2, "/c", "stopped on an error of its own, in its log")
    assert text.startswith(
        "tpukit: lost process 1 of 2 (it stopped on an error of its own, in its log, during"
    )


def test_the_waiting_line_names_the_processes_it_can_tell_are_missing():
    line = peers.waiting_message("10.0.0.1:1234", 2, 0, True, 31.4)
    assert line.startswith(
        "tpukit: waiting for process 1 of 2 to join at 10.0.0.1:1234 (31 s of 300 s)"
    )
    assert "process 0 (the coordinator) of 4" in peers.waiting_message("h:1", 4, 2, False, 5)
    line = peers.waiting_message("h:1", 4, 2, True, 5)
    assert "processes 1, 3 (some may have joined" in line and "process 0" not in line
    line = peers.waiting_message("h:1", 3, 0, True, 5)
    assert "processes 1, 2 (some may have joined" in line
