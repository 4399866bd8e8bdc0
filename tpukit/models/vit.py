"""Vision Transformer (ViT) image classifier built from the shared `TransformerBlock`."""

from __future__ import annotations

from typing import Literal

import keras
from keras import layers, ops

from tpukit.models.layers import ClassToken, PositionEmbedding, TransformerBlock


def vit(
    input_shape: tuple[int, ...] = (32, 32, 3),
    num_classes: int = 10,
    patch_size: int = 4,
    num_layers: int = 6,
    hidden_dim: int = 192,
    num_heads: int = 3,
    mlp_dim: int = 768,
    dropout: float = 0.0,
    pooling: Literal["class_token", "mean"] = "class_token",
) -> keras.Model:
    """ViT: non-overlapping patches embedded by a strided Conv2D, transformer blocks, pooled, float32 logits.

    Args:
        input_shape: `(height, width, channels)`; height and width must divide by `patch_size`.
        num_classes: number of output logits.
        patch_size: side of the square patches (and the stride of the patch embedding).
        num_layers: transformer blocks.
        hidden_dim: width of the residual stream; must divide by `num_heads`.
        num_heads: attention heads.
        mlp_dim: hidden width of each block's MLP.
        dropout: dropout after the embeddings, attention and MLP.
        pooling: "class_token" prepends a learned token and classifies from it (the original ViT); "mean"
            averages the patch tokens (big_vision's `gap`, often better for small data).
    """
    if len(input_shape) != 3:
        raise ValueError(
            f"vit: input_shape must be (height, width, channels); received input_shape={input_shape!r}."
        )
    height, width, _ = input_shape
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"vit: the image side must divide by patch_size; received input_shape={tuple(input_shape)}, "
            f"patch_size={patch_size}. Fix: resize the images in the pipeline or pick a divisor as patch_size."
        )
    if num_heads < 1 or hidden_dim % num_heads:
        raise ValueError(
            f"vit: hidden_dim must divide by num_heads; received hidden_dim={hidden_dim}, num_heads={num_heads}."
        )
    patches = (height // patch_size) * (width // patch_size)
    images = keras.Input(shape=tuple(input_shape), name="image")
    x = layers.Conv2D(
        hidden_dim, patch_size, strides=patch_size, padding="valid", name="patch_embedding"
    )(images)
    x = layers.Reshape((patches, hidden_dim), name="patch_tokens")(x)
    if pooling == "class_token":
        x = ClassToken(name="class_token")(x)
    x = PositionEmbedding(x.shape[1], name="position_embedding")(x)
    x = layers.Dropout(dropout, name="embedding_dropout")(x)
    for i in range(num_layers):
        x = TransformerBlock(num_heads, mlp_dim, dropout=dropout, name=f"block{i}")(x)
    x = layers.LayerNormalization(epsilon=1e-6, dtype="float32", name="final_norm")(x)
    pooled = x[:, 0] if pooling == "class_token" else ops.mean(x, axis=1)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(pooled)
    return keras.Model(images, logits, name="vit")
