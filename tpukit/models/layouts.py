"""Default weight layouts of the built-in models for the jax engine's `model` mesh axis (`runtime.mesh.model`).

Data: {model name: {regex matched whole against a variable's path: one axis name or None per dimension}}.
Megatron-style tensor parallelism (Shoeybi et al. 2019; the layout Keras' distribution guide and KerasHub's
`get_layout_map` use): a transformer block's first matmul of each pair (attention `qkv`, `mlp_in`) splits its output
columns on `model` and the second (`output`, `mlp_out`) its input rows, so the activations between them stay split;
embeddings split the hidden dimension; convolutions split their output channels. Norms, biases of the row-split
layers and classifier heads (their class counts rarely divide by the axis) stay replicated. `tpukit.planner.layouts`
checks every entry against the model and every split dimension against the axis before anything trains.
"""

from __future__ import annotations

import math

_TRANSFORMER = {
    r"(.*/)?token_embedding/embeddings": (None, "model"),
    r"(.*/)?position_embedding/position_embeddings": (None, "model"),
    r".*attention/qkv/kernel": (None, "model"),
    r".*attention/qkv/bias": ("model",),
    r".*attention/output/kernel": ("model", None),
    r".*mlp_in/kernel": (None, "model"),
    r".*mlp_in/bias": ("model",),
    r".*mlp_out/kernel": ("model", None),
}

DEFAULT_LAYOUTS: dict[str, dict[str, tuple[str | None, ...]]] = {
    # The language model's head is as wide as the vocabulary: split it too (256 and 32768 divide by 2, 4 and 8).
    "causal_lm": {
        **_TRANSFORMER,
        r"(.*/)?logits/kernel": (None, "model"),
        r"(.*/)?logits/bias": ("model",),
    },
    "transformer_classifier": dict(_TRANSFORMER),
    "vit": {
        **{k: v for k, v in _TRANSFORMER.items() if "token_embedding" not in k},
        r"(.*/)?patch_embedding/kernel": (None, None, None, "model"),
        r"(.*/)?patch_embedding/bias": ("model",),
    },
    "small_cnn": {
        r"(.*/)?block\d+_conv\d+/kernel": (None, None, None, "model"),
        r"(.*/)?dense/kernel": (None, "model"),
    },
    "resnet_cifar": {r".*conv\d*/kernel": (None, None, None, "model")},
    "resnet50": {r".*conv\d*/kernel": (None, None, None, "model")},
    # Recommenders: the tables are most of the weights; split each by rows (ids), as SparseCore shards them. The
    # builder pads every table to a multiple of the axis (`vocabulary_multiple`, set by tpukit.task).
    "dcn_ranking": {r"embedding/[^/]+/embeddings": ("model", None)},
}


# tpukit's layout for a KerasHub causal LM whose family has no `get_layout_map` (Gemma3, Mistral, GPT-2, ...):
# the rules KerasHub's own maps give Gemma (`decoder_block*`) and Llama/Qwen (`transformer_layer*`), by the names
# KerasHub's decoder blocks give their layers, as the FSDP-like Gemma map does (Gemma paper, arXiv:2403.08295):
#   - token embedding (vocabulary, hidden): vocabulary on `model`, hidden on `data`;
#   - attention query/key/value kernels (3 dimensions: heads, hidden, head_dim for Gemma's blocks; hidden, heads,
#     head_dim for the others): the first on `model`, the second on `data`;
#   - attention output kernel (heads, head_dim, hidden): heads on `model`, hidden on `data`;
#   - feed-forward kernels: gate/intermediate (hidden, intermediate) on (`data`, `model`), output
#     (intermediate, hidden) on (`model`, `data`).
# Norms, biases and LoRA adapters stay whole. The engine applies it leniently (`Layouts(lenient=True)`): a dimension
# its axis does not divide (2 key/value heads on a model axis of 4), an entry of another rank than a family's
# variables (a fused 2-D query_key_value) or one that matches nothing leaves those whole, with a plan line.
KERAS_HUB_DECODER: dict[str, tuple[str | None, ...]] = {
    r"(.*/)?token_embedding/embeddings": ("model", "data"),
    r".*(decoder_block|transformer_layer).*attention.*/(query|key|value)/kernel": (
        "model",
        "data",
        None,
    ),
    r".*(decoder_block|transformer_layer).*/attention_output/kernel": ("model", None, "data"),
    r".*decoder_block.*/ffw_gating(_2)?/kernel": ("data", "model"),
    r".*decoder_block.*/ffw_linear/kernel": ("model", "data"),
    r".*transformer_layer.*/feedforward_(gate|intermediate)_dense/kernel": ("data", "model"),
    r".*transformer_layer.*/feedforward_output_dense/kernel": ("model", "data"),
}


def placeholder_mesh(shape: tuple[int, ...], axis_names: list[str]):
    """A `keras.distribution.DeviceMesh` of `shape` whose devices are placeholders: what a layout builder
    (KerasHub's `get_layout_map`) is called with before any device is known; it reads only the axis names."""
    import keras
    import numpy as np

    count = math.prod(shape)
    return keras.distribution.DeviceMesh(
        shape, axis_names, devices=np.array([f"device{i}" for i in range(count)])
    )
