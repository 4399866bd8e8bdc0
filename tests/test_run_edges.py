"""The edges of a run (issue 19), in-process on digits: one run per output directory, outputs that survive damage,
a changed recipe refused on resume, Ctrl-C that saves. The multi-process versions are in test_run_edges_processes.py.
"""

import json
import logging
import os
import signal

import faults
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import digits_recipe, train_in_process

from tpukit import rundir
from tpukit.recipe import RecipeError, from_dict
from tpukit.runner import RunLockedError, TrainingInterrupted, run


def recipe(**overrides):
    base = {
        "train.epochs": 1,
        "train.steps_per_epoch": 12,
        "data.global_batch_size": 32,
        "runtime.verbose": 0,
        "runtime.checkpoint_max_overhead": None,
    }
    return from_dict(digits_recipe(**{**base, **overrides}), "digits_cnn.yaml")


def _checkpoints(directory):
    return sorted(os.listdir(os.path.join(directory, "checkpoints")))


def _stopped_at(tmp_path, step=5, signals="SIGTERM", **overrides):
    with faults.signals_at_step(step, signals):
        return run(recipe(**overrides), str(tmp_path))


@pytest.mark.integration
def test_a_directory_in_use_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    with rundir.RunLock(str(out)):
        with pytest.raises(RunLockedError, match=f"pid {os.getpid()}"):
            run(recipe(), str(out))
        assert sorted(os.listdir(out)) == [rundir.LOCK_NAME]  # no recipe.yaml, no checkpoints
    metrics = run(recipe(), str(out))  # the same call goes through once the other run is gone
    assert metrics["status"] == "done" and not os.path.exists(out / rundir.LOCK_NAME)
    (history,) = rundir.history(rundir.LocalFiles(), str(out))
    assert history["pid"] == os.getpid() and history["resumed_from_step"] == 0


@pytest.mark.parametrize("damage", ["", '{"status": "do', "not json at all"])
@pytest.mark.integration
def test_a_damaged_metrics_json_does_not_stop_the_rerun_of_a_finished_run(tmp_path, caplog, damage):
    run(recipe(), str(tmp_path))
    (tmp_path / "metrics.json").write_text(damage)
    with caplog.at_level(logging.WARNING, "tpukit"):
        again = run(recipe(), str(tmp_path))
    assert again["status"] == "done" and again["step"] == 12
    assert (
        str(tmp_path / "metrics.json") in caplog.text
        and "damaged" in caplog.text
        or "empty" in caplog.text
    )
    assert json.loads((tmp_path / "metrics.json").read_text())["step"] == 12  # whole again


@pytest.mark.integration
def test_a_damaged_recipe_yaml_is_survived_with_a_warning(tmp_path, caplog):
    _stopped_at(tmp_path)
    (tmp_path / "recipe.yaml").write_text("model: [unclosed")
    with caplog.at_level(logging.WARNING, "tpukit"):
        metrics = run(recipe(), str(tmp_path))
    assert metrics["status"] == "done" and metrics["resumed_from_step"] == 5
    assert str(tmp_path / "recipe.yaml") in caplog.text
    assert "train:" in (tmp_path / "recipe.yaml").read_text()  # rewritten whole


@pytest.mark.integration
def test_a_changed_recipe_is_refused_on_resume_and_accepted_by_name(tmp_path):
    assert _stopped_at(tmp_path)["status"] == "preempted"
    before = (_checkpoints(tmp_path), (tmp_path / "recipe.yaml").read_text())
    changed = recipe(**{"train.learning_rate": 0.01, "data.global_batch_size": 64, "train.seed": 3})
    with pytest.raises(RecipeError) as refused:
        run(changed, str(tmp_path))
    message = str(refused.value)
    assert "trained to step 5 with another recipe" in message
    assert (
        "data.global_batch_size: 32 -> 64" in message
        and "train.learning_rate: 0.002 -> 0.01" in message
    )
    assert "train.seed: 0 -> 3" in message
    assert "--accept_changes=data.global_batch_size,train.learning_rate,train.seed" in message
    assert (
        _checkpoints(tmp_path),
        (tmp_path / "recipe.yaml").read_text(),
    ) == before  # nothing touched
    with pytest.raises(RecipeError, match=r"--accept_changes=train\.seed"):
        run(
            changed, str(tmp_path), accept_changes=["train.learning_rate", "data.global_batch_size"]
        )

    accepted = ["train.learning_rate", "data.global_batch_size", "train.seed"]
    metrics = run(changed, str(tmp_path), accept_changes=accepted)
    assert metrics["status"] == "done" and metrics["resumed_from_step"] == 5
    first, second = rundir.history(rundir.LocalFiles(), str(tmp_path))
    assert first["accepted_changes"] == {}
    assert second["accepted_changes"] == {
        "data.global_batch_size": [32, 64],
        "train.learning_rate": [0.002, 0.01],
        "train.seed": [0, 3],
    }
    assert "learning_rate: 0.01" in (tmp_path / "recipe.yaml").read_text()
    run(
        changed, str(tmp_path)
    )  # the accepted recipe is the run's recipe now: no change left to refuse


