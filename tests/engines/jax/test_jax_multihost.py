"""The jax engine over 2 processes x 4 virtual CPU devices on 127.0.0.1 (`keras.distribution.initialize` through
$TPUKIT_COORDINATOR_ADDRESS): each process reads its own half of every batch, the 2x4 mesh spans both, and the
losses equal one device's. This proves JAX's multi-controller path and tpukit's per-process input and checkpoints
on one machine; nothing about a TPU pod's network."""

import json
import os
import subprocess
import sys
import time

import faults
import numpy as np
import pytest
from helpers import (
    JAX_CHILD,
    REPO,
    finish_processes,
    free_ports,
    jax_cluster_env,
    model_weights,
    run_jax,
)

from tpukit.engines.jax import peers

# No shuffling: each process reads every other example (its own shard), so a global batch then holds the same
# examples as one pipeline's batch, in another order (the loss is a mean: the order changes only rounding). With
# shuffling the shards make other batches than one pipeline does, as on any multi-host input.
SMALL_LM = [
    "data.shuffle_buffer=1",
    "train.epochs=2",
    "train.steps_per_epoch=3",
    "train.warmup_steps=2",
    "data.max_bytes=100000",
    "runtime.checkpoint_every_steps=2",
    # Every epoch end saves, however fast the machine (the SIGKILL test needs step 2's save committed by step 4:
    # step 3's save waits for it).
    "runtime.checkpoint_max_overhead=null",
    "runtime.verbose=0",
]


def _results(log_path):
    with open(log_path) as f:
        lines = f.read().splitlines()
    return [json.loads(line[len("RESULT ") :]) for line in lines if line.startswith("RESULT ")]


def _start_pair(tmp_path, name: str, configs: list, envs: tuple = ({}, {})) -> tuple[list, list]:
    """Starts tests/engines/jax/child.py (a config dict) or `python -m tpukit.train` (a list of its arguments) as
    processes 0 and 1 of one JAX cluster (4 virtual devices each, one coordinator on 127.0.0.1); returns the
    `(process, log file)` pairs and the paths of the logs."""
    (port,) = free_ports(1)
    processes, logs = [], []
    for index, config in enumerate(configs):
        env = jax_cluster_env(port, index)
        env.update(envs[index])
        logs.append(tmp_path / f"{name}{index}.log")
        log = open(logs[-1], "w")
        command = (
            [sys.executable, "-m", "tpukit.train", *config]  # CLI arguments
            if isinstance(config, list)
            else [sys.executable, "-X", "faulthandler", JAX_CHILD, json.dumps(config)]
        )
        processes.append(
            (
                subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO),
                log,
            )
        )
    return processes, logs


def _run_pair(tmp_path, name: str, configs: list, timeout: int = 480) -> tuple[list[int], list]:
    """`_start_pair`, then the exit codes (each waited for up to `timeout` seconds) and the paths of the logs."""
    processes, logs = _start_pair(tmp_path, name, configs)
    return finish_processes(processes, timeout=timeout), logs


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory):
    """One uninterrupted 2 x 4 run: (its output directory, its exit codes, its logs)."""
    tmp_path = tmp_path_factory.mktemp("pair")
    config = {
        "recipe": "textfiles_char_lm",
        "overrides": [*SMALL_LM, "runtime.mesh.data=2", "runtime.mesh.model=4"],
        "output_dir": str(tmp_path / "out"),
    }
    codes, logs = _run_pair(tmp_path, "process", [config, config])
    return tmp_path / "out", codes, logs


