"""Outputs never lie (issue 40, item 4): a KerasHub task is exported as itself (its `model.keras` loads and
generates the tokens the trained task generates), a model without `get_config` is found before training and its
weights are exported instead, and an export that fails leaves metrics.json (status failed, the missing output
named), the checkpoint, a non-zero exit with one paragraph, a tpukit error carrying the metrics, and a rerun that
exports without training again."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import REPO, tiny_gemma_backbone, train_in_process

import tpukit
from tpukit import rundir
from tpukit.engines.keras import export
from tpukit.runner import ExportFailedError

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub is not installed: pip install -e '.[hub]'"
)

VOCABULARY, LENGTH = 64, 8


def gemma():
    """A tiny GemmaCausalLM from a config: no download, no preprocessor (it takes token ids)."""
    backbone = tiny_gemma_backbone(VOCABULARY)
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def next_tokens(n=64, seed=0):
    ids = np.random.default_rng(seed).integers(1, VOCABULARY, (n, LENGTH + 1)).astype("int32")
    return {"token_ids": ids[:, :-1], "padding_mask": np.ones((n, LENGTH), "int32")}, ids[:, 1:]


def prompt():
    ids = np.zeros((2, LENGTH), "int32")
    ids[:, :3] = [[5, 9, 3], [7, 2, 11]]
    mask = np.zeros((2, LENGTH), bool)
    mask[:, :3] = True
    return {"token_ids": ids, "padding_mask": mask}


def greedy(model):
    model.compile(sampler="greedy")  # the tokens then depend on the weights only
    return model.generate(prompt(), max_length=LENGTH, stop_token_ids=None)["token_ids"]


def test_a_keras_hub_task_is_exported_as_itself_and_generates_the_tokens_it_was_trained_to(
    tmp_path,
):
    built = []

    def build():
        built.append(gemma())
        return built[-1]

    x, y = next_tokens()
    metrics = tpukit.fit(
        build,
        x,
        y,
        epochs=1,
        batch_size=16,
        learning_rate=1e-2,
        output_dir=str(tmp_path),
        verbose=0,
    )
    assert metrics["status"] == "done" and metrics["step"] == 4
    assert sorted(metrics["exported"]) == ["keras", "saved_model"]
    trained = built[-1]  # the task, whose layers tpukit trained
    loaded = keras.saving.load_model(metrics["exported"]["keras"])
    assert type(loaded) is keras_hub.models.GemmaCausalLM
    for theirs, ours in zip(trained.weights, loaded.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(theirs), np.asarray(ours))
    expected = greedy(trained)
    assert (expected[:, 3:] != 0).any()  # it generated something
    np.testing.assert_array_equal(greedy(loaded), expected)
    # The SavedModel serves the task's functional graph: its logits.
    served = export.load_serving(metrics["exported"]["saved_model"])
    inputs = {k: tf.constant(v[:2]) for k, v in x.items()}
    np.testing.assert_allclose(
        served(inputs), trained.predict(inputs, verbose=0), rtol=1e-5, atol=1e-5
    )


class Table:
    """What a DistributedEmbedding takes: a configuration Keras cannot serialize."""

    def __init__(self, rows):
        self.rows = rows


class Ranking(keras.Model):
    """keras-rs' DistributedEmbedding example's shape: a subclassed model with no get_config."""

    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(table.rows, 4)
        self.score = keras.layers.Dense(1)

    def call(self, ids):
        return self.score(keras.ops.mean(self.embedding(ids), axis=1))


def ranking():
    return Ranking(Table(20))


def ids_and_scores(n=64):
    ids = np.random.default_rng(1).integers(0, 20, (n, 3)).astype("int32")
    return ids, (ids[:, :1] % 3).astype("float32")


def test_unserializable_is_found_without_writing_anything():
    model = ranking()
    model(np.zeros((1, 3), "int32"))
    assert "defines no get_config" in export.unserializable(model)
    skipped = export.skipped_outputs(model, saved_model_from_keras=True)
    assert "model.weights.h5 instead" in skipped["keras"]
    assert "runtime.engine=tensorflow" in skipped["saved_model"]
    assert export.skipped_outputs(model) == {"keras": skipped["keras"]}
    plain = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert export.unserializable(plain) is None and export.skipped_outputs(plain) == {}


def test_a_class_of_the_script_is_named_where_another_process_loads_model_keras():
    class PlusOne(keras.layers.Layer):
        def call(self, x):
            return x + 1

    PlusOne.__module__ = "__main__"  # defined in the script that runs
    model = keras.Sequential([keras.Input((3,)), PlusOne(), keras.layers.Dense(2)])
    assert export.script_classes(model) == ["PlusOne"]
    assert (
        "cannot import PlusOne"
        in export.skipped_outputs(model, saved_model_from_keras=True)["saved_model"]
    )
    assert export.skipped_outputs(model) == {}  # the tensorflow engine exports in its own process


def test_a_weights_file_is_written_under_a_temporary_name_keras_accepts():
    temporary = rundir.temporary_name("/r/model.weights.h5")
    assert temporary.endswith(".weights.h5") and rundir.TEMPORARY_MARK in temporary
    assert not rundir._writer_alive(
        os.path.basename(temporary)
    )  # this process's: cleared at the next start


def test_a_model_without_get_config_is_warned_of_before_training_and_its_weights_exported(
    tmp_path, caplog
):
    ids, scores = ids_and_scores()
    with caplog.at_level(logging.INFO, logger="tpukit"):
        metrics = tpukit.fit(
            ranking, ids, scores, epochs=1, batch_size=16, output_dir=str(tmp_path), verbose=0
        )
    lines = [r.getMessage() for r in caplog.records]
    warned = next(i for i, m in enumerate(lines) if "output keras will not be written" in m)
    trained = next(i for i, m in enumerate(lines) if "trained steps" in m)
    assert warned < trained and "get_config" in lines[warned]
    assert metrics["status"] == "done"
    assert sorted(metrics["exported"]) == ["saved_model", "weights"]
    assert "get_config" in metrics["outputs_skipped"]["keras"]
    assert json.loads((tmp_path / "metrics.json").read_text())["exported"] == metrics["exported"]
    assert not (tmp_path / "model.keras").exists()
    # The weights load into the model the user's code builds; the SavedModel serves it.
    again = ranking()
    again(ids[:1])
    again.load_weights(metrics["exported"]["weights"])
    served = export.load_serving(metrics["exported"]["saved_model"])
    np.testing.assert_allclose(
        served(tf.constant(ids[:4])), again.predict(ids[:4], verbose=0), rtol=1e-5, atol=1e-6
    )


def _failing_saved_model(*args, **kwargs):
    raise RuntimeError("injected: the SavedModel writer broke")


def test_a_failed_export_writes_metrics_keeps_the_checkpoint_and_the_rerun_exports(
    tmp_path, monkeypatch
):
    ids, scores = ids_and_scores()

    def build():
        inputs = keras.Input((3,), name="ids")
        return keras.Model(inputs, keras.layers.Dense(1)(inputs))

    def fit():
        return tpukit.fit(
            build,
            ids.astype("float32"),
            scores,
            epochs=1,
            batch_size=16,
            output_dir=str(tmp_path),
            verbose=0,
        )

    monkeypatch.setattr(export, "_write_serving_module", _failing_saved_model)
    with pytest.raises(ExportFailedError) as raised:
        fit()
    message = str(raised.value)
    assert "\n" not in message
    for part in (
        "an output could not be exported (the SavedModel)",
        "The SavedModel could not be exported (RuntimeError: injected: the SavedModel writer broke)",
        f"metrics are written to {tmp_path / 'metrics.json'}",
        "trained checkpoint is kept (step 4",
        "run the same command",
    ):
        assert part in message, message
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert raised.value.metrics == written  # the numbers travel with the error
    assert written["status"] == "failed" and written["training_status"] == "done"
    assert list(written["outputs_missing"]) == ["saved_model"]
    assert written["exported"] == {"keras": str(tmp_path / "model.keras")}
    assert written["train"]["loss"] > 0
    assert not (tmp_path / "saved_model").exists()
    assert not [n for n in os.listdir(tmp_path) if rundir.TEMPORARY_MARK in n]
    monkeypatch.undo()
    again = fit()  # exported, not trained again
    assert again["status"] == "done" and again["step"] == again["resumed_from_step"] == 4
    assert sorted(again["exported"]) == ["keras", "saved_model"] and "outputs_missing" not in again
    assert again["train"] == written["train"]  # the training's numbers are kept


def test_the_command_exits_1_with_one_paragraph_and_metrics_json(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "_save_keras_file", _failing_saved_model)
    out = tmp_path / "run"
    result = train_in_process(
        "recipes/digits_cnn.yaml",
        f"--output_dir={out}",
        "--set=train.epochs=1",
        "--set=data.global_batch_size=256",
        "--set=runtime.verbose=0",
        "--mode=train",
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "tpukit: done" not in result.stdout
    error = [line for line in result.stderr.splitlines() if line.startswith("tpukit: error:")]
    assert len(error) == 1 and "model.keras could not be exported" in error[0], result.stderr[
        -2000:
    ]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["status"] == "failed" and list(metrics["outputs_missing"]) == ["keras"]
    assert "saved_model" in metrics["exported"]  # the other output was written all the same
    assert os.listdir(out / "checkpoints")


# ---------------------------------------------------------------------------------------------------------------
# The jax engine: its SavedModel is exported from model.keras by a TensorFlow-backend process.

SCRIPT = """
import json, sys
import numpy as np
import tpukit

