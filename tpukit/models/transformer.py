"""Text transformers: an encoder classifier and a decoder-only causal language model.

Both are token embedding + learned position embedding + `num_layers` shared `TransformerBlock`s + a final
LayerNorm, and differ only in the attention mask and the head. Inputs are int token ids of the static shape
`(batch, sequence_length)`; padding and truncation happen in the tf.data pipeline, not here.
"""

from __future__ import annotations

from typing import Literal

import keras
from keras import layers, ops

from tpukit.models.layers import PositionEmbedding, TransformerBlock


def _check_dims(builder: str, hidden_dim: int, num_heads: int) -> None:
    if num_heads < 1 or hidden_dim % num_heads:
        raise ValueError(
            f"{builder}: hidden_dim must divide by num_heads; received hidden_dim={hidden_dim}, num_heads={num_heads}. "
            "Fix: pick num_heads among the divisors of hidden_dim (e.g. hidden_dim=256, num_heads=4)."
        )


def _encoder(
    token_ids,
    *,
    vocab_size,
    sequence_length,
    num_layers,
    hidden_dim,
    num_heads,
    mlp_dim,
    dropout,
    causal,
    padding_mask,
):
    x = layers.Embedding(vocab_size, hidden_dim, name="token_embedding")(token_ids)
    x = PositionEmbedding(sequence_length, name="position_embedding")(x)
    x = layers.Dropout(dropout, name="embedding_dropout")(x)
    for i in range(num_layers):
        block = TransformerBlock(
            num_heads, mlp_dim, dropout=dropout, causal=causal, name=f"block{i}"
        )
        x = block(x, padding_mask=padding_mask)
    return layers.LayerNormalization(epsilon=1e-6, dtype="float32", name="final_norm")(x)


def transformer_classifier(
    vocab_size: int,
    sequence_length: int,
    num_classes: int = 2,
    num_layers: int = 2,
    hidden_dim: int = 128,
    num_heads: int = 4,
    mlp_dim: int = 512,
    dropout: float = 0.1,
    pooling: Literal["mean", "first"] = "mean",
    pad_token_id: int | None = 0,
) -> keras.Model:
    """An encoder text classifier: `(batch, sequence_length)` int token ids in, `(batch, num_classes)` float32 logits out.

    Args:
        vocab_size: token ids are in `[0, vocab_size)`.
        sequence_length: the static sequence length of the inputs.
        num_classes: number of output logits.
        num_layers: transformer blocks.
        hidden_dim: width of the residual stream; must divide by `num_heads`.
        num_heads: attention heads.
        mlp_dim: hidden width of each block's MLP.
        dropout: dropout after the embeddings, attention and MLP.
        pooling: "mean" averages the real (non-padding) tokens; "first" takes position 0 (a `[CLS]` token the
            tokenizer put there).
        pad_token_id: the padding id: padded positions receive no attention and are left out of the mean.
            null: every position is a real token.
    """
    _check_dims("transformer_classifier", hidden_dim, num_heads)
    token_ids = keras.Input(shape=(sequence_length,), dtype="int32", name="token_ids")
    padding_mask = None if pad_token_id is None else ops.not_equal(token_ids, pad_token_id)
    x = _encoder(
        token_ids,
        vocab_size=vocab_size,
        sequence_length=sequence_length,
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        dropout=dropout,
        causal=False,
        padding_mask=padding_mask,
    )
    if pooling == "first":
        pooled = x[:, 0]
    elif padding_mask is None:
        pooled = ops.mean(x, axis=1)
    else:
        weights = ops.cast(padding_mask, "float32")[..., None]
        # max(count, 1): an all-padding row pools to zeros instead of NaN.
        pooled = ops.sum(x * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)
    logits = layers.Dense(num_classes, dtype="float32", name="logits")(pooled)
    return keras.Model(token_ids, logits, name="transformer_classifier")


def causal_lm(
    vocab_size: int,
    sequence_length: int,
    num_layers: int = 2,
    hidden_dim: int = 128,
    num_heads: int = 4,
    mlp_dim: int = 512,
    dropout: float = 0.0,
) -> keras.Model:
    """A decoder-only (GPT-style) language model: `(batch, sequence_length)` int token ids in, float32 next-token
    logits `(batch, sequence_length, vocab_size)` out.

    Position t only attends to positions <= t, so the logits at t predict token t + 1; the pipeline supplies the
    shifted targets. Sequences are packed to the full length, so there is no padding mask.

    Args:
        vocab_size: token ids are in `[0, vocab_size)`; also the number of logits per position.
        sequence_length: the static sequence length of the inputs.
        num_layers: transformer blocks.
        hidden_dim: width of the residual stream; must divide by `num_heads`.
        num_heads: attention heads.
        mlp_dim: hidden width of each block's MLP.
        dropout: dropout after the embeddings, attention and MLP.
    """
    _check_dims("causal_lm", hidden_dim, num_heads)
    token_ids = keras.Input(shape=(sequence_length,), dtype="int32", name="token_ids")
    x = _encoder(
        token_ids,
        vocab_size=vocab_size,
        sequence_length=sequence_length,
        num_layers=num_layers,
        hidden_dim=hidden_dim,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        dropout=dropout,
        causal=True,
        padding_mask=None,
    )
    logits = layers.Dense(vocab_size, dtype="float32", name="logits")(x)
    return keras.Model(token_ids, logits, name="causal_lm")
