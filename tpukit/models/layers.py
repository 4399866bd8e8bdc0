"""Transformer layers shared by every transformer model in tpukit (text classifier, causal LM, ViT).

One block implementation, so a fix or a speed-up lands in all three models. Everything here is written for
`mixed_bfloat16` on TPU: variables stay float32 (Keras policy), the matmuls run in the compute dtype, and the
numerically fragile parts (attention softmax, LayerNorm) run in float32. Shapes are static: the sequence length
comes from the input's static shape, which XLA needs anyway.
"""

from __future__ import annotations

import keras
from keras import layers, ops

# The float32 logit given to masked keys: it zeroes their probability, and being finite (not -inf) it turns a
# fully masked row (an all-padding example) into a uniform softmax instead of NaN.
_MASK_VALUE = -1e9


@keras.saving.register_keras_serializable(package="tpukit")
class PositionEmbedding(layers.Layer):
    """Adds a learned embedding per position to a `(batch, sequence_length, hidden_dim)` input.

    Args:
        sequence_length: the static number of positions; inputs must have exactly this length.
        initializer_stddev: standard deviation of the normal initializer.
        **kwargs: standard `keras.layers.Layer` arguments (`name`, `dtype`, ...).
    """

    def __init__(self, sequence_length: int, initializer_stddev: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        if sequence_length < 1:
            raise ValueError(
                f"PositionEmbedding: sequence_length must be >= 1; received sequence_length={sequence_length}."
            )
        self.sequence_length = sequence_length
        self.initializer_stddev = initializer_stddev

    def build(self, input_shape):
        if input_shape[1] is not None and input_shape[1] != self.sequence_length:
            raise ValueError(
                f"PositionEmbedding: inputs have {input_shape[1]} positions but sequence_length="
                f"{self.sequence_length}. Fix: make the model's sequence_length match the data."
            )
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.sequence_length, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=self.initializer_stddev),
        )

    def call(self, inputs):
        return inputs + ops.cast(self.position_embeddings, inputs.dtype)[None]

    def get_config(self):
        config = super().get_config()
        config.update(
            {"sequence_length": self.sequence_length, "initializer_stddev": self.initializer_stddev}
        )
        return config


@keras.saving.register_keras_serializable(package="tpukit")
class ClassToken(layers.Layer):
    """Prepends one learned token to a `(batch, tokens, hidden_dim)` sequence (ViT's `[CLS]`).

    Args:
        **kwargs: standard `keras.layers.Layer` arguments.
    """

    def build(self, input_shape):
        self.class_token = self.add_weight(
            name="class_token", shape=(1, 1, input_shape[-1]), initializer="zeros"
        )

    def call(self, inputs):
        token = ops.cast(self.class_token, inputs.dtype)
        token = ops.broadcast_to(token, (ops.shape(inputs)[0], 1, ops.shape(inputs)[-1]))
        return ops.concatenate([token, inputs], axis=1)

    def compute_output_shape(self, input_shape):
        tokens = None if input_shape[1] is None else input_shape[1] + 1
        return (input_shape[0], tokens, input_shape[2])


