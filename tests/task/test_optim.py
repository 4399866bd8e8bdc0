"""Schedules, the linear scaling rule, build_optimizer, SGD with L2, and LARS against a NumPy reference."""

import contextlib
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpukit.task.optim import (
    LARS,
    SGDWithL2,
    WarmupCosine,
    WarmupStepDecay,
    build_optimizer,
    scaled_learning_rate,
)


def _train(**overrides):
    """A TrainConfig stand-in with the current schema's fields; overrides add the optional ones."""
    fields = dict(
        optimizer="sgd",
        learning_rate=0.1,
        momentum=0.9,
        weight_decay=0.0,
        schedule="constant",
        warmup_steps=0,
    )
    fields.update(overrides)
    return types.SimpleNamespace(**fields)


def _lr(schedule, steps):
    return [float(schedule(step)) for step in steps]


# ---- learning rate ---------------------------------------------------------------------------------------


def test_scaled_learning_rate_is_linear_in_the_global_batch():
    assert scaled_learning_rate(0.1, 4096, 256) == pytest.approx(1.6)
    assert scaled_learning_rate(0.1, 256, 256) == 0.1
    assert scaled_learning_rate(0.4, 64, 256) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="global_batch_size=0, reference_batch_size=256"):
        scaled_learning_rate(0.1, 0, 256)


def test_warmup_cosine_values():
    schedule = WarmupCosine(1.0, warmup_steps=4, total_steps=14)
    np.testing.assert_allclose(
        _lr(schedule, [0, 1, 3, 4, 9, 14, 20]), [0.25, 0.5, 1.0, 1.0, 0.5, 0.0, 0.0], atol=1e-6
    )
    constant = WarmupCosine(2.0, warmup_steps=0, total_steps=10, cosine=False)
    np.testing.assert_allclose(_lr(constant, [0, 9]), [2.0, 2.0])


def test_warmup_step_decay_values():
    schedule = WarmupStepDecay(1.0, warmup_steps=2, boundaries=[5, 8], decay_rate=0.1)
    np.testing.assert_allclose(
        _lr(schedule, [0, 1, 4, 5, 7, 8, 100]), [0.5, 1.0, 1.0, 0.1, 0.1, 0.01, 0.01], rtol=1e-6
    )
    with pytest.raises(ValueError, match="boundaries must increase"):
        WarmupStepDecay(1.0, 0, [8, 5])


@pytest.mark.parametrize(
    "schedule", [WarmupCosine(0.1, 3, 30), WarmupStepDecay(0.1, 3, [10, 20], 0.5)]
)
def test_schedules_serialize(schedule):
    restored = keras.optimizers.schedules.deserialize(
        keras.optimizers.schedules.serialize(schedule)
    )
    assert type(restored) is type(schedule)
    np.testing.assert_allclose(_lr(restored, range(30)), _lr(schedule, range(30)))


def test_step_schedule_boundaries_are_fractions_of_the_run():
    optimizer = build_optimizer(
        _train(schedule="step", decay_boundaries=(0.5, 0.75), decay_rate=0.2), total_steps=100
    )
    schedule = optimizer._learning_rate
    assert isinstance(schedule, WarmupStepDecay)
    assert schedule.boundaries == [50, 75]
    np.testing.assert_allclose(_lr(schedule, [49, 50, 75]), [0.1, 0.02, 0.004], rtol=1e-6)
    default = build_optimizer(_train(schedule="step"), total_steps=64_000)._learning_rate
    assert (default.boundaries, default.decay_rate) == (
        [32_000, 48_000],
        0.1,
    )  # He et al.'s CIFAR schedule


def test_reference_batch_size_scales_the_peak_learning_rate():
    train = _train(schedule="cosine", warmup_steps=5, reference_batch_size=256)
    optimizer = build_optimizer(train, total_steps=50, global_batch_size=1024)
    assert optimizer._learning_rate.peak == pytest.approx(0.4)
    with pytest.raises(ValueError, match="reference_batch_size=256.*Fix: pass global_batch_size"):
        build_optimizer(train, total_steps=50)


