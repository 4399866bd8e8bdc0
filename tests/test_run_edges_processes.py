"""The edges of a run (issue 19) with real processes: two CLI runs on one output directory, a real Ctrl-C (SIGINT)
to the CLI at a moment the test does not choose, and a notebook kernel's stop button (jupyter_client's
`interrupt_kernel`, what Jupyter and Colab send) during `tpukit.fit`. Slow tier: each starts TensorFlow."""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import REPO, run_cli

pytestmark = pytest.mark.slow

ARGS = ["digits_cnn", "--set=runtime.verbose=0", "--set=data.global_batch_size=32"]


def _start(output_dir, *extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    return subprocess.Popen(
        [sys.executable, "-m", "tpukit.train", *ARGS, f"--output_dir={output_dir}", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def _wait_for(condition, timeout=240, what="it"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _steps(output_dir):
    return sorted(
        int(m.group(1))
        for p in glob.glob(os.path.join(output_dir, "checkpoints", "ckpt-*.index"))
        if (m := re.search(r"ckpt-(\d+)\.index$", p))
    )


def test_a_second_run_on_the_same_output_dir_is_refused_and_then_finishes(tmp_path):
    out = str(tmp_path / "run")
    first = _start(out, "--set=train.epochs=60", "--set=runtime.checkpoint_every_steps=10")
    try:
        _wait_for(lambda: len(_steps(out)) >= 2, what="the first run's first checkpoints")
        # Paused (SIGSTOP) while the second command runs, so the first is still in flight however fast this
        # machine trains; it holds its lock all the same.
        first.send_signal(signal.SIGSTOP)
        try:
            second = run_cli(*ARGS, f"--output_dir={out}", "--set=train.epochs=60")
        finally:
            first.send_signal(signal.SIGCONT)
        assert second.returncode == 1, second.stderr
        assert "Traceback" not in second.stderr
        assert f"is in use by another tpukit run: pid {first.pid} on host" in second.stderr
        assert first.poll() is None  # the first run goes on, untouched
    finally:
        stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    done = json.loads(open(os.path.join(out, "metrics.json")).read())
    again = run_cli(
        *ARGS, f"--output_dir={out}", "--set=train.epochs=60"
    )  # the refused command, rerun
    assert again.returncode == 0, again.stderr
    assert json.loads(open(os.path.join(out, "metrics.json")).read())["step"] == done["step"]


def test_ctrl_c_to_the_cli_saves_exits_130_and_the_same_command_resumes(tmp_path):
    out = str(tmp_path / "run")
    extra = ["--set=train.epochs=30", "--set=runtime.checkpoint_every_steps=20"]
    process = _start(out, *extra)
    _wait_for(lambda: any(s > 0 for s in _steps(out)), what="a checkpoint after step 0")
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    stopped = re.search(r"tpukit: stopped by Ctrl-C at step (\d+)", stderr)
    assert stopped, stderr
    step = int(stopped.group(1))
    assert step in _steps(out)  # saved at the step it stopped at
    resumed = run_cli(*ARGS, f"--output_dir={out}", *extra)
    assert resumed.returncode == 0, resumed.stderr
    metrics = json.loads(open(os.path.join(out, "metrics.json")).read())
    assert metrics["resumed_from_step"] == step and metrics["status"] == "done"


NOTEBOOK_CELL = textwrap.dedent(
    """
    import numpy as np, keras, tpukit
    def build():
        return keras.Sequential([keras.Input((16,)), keras.layers.Dense(512, activation="relu"), keras.layers.Dense(4)])
    x = np.random.default_rng(0).normal(size=(4096, 16)).astype("float32")
    y = (x[:, :4].argmax(axis=1)).astype("int32")
    metrics = tpukit.fit(build, x, y, epochs=60, batch_size=64, output_dir=OUT, checkpoint_every_steps=25,
                         verbose=0)
    print("finished", metrics["status"], metrics["resumed_from_step"], metrics["step"])
    """
)


def _execute(client, code, timeout=600):
    """Runs `code` in the kernel; returns (status, the error's traceback lines, what it printed)."""
    return _collect(client, client.execute(code), timeout)


def test_a_notebook_stop_button_stops_the_cell_in_one_line_and_rerunning_resumes(tmp_path):
    jupyter_client = pytest.importorskip(
        "jupyter_client"
    )  # the test extra installs it (nbclient's dependency)
    out = str(tmp_path / "run")
    manager = jupyter_client.KernelManager(kernel_name="python3")
    manager.start_kernel(
        cwd=REPO, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    )
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        setup = f"OUT = {out!r}\n"
        first_id = client.execute(setup + NOTEBOOK_CELL)
        _wait_for(lambda: any(s > 0 for s in _steps(out)), what="a checkpoint after step 0")
        manager.interrupt_kernel()  # the stop button: SIGINT to the kernel
        status, traceback, stdout = _collect(client, first_id)
        assert status == "error", stdout
        assert len(traceback) == 1, traceback  # one line, not a traceback
        stopped = re.search(
            r"tpukit: stopped by Ctrl-C at step (\d+).*again to resume", traceback[0]
        )
        assert stopped, traceback
        step = int(stopped.group(1))
        assert step in _steps(out)
        status, traceback, stdout = _execute(client, setup + NOTEBOOK_CELL)  # run the cell again
        assert status == "ok", traceback
        assert f"finished done {step} " in stdout
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _collect(client, message_id, timeout=600):
    """(status, the error's traceback lines, stdout) of the request `message_id` once the kernel is idle again."""
    traceback, stdout = [], ""
    deadline = time.time() + timeout
    while time.time() < deadline:
        message = client.get_iopub_msg(timeout=timeout)
        if message["parent_header"].get("msg_id") != message_id:
            continue
        kind, content = message["msg_type"], message["content"]
        if kind == "error":
            traceback = content["traceback"]
        elif kind == "stream":
            stdout += content["text"]
        elif kind == "status" and content["execution_state"] == "idle":
            break
    reply = client.get_shell_msg(timeout=60)
    return reply["content"]["status"], traceback, stdout
