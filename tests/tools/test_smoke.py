"""`python -m tpukit.smoke` on this CPU: every path passes with the default strategy, the numbers it reports are
recomputed independently, and a failing path is reported (exit 1) without hiding the others.

What this proves: the smoke test's paths (connect, steps_per_execution > 1, checkpoint resume, exact eval,
SavedModel export) work on a CPU and its checks catch a broken path. It says nothing about a TPU: only a report
produced on one can.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored
from helpers import REPO

import tpukit
from tpukit import data
from tpukit.engines.keras import export as export_lib
from tpukit.tools import smoke


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    output_dir = str(tmp_path_factory.mktemp("smoke"))
    return smoke.run_smoke(output_dir=output_dir), output_dir


def _paths(report):
    return {p["name"]: p for p in report["paths"]}


@pytest.mark.integration
def test_every_path_passes_on_the_default_strategy(cpu_report):
    report, _ = cpu_report
    assert [p["name"] for p in report["paths"]] == list(smoke.PATHS)
    assert {p["name"]: p["status"] for p in report["paths"]} == dict.fromkeys(smoke.PATHS, "pass")
    assert report["ok"] is True
    assert report["device"]["strategy"] == "_DefaultDistributionStrategy"
    assert report["device"]["replicas"] == 1 and report["device"]["kind"] == "default"
    # float32 on a CPU unless asked; several steps per host call.
    assert report["plan"]["precision"] == "float32"
    assert report["plan"]["steps_per_execution"] == smoke.STEPS_PER_EXECUTION > 1
    per_replica, steps = smoke.SIZES["cpu"]
    assert report["plan"]["global_batch_size"] == per_replica
    paths = _paths(report)
    assert paths["checkpoint"]["detail"].startswith(
        f"resumed at step {steps} with the saved weights"
    )
    assert f"trained to step {2 * steps}" in paths["checkpoint"]["detail"]
    examples = 4 * per_replica
    assert paths["exact_eval"]["detail"].startswith(f"{examples} of {examples} examples counted")
    assert report["throughput"]["examples_per_second"] > 0
    # A peak timed under load is timed again when this CNN trains faster than it (`flops.checked_mfu`): the
    # report never says more than 100%, and says why when even the second timing is below the training rate.
    mfu, source = report["throughput"]["mfu"], report["throughput"]["peak_flops_source"]
    assert (0 < mfu <= 1) if mfu is not None else "above that peak" in source, (mfu, source)


@pytest.mark.integration
def test_outputs_match_the_report(cpu_report):
    """The runs' own files: the resumed run ended at 2 epochs, and its exact eval accuracy equals an
    example-by-example count from the exported model over the synthetic test split."""
    report, output_dir = cpu_report
    with open(os.path.join(output_dir, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    per_replica, steps = smoke.SIZES["cpu"]
    assert metrics["step"] == 2 * steps and metrics["resumed_from_step"] == steps
    assert tf.io.gfile.exists(os.path.join(output_dir, "checkpoints", f"ckpt-{2 * steps}.index"))
    options = smoke.smoke_recipe(1, accelerator=False)["data"]
    options = {k: options[k] for k in ("input_shape", "num_classes", "num_examples")}
    x, y = next(data.synthetic("test", None, **options).batch(1 << 20).as_numpy_iterator())
    assert len(y) == metrics["eval_examples"] == 4 * per_replica
    model = keras.saving.load_model(os.path.join(output_dir, "model.keras"), compile=False)
    correct = int(np.sum(np.argmax(model.predict(x, verbose=0), axis=-1) == y))
    assert metrics["eval"]["accuracy"] == pytest.approx(correct / len(y), abs=1e-6)
    serve = export_lib.load_serving(os.path.join(output_dir, "saved_model"))
    np.testing.assert_allclose(np.asarray(serve(x)), model.predict(x, verbose=0), atol=1e-5)


@pytest.mark.integration
def test_report_block_is_shareable(cpu_report):
    report, _ = cpu_report
    text = smoke.format_report(report)
    lines = text.splitlines()
    assert lines[0].startswith("tpukit smoke report")
    assert f"tensorflow {tf.__version__}" in lines[1] and f"keras {keras.__version__}" in lines[1]
    assert "device: CPU" in text and "examples/s, MFU" in text
    assert sum(line.startswith("  [PASS]") for line in lines) == len(smoke.PATHS)
    assert lines[-1].startswith(f"  result: PASS ({len(smoke.PATHS)}/{len(smoke.PATHS)} paths)")
    json.dumps(report)  # --json prints it as it is


@pytest.mark.integration
def test_a_broken_export_fails_that_path_and_exits_1(tmp_path, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise OSError("SavedModel unreadable (simulated)")

    monkeypatch.setattr(export_lib, "load_serving", broken)
    assert smoke.main(["--json", "--output_dir", str(tmp_path)]) == 1
    report = json.loads(capsys.readouterr().out)
    statuses = {p["name"]: p["status"] for p in report["paths"]}
    assert statuses == {
        "connect": "pass",
        "train": "pass",
        "checkpoint": "pass",
        "exact_eval": "pass",
        "export": "fail",
    }
    assert "OSError: SavedModel unreadable (simulated)" in _paths(report)["export"]["detail"]
    assert report["ok"] is False


def test_a_failed_connection_skips_the_rest(monkeypatch, tmp_path):
    def no_tpu(tpu=None):
        raise tpukit.TPUConnectionError("no TPU at grpc://10.0.0.2:8470 (simulated)")

    monkeypatch.setattr(tpukit, "connect", no_tpu)
    report = smoke.run_smoke(output_dir=str(tmp_path), tpu="grpc://10.0.0.2:8470")
    paths = _paths(report)
    assert paths["connect"]["status"] == "fail" and "simulated" in paths["connect"]["detail"]
    assert [paths[n]["status"] for n in smoke.PATHS[1:]] == ["skip"] * (len(smoke.PATHS) - 1)
    assert "result: FAIL (0/5 paths)" in smoke.format_report(report)


def test_recipe_is_sized_per_replica_and_pads_eval():
    raw = smoke.smoke_recipe(8, accelerator=True, precision="mixed_bfloat16", tpu="local")
    recipe = tpukit.recipe.from_dict(raw)
    assert recipe.data.global_batch_size == 8 * 128  # 128 per TPU core
    assert recipe.data.eval_global_batch_size == 8 * 96  # a multiple of 8 per core
    # 4 training batches of eval examples in batches of 3/4 of that: the last batch is partly padding.
    assert raw["data"]["num_examples"] % recipe.data.eval_global_batch_size != 0
    assert recipe.runtime.tpu == "local" and recipe.runtime.precision == "mixed_bfloat16"


@pytest.mark.slow
def test_two_mirrored_replicas(tmp_path):
    """The multi-replica path (tpukit's own multi-step loop for steps_per_execution > 1, keras-team/keras#19246)."""
    report = smoke.run_smoke(output_dir=str(tmp_path), strategy=mirrored(2))
    assert report["ok"], smoke.format_report(report)
    assert report["device"]["replicas"] == 2
    examples = 4 * 2 * smoke.SIZES["cpu"][0]
    assert _paths(report)["exact_eval"]["detail"].startswith(f"{examples} of {examples}")


@pytest.mark.slow
def test_command_line(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    result = subprocess.run(
        [sys.executable, "-m", "tpukit.smoke", "--precision", "mixed_bfloat16"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plan: mixed_bfloat16" in result.stdout
    assert "result: PASS (5/5 paths)" in result.stdout and "Traceback" not in result.stderr
