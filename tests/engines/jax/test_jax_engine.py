"""The jax engine on 8 virtual CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`), each run in its
own process (`child.py`). What this proves: Keras on JAX with tpukit's mesh, layouts and trainer computes the same
losses over a data x model mesh as on one device, the weights really are split, and a SIGKILLed run resumes to the
same weights. What it does not: anything about a TPU or a GPU (none here), or speed.
"""

import json
import os

import keras
import numpy as np
import pytest
from helpers import loss_recorder, model_weights, run_cli, run_jax, train_in_process

import tpukit

SMALL_LM = [
    "train.epochs=2",
    "train.steps_per_epoch=3",
    "train.warmup_steps=2",
    "data.max_bytes=100000",
    "runtime.checkpoint_every_steps=2",
    # Every epoch end saves, however fast the steps (the 2% budget skips saves when a warm compilation cache
    # makes an epoch short): the SIGKILL test expects the epoch-end checkpoint.
    "runtime.checkpoint_max_overhead=null",
    "runtime.verbose=0",
]


def _mesh(data, model):
    return [f"runtime.mesh.data={data}", f"runtime.mesh.model={model}"]


def _alive(pid: int, command: str, seconds: float = 10.0) -> bool:
    """Whether process `pid` still runs `command` after up to `seconds` (a killed one's end is asynchronous)."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                running = command.encode() in f.read()
            with open(f"/proc/{pid}/stat") as f:
                running = running and f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False
        if not running:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
    """textfiles_char_lm, 6 Adam steps, on a 1x1 mesh and on a 2x4 mesh."""
    runs = {}
    for data, model in ((1, 1), (2, 4)):
        out = str(tmp_path_factory.mktemp(f"lm_{data}x{model}"))
        code, result, output = run_jax(
            {
                "recipe": "textfiles_char_lm",
                "overrides": SMALL_LM + _mesh(data, model),
                "output_dir": out,
            }
        )
        assert code == 0 and result, output[-3000:]
        runs[(data, model)] = (out, result)
    return runs


@pytest.mark.integration
def test_model_parallel_2x4_gives_the_single_device_losses(lm_runs):
    _, one = lm_runs[(1, 1)]
    _, mesh = lm_runs[(2, 4)]
    assert len(one["losses"]) == len(mesh["losses"]) == 6
    np.testing.assert_allclose(mesh["losses"], one["losses"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        mesh["metrics"]["eval"]["loss"], one["metrics"]["eval"]["loss"], atol=1e-5
    )
    assert mesh["metrics"]["mesh"] == {"data": 2, "model": 4}
    assert mesh["metrics"]["engine"] == "jax" and mesh["metrics"]["strategy"] == "ModelParallel"


@pytest.mark.integration
def test_the_kernels_really_are_split_over_the_model_axis(lm_runs):
    _, mesh = lm_runs[(2, 4)]
    shards = mesh["shards"]
    # Read from the arrays: a column-split kernel holds a quarter of its columns on each device.
    qkv = shards["block0/attention/qkv/kernel"]
    assert qkv["shape"] == [128, 384] and qkv["shard"] == [128, 96] and qkv["devices"] == 8
    assert shards["block0/attention/output/kernel"]["shard"] == [32, 128]  # row-split
    assert shards["block0/mlp_in/kernel"]["shard"] == [128, 128]
    assert shards["token_embedding/embeddings"]["shard"] == [256, 32]
    assert shards["block0/attention_norm/gamma"]["shard"] == [128]  # norms stay whole
    reported = mesh["metrics"]["sharded"]
    assert reported["block0/attention/qkv/kernel"] == [None, "model"]
    assert sorted(reported) == sorted(p for p, s in shards.items() if s["shard"] != s["shape"])
    _, one = lm_runs[(1, 1)]
    assert all(s["shard"] == s["shape"] for s in one["shards"].values())
    assert one["metrics"]["sharded"] == {}


@pytest.mark.integration
def test_sigkill_then_rerun_ends_with_the_uninterrupted_weights(lm_runs, tmp_path):
    out = str(tmp_path / "killed")
    config = {"recipe": "textfiles_char_lm", "overrides": SMALL_LM + _mesh(2, 4), "output_dir": out}
    code, result, output = run_jax({**config, "kill_at_step": 5})
    assert code == -9 and result is None, output[-2000:]
    # The SavedModel's exporting process, paused while steps train, ended with the killed run.
    (pids,) = [
        json.loads(line.split(" ", 1)[1])
        for line in output.splitlines()
        if line.startswith("EXPORT_PROCESSES ")
    ]
    assert len(pids) == 1 and not _alive(pids[0], "tpukit.engines.jax.saved_model"), pids
    # Killed before step 5's save: the newest checkpoint is the epoch end (step 3), saved mid-run, unless its
    # asynchronous write was still in flight (then uncommitted, and step 2 is the newest).
    saved = {n for n in os.listdir(os.path.join(out, "checkpoints")) if "tmp" not in n}
    assert {"ckpt_0", "ckpt_2"} <= saved <= {"ckpt_0", "ckpt_2", "ckpt_3"}, saved
    code, result, output = run_jax(config)
    assert code == 0, output[-3000:]
    assert result["metrics"]["resumed_from_step"] == max(int(n[5:]) for n in saved)
    assert result["metrics"]["step"] == 6
    left = os.listdir(os.path.join(out, "checkpoints"))
    assert all(n.startswith("ckpt_") and n[5:].isdigit() for n in left), (
        left
    )  # no temporary survives
    reference_dir, reference = lm_runs[(2, 4)]
    np.testing.assert_array_equal(result["losses"][-1], reference["losses"][-1])
    for resumed, uninterrupted in zip(
        model_weights(os.path.join(out, "model.keras")),
        model_weights(os.path.join(reference_dir, "model.keras")),
        strict=True,
    ):
        np.testing.assert_array_equal(resumed, uninterrupted)


@pytest.mark.integration
def test_the_export_serves_the_trained_model(lm_runs):
    import tensorflow as tf

    out, result = lm_runs[(2, 4)]
    assert result["metrics"]["exported"] == {
        "keras": os.path.join(out, "model.keras"),
        "saved_model": os.path.join(out, "saved_model"),
    }
    tokens = np.arange(128, dtype=np.int32)[None] % 256
    loaded = tf.saved_model.load(
        os.path.join(out, "saved_model")
    )  # kept: its function reads its variables
    served = loaded.serve(tokens)
    expected = keras.saving.load_model(os.path.join(out, "model.keras"), compile=False)(tokens)
    np.testing.assert_allclose(np.asarray(served), np.asarray(expected), atol=1e-5)
    with open(os.path.join(out, "metrics.json")) as f:
        assert json.load(f)["mesh"] == {"data": 2, "model": 4}


@pytest.mark.slow
def test_data_parallel_over_8_devices_gives_the_single_device_losses(lm_runs, tmp_path):
    _, one = lm_runs[(1, 1)]
    code, result, output = run_jax(
        {
            "recipe": "textfiles_char_lm",
            "overrides": SMALL_LM + _mesh(8, 1),
            "output_dir": str(tmp_path),
        }
    )
    assert code == 0, output[-3000:]
    np.testing.assert_allclose(result["losses"], one["losses"], rtol=0, atol=1e-5)
    assert all(s["shard"] == s["shape"] and s["devices"] == 8 for s in result["shards"].values())


def test_the_tensorflow_engine_refuses_a_model_axis(tmp_path):
    done = train_in_process(
        "textfiles_char_lm",
        "--set",
        "runtime.engine=tensorflow",
        "--set",
        "runtime.mesh.model=4",
        "--output_dir",
        str(tmp_path / "out"),
    )
    assert done.returncode == 2, done.stderr
    assert "runtime.mesh.model=4" in done.stderr and "--set runtime.engine=jax" in done.stderr
    assert not os.path.exists(tmp_path / "out")


def test_one_process_trains_with_one_engine(tmp_path):
    recipe = tpukit.load_recipe("digits_cnn", ["runtime.engine=jax"])
    with pytest.raises(ImportError, match=r"tpukit.use_engine\('jax'\)"):
        tpukit.run(recipe, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.integration
def test_the_cli_picks_the_backend_from_the_recipe(tmp_path):
    """KERAS_BACKEND=tensorflow in the environment (run_cli sets it): the recipe's engine still decides."""
    done = run_cli(
        "digits_cnn",
        "--set",
        "runtime.engine=jax",
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=2",
        "--output_dir",
        str(tmp_path / "out"),
        env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "out" / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["engine"] == "jax" and metrics["mesh"] == {"data": 2, "model": 1}
    assert "using the Keras 'jax' backend instead of KERAS_BACKEND='tensorflow'" in done.stderr
    # After that notice (the user's KERAS_BACKEND), tpukit's first line says what it found, before the plan.
    lines = [line for line in done.stderr.splitlines() if "KERAS_BACKEND" not in line]
    assert lines[0].startswith(
        "tpukit: engine jax, 2 replicas on 2 CPU devices (cpu:0, cpu:1), mesh data 2 x model 1 because "
        "runtime.mesh is {data: auto, model: 1}; JAX "
    ), done.stderr[:3000]
    assert lines[1].startswith("tpukit plan: ")


def test_the_start_line_names_the_devices_the_mesh_and_the_processes():
    import jax

    from tpukit.engines.jax import engine as jax_engine

    class Chip:  # what the line reads of a jax.Device
        platform, device_kind = "tpu", "TPU v4"

        def __init__(self, index):
            self.index = index

        def __str__(self):
            return f"TPU_{self.index}"

    chips = [Chip(i) for i in range(16)]
    mesh = jax_engine.Mesh(data=4, model=4, devices=chips, processes=4)
    assert jax_engine.describe(mesh, {"data": "auto", "model": 4}) == (
        "tpukit: engine jax, 4 replicas on 16 TPU v4 devices (TPU_0, TPU_1, TPU_2, TPU_3, ... (16 in all)) in 4 "
        "processes, mesh data 4 x model 4 because runtime.mesh is {data: auto, model: 4}; "
        f"JAX {jax.__version__}, Keras {keras.__version__}"
    )


@pytest.mark.integration
def test_an_engine_does_not_resume_the_other_engines_checkpoints(tmp_path):
    trained = tmp_path / "tf"
    done = train_in_process(
        "digits_cnn",
        "--set",
        "train.epochs=1",
        "--set",
        "train.steps_per_epoch=2",
        "--output_dir",
        str(trained),
    )
    assert done.returncode == 0, done.stderr
    from tpukit.engines.jax import engine as jax_engine

    with pytest.raises(tpukit.RecipeError, match="checkpoints of the tensorflow engine"):
        jax_engine.checkpoints(str(trained / "checkpoints"), None)
    (tmp_path / "j" / "checkpoints").mkdir(parents=True)
    (tmp_path / "j" / "checkpoints" / "ckpt-3.npz").write_bytes(b"")
    done = train_in_process("digits_cnn", "--output_dir", str(tmp_path / "j"))
    assert done.returncode == 2 and "checkpoints of the jax engine" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_two_engines_give_the_same_losses_from_the_same_weights(optimizer, tmp_path):
    """digits_cnn without dropout (the engines draw different dropout masks) from one set of initial weights:
    TensorFlow's trainer here, JAX's in a child process, the same per-step losses."""
    import tensorflow as tf

    from tpukit.models import MODELS

    keras.utils.set_random_seed(0)
    recipe = tpukit.load_recipe("digits_cnn")
    start = str(tmp_path / "start.keras")
    MODELS["small_cnn"](**{**recipe.model.kwargs, "dropout": 0.0}).save(start)
    overrides = [
        "model.dropout=0.0",
        f"model.init_weights={start}",
        f"train.optimizer={optimizer}",
        "train.weight_decay=0",
        "train.learning_rate=0.01",
        "train.epochs=1",
        "train.steps_per_epoch=8",
        "runtime.verbose=0",
    ]
    recorder = loss_recorder()
    tpukit.run(
        tpukit.load_recipe("digits_cnn", overrides),
        str(tmp_path / "tf"),
        strategy=tf.distribute.get_strategy(),
        callbacks=[recorder],
    )
    code, result, output = run_jax(
        {
            "recipe": "digits_cnn",
            "overrides": overrides + _mesh(1, 1),
            "output_dir": str(tmp_path / "jax"),
        },
        devices=1,
    )
    assert code == 0, output[-3000:]
    assert len(recorder.losses) == len(result["losses"]) == 8
    np.testing.assert_allclose(result["losses"], recorder.losses, rtol=1e-5, atol=1e-5)


# Every epoch end saves, however short the epoch (a 2% budget skips the step-4 save of so short a run).
DIGITS = [
    "train.epochs=2",
    "train.steps_per_epoch=4",
    "runtime.verbose=0",
    "runtime.checkpoint_max_overhead=null",
]


@pytest.mark.integration
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    out = str(tmp_path / "run")
    config = {"recipe": "digits_cnn", "overrides": DIGITS, "output_dir": out}
    code, first, output = run_jax(config, devices=2)
    assert code == 0, output[-3000:]
    newest = os.path.join(out, "checkpoints", "ckpt_8", "state")
    data = [
        os.path.join(d, f) for d, _, files in os.walk(newest) for f in files if "/d/" in d + "/"
    ]
    assert data, os.listdir(newest)
    for path in data:
        with open(path, "r+b") as f:
            f.truncate(100)  # a disk that handed back half a file
    code, again, output = run_jax(config, devices=2)
    assert code == 0, output[-3000:]
    assert "ckpt_8 is incomplete or damaged" in output and "could not be read" in output
    assert again["metrics"]["resumed_from_step"] == 4 and again["metrics"]["step"] == 8
    np.testing.assert_allclose(again["losses"], first["losses"][4:], atol=1e-6)
    # The rerun wrote step 8 afresh: the next run restores it, with nothing damaged left.
    code, third, output = run_jax(config, devices=2)
    assert code == 0 and "incomplete or damaged" not in output, output[-3000:]
    assert third["metrics"]["resumed_from_step"] == 8, third["metrics"]


@pytest.mark.integration
def test_divergence_rolls_back_then_stops_with_the_fix(tmp_path):
    config = {
        "name": "diverges",
        "recipe": "digits_cnn",
        "overrides": [
            *DIGITS,
            "train.learning_rate=1.0e+12",
            "train.max_nan_retries=1",
            "train.optimizer=sgd",
        ],
        "output_dir": str(tmp_path / "run"),
    }
    code, results, output = run_jax({"runs": [config]}, devices=2, all_results=True)
    assert code == 0, output[-3000:]
    assert results[0]["error"].startswith("TrainingDivergedError: the loss became non-finite"), (
        results
    )
    assert "after 1 rollback(s) (train.max_nan_retries=1)" in results[0]["error"]
    assert results[0]["open_exports"] == 0  # the run's SavedModel export process ended with it
    assert "rolled back to step" in output


@pytest.mark.slow
def test_steps_per_execution_early_stopping_best_model_tensorboard_and_bfloat16(tmp_path):
    out = tmp_path / "run"
    overrides = [
        "train.epochs=3",
        "train.steps_per_epoch=4",
        "runtime.verbose=0",
        "runtime.steps_per_execution=4",
        "train.export_best_by=val_loss",
        "train.early_stopping_patience=5",
    ]
    code, result, output = run_jax(
        {"recipe": "digits_cnn", "overrides": overrides, "output_dir": str(out)}, devices=2
    )
    assert code == 0, output[-3000:]
    metrics = result["metrics"]
    assert (
        metrics["steps_per_execution"] == 4
        and metrics["status"] == "done"
        and metrics["step"] == 12
    )
    assert metrics["eval_examples"] == 360
    assert (out / "best.keras").exists() and (out / "saved_model").is_dir()
    assert any(name.startswith("events") for name in os.listdir(out / "logs" / "train"))
    # The reported accuracy is the exported model's over the 360 held-out digits, recounted here on TensorFlow
    # (in float32: in bfloat16 the two backends round differently and may flip a borderline prediction).
    from tpukit import data

    recipe = tpukit.load_recipe("digits_cnn")
    source = data.SOURCES[recipe.data.source]
    examples = source(split=recipe.data.eval_split, input_context=None, **recipe.data.options)
    model = tpukit.load_model(str(out / "model.keras"))
    correct = count = 0
    for features, labels in examples.batch(64):
        correct += int(np.sum(np.argmax(model(features, training=False), -1) == labels.numpy()))
        count += len(labels)
    assert count == 360 and metrics["eval"]["accuracy"] * 360 == pytest.approx(correct, abs=1e-3)

    bf16 = [*overrides[:3], "runtime.precision=mixed_bfloat16"]
    code, result, output = run_jax(
        {"recipe": "digits_cnn", "overrides": bf16, "output_dir": str(tmp_path / "bf16")}, devices=2
    )
    assert code == 0, output[-3000:]
    assert result["metrics"]["precision"] == "mixed_bfloat16" and np.isfinite(
        result["metrics"]["eval"]["loss"]
    )
    trained = keras.saving.load_model(str(tmp_path / "bf16" / "model.keras"), compile=False)
    assert trained.get_layer("block0_conv1").dtype_policy.name == "mixed_bfloat16"


@pytest.mark.integration
def test_batch_end_work_stays_on_the_main_thread():
    """Keras on JAX hands batch-end log conversions to a thread pool unless a callback overrides the hooks; on a
    mesh that deadlocked the CPU collectives of a long evaluation. Checked in a JAX process (on TensorFlow Keras
    never dispatches them asynchronously, so this process would prove nothing)."""
    import subprocess
    import sys

    code = (
        "import keras; from tpukit.engines.jax import engine; "
        "plain = keras.callbacks.CallbackList([keras.callbacks.Callback()]); "
        "ours = keras.callbacks.CallbackList([engine.InOrder()]); "
        "print(plain._async_test, ours._async_train, ours._async_test, ours._async_predict)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # Keras' own flags (keras/src/callbacks/callback_list.py, `_configure_async_dispatch`): on without InOrder.
    assert done.stdout.split()[-4:] == ["True", "False", "False", "False"], done.stdout