# ---- build_optimizer -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, cls",
    [
        ("adam", keras.optimizers.Adam),
        ("adamw", keras.optimizers.AdamW),
        ("lamb", keras.optimizers.Lamb),
        ("sgd", SGDWithL2),
        ("lars", LARS),
    ],
)
def test_build_optimizer_names(name, cls):
    weight_decay = 0.0 if name == "adam" else 1e-4
    optimizer = build_optimizer(_train(optimizer=name, weight_decay=weight_decay), total_steps=10)
    assert type(optimizer) is cls
    assert float(optimizer.learning_rate) == pytest.approx(0.1)


def test_build_optimizer_passes_momentum_decay_and_trust_coefficient():
    lars = build_optimizer(
        _train(optimizer="lars", momentum=0.8, weight_decay=5e-5, trust_coefficient=0.02), 10
    )
    assert (lars.momentum, lars.l2, lars.trust_coefficient) == (0.8, 5e-5, 0.02)
    sgd = build_optimizer(_train(optimizer="sgd", momentum=0.7, weight_decay=1e-4), 10)
    assert (sgd.momentum, sgd.l2, sgd.weight_decay) == (
        0.7,
        1e-4,
        None,
    )  # coupled only, never Keras' decoupled too


def test_adam_with_weight_decay_is_an_error_naming_adamw():
    with pytest.raises(ValueError, match="train.weight_decay=0.01 with optimizer 'adam'.*adamw"):
        build_optimizer(_train(optimizer="adam", weight_decay=0.01), 10)


@pytest.mark.parametrize("name", ["adamw", "lamb", "sgd", "lars"])
def test_weight_decay_skips_biases_and_norm_parameters(name):
    optimizer = build_optimizer(_train(optimizer=name, weight_decay=1e-4), total_steps=10)
    layers = [
        keras.layers.Dense(2, name="d"),
        keras.layers.BatchNormalization(name="bn"),
        keras.layers.LayerNormalization(name="ln"),
    ]
    for layer in layers:
        layer.build((None, 2))
    decayed = {
        v.path
        for layer in layers
        for v in layer.trainable_weights
        if optimizer._use_weight_decay(v)
    }
    assert decayed == {"d/kernel"}


# ---- SGD with L2 and LARS: exact updates -----------------------------------------------------------------


def _variables():
    rng = np.random.default_rng(0)
    kernel = keras.Variable(rng.normal(size=(3, 2)).astype("float32"), name="kernel")
    bias = keras.Variable(rng.normal(size=(2,)).astype("float32"), name="bias")
    grads = [
        [rng.normal(size=(3, 2)).astype("float32"), rng.normal(size=(2,)).astype("float32")]
        for _ in range(3)
    ]
    return [kernel, bias], grads


def _lars_reference(weights, grads, lr, momentum, weight_decay, eta, nesterov, excluded):
    """NumPy transcription of Model Garden's LARS._resource_apply_dense with classic_momentum=True."""
    weights = [w.astype(np.float64) for w in weights]
    velocities = [np.zeros_like(w) for w in weights]
    for step_grads in grads:
        for i, g in enumerate(step_grads):
            w, g = weights[i], g.astype(np.float64)
            trust = 1.0
            if not excluded[i]:
                g = g + weight_decay * w
                w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
                trust = eta * w_norm / g_norm if w_norm > 0 and g_norm > 0 else 1.0
            velocities[i] = momentum * velocities[i] + lr * trust * g
            update = momentum * velocities[i] + lr * trust * g if nesterov else velocities[i]
            weights[i] = w - update
    return weights


@pytest.mark.parametrize("nesterov", [False, True])
def test_lars_matches_the_numpy_reference_for_three_steps(nesterov):
    variables, grads = _variables()
    initial = [v.numpy() for v in variables]
    optimizer = LARS(
        0.5, momentum=0.9, weight_decay=0.01, trust_coefficient=0.02, nesterov=nesterov
    )
    for step_grads in grads:
        optimizer.apply_gradients(zip(step_grads, variables, strict=True))
    expected = _lars_reference(
        initial, grads, 0.5, 0.9, 0.01, 0.02, nesterov, excluded=[False, True]
    )
    for variable, want in zip(variables, expected, strict=True):
        np.testing.assert_allclose(variable.numpy(), want, rtol=1e-5, atol=1e-6)


