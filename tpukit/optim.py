"""Optimizers and learning-rate schedules from a recipe's `train` section."""

from __future__ import annotations

import keras


class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to `peak` over `warmup_steps`, then cosine (or constant) to `total_steps`."""

    def __init__(self, peak: float, warmup_steps: int, total_steps: int, cosine: bool = True):
        self.peak = peak
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.cosine = cosine

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        warmup = keras.ops.maximum(float(self.warmup_steps), 1.0)
        warm = self.peak * keras.ops.minimum(1.0, (step + 1.0) / warmup)
        if not self.cosine:
            return warm if self.warmup_steps else keras.ops.full_like(step, self.peak)
        decay_steps = max(self.total_steps - self.warmup_steps, 1)
        progress = keras.ops.clip((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
        cosine = 0.5 * self.peak * (1.0 + keras.ops.cos(3.141592653589793 * progress))
        return keras.ops.where(step < self.warmup_steps, warm, cosine)

    def get_config(self):
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "total_steps": self.total_steps, "cosine": self.cosine}


def build_optimizer(train, total_steps: int) -> keras.optimizers.Optimizer:
    """The optimizer named by `train.optimizer` with `train.schedule` over `total_steps` steps."""
    if train.schedule == "constant" and not train.warmup_steps:
        learning_rate = train.learning_rate
    else:
        learning_rate = WarmupCosine(train.learning_rate, train.warmup_steps, total_steps, cosine=train.schedule == "cosine")
    if train.optimizer == "adam":
        return keras.optimizers.Adam(learning_rate)
    if train.optimizer == "adamw":
        return keras.optimizers.AdamW(learning_rate, weight_decay=train.weight_decay)
    if train.optimizer == "sgd":
        return keras.optimizers.SGD(learning_rate, momentum=train.momentum, weight_decay=train.weight_decay or None)
    raise ValueError(f"unknown optimizer {train.optimizer!r}")  # recipe validation makes this unreachable