@pytest.mark.cluster
def test_two_processes_of_four_devices_give_the_single_device_losses(pair_run, tmp_path):
    out, codes, log_paths = pair_run
    logs = [path.read_text()[-3000:] for path in log_paths]
    assert codes == [0, 0], logs
    chief, other = (_results(path)[0] for path in log_paths)

    code, one, output = run_jax(
        {
            "recipe": "textfiles_char_lm",
            "overrides": [*SMALL_LM, "runtime.mesh.data=1", "runtime.mesh.model=1"],
            "output_dir": str(tmp_path / "one"),
        },
        devices=1,
    )
    assert code == 0, output[-3000:]
    for result in (chief, other):
        assert (
            result["metrics"]["input_pipelines"] == 2
            if "input_pipelines" in result["metrics"]
            else True
        )
        np.testing.assert_allclose(result["losses"], one["losses"], rtol=0, atol=1e-5)
        np.testing.assert_allclose(
            result["metrics"]["eval"]["loss"], one["metrics"]["eval"]["loss"], atol=1e-5
        )
    # The kernels are split over devices of both processes: each holds a quarter of the columns.
    qkv = chief["shards"]["block0/attention/qkv/kernel"]
    assert qkv["shard"] == [128, 96] and qkv["devices"] == 8
    # Process 0 writes the run's outputs; both processes write their shards into one checkpoint directory (Orbax).
    assert (out / "model.keras").exists() and (out / "saved_model").is_dir()
    assert "ckpt_6" in os.listdir(out / "checkpoints")
    assert not (out / "worker1" / "checkpoints").exists()
    assert (
        sorted(os.listdir(out / "checkpoints" / "ckpt_6" / "state")).count("ocdbt.process_1") == 1
    )
    assert chief["metrics"]["exported"]["keras"] == str(out / "model.keras")


@pytest.mark.cluster
@pytest.mark.parametrize("killed", [1, 0])
def test_sigkill_either_process_stops_the_other_and_a_rerun_gives_the_uninterrupted_weights(
    killed, pair_run, tmp_path
):
    # Killed at the end of step 4: the step-3 save (the epoch end) may still be in flight, written by both
    # processes or by one only. The survivor must stop (never "done", never hang); a rerun of both must agree on
    # one committed step and finish as if never killed.
    reference, codes, _ = pair_run
    assert codes == [0, 0]
    checkpoints = tmp_path / "out" / "checkpoints"
    config = {
        "recipe": "textfiles_char_lm",
        "overrides": [*SMALL_LM, "runtime.mesh.data=2", "runtime.mesh.model=4"],
        "output_dir": str(tmp_path / "out"),
    }
    configs = [config, config]
    configs[killed] = {**config, "kill_at_step": 4}
    processes, logs = _start_pair(tmp_path, "killed", configs)
    (victim, _), (survivor, _) = processes[killed], processes[1 - killed]
    try:
        assert victim.wait(timeout=480) == -9, logs[killed].read_text()[-3000:]
        killed_at = time.monotonic()
        code = survivor.wait(timeout=90)
        waited = time.monotonic() - killed_at
    finally:
        finish_processes(processes, timeout=1)
    output = logs[1 - killed].read_text()
    assert code != 0 and waited < 60, (code, waited, output[-3000:])
    committed = {n for n in os.listdir(checkpoints) if n[5:].isdigit()}
    assert {"ckpt_0", "ckpt_2"} <= committed <= {"ckpt_0", "ckpt_2", "ckpt_3"}, committed
    if killed == 1:
        # Process 0 hosts the coordination service: it sees process 1 go and says so (tpukit.engines.jax.peers).
        # Process 1 of a lost process 0 is ended by JAX's C++ abort, which nothing in Python can stop (peers.py).
        assert code == 1 and waited < peers.HEARTBEAT_SECONDS + 30, (code, waited)
        assert "tpukit: lost process 1 of 2" in output, output[-3000:]
        assert "restart every process with the same command" in output, output[-3000:]
        assert (
            f"newest ckpt step {max(int(n[5:]) for n in committed)} in {checkpoints}" in output
        ), output[-3000:]
        for crash in ("Traceback", "Check failure", "Fatal Python error", "Terminating process"):
            assert crash not in output, output[-3000:]

    codes, logs = _run_pair(tmp_path, "rerun", [config, config])
    assert codes == [0, 0], [p.read_text()[-3000:] for p in logs]
    resumed = {_results(path)[0]["metrics"]["resumed_from_step"] for path in logs}
    assert resumed == {max(int(n[5:]) for n in committed)}, resumed  # both processes, one step
    for rerun, uninterrupted in zip(
        model_weights(str(tmp_path / "out" / "model.keras")),
        model_weights(str(reference / "model.keras")),
        strict=True,
    ):
        np.testing.assert_array_equal(rerun, uninterrupted)
    left = os.listdir(checkpoints)
    assert all(n[5:].isdigit() for n in left), left  # no temporary of the killed save survives