def test_lars_trust_ratio_is_one_for_zero_weights():
    kernel = keras.Variable(np.zeros((2, 2), "float32"), name="kernel")
    optimizer = LARS(0.1, momentum=0.0, trust_coefficient=0.001)
    optimizer.apply_gradients([(np.ones((2, 2), "float32"), kernel)])
    np.testing.assert_allclose(kernel.numpy(), -0.1)  # plain SGD step, not a 0 * lr step


def test_sgd_with_l2_adds_decay_to_the_gradient_before_momentum():
    variables, grads = _variables()
    kernel0, bias0 = (v.numpy().astype(np.float64) for v in variables)
    optimizer = SGDWithL2(0.1, momentum=0.9, weight_decay=0.01)
    for step_grads in grads[:2]:
        optimizer.apply_gradients(zip(step_grads, variables, strict=True))
    # Keras momentum: v = m v - lr g; w += v, with g = grad + wd * w for the kernel only.
    v_k, v_b, k, b = 0.0, 0.0, kernel0, bias0
    for g_k, g_b in grads[:2]:
        v_k = 0.9 * v_k - 0.1 * (g_k + 0.01 * k)
        v_b = 0.9 * v_b - 0.1 * g_b
        k, b = k + v_k, b + v_b
    np.testing.assert_allclose(variables[0].numpy(), k, rtol=1e-5)
    np.testing.assert_allclose(variables[1].numpy(), b, rtol=1e-5)


@pytest.mark.parametrize(
    "optimizer",
    [
        LARS(
            0.3,
            momentum=0.8,
            weight_decay=1e-3,
            trust_coefficient=0.01,
            nesterov=True,
            exclude_names=("bias",),
        ),
        SGDWithL2(0.1, 0.9, True, 1e-4),
    ],
)
def test_custom_optimizers_round_trip_their_config(optimizer):
    config = optimizer.get_config()
    restored = type(optimizer).from_config(config)
    assert restored.get_config() == config
    assert (
        keras.optimizers.deserialize(keras.optimizers.serialize(optimizer)).get_config() == config
    )


# ---- LARS inside model.fit: XLA and MirroredStrategy -----------------------------------------------------


def _lars_fit(jit_compile, strategy=None, steps=3):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 4)).astype("float32")
    y = rng.integers(0, 3, size=(8,))
    scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
    with scope:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(3)]
        )
        model.compile(
            optimizer=LARS(0.5, momentum=0.9, weight_decay=1e-3, trust_coefficient=0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit_compile,
        )
    model.fit(x, y, batch_size=8, epochs=steps, shuffle=False, verbose=0)
    return [w.numpy() for w in model.weights], model


def test_lars_under_xla_matches_eager():
    eager, _ = _lars_fit(jit_compile=False)
    compiled, model = _lars_fit(jit_compile=True)
    assert int(model.optimizer.iterations.numpy()) == 3
    for a, b in zip(eager, compiled, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


@pytest.mark.integration
def test_lars_on_two_replicas_matches_one_device():
    # Reduce without TF collectives: every MirroredStrategy object numbers its collective groups from 1, so one
    # created here makes the next test's strategy fail its all-reduce ("joining a group that is already full").
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    single, _ = _lars_fit(jit_compile=False)
    replicated, model = _lars_fit(jit_compile=False, strategy=strategy)
    assert model.distribute_strategy.num_replicas_in_sync == 2
    for a, b in zip(single, replicated, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_lars_momentum_survives_a_checkpoint_round_trip(tmp_path):
    from tpukit.engines.tensorflow.checkpoint import Checkpointer

    weights, model = _lars_fit(jit_compile=False, steps=2)
    saved = Checkpointer(str(tmp_path), model, model.optimizer)
    saved.save()
    _, fresh = _lars_fit(jit_compile=False, steps=1)
    restored = Checkpointer(str(tmp_path), fresh, fresh.optimizer)
    assert restored.restore() == 2
    for a, b in zip(model.optimizer.momentums, fresh.optimizer.momentums, strict=True):
        np.testing.assert_array_equal(b.numpy(), a.numpy())
    assert np.abs(model.optimizer.momentums[0].numpy()).sum() > 0
