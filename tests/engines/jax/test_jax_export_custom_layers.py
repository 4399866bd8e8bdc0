"""The jax engine's SavedModel is written by a TensorFlow-backend process that loads `model.keras`: a user's own
layer classes must be found there. Found by benchmarks/vs_keras.py's keras-io text model (issue 22)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

LAYERS = """
import jax  # a jax-engine user's module may; the exporting process keeps jax out of its own imports
import keras


class Doubler(keras.layers.Layer):  # a user's layer, neither registered nor given a get_config
    def call(self, x):
        return 2 * x
"""

SCRIPT = """
import json, sys
import numpy as np
import tpukit

tpukit.use_engine("jax")
import keras
from mylayers import Doubler


class PlusOne(keras.layers.Layer):  # defined in the script itself
    def call(self, x):
        return x + 1


def build():
    extra = [PlusOne()] if sys.argv[1] == "script" else []
    return keras.Sequential([keras.Input((3,)), Doubler(), *extra, keras.layers.Dense(2)])


x = np.random.default_rng(0).random((64, 3), dtype=np.float32)
y = (x[:, 0] > 0.5).astype("int32")
try:
    metrics = tpukit.fit(build, x, y, epochs=1, batch_size=16, output_dir=sys.argv[2], engine="jax")
except tpukit.runner.ExportFailedError as failed:  # an output missing: the run fails, its metrics written
    print(f"FAILED {failed}", file=sys.stderr)
    metrics = failed.metrics
print("EXPORTED", json.dumps(sorted(metrics["exported"])))
print("MISSING", json.dumps(sorted(metrics.get("outputs_missing", {}))))
"""


def _fit(tmp_path, where: str, broken: bool = False):
    # broken: the module raises outside the jax run (the exporting process is Keras on TensorFlow).
    guard = 'import os\nif os.environ["KERAS_BACKEND"] != "jax":\n    raise RuntimeError("only in the run")\n'
    (tmp_path / "mylayers.py").write_text((guard if broken else "") + LAYERS)
    (tmp_path / "script.py").write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")])
    out = tmp_path / f"run-{where}"
    done = subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), where, str(out)],
        capture_output=True,
        text=True,
        cwd=str(
            tmp_path.parent
        ),  # not the script's directory: mylayers is found through the run's sys.path
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    exported = json.loads(done.stdout.split("EXPORTED")[1].split("MISSING")[0])
    missing = json.loads(done.stdout.split("MISSING")[1])
    return out, exported, done.stderr, missing


@pytest.mark.integration
def test_a_layer_from_the_users_module_is_exported(tmp_path):
    out, exported, _, missing = _fit(tmp_path, "module")
    assert exported == ["keras", "saved_model"] and missing == []
    loaded = tf.saved_model.load(str(out / "saved_model"))  # kept: the endpoint reads its variables
    served = loaded.serve(tf.ones((2, 3)))
    assert tuple(served.shape) == (2, 2)


@pytest.mark.integration
def test_a_layer_defined_in_the_script_leaves_model_keras_and_says_the_fix(tmp_path):
    # Found before training (issue 40): the SavedModel is skipped with a warning, the run ends done.
    out, exported, stderr, missing = _fit(tmp_path, "script")
    assert exported == ["keras"] and missing == [] and (out / "model.keras").exists()
    assert "cannot import PlusOne defined in the script that runs" in stderr
    assert "Fix: define the model's own layers in a module of yours" in stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "done" and list(metrics["outputs_skipped"]) == ["saved_model"]


@pytest.mark.integration
def test_a_module_that_cannot_load_in_the_exporting_process_is_named(tmp_path):
    # Met only at the export: the run fails (issue 40), model.keras and metrics.json written.
    out, exported, stderr, missing = _fit(tmp_path, "module", broken=True)
    assert exported == ["keras"] and missing == ["saved_model"] and (out / "model.keras").exists()
    assert json.loads((out / "metrics.json").read_text())["status"] == "failed"
    assert "could not import mylayers: RuntimeError: only in the run" in stderr
    assert "Fix: define the model's own layers" not in stderr  # they are in a module already
