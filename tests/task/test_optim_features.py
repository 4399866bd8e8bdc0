"""Optimizer features every `build_optimizer` optimizer takes (issue 18, item 5): `train.gradient_accumulation_steps`,
`train.ema_momentum`, `train.global_clipnorm`, with Keras 3.15's semantics (keras/src/optimizers/base_optimizer.py)."""

import os
import types

import keras
import numpy as np
import pytest
from conftest import mirrored

import tpukit
from tpukit.recipe import RecipeError
from tpukit.task.optim import build_optimizer

X = np.random.RandomState(0).randn(64, 4).astype("float32")
Y = (X.sum(1) > 0).astype("int32")


def _train(**overrides):
    fields = dict(
        optimizer="sgd", learning_rate=0.1, momentum=0.0, weight_decay=0.0, schedule="constant"
    )
    fields.update(warmup_steps=0, **overrides)
    return types.SimpleNamespace(**fields)


def mlp():
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)]
    )


def fit(output_dir, **settings):
    """One tpukit.fit run over X, Y in a fixed order; returns (metrics, the exported model's weights)."""
    settings = {"epochs": 1, "batch_size": 8, "optimizer": "sgd", "learning_rate": 0.1, **settings}
    metrics = tpukit.fit(
        mlp, X, Y, output_dir=str(output_dir), verbose=0, seed=1, shuffle_buffer=1, **settings
    )
    model = tpukit.load_model(os.path.join(str(output_dir), "model.keras"))
    return metrics, [w.numpy() for w in model.weights]


def assert_weights_close(a, b, atol=1e-6):
    for u, v in zip(a, b, strict=True):
        np.testing.assert_allclose(u, v, atol=atol)


# ---- build_optimizer passes them to every optimizer ----------------------------------------------------------


@pytest.mark.parametrize("name", ["adam", "adamw", "lamb", "sgd", "lars"])
def test_every_optimizer_gets_accumulation_ema_and_clipnorm_and_keeps_them_in_its_config(name):
    train = _train(
        optimizer=name, gradient_accumulation_steps=4, ema_momentum=0.999, global_clipnorm=1.5
    )
    optimizer = build_optimizer(train, total_steps=10)
    restored = type(optimizer).from_config(optimizer.get_config())
    for opt in (optimizer, restored):
        assert (
            opt.gradient_accumulation_steps,
            opt.use_ema,
            opt.ema_momentum,
            opt.global_clipnorm,
        ) == (
            4,
            True,
            0.999,
            1.5,
        )
    plain = build_optimizer(_train(optimizer=name), total_steps=10)
    assert (plain.gradient_accumulation_steps, plain.use_ema, plain.global_clipnorm) == (
        None,
        False,
        None,
    )
    one = build_optimizer(_train(optimizer=name, gradient_accumulation_steps=1), total_steps=10)
    assert one.gradient_accumulation_steps is None  # 1: every batch (Keras itself requires >= 2)


def test_accumulation_applies_the_mean_of_k_gradients_every_k_batches():
    """Keras: `(g + accumulated) / k` is applied on batch k; `_iterations` counts batches (the schedule reads it),
    `iterations` counts updates (`_iterations // k`)."""
    optimizer = build_optimizer(_train(gradient_accumulation_steps=2), total_steps=10)
    w = keras.Variable(np.zeros(3, "float32"))
    grads = [np.array([1.0, 2.0, 3.0], "float32"), np.array([3.0, 2.0, 1.0], "float32")] * 2
    seen = []
    for g in grads:
        optimizer.apply_gradients([(g, w)])
        seen.append(w.numpy().copy())
    np.testing.assert_allclose(seen[0], 0.0)  # accumulated only
    np.testing.assert_allclose(seen[1], -0.1 * np.array([2.0, 2.0, 2.0]))  # lr * mean of the two
    np.testing.assert_allclose(seen[3], -0.2 * np.array([2.0, 2.0, 2.0]), rtol=1e-6)
    assert int(optimizer._iterations) == 4 and int(optimizer.iterations) == 2


