"""A small convnet for MNIST/digits-sized images. Plain keyword arguments in, an uncompiled keras.Model out."""

from __future__ import annotations

import keras
from keras import layers


def small_cnn(
    input_shape: tuple[int, ...] = (28, 28, 1),
    num_classes: int = 10,
    filters: tuple[int, ...] = (32, 64),
    dense_units: int = 128,
    dropout: float = 0.25,
) -> keras.Model:
    """Conv-conv-pool blocks (one per entry of `filters`), a dense layer, and float32 logits.

    The logits layer is float32 even under `mixed_bfloat16`, so the softmax and loss stay in float32.
    """
    if not filters:
        raise ValueError(
            f"small_cnn: filters must name at least one block; received filters={filters!r}."
        )
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = inputs
    for i, width in enumerate(filters):
        x = layers.Conv2D(width, 3, padding="same", activation="relu", name=f"block{i}_conv1")(x)
        x = layers.Conv2D(width, 3, padding="same", activation="relu", name=f"block{i}_conv2")(x)
        if x.shape[1] >= 2 and x.shape[2] >= 2:
            x = layers.MaxPooling2D(2, name=f"block{i}_pool")(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(dense_units, activation="relu", name="dense")(x)
    x = layers.Dropout(dropout, name="dropout")(x)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="small_cnn")
