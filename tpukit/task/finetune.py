"""Fine-tuning a built model: start from weights, freeze layers by name, LoRA (issue 18, item 4).

PLACEHOLDER being implemented.
"""

from __future__ import annotations


def prepare(model, config, resuming: bool, path: str = "<dict>"):
    """Applies `config.init_weights` (not when `resuming`), `config.freeze` and `config.lora_rank` to `model`."""
    return model
