"""The pieces of `jit_compile: auto` on a CPU that touch Keras' internals (keras_private): every nested layer's
class is seen, and the choice lands in the compile config `model.keras` keeps."""

import json
import zipfile

import keras

from tpukit.engines.keras import keras_private
from tpukit.models.layers import SelfAttention


class _Block(keras.layers.Layer):
    """Holds its attention as an attribute: `model.layers` does not list it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = SelfAttention(num_heads=2)

    def call(self, x):
        return self.attention(x)


def test_layer_classes_sees_layers_nested_as_attributes():
    inputs = keras.Input((4, 8))
    model = keras.Model(inputs, keras.layers.Dense(2)(_Block()(inputs)))
    assert SelfAttention not in {type(layer) for layer in model.layers}
    classes = keras_private.layer_classes(model)
    assert {SelfAttention, _Block, keras.layers.Dense} <= classes
    # SelfAttention's own Dense and Dropout sublayers too
    assert keras.layers.Dropout in classes


def test_record_jit_compile_is_what_model_keras_keeps(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    model.jit_compile = True
    keras_private.record_jit_compile(model, True)
    model.save(tmp_path / "m.keras")
    with zipfile.ZipFile(tmp_path / "m.keras") as saved:
        assert json.loads(saved.read("config.json"))["compile_config"]["jit_compile"] is True
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.jit_compile is True