def test_global_clipnorm_bounds_the_step_of_a_huge_learning_rate():
    optimizer = build_optimizer(_train(learning_rate=1000.0, global_clipnorm=0.5), total_steps=10)
    a, b = keras.Variable(np.zeros(3, "float32")), keras.Variable(np.zeros(2, "float32"))
    optimizer.apply_gradients([(np.full(3, 1e6, "float32"), a), (np.full(2, -1e6, "float32"), b)])
    step = np.sqrt(np.sum(a.numpy() ** 2) + np.sum(b.numpy() ** 2))
    assert step == pytest.approx(1000.0 * 0.5, rel=1e-5)  # the whole update has norm lr * clipnorm


# ---- gradient accumulation through tpukit's trainer ------------------------------------------------------------


def test_accumulating_two_batches_of_b_equals_one_step_of_2b(tmp_path):
    _, big = fit(tmp_path / "big", batch_size=16)
    metrics, accumulated = fit(tmp_path / "acc", batch_size=8, gradient_accumulation_steps=2)
    assert metrics["step"] == 8  # tpukit's step counts batches, not the 4 updates
    assert_weights_close(accumulated, big)


@pytest.mark.slow
def test_accumulation_resumes_like_an_uninterrupted_run(tmp_path):
    settings = dict(batch_size=8, gradient_accumulation_steps=2, optimizer="sgd", momentum=0.9)
    _, whole = fit(tmp_path / "whole", epochs=2, **settings)
    fit(tmp_path / "cut", epochs=1, **settings)
    metrics, resumed = fit(tmp_path / "cut", epochs=2, **settings)
    assert (metrics["resumed_from_step"], metrics["step"]) == (8, 16)
    assert_weights_close(resumed, whole)


def test_accumulation_on_two_mirrored_replicas_is_refused(tmp_path):
    with pytest.raises(
        RecipeError,
        match=r"train.gradient_accumulation_steps=2 does not work on 2 mirrored replicas",
    ):
        fit(tmp_path / "acc", gradient_accumulation_steps=2, strategy=mirrored(2))
    assert not os.path.exists(
        tmp_path / "acc"
    )  # refused by the plan: nothing built, nothing written


# ---- EMA -----------------------------------------------------------------------------------------------------


class Trajectory(keras.callbacks.Callback):
    """The model's weights after every batch (steps_per_execution 1)."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_end(self, batch, logs=None):
        self.weights.append([w.numpy() for w in self.model.weights])


def _ema(trajectory, momentum):
    """Keras' EMA: the first update copies the weights, then `m * average + (1 - m) * w` after every update."""
    average = trajectory[0]
    for weights in trajectory[1:]:
        average = [momentum * a + (1 - momentum) * w for a, w in zip(average, weights, strict=True)]
    return average


def test_the_exported_model_holds_the_moving_average(tmp_path):
    """EMA does not change training; `fit` copies the average into the model when it returns
    (`finalize_variable_values`), so the exported (and evaluated) model is the average of the trajectory."""
    trajectory = Trajectory()
    tpukit.fit(
        mlp, X, Y, output_dir=str(tmp_path / "raw"), verbose=0, seed=1, shuffle_buffer=1, epochs=1,
        batch_size=8, optimizer="sgd", learning_rate=0.1, callbacks=[trajectory],
    )  # fmt: skip
    _, raw = fit(tmp_path / "raw2")
    assert_weights_close(trajectory.weights[-1], raw)
    _, averaged = fit(tmp_path / "ema", ema_momentum=0.9)
    assert_weights_close(averaged, _ema(trajectory.weights, 0.9))
    assert not np.allclose(averaged[0], raw[0], atol=1e-3)


@pytest.mark.slow
def test_ema_on_two_replicas_with_steps_per_execution_matches_one_replica(tmp_path):
    _, one = fit(tmp_path / "one", ema_momentum=0.9)
    _, two = fit(tmp_path / "two", ema_momentum=0.9, strategy=mirrored(2), steps_per_execution=2)
    assert_weights_close(two, one, atol=1e-5)


def test_ema_resumes_like_an_uninterrupted_run(tmp_path):
    """The averages are optimizer variables, so the checkpoint holds them; the checkpoint must also hold the raw
    weights (not the average `fit` swapped in when it returned), or epoch 2 would train from the average."""
    _, whole = fit(tmp_path / "whole", epochs=2, ema_momentum=0.9)
    fit(tmp_path / "cut", epochs=1, ema_momentum=0.9)
    metrics, resumed = fit(tmp_path / "cut", epochs=2, ema_momentum=0.9)
    assert metrics["resumed_from_step"] == 8
    assert_weights_close(resumed, whole)