@keras.saving.register_keras_serializable(package="tpukit")
class SelfAttention(layers.Layer):
    """Multi-head self-attention with the softmax in float32 and an optional causal and padding mask.

    Written out (rather than `keras.layers.MultiHeadAttention`) so the dtype of every step is explicit: under
    `mixed_bfloat16` the projections run in bfloat16 and the logits are upcast to float32 for the mask and softmax.

    Args:
        num_heads: attention heads; `hidden_dim` (the input's last axis) must divide by it.
        causal: if True, position i attends only to positions <= i (decoder-only language models).
        dropout: dropout rate on the attention probabilities.
        **kwargs: standard `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, sequence_length, hidden_dim)`.
        padding_mask: optional `(batch, sequence_length)` boolean, True for real tokens; padded keys get no
            attention.
        training: enables dropout.
    """

    def __init__(self, num_heads: int, causal: bool = False, dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.causal = causal
        self.dropout = dropout
        self.dropout_layer = layers.Dropout(dropout, name="attention_dropout")

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"SelfAttention: hidden_dim must divide by num_heads; received hidden_dim={hidden_dim}, "
                f"num_heads={self.num_heads}. Fix: pick num_heads among the divisors of hidden_dim."
            )
        self.head_dim = hidden_dim // self.num_heads
        # One fused projection for q, k and v: one large matmul is faster on the TPU's matrix unit than three.
        self.qkv = layers.Dense(3 * hidden_dim, name="qkv", dtype=self.dtype_policy)
        self.qkv.build(input_shape)
        self.output_dense = layers.Dense(hidden_dim, name="output", dtype=self.dtype_policy)
        self.output_dense.build(input_shape)

    def call(self, inputs, padding_mask=None, training=None):
        length = inputs.shape[1]
        qkv = ops.reshape(self.qkv(inputs), (-1, length, 3, self.num_heads, self.head_dim))
        query, key, value = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        query = query * ops.cast(self.head_dim**-0.5, query.dtype)
        logits = ops.cast(ops.einsum("bqhd,bkhd->bhqk", query, key), "float32")
        allowed = None
        if self.causal:
            allowed = ops.tril(ops.ones((length, length), dtype="bool"))[None, None]
        if padding_mask is not None:
            keys = ops.cast(padding_mask, "bool")[:, None, None, :]
            allowed = keys if allowed is None else ops.logical_and(allowed, keys)
        if allowed is not None:
            logits = ops.where(allowed, logits, _MASK_VALUE)
        probs = ops.softmax(logits, axis=-1)
        probs = self.dropout_layer(ops.cast(probs, value.dtype), training=training)
        context = ops.einsum("bhqk,bkhd->bqhd", probs, value)
        context = ops.reshape(context, (-1, length, self.num_heads * self.head_dim))
        return self.output_dense(context)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"num_heads": self.num_heads, "causal": self.causal, "dropout": self.dropout})
        return config


@keras.saving.register_keras_serializable(package="tpukit")
class TransformerBlock(layers.Layer):
    """A pre-LayerNorm transformer block: `x + attention(ln(x))`, then `x + mlp(ln(x))`.

    Pre-LN (as in GPT-2 and ViT) trains stably at the large learning rates of big-batch TPU runs without a long
    warmup. The LayerNorms run in float32 under any mixed policy.

    Args:
        num_heads: attention heads.
        mlp_dim: width of the hidden layer of the MLP.
        dropout: dropout rate after the attention and after the MLP.
        attention_dropout: dropout rate on the attention probabilities.
        causal: causal self-attention (decoder-only language models).
        layer_norm_epsilon: epsilon of both LayerNorms.
        activation: the MLP activation, a `keras.activations` name.
        **kwargs: standard `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, sequence_length, hidden_dim)`.
        padding_mask: optional `(batch, sequence_length)` boolean, True for real tokens.
        training: enables dropout.
    """

    def __init__(
        self,
        num_heads: int,
        mlp_dim: int,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        causal: bool = False,
        layer_norm_epsilon: float = 1e-6,
        activation: str = "gelu",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.causal = causal
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = activation

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        self.attention_norm = layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype="float32", name="attention_norm"
        )
        self.attention_norm.build(input_shape)
        self.attention = SelfAttention(
            self.num_heads,
            causal=self.causal,
            dropout=self.attention_dropout,
            dtype=self.dtype_policy,
            name="attention",
        )
        self.attention.build(input_shape)
        self.mlp_norm = layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype="float32", name="mlp_norm"
        )
        self.mlp_norm.build(input_shape)
        self.mlp_in = layers.Dense(
            self.mlp_dim, activation=self.activation, dtype=self.dtype_policy, name="mlp_in"
        )
        self.mlp_in.build(input_shape)
        self.mlp_out = layers.Dense(hidden_dim, dtype=self.dtype_policy, name="mlp_out")
        self.mlp_out.build(tuple(input_shape[:-1]) + (self.mlp_dim,))
        self.attention_output_dropout = layers.Dropout(
            self.dropout, name="attention_output_dropout"
        )
        self.mlp_output_dropout = layers.Dropout(self.dropout, name="mlp_output_dropout")

    def call(self, inputs, padding_mask=None, training=None):
        # The float32 LayerNorm output is cast back so the residual stream keeps the compute dtype.
        normed = ops.cast(self.attention_norm(inputs), self.compute_dtype)
        attended = self.attention(normed, padding_mask=padding_mask, training=training)
        x = inputs + self.attention_output_dropout(attended, training=training)
        normed = ops.cast(self.mlp_norm(x), self.compute_dtype)
        mlp = self.mlp_out(self.mlp_in(normed))
        return x + self.mlp_output_dropout(mlp, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "causal": self.causal,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "activation": self.activation,
            }
        )
        return config