tpukit.use_engine("jax")
sys.path.insert(0, sys.argv[2])
import test_export_outputs as t

if sys.argv[1] == "gemma":
    built = []
    x, y = t.next_tokens()
    metrics = tpukit.fit(lambda: built.append(t.gemma()) or built[-1], x, y, epochs=1, batch_size=16,
                         learning_rate=1e-2, output_dir=sys.argv[3], verbose=0, engine="jax")
    np.save(sys.argv[3] + "/expected.npy", t.greedy(built[-1]))
else:
    ids, scores = t.ids_and_scores()
    metrics = tpukit.fit(t.ranking, ids, scores, epochs=1, batch_size=16, output_dir=sys.argv[3], verbose=0,
                         engine="jax")
print("METRICS", json.dumps(metrics))
"""


def _jax_fit(tmp_path, which):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / which
    out.mkdir()
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO, os.path.join(REPO, "tests"), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, str(script), which, os.path.dirname(__file__), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(done.stdout.split("METRICS")[1]), done.stderr


@pytest.mark.integration
def test_jax_a_keras_hub_task_is_exported_as_itself_with_its_saved_model(tmp_path):
    out, metrics, _ = _jax_fit(tmp_path, "gemma")
    assert metrics["status"] == "done" and sorted(metrics["exported"]) == ["keras", "saved_model"]
    loaded = keras.saving.load_model(metrics["exported"]["keras"])
    np.testing.assert_array_equal(greedy(loaded), np.load(out / "expected.npy"))
    served = export.load_serving(metrics["exported"]["saved_model"])
    x, _ = next_tokens(4)
    inputs = {k: tf.constant(v) for k, v in x.items()}
    np.testing.assert_allclose(
        served(inputs), loaded.predict(inputs, verbose=0), rtol=1e-4, atol=1e-4
    )


@pytest.mark.integration
def test_jax_a_model_without_get_config_ends_with_its_weights_and_metrics(tmp_path):
    out, metrics, stderr = _jax_fit(tmp_path, "ranking")
    assert metrics["status"] == "done" and sorted(metrics["exported"]) == ["weights"]
    assert sorted(metrics["outputs_skipped"]) == ["keras", "saved_model"]
    assert "output keras will not be written" in stderr
    assert json.loads((out / "metrics.json").read_text())["step"] == 4
    again = ranking()
    ids, _ = ids_and_scores(4)
    again(ids)
    again.load_weights(metrics["exported"]["weights"])


def test_the_runs_export_tries_each_output_and_names_those_missing(tmp_path, monkeypatch):
    inputs = keras.Input((3,), name="x")
    model = keras.Model(inputs, keras.layers.Dense(2)(inputs))

    def full(*args, **kwargs):
        raise OSError(28, os.strerror(28), "somewhere")

    monkeypatch.setattr(export, "_save_keras_file", full)
    with pytest.raises(export.OutputsMissing) as raised:
        export.export_outputs(model, str(tmp_path))
    assert list(raised.value.missing) == ["keras"]
    assert "model.keras could not be written" in str(raised.value.missing["keras"])
    assert raised.value.exported == {
        "saved_model": str(tmp_path / "saved_model")
    }  # written all the same
    assert sorted(os.listdir(tmp_path)) == ["saved_model"]  # no temporary left
    with pytest.raises(
        export.ExportWriteError
    ):  # the public function: its first failure, as before
        export.export_model(model, str(tmp_path / "again"))
