"""The jax engine over 2 processes x 4 virtual CPU devices on 127.0.0.1 (`keras.distribution.initialize` through
$TPUKIT_COORDINATOR_ADDRESS): each process reads its own half of every batch, the 2x4 mesh spans both, and the
losses equal one device's. This proves JAX's multi-controller path and tpukit's per-process input and checkpoints
on one machine; nothing about a TPU pod's network."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import JAX_CHILD, REPO, finish_processes, free_ports, run_jax

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
    "runtime.verbose=0",
]


def _results(log_path):
    with open(log_path) as f:
        lines = f.read().splitlines()
    return [json.loads(line[len("RESULT ") :]) for line in lines if line.startswith("RESULT ")]


@pytest.mark.cluster
def test_two_processes_of_four_devices_give_the_single_device_losses(tmp_path):
    config = {
        "recipe": "textfiles_char_lm",
        "overrides": [*SMALL_LM, "runtime.mesh.data=2", "runtime.mesh.model=4"],
        "output_dir": str(tmp_path / "out"),
    }
    (port,) = free_ports(1)
    processes = []
    for index in range(2):
        env = dict(
            os.environ,
            XLA_FLAGS="--xla_force_host_platform_device_count=4",
            KERAS_BACKEND="jax",
            TF_CPP_MIN_LOG_LEVEL="2",
            TPUKIT_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
            TPUKIT_NUM_PROCESSES="2",
            TPUKIT_PROCESS_ID=str(index),
            PYTHONPATH=REPO,
        )
        log = open(tmp_path / f"process{index}.log", "w")
        command = [sys.executable, "-X", "faulthandler", JAX_CHILD, json.dumps(config)]
        processes.append(
            (
                subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO),
                log,
            )
        )
    codes = finish_processes(processes, timeout=480)
    logs = [(tmp_path / f"process{i}.log").read_text()[-3000:] for i in range(2)]
    assert codes == [0, 0], logs
    chief, other = (_results(tmp_path / f"process{i}.log")[0] for i in range(2))

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
    # Process 0 writes the run's outputs; process 1 its own checkpoints (as a TF_CONFIG worker does).
    out = tmp_path / "out"
    assert (out / "model.keras").exists() and (out / "saved_model").is_dir()
    assert sorted(os.listdir(out / "worker1" / "checkpoints"))[-1] == "ckpt-6.npz"
    assert chief["metrics"]["exported"]["keras"] == str(out / "model.keras")
