"""`tpukit.fit(sample_weight=..., class_weight=...)` and a model's own compiled loss train as plain Keras `fit`
does, on both engines, and exact evaluation stays exact with weights (issue 40).

"Exact" here: what plain Keras `evaluate` gives over the whole eval set in one batch with no padding: the weighted
metrics, tpukit's own loss (averaged by the weights) and a loss compiled with Keras' default reduction (the weighted
sum over the number of loss values)."""

import logging
import os
import re

import keras
import numpy as np
import pytest
import weight_cases as cases
from conftest import mirrored
from helpers import run_jax_snippet

import tpukit
from tpukit import user_model
from tpukit.recipe import RecipeError

TESTS = os.path.dirname(__file__)


@pytest.mark.parametrize("case", ["sample_weight", "class_weight", "guide"])
def test_weights_and_the_compiled_loss_train_as_plain_keras_on_the_tensorflow_engine(
    tmp_path, case
):
    plain, plain_eval = cases.plain(case)
    losses, metrics = cases.with_tpukit(case, tmp_path / case)
    assert metrics["status"] == "done"
    np.testing.assert_allclose(losses, plain, rtol=1e-5)
    # 37 weighted eval examples in batches of 16: exact, and (as in Keras) not weighted by class.
    assert metrics["eval"]["loss"] == pytest.approx(plain_eval, rel=1e-5)
    if case == "sample_weight":  # the weights change the loss: without them it is another number
        unweighted, _ = cases.with_tpukit(
            "sample_weight", tmp_path / "unweighted", sample_weight=None
        )
        assert abs(unweighted[0] - plain[0]) > 0.05


JAX_CHILD = f"""
import json, sys, tempfile
sys.path.insert(0, {TESTS!r})
import weight_cases as cases
result = {{}}
for case in ("sample_weight", "class_weight", "guide"):
    with tempfile.TemporaryDirectory() as out:
        losses, metrics = cases.with_tpukit(case, out + "/run", engine="jax")
    plain, plain_eval = cases.plain(case)
    result[case] = {{"plain": plain, "plain_eval": plain_eval, "tpukit": losses, "eval": metrics["eval"]["loss"],
                    "status": metrics["status"]}}
print("RESULT " + json.dumps(result))
"""


@pytest.mark.integration
def test_weights_and_the_compiled_loss_train_as_plain_keras_on_the_jax_engine():
    # Two CPU devices: each batch split over a data axis of 2, each eval batch padded per device.
    flags = "--xla_force_host_platform_device_count=2"
    result = run_jax_snippet(JAX_CHILD, "weights", timeout=600, XLA_FLAGS=flags)
    for case, found in result.items():
        assert found["status"] == "done", case
        np.testing.assert_allclose(found["tpukit"], found["plain"], rtol=1e-5, err_msg=case)
        assert found["eval"] == pytest.approx(found["plain_eval"], rel=1e-5), case


def _one_batch(path, loss, vx, vy, vw):
    """Plain Keras `evaluate` of the exported model over the whole eval set in one batch, no padding."""
    model = keras.saving.load_model(path, compile=False)
    model.compile(
        loss=loss, weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    )
    return model.evaluate(vx, vy, sample_weight=vw, batch_size=len(vx), verbose=0, return_dict=True)


