"""Sparse categorical cross-entropy with label smoothing equals Keras' one-hot version."""

import keras
import numpy as np
import pytest

from tpukit.task.losses import SparseCategoricalCrossentropyWithLabelSmoothing


def _data(shape, num_classes, seed=0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(*shape, num_classes)).astype("float32") * 3
    labels = rng.integers(0, num_classes, size=shape)
    return labels, logits


@pytest.mark.parametrize("shape", [(4,), (2, 5)], ids=["classifier", "per_token"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_matches_categorical_crossentropy_on_one_hot_labels(shape, smoothing):
    labels, logits = _data(shape, num_classes=7)
    ours = SparseCategoricalCrossentropyWithLabelSmoothing(
        smoothing, from_logits=True, reduction=None
    )
    keras_loss = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=smoothing, reduction=None
    )
    expected = keras_loss(keras.ops.one_hot(labels, 7), logits)
    result = ours(labels, logits)
    assert tuple(result.shape) == shape
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


def test_matches_on_probabilities_and_with_mean_reduction():
    labels, logits = _data((6,), num_classes=4)
    probs = keras.ops.softmax(logits)
    ours = SparseCategoricalCrossentropyWithLabelSmoothing(0.2, from_logits=False)
    expected = keras.losses.CategoricalCrossentropy(label_smoothing=0.2)(
        keras.ops.one_hot(labels, 4), probs
    )
    np.testing.assert_allclose(ours(labels, probs), expected, rtol=1e-5)


def test_zero_smoothing_equals_sparse_crossentropy_with_sample_weights():
    labels, logits = _data((5,), num_classes=3)
    weights = np.array([1, 1, 0, 1, 0], "float32")
    ours = SparseCategoricalCrossentropyWithLabelSmoothing(0.0, reduction="mean_with_sample_weight")
    keras_loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight"
    )
    np.testing.assert_allclose(
        ours(labels, logits, weights), keras_loss(labels, logits, weights), rtol=1e-6
    )


def test_bfloat16_logits_give_a_float32_loss():
    labels, logits = _data((3, 4), num_classes=5)
    loss = SparseCategoricalCrossentropyWithLabelSmoothing(0.1, reduction=None)(
        labels, keras.ops.cast(logits, "bfloat16")
    )
    assert loss.dtype == "float32"
    assert tuple(loss.shape) == (3, 4)


def test_accepts_labels_with_a_trailing_unit_axis():
    labels, logits = _data((4,), num_classes=3)
    loss = SparseCategoricalCrossentropyWithLabelSmoothing(0.1, reduction=None)
    np.testing.assert_allclose(loss(labels[:, None], logits), loss(labels, logits), rtol=1e-6)


def test_config_round_trip_and_bad_smoothing():
    loss = SparseCategoricalCrossentropyWithLabelSmoothing(0.25, from_logits=False, reduction="sum")
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert type(restored) is SparseCategoricalCrossentropyWithLabelSmoothing
    assert (restored.label_smoothing, restored.from_logits, restored.reduction) == (
        0.25,
        False,
        "sum",
    )
    with pytest.raises(ValueError, match="received label_smoothing=1.0"):
        SparseCategoricalCrossentropyWithLabelSmoothing(1.0)


def test_the_task_loss_smooths_only_when_asked():
    from tpukit.task.compiling import task_loss
    from tpukit.task.targets import Target

    ids = Target("output", "classification", True, True, 10, 0)
    plain, smoothed = task_loss(ids, 0.0), task_loss(ids, 0.1)
    assert type(plain) is keras.losses.SparseCategoricalCrossentropy
    assert type(smoothed) is SparseCategoricalCrossentropyWithLabelSmoothing
    assert (smoothed.label_smoothing, smoothed.reduction) == (0.1, "mean_with_sample_weight")
    one_hot = task_loss(Target("output", "classification", False, False, 10, 0), 0.1)
    assert type(one_hot) is keras.losses.CategoricalCrossentropy and one_hot.label_smoothing == 0.1


def test_trains_a_causal_lm_step_under_xla():
    from tpukit.models import causal_lm

    model = causal_lm(
        vocab_size=11, sequence_length=4, num_layers=1, hidden_dim=8, num_heads=2, mlp_dim=8
    )
    model.compile(
        optimizer="sgd", loss=SparseCategoricalCrossentropyWithLabelSmoothing(0.1), jit_compile=True
    )
    tokens = np.arange(8, dtype="int32").reshape(2, 4)
    assert np.isfinite(model.train_on_batch(tokens, (tokens + 1) % 11))
