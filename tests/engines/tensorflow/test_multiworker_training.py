"""Training under a real MultiWorkerMirroredStrategy: 2 worker processes on 127.0.0.1.

Stock Keras 3.15 cannot `fit` there at all (its symbolic build and its per-replica output reduction fail); this
proves tpukit's loop trains across worker processes with the same losses as one device, and that the CLI runs a
recipe on a 2-worker cluster chosen by `connect()` from TF_CONFIG."""

import json
import os
import subprocess
import sys
import textwrap
import time

import faults
import pytest
from helpers import start_workers

# Every case starts 2-3 worker processes on 127.0.0.1 (a MultiWorkerMirroredStrategy cluster).
pytestmark = pytest.mark.cluster

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf

    multi = bool(os.environ.get("TF_CONFIG"))
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if multi else tf.distribute.get_strategy()

    import keras
    import numpy as np
    from tpukit.engines.tensorflow import loop

    keras.utils.set_random_seed(1)
    x = np.random.RandomState(0).randn(64, 4).astype("float32")
    y = (x.sum(1) > 0).astype("int32")

    def dataset_fn(ctx):
        # Worker i takes rows [i * per, (i + 1) * per) of every global batch of 16: the same global batches as one device.
        per, i = ctx.get_per_replica_batch_size(16), ctx.input_pipeline_id
        ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)
        return ds.map(lambda a, b: (a[i * per:(i + 1) * per], b[i * per:(i + 1) * per]))

    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), steps_per_execution=int(sys.argv[2]),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    used = loop.use_multi_step_loop(model)
    history = model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=2, steps_per_epoch=8, verbose=0)
    with open(sys.argv[1], "w") as f:
        json.dump({"loss": history.history["loss"], "step": int(model.optimizer.iterations.numpy()), "loop": used}, f)
    """
)


def test_two_workers_train_with_the_single_device_losses(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    codes = start_workers(
        tmp_path, lambda i: [sys.executable, str(script), str(tmp_path / f"out{i}.json"), "4"]
    )
    assert codes == [0, 0], (tmp_path / "worker0.log").read_text()[-3000:]
    single = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "single.json"), "1"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        timeout=300,
    )
    assert single.returncode == 0, single.stderr[-2000:]
    expected = json.loads((tmp_path / "single.json").read_text())
    for index in range(2):
        got = json.loads((tmp_path / f"out{index}.json").read_text())
        assert got["loop"] is True and got["step"] == 16
        for a, b in zip(got["loss"], expected["loss"], strict=True):
            assert abs(a - b) < 1e-5


def _cli_args(output_dir, *sets, extra=()):
    """`args_for(index)` for start_workers: the digits recipe through the CLI with `--set` for each of `sets`."""
    command = [
        sys.executable,
        "-m",
        "tpukit.train",
        "recipes/digits_cnn.yaml",
        "--output_dir",
        str(output_dir),
    ]
    for setting in sets:
        command += ["--set", setting]
    return lambda index: [*command, *extra]


def test_the_cli_trains_a_recipe_on_a_two_worker_cluster(tmp_path):
    output_dir = tmp_path / "run"  # one directory for both workers, as on a shared file system
    args = _cli_args(
        output_dir, "train.epochs=1", "data.global_batch_size=32", "runtime.steps_per_execution=2"
    )

    codes = start_workers(tmp_path, args)
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs[0][-3000:]
    # The chief writes OUTPUT_DIR; the other worker takes part in every save under OUTPUT_DIR/worker1 and keeps
    # only its checkpoints (it resumes from them): no summaries, model, best.keras or metrics.json of its own.
    metrics = json.loads((output_dir / "metrics.json").read_text())
    assert metrics["strategy"] == "CollectiveAllReduceStrategy"  # MultiWorkerMirroredStrategy
    assert metrics["replicas"] == 2 and metrics["step"] == 1437 // 32
    assert metrics["eval_examples"] == 360 and metrics["eval"]["accuracy"] > 0.5
    assert (output_dir / "model.keras").is_file() and (output_dir / "logs").is_dir()
    # ... and its own history of the runs started there (each worker holds the lock of its own directory)
    assert sorted(p.name for p in (output_dir / "worker1").iterdir()) == [
        "checkpoints",
        "runs.jsonl",
    ]
    assert (output_dir / "worker1" / "checkpoints" / "ckpt-44.index").is_file()
    # One model, evaluated over both workers' shards: both print the same evaluation.
    summaries = [log.split("tpukit: done")[1].split(";")[0] for log in logs]
    assert summaries[0] == summaries[1]
    assert "TF_CONFIG describes a cluster of 2 worker(s)" in logs[0]
    assert "not the chief" in logs[1] and "not the chief" not in logs[0]


def test_sigterm_on_one_worker_stops_every_worker_at_the_same_step_and_all_resume(tmp_path):
    # A preempted host gets SIGTERM alone: here worker 1 (not the chief) at step 10 of 44.
    output_dir = tmp_path / "run"
    args = _cli_args(
        output_dir,
        "train.epochs=1",
        "data.global_batch_size=32",
        "runtime.steps_per_execution=2",
        "data.deterministic=true",
    )

    codes = start_workers(
        tmp_path, args, env_for=lambda i: faults.env(signals_at_step=10) if i == 1 else {}
    )
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert codes == [143, 143], logs[0][-3000:] + logs[1][-3000:]
    assert all("stopped by SIGTERM at step 10" in log for log in logs)
    assert json.loads((output_dir / "metrics.json").read_text())["status"] == "preempted"
    for directory in (output_dir, output_dir / "worker1"):
        assert (directory / "checkpoints" / "ckpt-10.index").is_file()

    codes = start_workers(tmp_path, args)  # the same command on every worker
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs[0][-3000:]
    metrics = json.loads((output_dir / "metrics.json").read_text())
    assert metrics["resumed_from_step"] == 10 and metrics["step"] == 44
    assert all("resuming mid-epoch at step 10" in log for log in logs)


def _digits_args(output_dir, *extra):
    return _cli_args(
        output_dir,
        "train.epochs=2",
        "data.global_batch_size=32",
        "runtime.steps_per_execution=2",
        "runtime.checkpoint_every_steps=4",
        "data.deterministic=true",
        extra=extra,
    )


def _wait_for_every_workers_ckpt_20(output_dir, workers, seconds):
    """Until every worker has written its ckpt-20 (the chief in checkpoints/, worker N in workerN/checkpoints/):
    a worker whose save lagged the chief's would otherwise make 16 the newest step all of them hold."""
    wanted = [output_dir / "checkpoints" / "ckpt-20.index"]
    wanted += [
        output_dir / f"worker{i}" / "checkpoints" / "ckpt-20.index" for i in range(1, workers)
    ]
    deadline = time.time() + seconds
    while time.time() < deadline and not all(path.exists() for path in wanted):
        time.sleep(0.2)


