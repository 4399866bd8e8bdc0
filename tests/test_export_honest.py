"""Outputs never lie, the review's cases (issue 40, item 4): a registered layer whose `get_config` omits a required
`__init__` argument is found before training (weights exported instead, on both engines); a failed export says that
the file at the output's path is an earlier export's; the messages name the real path and the files, and say the
checkpoint sentence once; and the branches of the failure paths each show the user what happened."""

import json
import logging
import os
import subprocess
import sys
import textwrap
import types

import keras
import numpy as np
import pytest
from helpers import REPO

import tpukit
from tpukit import runner
from tpukit.engines.keras import export
from tpukit.engines.keras import session as session_lib
from tpukit.runner import ExportFailedError


@keras.saving.register_keras_serializable("tpukit_test_honest")
class Forgetful(keras.layers.Layer):
    """Saves, but does not load: its config forgets `factor`."""

    def __init__(self, factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return super().get_config()


class Unjsonable(keras.layers.Layer):
    """A config that does not serialize: an object JSON cannot hold."""

    def call(self, x):
        return x

    def get_config(self):
        return {**super().get_config(), "thing": object()}


def forgetful_model():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3)(Forgetful(2.0)(inputs)))


def plain_model():
    inputs = keras.Input((4,), name="x")
    return keras.Model(inputs, keras.layers.Dense(3)(inputs))


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, 64)


def fit(build, out, epochs=1, **kwargs):
    x, y = data()
    return tpukit.fit(
        build, x, y, epochs=epochs, batch_size=16, output_dir=str(out), verbose=0, **kwargs
    )


def test_a_config_that_does_not_rebuild_is_found_naming_the_missing_argument():
    why = export.unserializable(forgetful_model())
    assert "could not rebuild it from its config" in why
    assert "missing 1 required positional argument: 'factor'" in why
    skipped = export.skipped_outputs(forgetful_model())
    assert list(skipped) == ["keras"] and "model.weights.h5 instead" in skipped["keras"]
    assert export.unserializable(plain_model()) is None


def test_a_class_known_only_to_this_process_still_rebuilds():
    class Local(
        keras.layers.Layer
    ):  # unregistered, not importable: found among the model's own classes
        def call(self, x):
            return x + 1

    inputs = keras.Input((4,))
    assert export.unserializable(keras.Model(inputs, Local()(inputs))) is None


def test_a_config_that_does_not_serialize_is_named():
    inputs = keras.Input((4,))
    why = export.unserializable(keras.Model(inputs, Unjsonable()(inputs)))
    assert "its config does not serialize (TypeError" in why and "plain values" in why


def test_tensorflow_a_config_that_does_not_rebuild_exports_weights_not_a_broken_file(
    tmp_path,
):
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("tpukit").addHandler(handler)
    try:
        metrics = fit(forgetful_model, tmp_path, export_best_by="val_loss", validation_data=data())
    finally:
        logging.getLogger("tpukit").removeHandler(handler)
    warning = next(r.getMessage() for r in records if "output keras" in r.getMessage())
    assert (
        "'factor'" in warning and "no best.keras either (train.export_best_by=val_loss)" in warning
    )
    assert metrics["status"] == "done"
    assert sorted(metrics["exported"]) == ["saved_model", "weights"]
    assert "'factor'" in metrics["outputs_skipped"]["keras"]
    assert not (tmp_path / "model.keras").exists() and not (tmp_path / "best.keras").exists()
    again = forgetful_model()
    again.load_weights(metrics["exported"]["weights"])


def _failing(*args, **kwargs):
    raise RuntimeError("injected: the writer broke")


def test_a_failed_export_says_the_file_there_is_an_earlier_exports(tmp_path, monkeypatch):
    first = fit(plain_model, tmp_path)
    assert first["status"] == "done"
    before = (tmp_path / "model.keras").read_bytes()
    monkeypatch.setattr(export, "_save_keras_file", _failing)
    monkeypatch.setattr(export, "_write_serving_module", _failing)
    with pytest.raises(ExportFailedError) as raised:
        fit(plain_model, tmp_path, epochs=2)  # one more epoch: a later step, whose export fails
    message = str(raised.value)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["step"] == 8 and written["status"] == "failed"
    assert (
        "the model.keras there is an earlier export's, not this run's"
        in written["outputs_missing"]["keras"]
    )
    assert (
        "the saved_model/ there is an earlier export's" in written["outputs_missing"]["saved_model"]
    )
    # Both missing: named by file, the checkpoint sentence said once.
    assert "2 outputs could not be exported (model.keras, the SavedModel)" in message
    assert message.count("The trained checkpoint is kept") == 1 and "(step 8 in " in message
    assert "the model.keras there is an earlier export's" in message
    assert (tmp_path / "model.keras").read_bytes() == before  # the earlier file intact


