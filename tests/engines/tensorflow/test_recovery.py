"""Issue 8: counts that are exact at any steps_per_execution, recoveries that move forward, resume after any crash.

Each test here failed on the trainer before issue 8: eval counted the start of the next pass at steps_per_execution
> 1, a resume replayed epoch 0's order, a NaN rollback retried the same batch, early stopping restarted at every fit
segment, non-finite weights were checkpointed, and a damaged newest checkpoint ended the rerun in a traceback.
"""

import glob
import json
import logging
import os

import faults
import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored
from helpers import digits_recipe, run_cli

import tpukit  # noqa: F401  (registers tpukit classes for load_model)
from tpukit import data
from tpukit.engines.keras import trainer
from tpukit.engines.tensorflow import checkpoint as checkpoint_lib
from tpukit.recipe import RecipeError, from_dict
from tpukit.runner import run


def recipe(**overrides):
    base = {
        "train.epochs": 1,
        "data.global_batch_size": 32,
        "train.warmup_steps": 5,
        "runtime.verbose": 0,
        "data.deterministic": True,
    }
    return from_dict(digits_recipe(**{**base, **overrides}), "digits_cnn.yaml")


def exported_counts(output_dir):
    """Accuracy and mean cross-entropy over the 360 test digits, example by example, from the exported model."""
    from tpukit.data.sources import _digits_split

    x, y = _digits_split("test", 0.2)
    logits = (
        keras.saving.load_model(os.path.join(output_dir, "model.keras"))
        .predict(x, verbose=0)
        .astype(np.float64)
    )
    shifted = logits - logits.max(1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    return int((logits.argmax(1) == y).sum()), float(-log_probs[np.arange(len(y)), y].mean())


# ---- exact eval at steps_per_execution > 1 ----------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.integration
def test_eval_is_exact_when_eval_steps_do_not_divide_by_steps_per_execution(tmp_path, replicas):
    # 360 test images / 32 = 12 eval steps; steps_per_execution 11 (a divisor of the 44-step epoch) does not
    # divide 12: the second execution of each eval pass must end where the finite pass ends (1 batch in).
    strategy = mirrored(2) if replicas == 2 else None
    metrics = run(recipe(**{"runtime.steps_per_execution": 11}), str(tmp_path), strategy=strategy)
    assert metrics["steps_per_execution"] == 11 and metrics["eval_examples"] == 360
    correct, cross_entropy = exported_counts(str(tmp_path))
    assert metrics["eval"]["accuracy"] * 360 == pytest.approx(correct, abs=1e-3)
    assert metrics["eval"]["cross_entropy"] == pytest.approx(cross_entropy, abs=1e-4)
    assert metrics["validation"]["val_accuracy"] == pytest.approx(
        metrics["eval"]["accuracy"], abs=1e-6
    )


def test_padded_eval_steps_are_whole_executions_and_the_padding_weighs_nothing():
    assert data.padded_eval_steps(360, 32, 1, 11) == 22
    assert data.padded_eval_steps(360, 32, 1, 1) == 12
    ids = np.arange(10, dtype=np.int32)
    batches = data.eval_batches(
        tf.data.Dataset.from_tensor_slices((ids[:, None].astype("float32"), ids)), 10, 4, steps=5
    )
    weights = [w.numpy() for _, _, w in batches]
    assert len(weights) == 5 and sum(w.sum() for w in weights) == 10
    with pytest.raises(ValueError, match="steps=2 is fewer than the 3 eval steps"):
        data.eval_batches(
            tf.data.Dataset.from_tensor_slices((ids[:, None].astype("float32"), ids)),
            10,
            4,
            steps=2,
        )


# ---- resume order -------------------------------------------------------------------------------------------------


def _labels(dataset, batches):
    return [b[1].numpy().tolist() for b in dataset.take(batches)]


def _examples(n, counter=None):
    ids = np.arange(n, dtype=np.int64)
    examples = tf.data.Dataset.from_tensor_slices((ids[:, None].astype("float32"), ids))
    if counter is not None:  # counts examples read from the source
        examples = examples.map(lambda x, y: (x, y + 0 * counter.assign_add(1)))
    return examples


def test_every_epoch_has_its_own_order_and_a_resume_continues_it_exactly():
    def stream(skip):
        return data.training_batches(
            _examples(40),
            8,
            shuffle_buffer=40,
            seed=3,
            cache=False,
            deterministic=True,
            steps_per_epoch=5,
            skip_steps=skip,
        )

    whole = _labels(stream(0), 20)  # 4 epochs of 5 steps
    epochs = [sorted(sum(whole[e * 5 : (e + 1) * 5], [])) for e in range(4)]
    assert all(e == list(range(40)) for e in epochs)  # each epoch is one pass
    assert (
        len({tuple(sum(whole[e * 5 : (e + 1) * 5], [])) for e in range(4)}) == 4
    )  # four different orders
    for skip in (3, 5, 12, 17):  # mid-epoch and epoch boundaries, in later epochs too
        assert _labels(stream(skip), 20 - skip) == whole[skip:], skip


def test_a_resume_reads_only_the_batches_already_trained_in_its_epoch():
    counter = tf.Variable(0, dtype=tf.int64)
    resumed = data.training_batches(
        _examples(40, counter),
        8,
        shuffle_buffer=1,
        cache=False,
        deterministic=True,
        steps_per_epoch=5,
        skip_steps=3 * 5 + 2,
        prefetch_batches=0,
        private_threadpool_size=2,  # tf.data's read-ahead grows with the threads: 2, as on this 2-core machine
    )
    next(iter(resumed))
    # Epochs 0-2 are not read at all: epoch 3 is rebuilt from its own seed and only its first batches are read (2
    # skipped + 1 taken = 24 examples, plus what tf.data's parallel batching reads ahead, measured up to 40 here
    # under load). Replaying from step 0 would read 18 batches (144 examples) first, epochs 0-2 alone 120.
    assert 3 * 8 <= int(counter.numpy()) < 3 * 40


@pytest.mark.slow  # a SIGTERM resume stays in the default tier: tests/test_user_model.py
def test_a_sigterm_resume_in_a_later_epoch_continues_that_epochs_order(tmp_path):
    # Step 60 is in epoch 2: the resumed pipeline starts at epoch 2's own shuffle (seeded by (seed, 2)) and skips the
    # 16 batches already trained in it, instead of replaying from step 0; the weights equal an uninterrupted run's.
    # (data.deterministic keeps tf.data's parallel map order fixed, so the comparison is exact.)
    overrides = {"train.epochs": 3, "data.deterministic": True}
    run(recipe(**overrides), str(tmp_path / "whole"))
    with faults.signals_at_step(60):
        assert run(recipe(**overrides), str(tmp_path / "cut"))["status"] == "preempted"
    assert run(recipe(**overrides), str(tmp_path / "cut"))["resumed_from_step"] == 60
    whole = keras.saving.load_model(str(tmp_path / "whole" / "model.keras")).get_weights()
    cut = keras.saving.load_model(str(tmp_path / "cut" / "model.keras")).get_weights()
    for a, b in zip(whole, cut, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


# ---- NaN rollback that moves forward --------------------------------------------------------------------------------


def _tiny_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def _train_over_bad_rows(tmp_path, bad_rows, max_nan_retries):
    """fit_with_recovery on 64 batches whose `bad_rows` hold NaN, checkpoints every 10 steps, 2 epochs of 20 steps;
    returns (outcome, checkpointer, model, the data positions each fit segment started at)."""
    features = np.ones((64, 4, 2), "float32")
    features[list(bad_rows)] = np.nan
    batches = tf.data.Dataset.from_tensor_slices((features, np.zeros((64, 4), "int64")))
    model = _tiny_model()
    checkpointer = checkpoint_lib.Checkpointer(str(tmp_path), model, model.optimizer)
    positions = []

    def make_dataset(position):
        positions.append(position)
        return batches.skip(position)

    outcome = trainer.fit_with_recovery(
        model,
        make_dataset,
        checkpointer=checkpointer,
        steps_per_epoch=20,
        epochs=2,
        callbacks=[],
        checkpoint_every_steps=10,
        max_nan_retries=max_nan_retries,
        verbose=0,
    )
    return outcome, checkpointer, model, positions


def test_two_bad_batches_in_one_checkpoint_interval_are_both_skipped(tmp_path):
    # Batches 15 and 18 hold NaN: the second rollback lands on the same checkpoint (step 10) and must keep the first
    # skipped window (6 batches) as well as add its own.
    outcome, _, _, positions = _train_over_bad_rows(tmp_path, [15, 18], max_nan_retries=2)
    assert outcome.status == "done" and outcome.nan_rollbacks == 2
    # step 10 at data 16 hits row 18 at step 13: skip 3 more (6 + 3 = 9), step 10 resumes at data 19
    assert positions[:3] == [0, 16, 19] and outcome.skipped_steps == 9


def test_a_nan_caused_by_a_batch_is_skipped_after_the_rollback(tmp_path):
    # Batch 15 of the data holds a NaN. Retrying from step 10 on the same data would hit it every time.
    outcome, checkpointer, model, positions = _train_over_bad_rows(
        tmp_path, [15], max_nan_retries=1
    )
    assert outcome.status == "done" and outcome.nan_rollbacks == 1
    assert (
        outcome.skipped_steps == 6
    )  # steps 10..15: from the checkpoint to the batch that diverged
    # The retry starts after the bad batch, at step 10; the next epoch's segment continues 6 batches ahead.
    assert positions == [0, 16, 26]
    assert checkpointer.step == 40 and checkpointer.data_position == 46
    assert checkpoint_lib.all_finite(model.weights)
    # The skipped window is in the checkpoint: a new process resumes at the same data position.
    again = _tiny_model()
    restored = checkpoint_lib.Checkpointer(str(tmp_path), again, again.optimizer)
    assert restored.restore() == 40 and restored.data_position == 46


class PoisonWeights(keras.callbacks.Callback):
    """Sets the logits kernel to NaN at the end of step `at`, once: the loss of that step was finite."""

    def __init__(self, at):
        super().__init__()
        self.at, self.fired = at, 0

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.at and not self.fired:
            kernel = self.model.get_layer("logits").kernel
            kernel.assign(np.full(kernel.shape, np.nan, dtype="float32"))
            self.fired += 1


@pytest.mark.integration
def test_weights_that_are_not_finite_are_never_checkpointed(tmp_path):
    poison = PoisonWeights(
        at=10
    )  # a checkpoint step: the save sees NaN weights after a finite loss
    metrics = run(
        recipe(**{"runtime.checkpoint_every_steps": 5}), str(tmp_path), callbacks=[poison]
    )
    assert poison.fired == 1 and metrics["nan_rollbacks"] == 1 and metrics["status"] == "done"
    assert (
        metrics["nan_skipped_examples"] == 5 * 32
    )  # steps 5..9 of data, after the rollback to step 5
    for index in glob.glob(str(tmp_path / "checkpoints" / "ckpt-*.index")):
        reader = tf.train.load_checkpoint(index[: -len(".index")])
        for name, dtype in reader.get_variable_to_dtype_map().items():
            if name.startswith("model/") and dtype.is_floating:
                assert np.isfinite(reader.get_tensor(name)).all(), (index, name)


# ---- early stopping and best.keras across restarts ----------------------------------------------------------------

EARLY = {
    "train.epochs": 6,
    "train.learning_rate": 0.0,
    "train.warmup_steps": 0,
    "train.early_stopping_patience": 1,
    "train.export_best_by": "val_accuracy",
}


@pytest.mark.parametrize("checkpoint_every_steps", [None, pytest.param(22, marks=pytest.mark.slow)])
@pytest.mark.integration
def test_early_stopping_survives_a_restart_and_a_stopped_run_stays_stopped(
    tmp_path, checkpoint_every_steps
):
    # lr 0: val_loss never improves, so patience 1 stops at the end of epoch 2 (step 88) in an uninterrupted run.
    # With checkpoints every 22 steps, a periodic save lands on each epoch's last step, before early stopping's
    # epoch-end state exists: the epoch-end save must write that step again.
    overrides = {**EARLY, "runtime.checkpoint_every_steps": checkpoint_every_steps}

    def recipe_(**more):
        return recipe(**overrides, **more)

    assert run(recipe_(), str(tmp_path / "whole"))["step"] == 88
    with faults.signals_at_step(50):  # in epoch 2, after epoch 1 set the best value
        assert run(recipe_(), str(tmp_path / "cut"))["status"] == "preempted"
    best = tmp_path / "cut" / "best.keras"
    written = best.stat().st_mtime_ns
    resumed = run(recipe_(), str(tmp_path / "cut"))
    assert (
        resumed["status"] == "early_stopped" and resumed["step"] == 88
    )  # patience did not restart
    assert (
        best.stat().st_mtime_ns == written
    )  # an equal val_accuracy after the restart is not "better"
    again = run(recipe_(), str(tmp_path / "cut"))  # the same command once more
    assert (
        again["status"] == "early_stopped"
        and again["step"] == 88
        and again["resumed_from_step"] == 88
    )


# ---- damaged checkpoints ------------------------------------------------------------------------------------------


def _train_with_checkpoints(output_dir):
    return run(
        recipe(**{"runtime.checkpoint_every_steps": 10}), output_dir
    )  # keeps ckpt-30, -40, -44


def _truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


@pytest.mark.parametrize(
    "damage",
    [
        "index",
        *(pytest.param(d, marks=pytest.mark.slow) for d in ("data", "missing_index", "state_file")),
    ],
)
@pytest.mark.integration
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, damage, caplog):
    output_dir = str(tmp_path)
    _train_with_checkpoints(output_dir)
    ckpt = os.path.join(output_dir, "checkpoints", "ckpt-44")
    if damage == "data":
        data_file = glob.glob(ckpt + ".data-*")[0]
        _truncate(data_file, os.path.getsize(data_file) // 2)
    elif damage == "index":
        _truncate(ckpt + ".index", 10)
    elif damage == "missing_index":
        os.remove(ckpt + ".index")
    else:  # the manager's state file, damaged: the checkpoints themselves are found by name
        with open(os.path.join(output_dir, "checkpoints", "checkpoint"), "wb") as f:
            f.write(b"\x00\xff garbage")
    with caplog.at_level(logging.WARNING, logger="tpukit"):
        metrics = run(  # a second epoch under the recipe's cosine schedule: accepted by name
            recipe(**{"train.epochs": 2, "runtime.checkpoint_every_steps": 10}),
            output_dir,
            accept_changes=["train.epochs"],
        )
    expected = 44 if damage == "state_file" else 40
    assert metrics["resumed_from_step"] == expected and metrics["step"] == 88
    if damage == "state_file":
        assert "moved it to" in caplog.text and os.path.isfile(
            os.path.join(output_dir, "checkpoints", "checkpoint.damaged")
        )
    else:
        assert (
            f"resumed from {os.path.join(output_dir, 'checkpoints', 'ckpt-40')} (step 40)"
            in caplog.text
        )


@pytest.mark.integration
def test_when_no_checkpoint_can_be_read_the_run_stops_and_deletes_nothing(tmp_path):
    output_dir = str(tmp_path)
    _train_with_checkpoints(output_dir)
    for index in glob.glob(os.path.join(output_dir, "checkpoints", "ckpt-*.index")):
        _truncate(index, 10)
    before = sorted(os.listdir(os.path.join(output_dir, "checkpoints")))
    with pytest.raises(RecipeError) as info:
        run(recipe(**{"train.epochs": 2}), output_dir, accept_changes=["train.epochs"])
    assert "no checkpoint in" in str(info.value) and "could be read" in str(info.value)
    assert "ckpt-30" in str(info.value) and "ckpt-44" in str(info.value)
    assert sorted(os.listdir(os.path.join(output_dir, "checkpoints"))) == before


# ---- cheap checks before slow work ------------------------------------------------------------------------------


def test_a_bad_checkpoint_path_and_a_missing_checkpoint_are_refused_before_any_model_is_built(
    tmp_path, monkeypatch
):
    import functools

    from tpukit import models

    @functools.wraps(models.MODELS["small_cnn"])  # same signature: the recipe still validates
    def refuse(**kwargs):
        raise AssertionError("the model was built before the cheap checks")

    monkeypatch.setitem(models.MODELS, "small_cnn", refuse)
    with pytest.raises(RecipeError, match="no such checkpoint"):
        run(recipe(), str(tmp_path), mode="eval", checkpoint=str(tmp_path / "ckpt-7"))
    with pytest.raises(RecipeError, match="mode eval: no checkpoint in"):
        run(recipe(), str(tmp_path), mode="eval")


@pytest.mark.integration
def test_eval_mode_decides_no_steps_per_execution(tmp_path, caplog, monkeypatch):
    from tpukit.engines.keras import flops

    run(recipe(), str(tmp_path))
    timed = []
    original = flops.device_peak_flops
    monkeypatch.setattr(
        flops, "device_peak_flops", lambda *a, **k: timed.append(a) or original(*a, **k)
    )
    with caplog.at_level(logging.INFO, logger="tpukit"):
        metrics = run(recipe(**{"runtime.steps_per_execution": "auto"}), str(tmp_path), mode="eval")
    # nothing trains, and a CNN's jit_compile choice does not need the peak: it is not read (nor timed)
    assert timed == [] and metrics["jit_compile"] is False
    assert "steps_per_execution auto" not in caplog.text
    assert metrics["steps_per_execution"] == 1
    assert metrics["steps_per_execution_decision"]["rule"].startswith("mode eval")


# ---- SIGKILL at random moments ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkills_at_random_moments_resume_to_the_uninterrupted_weights(tmp_path):
    import random
    import subprocess
    import sys
    import time

    from helpers import REPO

    args = [
        "recipes/digits_cnn.yaml",
        "--set",
        "train.epochs=3",
        "--set",
        "data.global_batch_size=32",
        "--set",
        "data.deterministic=true",
        "--set",
        "runtime.checkpoint_every_steps=3",
        "--set",
        "runtime.max_checkpoints_to_keep=2",
    ]
    whole = str(tmp_path / "whole")
    assert run_cli(*args, "--output_dir", whole).returncode == 0
    cut = str(tmp_path / "cut")
    rng = random.Random()
    moments = []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    for _ in range(4):
        # After imports (~5 s) the run trains ~132 steps in a few seconds, saving every 3 steps: most moments land in
        # training or inside a save.
        delay = rng.uniform(5.0, 12.0)
        moments.append(round(delay, 2))
        process = subprocess.Popen(
            [sys.executable, "-m", "tpukit.train", *args, "--output_dir", cut],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(delay)
        process.kill()
        process.wait()
    final = run_cli(*args, "--output_dir", cut)
    assert final.returncode == 0, (moments, final.stderr[-3000:])
    with open(os.path.join(cut, "metrics.json")) as f:
        assert json.load(f)["step"] == 132, moments
    a = keras.saving.load_model(os.path.join(whole, "model.keras")).get_weights()
    b = keras.saving.load_model(os.path.join(cut, "model.keras")).get_weights()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6, err_msg=f"kill moments {moments}")