def test_a_killed_worker_stops_the_other_with_a_clear_message_and_all_resume(tmp_path):
    from helpers import REPO, free_ports

    output_dir = tmp_path / "run"
    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes, logs = [], []
    for index in range(2):
        env = dict(
            os.environ,
            TF_CPP_MIN_LOG_LEVEL="2",
            KERAS_BACKEND="tensorflow",
            CUDA_VISIBLE_DEVICES="",
            TF_CONFIG=json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            ),
        )
        logs.append(open(tmp_path / f"worker{index}.log", "w"))
        processes.append(
            subprocess.Popen(
                _digits_args(output_dir)(index),
                env=env,
                cwd=REPO,
                stdout=logs[-1],
                stderr=subprocess.STDOUT,
            )
        )
    try:
        _wait_for_every_workers_ckpt_20(output_dir, workers=2, seconds=240)
        processes[1].kill()  # SIGKILL: no handler runs, as on a lost VM
        killed = time.time()
        processes[0].wait(timeout=120)
        waited = time.time() - killed
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        for log in logs:
            log.close()
    chief = (tmp_path / "worker0.log").read_text()
    assert processes[0].returncode == 1, chief[-3000:]
    assert (
        waited < 60
    )  # TensorFlow's coordination service notices the missing heartbeats (~10 s measured)
    assert (
        "another worker of this multi-worker cluster stopped" in chief and "Traceback" not in chief
    )

    codes = start_workers(tmp_path, _digits_args(output_dir))  # the same command on every worker
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    resumed = json.loads((output_dir / "metrics.json").read_text())
    assert resumed["resumed_from_step"] >= 20 and resumed["step"] == 2 * (1437 // 32)
    # Both workers restored the same step: the oldest of their newest checkpoints.
    import re

    restored = [re.findall(r"(?:restored|resumed from) \S+ckpt-(\d+)", log) for log in logs]
    assert [int(r[-1]) for r in restored] == [resumed["resumed_from_step"]] * 2, restored


def test_workers_started_with_different_recipes_are_refused_before_training(tmp_path):
    output_dir = tmp_path / "run"

    def args(index):
        return _digits_args(
            output_dir, *(["--set", "data.global_batch_size=64"] if index == 1 else [])
        )(index)

    codes = start_workers(tmp_path, args)
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert codes == [2, 2], logs[0][-3000:]
    for log in logs:
        assert "started with different data.global_batch_size" in log and "Traceback" not in log
    assert "this worker has data.global_batch_size=32" in logs[0]
    assert "this worker has data.global_batch_size=64" in logs[1]
    assert not (output_dir / "checkpoints").exists()


@pytest.mark.slow
def test_three_workers_one_late_then_the_chief_killed_the_others_stop_and_all_resume(tmp_path):
    # 3 real processes: worker 2 starts 10 s after the others (they wait for it at the cluster's start-up, so it
    # trains with them), then the chief is SIGKILLed; the other two stop within a bound and a restart resumes.
    from helpers import REPO, free_ports

    output_dir = tmp_path / "run"
    workers = [f"127.0.0.1:{port}" for port in free_ports(3)]
    # A global batch that 3 replicas divide (29 steps per epoch, one step per execution).
    args = _digits_args(
        output_dir, "--set", "data.global_batch_size=48", "--set", "runtime.steps_per_execution=1"
    )
    processes, logs = [], []
    try:
        for index in range(3):
            if index == 2:
                time.sleep(10)
            env = dict(
                os.environ,
                TF_CPP_MIN_LOG_LEVEL="2",
                KERAS_BACKEND="tensorflow",
                CUDA_VISIBLE_DEVICES="",
                TF_CONFIG=json.dumps(
                    {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
                ),
            )
            logs.append(open(tmp_path / f"worker{index}.log", "w"))
            processes.append(
                subprocess.Popen(
                    args(index), env=env, cwd=REPO, stdout=logs[-1], stderr=subprocess.STDOUT
                )
            )
        _wait_for_every_workers_ckpt_20(output_dir, workers=3, seconds=400)
        processes[0].kill()
        killed = time.time()
        for process in processes[1:]:
            process.wait(timeout=180)
        waited = time.time() - killed
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
        for log in logs:
            log.close()
    texts = [(tmp_path / f"worker{i}.log").read_text() for i in (1, 2)]
    assert [p.returncode for p in processes[1:]] == [1, 1], texts[0][-3000:]
    assert waited < 90
    assert all(
        "another worker of this multi-worker cluster stopped" in t and "Traceback" not in t
        for t in texts
    )
    codes = start_workers(tmp_path, args, count=3, timeout=600)
    assert codes == [0, 0, 0], (tmp_path / "worker0.log").read_text()[-3000:]
    resumed = json.loads((output_dir / "metrics.json").read_text())
    assert resumed["resumed_from_step"] >= 20 and resumed["step"] == 2 * (1437 // 48)