def test_a_failed_rename_names_model_keras_not_the_temporary(tmp_path):
    (tmp_path / "model.keras" / "in_the_way").mkdir(parents=True)
    with pytest.raises(export.OutputsMissing) as raised:
        export.export_outputs(plain_model(), str(tmp_path))
    text = str(raised.value.missing["keras"])
    assert f"could not be put in place at {tmp_path / 'model.keras'}" in text
    assert rundir_mark() not in text
    assert not [n for n in os.listdir(tmp_path) if rundir_mark() in n]


def rundir_mark():
    from tpukit import rundir

    return rundir.TEMPORARY_MARK


def test_metrics_that_cannot_be_written_are_said_in_the_error(monkeypatch, tmp_path):
    def refused(*args, **kwargs):
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(runner, "write_metrics", refused)
    plan = types.SimpleNamespace(output_dir=str(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"))
    metrics = {
        "step": 4,
        "outputs_missing": {"keras": "model.keras could not be exported (x). Fix: y"},
    }
    error = runner._failed_export(plan, metrics, files=None)
    assert isinstance(error, ExportFailedError) and error.metrics is metrics
    assert "metrics.json could not be written either" in str(error)
    assert "metrics are written" not in str(error)
    assert f"kept (step 4 in {tmp_path / 'ckpt'})" in str(error)


def _jax_session(tmp_path, processes=1):
    plan = types.SimpleNamespace(
        training=True,
        chief=True,
        output_dir=str(tmp_path),
        checkpoint_dir=str(tmp_path / "checkpoints"),
        strategy=types.SimpleNamespace(processes=processes),
    )
    return types.SimpleNamespace(
        plan=plan, model=plain_model(), outputs_skipped={}, outputs_missing={}, saved_model=None
    )


def test_jax_a_host_copy_failure_names_the_output(tmp_path, monkeypatch):
    from tpukit.engines.jax import engine

    def lost(model):
        raise RuntimeError("injected: a shard could not be gathered")

    monkeypatch.setattr(engine, "_host_copy", lost)
    session = _jax_session(tmp_path, processes=2)
    exported = session_lib.exporting(
        session, lambda: engine._export(session, types.SimpleNamespace(status="done"))
    )
    assert exported == {}
    assert list(session.outputs_missing) == ["keras"]
    assert session.outputs_missing["keras"].startswith(
        "model.keras could not be exported (RuntimeError: injected: a shard could not be gathered)"
    )


def test_jax_a_model_keras_that_does_not_load_is_what_is_missing(tmp_path, monkeypatch):
    from tpukit.engines.jax import engine

    class Loads:  # the exporting process, which could not load the file
        def run(self, keras_path, output_dir):
            return f"{export.LOAD_MARK}TypeError: Forgetful.__init__() missing 1 required positional argument"

    session = _jax_session(tmp_path)
    session.saved_model = Loads()
    (tmp_path / "saved_model").mkdir()  # an earlier export's
    keras_path = str(tmp_path / "model.keras")
    exported = session_lib.exporting(
        session, lambda: engine._export_saved_model(session, keras_path, {"keras": keras_path})
    )
    assert exported == {}  # the broken file is not listed as exported
    keras_reason = session.outputs_missing["keras"]
    assert f"the model.keras written at {keras_path} does not load" in keras_reason
    assert "earlier export" not in keras_reason  # it is this run's
    assert "which does not load" in session.outputs_missing["saved_model"]
    assert "the saved_model/ there is an earlier export's" in session.outputs_missing["saved_model"]


def test_the_exporting_command_names_a_file_that_does_not_load(tmp_path, capsys):
    path = str(tmp_path / "model.keras")
    forgetful_model().save(path)  # saves: its config is only wrong on loading
    assert export.main([path, str(tmp_path)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(export.LOAD_MARK) and "'factor'" in last
    assert not (tmp_path / "saved_model").exists()


SCRIPT = """
import json, sys
import numpy as np
import tpukit

tpukit.use_engine("jax")
sys.path.insert(0, sys.argv[1])
import test_export_honest as t

print("METRICS", json.dumps(t.fit(t.forgetful_model, sys.argv[2], engine="jax")))
"""


@pytest.mark.integration
def test_jax_a_config_that_does_not_rebuild_exports_weights_not_a_broken_file(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "run"
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO, os.path.join(REPO, "tests"), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(
        [sys.executable, str(script), os.path.dirname(__file__), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads(done.stdout.split("METRICS")[1])
    assert metrics["status"] == "done" and sorted(metrics["exported"]) == ["weights"]
    assert "'factor'" in metrics["outputs_skipped"]["keras"]
    assert "the one model.keras names" in metrics["outputs_skipped"]["saved_model"]
    assert not (out / "model.keras").exists()


def test_the_exporting_command_lets_a_missing_class_name_itself(tmp_path):
    class Elsewhere(keras.layers.Layer):  # unregistered: the exporting process cannot find it
        def call(self, x):
            return x

    inputs = keras.Input((4,))
    path = str(tmp_path / "model.keras")
    keras.Model(inputs, Elsewhere()(inputs)).save(path)
    with pytest.raises(TypeError, match="Could not locate class"):
        export.main(
            [path, str(tmp_path)]
        )  # not LOAD_MARK: the file is sound, the run names the SavedModel