@pytest.mark.integration
def test_runtime_changes_resume_without_a_question(tmp_path):
    _stopped_at(tmp_path)
    metrics = run(
        recipe(**{"runtime.checkpoint_every_steps": 3, "runtime.verbose": 2}), str(tmp_path)
    )
    assert metrics["status"] == "done" and metrics["resumed_from_step"] == 5


@pytest.mark.integration
def test_the_cli_refuses_a_changed_recipe_with_exit_2_and_the_flag(tmp_path):
    _stopped_at(tmp_path)
    args = [
        "recipes/digits_cnn.yaml",
        f"--output_dir={tmp_path}",
        "--set=train.epochs=1",
        "--set=train.steps_per_epoch=12",
        "--set=data.global_batch_size=32",
        "--set=runtime.verbose=0",
        "--set=train.learning_rate=0.0005",
    ]
    result = train_in_process(*args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "(train.learning_rate: 0.002 -> 0.0005; the run's recipe is" in result.stderr
    assert "--accept_changes=train.learning_rate " in result.stderr
    accepted = train_in_process(*args, "--accept_changes=train.learning_rate")
    assert accepted.returncode == 0, accepted.stderr


class _CtrlC(keras.callbacks.Callback):
    """Presses Ctrl-C (a real SIGINT to this process) after batch `at`."""

    def __init__(self, at):
        super().__init__()
        self.at = at

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.at:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.integration
def test_ctrl_c_finishes_the_step_saves_and_a_rerun_resumes(tmp_path):
    with pytest.raises(TrainingInterrupted) as stopped:
        run(recipe(), str(tmp_path), callbacks=[_CtrlC(at=3)])
    assert isinstance(
        stopped.value, KeyboardInterrupt
    )  # scripts and notebooks stop, as on any Ctrl-C
    step = stopped.value.metrics["step"]
    assert step == 4  # the step in flight finished, then it stopped
    assert f"ckpt-{step}.index" in _checkpoints(tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text())["status"] == "interrupted"
    shown = stopped.value._render_traceback_()  # what IPython prints instead of a traceback
    assert (
        len(shown) == 1 and f"stopped by Ctrl-C at step {step}" in shown[0] and "again" in shown[0]
    )
    assert (
        signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )  # Python's own handler is back
    metrics = run(recipe(), str(tmp_path))
    assert (
        metrics["status"] == "done"
        and metrics["resumed_from_step"] == step
        and metrics["step"] == 12
    )


@pytest.mark.integration
def test_a_second_ctrl_c_stops_at_once_without_saving(tmp_path):
    with pytest.raises(KeyboardInterrupt) as stopped:
        _stopped_at(tmp_path, step=5, signals="SIGINT,SIGINT")
    assert not isinstance(stopped.value, TrainingInterrupted)
    assert _checkpoints(tmp_path)[-1] != "ckpt-5.index"  # nothing saved at the stop
    assert not os.path.exists(tmp_path / rundir.LOCK_NAME)  # the lock went with the run
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert run(recipe(), str(tmp_path))["status"] == "done"


@pytest.mark.integration
def test_the_cli_exits_130_on_ctrl_c_with_one_line(tmp_path):
    args = [
        "digits_cnn",
        f"--output_dir={tmp_path}",
        "--set=train.steps_per_epoch=12",
        "--set=train.epochs=1",
    ]
    with faults.signals_at_step(5, "SIGINT"):
        result = train_in_process(*args, "--set=runtime.verbose=0")
    assert result.returncode == 130 and "Traceback" not in result.stderr
    assert "tpukit: stopped by Ctrl-C at step 5" in result.stderr
    with faults.signals_at_step(8, "SIGINT,SIGINT"):
        result = train_in_process(*args, "--set=runtime.verbose=0")
    assert result.returncode == 130 and "Traceback" not in result.stderr
    assert "stopped at once by Ctrl-C" in result.stderr


@pytest.mark.integration
def test_a_changed_resolved_precision_is_refused_and_accepted_by_name(tmp_path):
    _stopped_at(tmp_path, **{"runtime.precision": "float32"})
    with pytest.raises(RecipeError) as refused:
        run(recipe(**{"runtime.precision": "mixed_bfloat16"}), str(tmp_path))
    assert "runtime.precision: 'float32' -> 'mixed_bfloat16'" in str(refused.value)
    metrics = run(
        recipe(**{"runtime.precision": "mixed_bfloat16"}),
        str(tmp_path),
        accept_changes=["runtime.precision"],
    )
    assert metrics["status"] == "done" and metrics["precision"] == "mixed_bfloat16"


@pytest.mark.integration
def test_an_unfinished_checkpoint_save_is_cleared_by_the_next_run(tmp_path):
    _stopped_at(tmp_path)
    leftover = (
        tmp_path / "checkpoints" / "ckpt-6_temp"
    )  # a save killed half-way (SIGKILL, a second Ctrl-C)
    leftover.mkdir()
    (leftover / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 100)
    assert run(recipe(), str(tmp_path))["status"] == "done"
    assert not leftover.exists()


def test_exports_are_written_whole_and_a_failed_export_keeps_the_previous_one(
    tmp_path, monkeypatch
):
    from tpukit.engines.keras import export

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    export.export_model(model, str(tmp_path))
    before = (tmp_path / "model.keras").read_bytes()
    saved_model_files = sorted(os.listdir(tmp_path / "saved_model"))

    def torn_save(path, *args, **kwargs):  # a full disk half-way through the zip
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 torn")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(model, "save", torn_save)
    with pytest.raises(OSError, match="No space"):
        export.export_model(model, str(tmp_path))
    assert (tmp_path / "model.keras").read_bytes() == before
    monkeypatch.undo()

    def torn_save_model(
        obj, path, *args, **kwargs
    ):  # both export paths write with tf.saved_model.save
        os.makedirs(path)
        (open(os.path.join(path, "saved_model.pb"), "wb")).close()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", torn_save_model)
    with pytest.raises(OSError, match="No space"):
        export.export_model(model, str(tmp_path))
    assert sorted(os.listdir(tmp_path / "saved_model")) == saved_model_files  # the previous export
    assert sorted(os.listdir(tmp_path)) == ["model.keras", "saved_model"]  # no temporaries left
    monkeypatch.undo()
    export.export_model(model, str(tmp_path))
    serve = export.load_serving(str(tmp_path / "saved_model"))
    assert serve(np.zeros((1, 3), "float32")).shape == (1, 2)


@pytest.mark.integration
def test_best_keras_is_written_under_a_temporary_name_then_renamed(tmp_path, monkeypatch):
    saved = []
    original = keras.Model.save

    def spy(self, path, *args, **kwargs):
        saved.append(os.path.basename(str(path)))
        return original(self, path, *args, **kwargs)

    monkeypatch.setattr(keras.Model, "save", spy)
    run(recipe(**{"train.export_best_by": "val_loss", "train.epochs": 2}), str(tmp_path))
    best = [name for name in saved if name.startswith("best")]
    assert best and all(rundir.TEMPORARY_MARK in n and n.endswith(".keras") for n in best)
    assert keras.saving.load_model(tmp_path / "best.keras").count_params() > 0
    assert not [n for n in os.listdir(tmp_path) if rundir.TEMPORARY_MARK in n]


def test_an_ignored_ctrl_c_stays_ignored_during_training(tmp_path):
    previous = signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # as for a job started with `&` or nohup
    try:
        metrics = run(recipe(), str(tmp_path), callbacks=[_CtrlC(at=3)])
        assert metrics["status"] == "done" and metrics["step"] == 12
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_run_whose_lease_was_taken_over_stops_without_writing_more(tmp_path):
    class TakenOver(
        keras.callbacks.Callback
    ):  # what the lease's heartbeat thread records when it finds another
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                rundir._LOST.append(
                    (str(tmp_path), rundir.Holder(**{**rundir.Holder.me().__dict__, "pid": 7}))
                )

    try:
        with pytest.raises(rundir.LeaseLostError, match="without writing anything more there"):
            run(recipe(), str(tmp_path), callbacks=[TakenOver()])
    finally:
        rundir._LOST.clear()
    assert _checkpoints(tmp_path) == ["checkpoint", "ckpt-0.data-00000-of-00001", "ckpt-0.index"]
    assert not (tmp_path / "metrics.json").exists() and not (tmp_path / "model.keras").exists()
