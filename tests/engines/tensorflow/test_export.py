"""tpukit.engines.keras.export: model.keras + a SavedModel `serve` endpoint that reproduce the model, float32 out."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tpukit.engines.keras.export import export_model, io_device_for, load_serving
from tpukit.models import small_cnn


def _model():
    keras.utils.set_random_seed(0)
    return small_cnn(input_shape=(8, 8, 1), num_classes=10, filters=(4,), dense_units=8)


def _images(batch=3):
    return np.random.RandomState(0).rand(batch, 8, 8, 1).astype("float32")


def test_export_round_trips_keras_and_saved_model(tmp_path):
    model = _model()
    images = _images()
    expected = model(images, training=False).numpy()

    paths = export_model(model, str(tmp_path / "out"))

    assert paths == {
        "keras": str(tmp_path / "out" / "model.keras"),
        "saved_model": str(tmp_path / "out" / "saved_model"),
    }
    reloaded = keras.models.load_model(paths["keras"])
    np.testing.assert_allclose(reloaded(images, training=False).numpy(), expected, atol=1e-5)
    # The plain TensorFlow way, without tpukit: the endpoint is named "serve", as keras.Model.export names it.
    # `loaded` must outlive the call: `tf.saved_model.load(path).serve(x)` in one expression frees the variables.
    loaded = tf.saved_model.load(paths["saved_model"])
    served = loaded.serve(tf.constant(images))
    # The variables as Keras' ExportArchive exposes them.
    assert len(loaded.variables) == len(model.variables)
    assert len(loaded.trainable_variables) == len(model.trainable_variables)
    assert len(loaded.non_trainable_variables) == len(model.non_trainable_variables)
    np.testing.assert_allclose(served.numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(
        load_serving(paths["saved_model"])(images).numpy(), expected, atol=1e-5
    )


def test_saved_model_has_serving_default_with_dynamic_batch(tmp_path):
    paths = export_model(_model(), str(tmp_path))
    loaded = tf.saved_model.load(paths["saved_model"])
    assert sorted(loaded.signatures) == ["serve", "serving_default"]
    (spec,) = loaded.signatures["serving_default"].structured_input_signature[1].values()
    assert spec.shape.as_list() == [None, 8, 8, 1] and spec.dtype == tf.float32
    assert load_serving(paths["saved_model"])(_images(batch=5)).shape == (5, 10)


def test_mixed_bfloat16_serves_float32_logits(tmp_path):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")  # conftest resets it
    model = _model()
    images = _images()
    expected = model(images, training=False)
    assert expected.dtype == "float32"  # small_cnn's logits layer is float32 by design

    paths = export_model(model, str(tmp_path))

    served = load_serving(paths["saved_model"])(images)
    assert served.dtype == tf.float32
    np.testing.assert_allclose(served.numpy(), expected.numpy(), atol=1e-5)
    reloaded = keras.models.load_model(paths["keras"])
    assert reloaded.dtype_policy.name == "mixed_bfloat16"
    np.testing.assert_allclose(
        reloaded(images, training=False).numpy(), expected.numpy(), atol=1e-5
    )


def test_bfloat16_outputs_are_cast_to_float32_for_serving(tmp_path):
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))  # no float32 head: outputs bfloat16
    images = np.ones((2, 4), "float32")
    assert model(images).dtype == "bfloat16"

    served = load_serving(export_model(model, str(tmp_path))["saved_model"])(images)

    assert served.dtype == tf.float32
    np.testing.assert_allclose(served.numpy(), model(images).numpy().astype("float32"), atol=1e-5)


def test_io_device_is_passed_to_save_and_load(tmp_path):
    # On a remote TPU Node this is what makes local paths work; here it must at least be accepted end to end.
    model = _model()
    paths = export_model(model, str(tmp_path), io_device="/job:localhost")
    served = load_serving(paths["saved_model"], io_device="/job:localhost")(_images())
    np.testing.assert_allclose(served.numpy(), model(_images(), training=False).numpy(), atol=1e-5)


def test_export_model_built_under_a_strategy(tmp_path, strategy_2):
    with strategy_2.scope():
        model = _model()
    paths = export_model(model, str(tmp_path))
    np.testing.assert_allclose(
        load_serving(paths["saved_model"])(_images()).numpy(),
        model(_images(), training=False).numpy(),
        atol=1e-5,
    )


def test_load_serving_unknown_endpoint_lists_the_available_ones(tmp_path):
    paths = export_model(_model(), str(tmp_path))
    with pytest.raises(ValueError, match=r"endpoint='predict'.*\['serve', 'serving_default'\]"):
        load_serving(paths["saved_model"], endpoint="predict")


def test_subclassed_model_without_inputs_is_refused_before_writing(tmp_path):
    class Bare(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(ValueError, match="no symbolic inputs.*Fix: build it as a functional model"):
        export_model(Bare(), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


class _Resolver:
    def __init__(self, master):
        self._master = master

    def master(self):
        return self._master


class _Strategy:
    def __init__(self, master):
        self.cluster_resolver = _Resolver(master)


@pytest.mark.parametrize(
    "master, expected",
    [
        ("grpc://10.0.0.2:8470", "/job:localhost"),
        (b"grpc://10.0.0.2:8470", "/job:localhost"),
        ("", None),
        ("local", None),
    ],
)
def test_io_device_for_remote_tpu_nodes_only(master, expected):
    assert io_device_for(_Strategy(master)) == expected


def test_io_device_for_gcs_directories_is_not_needed():
    assert io_device_for(_Strategy("grpc://10.0.0.2:8470"), "gs://bucket/run") is None
    assert io_device_for(_Strategy("grpc://10.0.0.2:8470"), "/tmp/run") == "/job:localhost"


def test_io_device_for_strategies_without_a_resolver(strategy_2):
    assert io_device_for(strategy_2) is None
    assert io_device_for(tf.distribute.get_strategy()) is None


def test_a_model_holding_a_lookup_table_exports_through_keras_export_archive(tmp_path):
    # The fast path saves the variables and the endpoint only; a table is a resource outside them, which
    # Keras' ExportArchive tracks: the export falls back to it and serves the same.
    inputs = keras.Input((1,), dtype="string")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c"])(inputs)
    model = keras.Model(inputs, keras.layers.Embedding(4, 2)(ids))
    words = tf.constant([["b"], ["c"], ["z"]])
    expected = model(words).numpy()

    served = load_serving(export_model(model, str(tmp_path))["saved_model"])(words)

    np.testing.assert_allclose(served.numpy(), expected, atol=1e-6)