@pytest.mark.cluster
def test_a_checkpoint_directory_one_process_cannot_see_is_refused_before_training(tmp_path):
    # Each host of a slice with a local --output_dir writes to its own disk: here, two paths on one disk.
    overrides = [*SMALL_LM, "runtime.engine=jax", "runtime.mesh.data=2", "runtime.mesh.model=4"]
    configs = [
        [
            "textfiles_char_lm",
            "--output_dir",
            str(tmp_path / name),
            *[arg for override in overrides for arg in ("--set", override)],
        ]
        for name in ("host0", "host1")
    ]
    codes, logs = _run_pair(tmp_path, "unshared", configs, timeout=240)
    outputs = [path.read_text() for path in logs]
    assert codes == [2, 2], [o[-2000:] for o in outputs]
    for output in outputs:
        assert "process(es) 1 of 2 cannot see the checkpoint directory" in output, output[-2000:]
        assert "gs:// bucket" in output and "Traceback" not in output
    assert not (tmp_path / "host0" / "checkpoints").exists() or not [
        n for n in os.listdir(tmp_path / "host0" / "checkpoints") if n.startswith("ckpt_")
    ]


@pytest.mark.cluster
def test_one_process_evaluates_the_checkpoint_two_processes_wrote(pair_run):
    # A restore onto another process count and mesh: 1 process, 1 device, from the 2 x 4 run's Orbax step.
    out, codes, log_paths = pair_run
    assert codes == [0, 0]
    overrides = [*SMALL_LM, "runtime.engine=jax", "runtime.mesh.data=1", "runtime.mesh.model=1"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpukit.train",
            "textfiles_char_lm",
            "--mode",
            "eval",
            "--output_dir",
            str(out),
        ]
        + [arg for override in overrides for arg in ("--set", override)],
        env=dict(
            os.environ,
            XLA_FLAGS="--xla_force_host_platform_device_count=1",
            KERAS_BACKEND="jax",
            PYTHONPATH=REPO,
        ),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    evaluated = json.loads((out / "eval_metrics.json").read_text())
    chief = _results(log_paths[0])[0]["metrics"]
    assert evaluated["step"] == 6, evaluated
    np.testing.assert_allclose(evaluated["eval"]["loss"], chief["eval"]["loss"], rtol=0, atol=1e-5)


@pytest.mark.cluster
def test_a_process_that_stops_on_its_own_error_is_named_by_the_other(tmp_path):
    # Process 1's output directory turns full at its first step (a faked ENOSPC): it stops with the disk message,
    # and process 0, left alone in a collective, names it instead of printing the collective's traceback.
    overrides = [*SMALL_LM, "runtime.engine=jax", "runtime.mesh.data=2", "runtime.mesh.model=4"]
    args = ["textfiles_char_lm", "--output_dir", str(tmp_path / "out")]
    args += [arg for override in overrides for arg in ("--set", override)]
    fault = faults.env(oserror="tpukit.rundir:check_leases:ENOSPC", base={"PYTHONPATH": REPO})
    processes, logs = _start_pair(tmp_path, "failing", [args, args], envs=({}, fault))
    codes = finish_processes(processes, timeout=240)
    outputs = [path.read_text() for path in logs]
    assert codes == [1, 1], [o[-2000:] for o in outputs]
    assert "No space left on device" in outputs[1], outputs[1][-2000:]
    assert (
        "tpukit: lost process 1 of 2 (it stopped on an error of its own, in its log" in outputs[0]
    ), outputs[0][-3000:]
    assert "Traceback" not in outputs[0], outputs[0][-3000:]
