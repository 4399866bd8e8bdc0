"""Keras 3 model builders: plain keyword arguments in, an uncompiled `keras.Model` (float32 logits) out.

Model code never sees a strategy, a device or a recipe: build it under whatever `strategy.scope()` you train with.
"""

from tpukit import compat as _compat  # noqa: F401  (sets the Keras backend before Keras loads)
from tpukit.models.cnn import small_cnn

# Builders a recipe's `model.name` may name; their keyword arguments are the recipe's `model` keys.
MODELS = {
    "small_cnn": small_cnn,
}

__all__ = ["MODELS", "small_cnn"]