@pytest.mark.parametrize("replicas", [1, 2])
def test_exact_evaluation_with_sample_weights_equals_one_batch_of_plain_keras(tmp_path, replicas):
    x, y, w = cases.arrays(cases.N, 0)
    vx, vy, vw = cases.arrays(
        cases.EVAL_N, 1
    )  # 37 examples: the last eval batch of 16 is mostly padding
    metrics = tpukit.fit(
        lambda: cases.classifier(compiled=False),
        x,
        y,
        sample_weight=w,
        validation_data=(vx, vy, vw),
        epochs=1,
        batch_size=cases.BATCH,
        learning_rate=0.01,
        output_dir=str(tmp_path / "own"),
        strategy=mirrored(replicas) if replicas > 1 else None,
        verbose=0,
    )
    own_loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="mean_with_sample_weight"
    )
    plain = _one_batch(metrics["exported"]["keras"], own_loss, vx, vy, vw)
    assert metrics["eval"]["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    assert metrics["eval"]["accuracy"] == pytest.approx(plain["accuracy"], rel=1e-6)
    # The weights count: without them the numbers are others.
    unweighted = _one_batch(metrics["exported"]["keras"], own_loss, vx, vy, None)
    assert abs(unweighted["loss"] - plain["loss"]) > 1e-3

    compiled = tpukit.fit(
        cases.classifier,
        x,
        y,
        sample_weight=w,
        validation_data=(vx, vy, vw),
        epochs=1,
        batch_size=cases.BATCH,
        output_dir=str(tmp_path / "compiled"),
        strategy=mirrored(replicas) if replicas > 1 else None,
        verbose=0,
    )
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    plain = _one_batch(compiled["exported"]["keras"], keras_loss, vx, vy, vw)
    assert compiled["eval"]["sparse_categorical_accuracy"] == pytest.approx(
        plain["accuracy"], rel=1e-6
    )
    model = keras.saving.load_model(compiled["exported"]["keras"], compile=False)
    per_example = keras.losses.sparse_categorical_crossentropy(
        vy, model.predict(vx, verbose=0), from_logits=True
    )
    # Keras' default reduction divides the weighted sum by the number of loss values, the reported loss too; the
    # `weighted_loss` metric beside it is the weighted mean.
    assert compiled["eval"]["loss"] == pytest.approx(plain["loss"], rel=1e-5)
    weighted_mean = float(np.sum(np.asarray(per_example) * vw) / np.sum(vw))
    assert compiled["eval"]["weighted_loss"] == pytest.approx(weighted_mean, rel=1e-5)
    assert abs(weighted_mean - plain["loss"]) > 1e-3


def test_validation_split_holds_out_the_last_sample_weights_too():
    x, y, w = cases.arrays(10, 0)
    with user_model.as_recipe(
        cases.classifier, x, y, sample_weight=w, validation_split=0.3, epochs=1, batch_size=2
    ) as recipe:
        from tpukit.data import SOURCES

        source = SOURCES[recipe.data.source]
        train = list(source("train").as_numpy_iterator())
        held_out = list(source("validation").as_numpy_iterator())
    np.testing.assert_array_equal([e[2] for e in train], w[:7])
    np.testing.assert_array_equal([e[2] for e in held_out], w[7:])


def test_weights_that_do_not_fit_are_refused_before_anything_is_written(tmp_path):
    x, y, w = cases.arrays(16, 0)
    common = dict(epochs=1, batch_size=8, output_dir=str(tmp_path / "run"), verbose=0)
    with pytest.raises(RecipeError, match="sample_weight must hold one weight .* per example of x"):
        tpukit.fit(cases.classifier, x, y, sample_weight=w[:5], **common)
    with pytest.raises(RecipeError, match="validation_data must be \\(x_val, y_val\\)"):
        tpukit.fit(cases.classifier, x, y, validation_data=(x,), **common)
    gx, gy = cases.guide_arrays(16, 0)
    with pytest.raises(RecipeError) as error:
        tpukit.fit(cases.guide_model, gx, gy, class_weight={0: 2.0}, **common)
    assert "train.class_weight={0: 2.0} weighs examples by class" in str(error.value)
    assert "['regression']" in str(error.value) and "Fix: " in str(error.value)
    assert not os.path.exists(tmp_path / "run")


def first_unit_squared_error(y_true, y_pred):
    """A loss of the user's own: the first unit regresses the label."""
    return (y_pred[:, 0] - keras.ops.cast(y_true, "float32")) ** 2


def test_a_compiled_loss_tpukit_does_not_know_leaves_the_labels_unchecked(tmp_path):
    # Class ids 0..2 on a 2-unit output would be refused as classification; a custom loss takes what it takes.
    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss=first_unit_squared_error)
        return model

    x, y, _ = cases.arrays(32, 0)
    metrics = tpukit.fit(
        build, x, y, epochs=1, batch_size=8, output_dir=str(tmp_path / "run"), verbose=0
    )
    assert metrics["status"] == "done"
    with pytest.raises(RecipeError, match="classes"):  # inferred (nothing compiled): refused
        tpukit.fit(
            lambda: keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)]),
            x,
            y,
            epochs=1,
            batch_size=8,
            output_dir=str(tmp_path / "inferred"),
            verbose=0,
        )


def one_hot_cross_entropy(y_true, y_pred):
    """A loss of the user's own on one-hot labels (tpukit does not know it: its task is custom)."""
    return keras.losses.categorical_crossentropy(y_true, y_pred, from_logits=True)


