"""`python -m tpukit.smoke --engine jax` on 8 virtual CPU devices (`XLA_FLAGS=--xla_force_host_platform_device_count=8`),
in a process of its own: this process's Keras is on TensorFlow, and Keras' backend is fixed when it is first imported.

What this proves: the smoke test's paths (steps_per_execution > 1, checkpoint resume, exact eval, a SavedModel that
matches the JAX model) pass on the jax engine over a data x model mesh, and the report names the engine and the mesh.
It says nothing about a TPU or a GPU.
"""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO

from tpukit.tools import smoke


def _paths(report):
    return {p["name"]: p for p in report["paths"]}


@pytest.fixture(scope="module")
def jax_report(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("smoke_jax")
    environment = dict(
        os.environ,
        XLA_FLAGS="--xla_force_host_platform_device_count=8",
        KERAS_BACKEND="tensorflow",  # --engine decides, as runtime.engine does for `tpukit.train`
        TF_CPP_MIN_LOG_LEVEL="2",
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpukit.smoke",
            "--engine",
            "jax",
            "--mesh_model",
            "2",
            "--json",
            "--output_dir",
            str(output_dir),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=600,
    )
    assert done.stdout.startswith("{"), done.stderr[-3000:]
    return done, json.loads(done.stdout), str(output_dir)


@pytest.mark.integration
def test_every_path_passes_on_a_data_by_model_mesh(jax_report):
    done, report, _ = jax_report
    assert {p["name"]: p["status"] for p in report["paths"]} == dict.fromkeys(
        smoke.PATHS, "pass"
    ), smoke.format_report(report)
    assert done.returncode == 0 and report["ok"] is True
    assert "Traceback" not in done.stderr
    assert report["engine"] == "jax" and report["plan"]["engine"] == "jax"
    device = report["device"]
    assert device["engine"] == "jax" and device["kind"] == "jax_cpu"
    assert device["devices"] == 8 and device["mesh"] == {"data": 4, "model": 2}
    assert device["replicas"] == 4 and device["hosts"] == 1
    per_replica, steps = smoke.SIZES["cpu"]
    assert report["plan"]["global_batch_size"] == 4 * per_replica
    assert report["plan"]["steps_per_execution"] == smoke.STEPS_PER_EXECUTION > 1
    assert report["plan"]["mesh"] == {"data": 4, "model": 2}
    # small_cnn's default layout splits its conv and dense kernels over the model axis.
    assert "dense/kernel" in report["plan"]["sharded"]
    paths = _paths(report)
    assert paths["checkpoint"]["detail"].startswith(
        f"resumed at step {steps} with the saved weights"
    )
    assert f"trained to step {2 * steps}" in paths["checkpoint"]["detail"]
    examples = 4 * 4 * per_replica
    assert paths["exact_eval"]["detail"].startswith(f"{examples} of {examples} examples counted")
    assert "jax engine's model" in paths["export"]["detail"]
    # The shell's KERAS_BACKEND=tensorflow was replaced, and said so.
    assert "using the Keras 'jax' backend instead of KERAS_BACKEND='tensorflow'" in done.stderr


@pytest.mark.integration
def test_the_report_names_the_engine_and_the_mesh(jax_report):
    _, report, output_dir = jax_report
    text = smoke.format_report(report)
    assert "  engine: jax" in text.splitlines()
    assert "8 cpu device(s) in 1 process(es), mesh data 4 x model 2 (4 replica(s))" in text
    assert f"jax {report['versions']['jax']}" in text.splitlines()[1]
    with open(os.path.join(output_dir, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)
    assert metrics["engine"] == "jax" and metrics["mesh"] == {"data": 4, "model": 2}
    assert metrics["step"] == 2 * smoke.SIZES["cpu"][1]
    assert os.path.isdir(os.path.join(output_dir, "saved_model"))


def test_a_process_on_the_tensorflow_backend_fails_connect_with_the_fix(tmp_path):
    """This process imported Keras on TensorFlow: the jax engine's paths cannot run here, and the report says why."""
    report = smoke.run_smoke(output_dir=str(tmp_path), engine="jax")
    paths = _paths(report)
    assert paths["connect"]["status"] == "fail"
    assert "tpukit.use_engine('jax')" in paths["connect"]["detail"]
    assert [paths[n]["status"] for n in smoke.PATHS[1:]] == ["skip"] * (len(smoke.PATHS) - 1)


def test_mesh_flags_need_the_jax_engine(capsys):
    with pytest.raises(SystemExit) as exited:
        smoke.main(["--mesh_model", "2"])
    assert exited.value.code == 2
    assert "--mesh_data and --mesh_model need --engine=jax" in capsys.readouterr().err
