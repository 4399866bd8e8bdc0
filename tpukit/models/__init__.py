"""Keras 3 model builders: plain keyword arguments in, an uncompiled `keras.Model` (float32 logits) out.

Model code never sees a strategy, a device or a recipe: build it under whatever `strategy.scope()` you train with.
"""

from tpukit.environment import backend as _backend

_backend.use_default()  # before anything below imports Keras or TensorFlow

from tpukit.models.cnn import small_cnn
from tpukit.models.hub import keras_hub_causal_lm
from tpukit.models.recommender import dcn_ranking
from tpukit.models.resnet import resnet50, resnet_cifar
from tpukit.models.transformer import causal_lm, transformer_classifier
from tpukit.models.vit import vit

# Builders a recipe's `model.name` may name; their keyword arguments are the recipe's `model` keys.
MODELS = {
    "small_cnn": small_cnn,
    "resnet_cifar": resnet_cifar,
    "resnet50": resnet50,
    "transformer_classifier": transformer_classifier,
    "causal_lm": causal_lm,
    "vit": vit,
    "dcn_ranking": dcn_ranking,
    "keras_hub_causal_lm": keras_hub_causal_lm,
}

__all__ = [
    "MODELS",
    "causal_lm",
    "dcn_ranking",
    "keras_hub_causal_lm",
    "resnet50",
    "resnet_cifar",
    "small_cnn",
    "transformer_classifier",
    "vit",
]