@pytest.mark.parametrize("labels", ["ids", "one_hot"])
def test_class_weight_with_a_loss_tpukit_does_not_know_trains_as_plain_keras(tmp_path, labels):
    # Keras reads the class of a [B, 3] one-hot label by argmax, of a [B] label by rounding: tpukit too.
    loss = first_unit_squared_error if labels == "ids" else one_hot_cross_entropy

    def build():
        model = cases.classifier(compiled=False)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
        return model

    x, y, _ = cases.arrays(cases.N, 0)
    if labels == "one_hot":
        y = np.eye(3, dtype="float32")[y]
    recorder = cases.Losses()
    build().fit(
        x,
        y,
        class_weight=cases.CLASS_WEIGHT,
        batch_size=cases.BATCH,
        epochs=cases.EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[recorder],
    )
    mine = cases.Losses()
    metrics = tpukit.fit(
        build,
        x,
        y,
        class_weight=cases.CLASS_WEIGHT,
        epochs=cases.EPOCHS,
        batch_size=cases.BATCH,
        output_dir=str(tmp_path / "run"),
        seed=cases.SEED,
        shuffle_buffer=1,
        deterministic=True,
        verbose=0,
        callbacks=[mine],
    )
    assert metrics["status"] == "done"
    np.testing.assert_allclose(mine.losses, recorder.losses, rtol=1e-5)
    unweighted = cases.Losses()
    build().fit(
        x, y, batch_size=cases.BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[unweighted]
    )
    assert abs(unweighted.losses[0] - recorder.losses[0]) > 1e-3  # the class weights count


def test_a_class_weight_key_beyond_the_classes_is_refused(tmp_path):
    x, y, _ = cases.arrays(16, 0)
    with pytest.raises(RecipeError) as error:
        tpukit.fit(
            cases.classifier,
            x,
            y,
            class_weight={0: 1.0, 1_000_000_000: 1.0},
            epochs=1,
            batch_size=8,
            output_dir=str(tmp_path / "run"),
            verbose=0,
        )
    message = str(error.value)
    assert "train.class_weight names class 1000000000" in message
    assert "has 3 classes (ids 0 to 2)" in message and "Fix: " in message
    assert not os.path.exists(tmp_path / "run")


def test_a_sample_weight_of_the_wrong_shape_is_refused_before_any_pipeline(tmp_path):
    x, y, w = cases.arrays(16, 0)
    common = dict(epochs=1, batch_size=8, output_dir=str(tmp_path / "run"), verbose=0)
    with pytest.raises(RecipeError) as error:
        tpukit.fit(cases.classifier, x, y, sample_weight=np.ones((16, 3), "float32"), **common)
    message = str(error.value)
    assert (
        "tpukit.fit: sample_weight has shape [16, 3], which does not fit labels of shape [16]"
        in message
    )
    assert (
        "Fix: a sample_weight of shape [N] (N examples)" in message and "autograph" not in message
    )
    with pytest.raises(RecipeError) as error:
        tpukit.fit(cases.classifier, x, y, validation_data=(x, y, np.ones((16, 2, 2))), **common)
    assert "validation_data's sample weight has shape [16, 2, 2]" in str(error.value)
    # Per-token labels take one weight per example or per token (a trailing axis of 1 is squeezed, as Keras).
    tokens = np.zeros((16, 5), "int32")
    for fits in (w, w[:, None], np.ones((16, 5)), np.ones((16, 5, 1))):
        user_model._check_weight_shape(fits, tokens, "sample_weight")
    with pytest.raises(RecipeError, match=re.escape("of shape [N], [N, 5] (N examples)")):
        user_model._check_weight_shape(np.ones((16, 4)), tokens, "sample_weight")
    assert not os.path.exists(tmp_path / "run")


def test_compiled_unweighted_metrics_with_weights_are_announced_as_weighted(tmp_path, caplog):
    # Keras leaves `metrics` unweighted; tpukit weighs every metric (its eval padding needs the weights): one line.
    def build(weighted):
        keras.utils.set_random_seed(cases.SEED)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, activation="sigmoid")])
        chosen = {"weighted_metrics" if weighted else "metrics": [keras.metrics.BinaryAccuracy()]}
        model.compile(optimizer="sgd", loss="binary_crossentropy", **chosen)
        return model

    x, _, _ = cases.arrays(16, 0)
    y = (x[:, 0] > 0.5).astype("float32")
    common = dict(epochs=1, batch_size=8, class_weight={0: 1.0, 1: 3.0}, verbose=0)
    tpukit_logger = logging.getLogger(
        "tpukit"
    )  # tpukit's logger does not propagate: caplog listens on it
    tpukit_logger.addHandler(caplog.handler)
    try:
        tpukit.fit(lambda: build(False), x, y, output_dir=str(tmp_path / "a"), **common)
        lines = [
            r.getMessage() for r in caplog.records if "Keras leaves unweighted" in r.getMessage()
        ]
        assert len(lines) == 1 and "metrics=['binary_accuracy']" in lines[0]
        caplog.clear()
        tpukit.fit(lambda: build(True), x, y, output_dir=str(tmp_path / "b"), **common)
        tpukit.fit(
            lambda: build(False), x, y, output_dir=str(tmp_path / "c"), epochs=1, batch_size=8
        )
        assert not any("Keras leaves unweighted" in r.getMessage() for r in caplog.records)
    finally:
        tpukit_logger.removeHandler(caplog.handler)
