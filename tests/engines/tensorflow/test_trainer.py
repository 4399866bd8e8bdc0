"""The trainer's robustness features: SIGTERM preemption and exact resume, NaN rollback, TensorBoard scalars,
eval mode, early stopping and best-model export. All on the CPU; the preemption test delivers a real SIGTERM to a
real training process."""

import json
import os

import faults
import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import digits_recipe, run_cli

import tpukit  # noqa: F401  (registers tpukit classes for load_model)
from tpukit.engines.keras.trainer import TrainingDivergedError
from tpukit.recipe import RecipeError, from_dict
from tpukit.runner import run


def recipe(**overrides):
    base = {
        "train.epochs": 2,
        "data.global_batch_size": 32,
        "train.warmup_steps": 5,
        "runtime.verbose": 0,
        "data.deterministic": True,
    }
    return from_dict(digits_recipe(**{**base, **overrides}), "digits_cnn.yaml")


def weights(output_dir):
    return keras.saving.load_model(os.path.join(output_dir, "model.keras")).get_weights()


# ---- preemption ------------------------------------------------------------------------------------------------

SIGTERM_ARGS = [
    "--set",
    "train.epochs=2",
    "--set",
    "data.global_batch_size=32",
    "--set",
    "data.deterministic=true",
]


@pytest.mark.slow
def test_sigterm_mid_epoch_saves_and_the_rerun_matches_an_uninterrupted_run(tmp_path):
    whole, interrupted = str(tmp_path / "whole"), str(tmp_path / "interrupted")
    assert run_cli("recipes/digits_cnn.yaml", "--output_dir", whole, *SIGTERM_ARGS).returncode == 0

    env = dict(
        os.environ, **faults.env(signals_at_step=30)
    )  # a real SIGTERM, sent at step 30 of 88
    first = run_cli("recipes/digits_cnn.yaml", "--output_dir", interrupted, *SIGTERM_ARGS, env=env)
    assert first.returncode == 143, first.stderr[-2000:]
    assert "stopped by SIGTERM at step 30" in first.stdout and "Traceback" not in first.stderr
    assert "val_accuracy" not in first.stdout  # no validation pass between the signal and the exit
    with open(os.path.join(interrupted, "metrics.json")) as f:
        assert json.load(f)["status"] == "preempted"
    assert tf.train.latest_checkpoint(os.path.join(interrupted, "checkpoints")).endswith("ckpt-30")

    second = run_cli(
        "recipes/digits_cnn.yaml", "--output_dir", interrupted, *SIGTERM_ARGS
    )  # the same command
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resuming mid-epoch at step 30: 14 steps left in epoch 1" in second.stderr
    with open(os.path.join(interrupted, "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["resumed_from_step"] == 30 and metrics["step"] == 88
    for a, b in zip(weights(whole), weights(interrupted), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


# ---- NaN rollback ----------------------------------------------------------------------------------------------


class PoisonWeights(keras.callbacks.Callback):
    """Sets the logits kernel to NaN at the end of step `at` (once, or every time it gets there)."""

    def __init__(self, at: int, once: bool = True):
        super().__init__()
        self.at, self.once, self.fired = at, once, 0

    def on_train_batch_end(self, batch, logs=None):
        step = int(self.model.optimizer.iterations.numpy())
        if step == self.at and (not self.once or not self.fired):
            kernel = self.model.get_layer("logits").kernel
            kernel.assign(np.full(kernel.shape, np.nan, dtype="float32"))
            self.fired += 1


@pytest.mark.integration
def test_a_nan_is_rolled_back_to_the_last_checkpoint_and_training_finishes(tmp_path):
    poison = PoisonWeights(at=15)
    metrics = run(
        recipe(**{"runtime.checkpoint_every_steps": 10}), str(tmp_path), callbacks=[poison]
    )
    assert poison.fired == 1
    assert metrics["nan_rollbacks"] == 1
    assert metrics["status"] == "done" and metrics["step"] == 88
    assert all(np.isfinite(w).all() for w in weights(str(tmp_path)))
    assert metrics["eval"]["accuracy"] > 0.5


def test_a_nan_that_keeps_coming_back_stops_with_a_clear_message(tmp_path):
    poison = PoisonWeights(at=15, once=False)
    with pytest.raises(TrainingDivergedError) as info:
        run(
            recipe(**{"runtime.checkpoint_every_steps": 10, "train.max_nan_retries": 2}),
            str(tmp_path),
            callbacks=[poison],
        )
    assert poison.fired == 3  # the first time and two retries
    assert (
        "the loss became non-finite at step 16 after 2 rollback(s) (train.max_nan_retries=2)"
        in str(info.value)
    )
    assert "Fix: lower train.learning_rate" in str(info.value)


# ---- outputs ---------------------------------------------------------------------------------------------------


def scalar_tags(directory):
    tags = {}
    for path in tf.io.gfile.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    return tags


@pytest.mark.integration
def test_tensorboard_has_metrics_learning_rate_and_throughput_at_optimizer_steps(tmp_path):
    run(recipe(), str(tmp_path))
    train = scalar_tags(os.path.join(tmp_path, "logs", "train"))
    for tag in (
        "epoch_loss",
        "epoch_accuracy",
        "learning_rate",
        "examples_per_second",
        "steps_per_second",
    ):
        assert tag in train, sorted(train)
    assert sorted(train["learning_rate"]) == [44, 88]
    assert sorted(train["epoch_loss"]) == [
        44,
        88,
    ]  # Keras' scalars at the same optimizer steps as tpukit's
    assert sorted(scalar_tags(os.path.join(tmp_path, "logs", "validation"))["epoch_loss"]) == [
        44,
        88,
    ]


@pytest.mark.integration
def test_eval_mode_evaluates_the_saved_checkpoint_exactly(tmp_path):
    trained = run(recipe(), str(tmp_path))
    evaluated = run(recipe(), str(tmp_path), mode="eval")
    assert evaluated["step"] == 88 and evaluated["status"] == "done"
    assert evaluated["eval"] == pytest.approx(trained["eval"], abs=1e-6)
    assert os.path.isfile(os.path.join(tmp_path, "eval_metrics.json"))


@pytest.mark.integration
def test_early_stopping_and_best_model_export(tmp_path):
    # A zero learning rate never improves val_loss, so patience 0 stops after the second epoch of five.
    metrics = run(
        recipe(
            **{
                "train.epochs": 5,
                "train.learning_rate": 0.0,
                "train.warmup_steps": 0,
                "train.early_stopping_patience": 0,
                "train.export_best_by": "val_accuracy",
            }
        ),
        str(tmp_path),
    )
    assert metrics["status"] == "early_stopped"
    assert metrics["step"] == 2 * 44
    assert os.path.isfile(os.path.join(tmp_path, "best.keras"))


@pytest.mark.integration
def test_profile_steps_records_a_profiler_trace(tmp_path):
    run(recipe(**{"train.epochs": 1, "runtime.profile_steps": [3, 5]}), str(tmp_path))
    traces = tf.io.gfile.glob(
        os.path.join(tmp_path, "logs", "train", "plugins", "profile", "*", "*.xplane.pb")
    )
    assert len(traces) == 1


def test_resuming_mid_epoch_with_a_steps_per_execution_that_does_not_fit_is_refused(tmp_path):
    with faults.signals_at_step(5):
        assert run(recipe(), str(tmp_path))["status"] == "preempted"
    with pytest.raises(RecipeError) as info:
        run(recipe(**{"runtime.steps_per_execution": 2}), str(tmp_path))
    assert "does not divide the 39 steps left in the epoch this run resumes at (step 5)" in str(
        info.value
    )
    assert "one of 1." in str(info.value)


# ---- checkpoint cadence ----------------------------------------------------------------------------------------


def _checkpoint_steps(output_dir):
    return sorted(
        int(name.split("-")[1].split(".")[0])
        for name in os.listdir(os.path.join(output_dir, "checkpoints"))
        if name.startswith("ckpt-") and name.endswith(".index")
    )


@pytest.mark.slow
def test_epoch_end_saves_are_skipped_while_they_would_cost_more_than_the_overhead_bound(tmp_path):
    # 4 epochs of 44 steps. A bound of 1e-6 allows a save only 10^6 save-durations (~50 ms each, estimated from the
    # checkpoint's size before the first) after the last save: a new run saves its initial weights (step 0, so a NaN
    # rollback has a checkpoint), every epoch end is skipped, and the last step always saves.
    bounded = run(
        recipe(**{"train.epochs": 4, "runtime.checkpoint_max_overhead": 1e-6}),
        str(tmp_path / "bounded"),
    )
    assert bounded["step"] == 176 and _checkpoint_steps(tmp_path / "bounded") == [0, 176]
    every = run(
        recipe(
            **{
                "train.epochs": 4,
                "runtime.checkpoint_max_overhead": None,
                "runtime.max_checkpoints_to_keep": 6,
            }
        ),
        str(tmp_path / "every"),
    )
    assert every["step"] == 176 and _checkpoint_steps(tmp_path / "every") == [0, 44, 88, 132, 176]
    # Skipping saves changes nothing else: same weights, and a rerun resumes from the last step.
    for a, b in zip(weights(tmp_path / "bounded"), weights(tmp_path / "every"), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    again = run(recipe(**{"train.epochs": 4}), str(tmp_path / "bounded"))
    assert again["resumed_from_step"] == 176 and again["step"] == 176


@pytest.mark.integration
def test_a_run_that_stops_early_saves_its_stop_although_the_bound_would_skip_that_epoch(tmp_path):
    # patience 0 after a tiny learning rate: early stopping ends the run at an epoch end the bound would skip.
    settings = {
        "train.epochs": 6,
        "train.learning_rate": 1e-9,
        "train.warmup_steps": 0,
        "train.early_stopping_patience": 1,
        "train.early_stopping_metric": "val_accuracy",
        "runtime.checkpoint_max_overhead": 1e-6,
    }
    metrics = run(recipe(**settings), str(tmp_path))
    assert metrics["status"] == "early_stopped"
    assert _checkpoint_steps(tmp_path) == [0, metrics["step"]] and 44 < metrics["step"] < 6 * 44
    again = run(recipe(**settings), str(tmp_path))  # the same command again
    assert again["status"] == "early_stopped" and again["step"] == metrics["step"]


def test_checkpoint_max_overhead_is_checked_in_the_recipe():
    with pytest.raises(RecipeError, match=r"runtime.checkpoint_max_overhead.*received 0"):
        recipe(**{"runtime.checkpoint_max_overhead": 0})
    with pytest.raises(RecipeError, match=r"runtime.checkpoint_max_overhead.*received 2"):
        recipe(**{"runtime.checkpoint_max_overhead": 2})


def test_a_save_is_due_once_the_time_since_the_last_outweighs_its_cost(tmp_path, monkeypatch):
    from tpukit.engines.tensorflow import checkpoint as checkpoint_lib

    model = keras.Sequential(
        [keras.Input((1000,)), keras.layers.Dense(1000)]
    )  # 1,001,000 float32 weights
    model.compile(optimizer="adam", loss="mse")
    checkpointer = checkpoint_lib.Checkpointer(str(tmp_path), model, model.optimizer)
    # Before any save: 50 ms + the bytes at 200 MB/s: the weights' 4,004,000 and the optimizer's step (int64) and
    # learning rate (float32); Adam's slots are built lazily, at the first step or restore.
    assert checkpointer.save_seconds == pytest.approx(0.05 + (4_004_000 + 8 + 4) / 200e6, rel=1e-9)
    assert checkpointer.save_is_due(
        0.02
    )  # no checkpoint yet: a NaN rollback would have nothing to go back to
    checkpointer.save()
    assert checkpointer.last_saved_step == 0 and checkpointer.save_seconds > 0
    clock = [checkpointer.saved_at]
    monkeypatch.setattr(checkpoint_lib.time, "perf_counter", lambda: clock[0])
    assert checkpointer.save_is_due(None)
    assert not checkpointer.save_is_due(0.02)
    clock[0] += checkpointer.save_seconds / 0.02 * 1.001  # just over 50 save-durations later
    assert checkpointer.save_is_due(0.02) and not checkpointer.save_is_due(0.01)


@pytest.mark.parametrize(
    "at", [100, pytest.param(132, marks=pytest.mark.slow)]
)  # in the third epoch; at the very last step
@pytest.mark.integration
def test_a_nan_late_in_a_short_run_rolls_back_with_the_default_checkpoint_cadence(tmp_path, at):
    # 3 epochs of 44 steps take ~1 s: the default bound skips the epoch-end saves, but a new run saves its initial
    # weights, so a rollback has a checkpoint to go back to (before, the run failed: "nothing to roll back to").
    poison = PoisonWeights(at=at)
    metrics = run(recipe(**{"train.epochs": 3}), str(tmp_path), callbacks=[poison])
    assert poison.fired == 1 and metrics["nan_rollbacks"] == 1
    assert metrics["status"] == "done" and metrics["step"] == 132
    assert all(np.isfinite(w).all() for w in weights(str(tmp_path)))
    assert metrics["nan_skipped_examples"] > 0


@pytest.mark.integration
def test_checkpoint_every_steps_keeps_its_cadence_across_a_resume_at_a_step_never_saved(tmp_path):
    # SIGTERM at step 30 saves ckpt-30; the rerun's partial epoch ends at 44 without a save (tight bound), and the
    # next fit segment must count from 30 (the last checkpoint), not from 44: saves at 0, 30, 70, 110, 132.
    settings = {
        "train.epochs": 3,
        "runtime.checkpoint_every_steps": 40,
        "runtime.checkpoint_max_overhead": 1e-6,
        "runtime.max_checkpoints_to_keep": 20,
    }
    with faults.signals_at_step(30):
        assert run(recipe(**settings), str(tmp_path))["status"] == "preempted"
    assert run(recipe(**settings), str(tmp_path))["step"] == 132
    assert _checkpoint_steps(tmp_path) == [0, 30, 70, 110, 132]


@pytest.mark.integration
def test_weighted_loss_is_still_logged_without_label_smoothing(tmp_path):
    # Without smoothing no WeightedLoss metric is compiled; the exact cross-entropy is logged under both names, so
    # readers of metrics.json, TensorBoard and the history find `weighted_loss` as before.
    metrics = run(recipe(**{"train.label_smoothing": 0.0}), str(tmp_path))
    train, validation, evaluation = metrics["train"], metrics["validation"], metrics["eval"]
    assert train["weighted_loss"] == train["cross_entropy"]
    assert (
        validation["val_weighted_loss"] == validation["val_cross_entropy"] == validation["val_loss"]
    )
    assert evaluation["weighted_loss"] == evaluation["cross_entropy"] == evaluation["loss"]


def test_mixed_float16_counts_steps_through_the_loss_scale_optimizer(tmp_path):
    # The LossScaleOptimizer's own step counter never moves (its wrapped optimizer counts): counting with it, the
    # trainer re-ran fit forever. An alarm turns such a hang into a failure.
    import signal

    import keras
    import numpy as np

    def hang(signum, frame):
        raise TimeoutError("the run did not finish: steps are not being counted")

    x = np.random.RandomState(0).randn(64, 4).astype("float32")
    y = (x.sum(1) > 0).astype("int32")
    previous = signal.signal(signal.SIGALRM, hang)
    signal.alarm(120)
    try:
        metrics = tpukit.fit(
            lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]),
            x,
            y,
            epochs=2,
            batch_size=16,
            output_dir=str(tmp_path / "f16"),
            precision="mixed_float16",
            verbose=0,
        )
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert metrics["step"] == 8 and metrics["precision"] == "mixed_float16"


def test_scalars_written_off_the_step_loop_are_what_tensorboard_reads(tmp_path):
    # The writer thread builds the protocol buffers tf.summary.scalar writes (no TensorFlow op runs): TensorBoard's
    # own loader finds them as scalar tensors, by split, at their steps; and a flush leaves nothing queued.
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    from tpukit.engines.keras.callbacks import _SummaryThread

    thread = _SummaryThread(str(tmp_path))
    for step in (44, 88):
        thread.write("train", "epoch_loss", 1.0 / step, step)
        thread.write("validation", "epoch_loss", 2.0 / step, step)
        thread.flush()
    thread.close()
    assert not thread._thread.is_alive()
    for split, scale in (("train", 1.0), ("validation", 2.0)):
        loaded = event_accumulator.EventAccumulator(
            str(tmp_path / split), size_guidance={event_accumulator.TENSORS: 0}
        )
        loaded.Reload()
        events = loaded.Tensors("epoch_loss")
        assert [e.step for e in events] == [44, 88]
        assert [float(tensor_util.make_ndarray(e.tensor_proto)) for e in events] == pytest.approx(
            [scale / 44, scale / 88]
        )
        assert loaded.SummaryMetadata("epoch_loss").plugin_data.plugin_name == "scalars"
