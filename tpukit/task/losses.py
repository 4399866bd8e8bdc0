"""Losses for integer labels that Keras lacks: sparse categorical cross-entropy with label smoothing.

Keras' `SparseCategoricalCrossentropy` has no `label_smoothing`, and one-hot encoding the labels in the pipeline
would make the host ship `num_classes` (or `vocab_size` per token) floats per example to the TPU.
"""

from __future__ import annotations

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="tpukit")
class SparseCategoricalCrossentropyWithLabelSmoothing(keras.losses.Loss):
    """Cross-entropy of integer labels against `(1 - label_smoothing) * one_hot + label_smoothing / num_classes`.

    Equal to `keras.losses.CategoricalCrossentropy(label_smoothing=...)` on one-hot labels, without building the
    one-hot tensor: `-(1 - s) * log_p[label] - (s / C) * sum(log_p)`. Works for `(B,)` labels with `(B, C)` logits and
    `(B, T)` labels with `(B, T, C)` logits; computes in float32 whatever the logits' dtype.

    Args:
        label_smoothing: in [0, 1); 0 is plain sparse categorical cross-entropy.
        from_logits: True when `y_pred` are logits (tpukit models return logits), False for probabilities.
        reduction: a Keras reduction ("sum_over_batch_size", "mean_with_sample_weight", "sum", None, ...).
        name: the loss name.
        dtype: the loss dtype; float32 by default so bfloat16 logits are upcast.
    """

    def __init__(
        self,
        label_smoothing: float = 0.1,
        from_logits: bool = True,
        reduction="sum_over_batch_size",
        name: str = "sparse_categorical_crossentropy_with_label_smoothing",
        dtype=None,
    ):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"label_smoothing must be in [0, 1); received label_smoothing={label_smoothing}. Fix: e.g. 0.1."
            )
        super().__init__(name=name, reduction=reduction, dtype=dtype or "float32")
        self.label_smoothing = float(label_smoothing)
        self.from_logits = from_logits

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")
        labels = ops.cast(y_true, "int32")
        if len(labels.shape) == len(
            y_pred.shape
        ):  # (B, 1) or (B, T, 1) labels, as Keras also accepts
            labels = ops.squeeze(labels, axis=-1)
        if self.from_logits:
            log_probs = ops.log_softmax(y_pred, axis=-1)
        else:
            probs = y_pred / ops.sum(y_pred, axis=-1, keepdims=True)
            log_probs = ops.log(
                ops.clip(probs, keras.config.epsilon(), 1.0 - keras.config.epsilon())
            )
        label_log_prob = ops.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
        uniform = ops.mean(log_probs, axis=-1)  # sum(log_p) / C
        return -(1.0 - self.label_smoothing) * label_log_prob - self.label_smoothing * uniform

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "from_logits": self.from_logits})
        return config


@keras.saving.register_keras_serializable(package="tpukit")
class WeightedLoss(keras.metrics.Mean):
    """A training loss averaged over examples by their sample weights: exact where Keras' own is not.

    Keras' own `loss` metric weights every batch by its size, so the zero-weight examples that complete the last
    eval batch pull it down; this one is exact. `loss` is any Keras loss (its `call` gives per-example values) or a
    `fn(y_true, y_pred)` returning them; without one it is the sparse cross-entropy with `label_smoothing` (the
    form tpukit 0.x saved, so its `model.keras` files still load). `callbacks.ExactValidationLoss` and the engine's
    `evaluate` report it as `val_loss` / `loss`. Regularization terms (`model.losses`) are not included.
    """

    def __init__(
        self, loss=None, label_smoothing: float = 0.0, name: str = "weighted_loss", dtype=None
    ):
        super().__init__(name=name, dtype=dtype)
        self.label_smoothing = float(label_smoothing)
        if isinstance(loss, dict):
            loss = keras.saving.deserialize_keras_object(loss)
        if loss is None:
            loss = SparseCategoricalCrossentropyWithLabelSmoothing(label_smoothing, reduction=None)
        self.loss = loss

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = keras.tree.map_structure(lambda t: ops.cast(t, "float32"), y_pred)
        # A Loss object's `call` gives the per-example values; a loss function (keras.losses.mse, your own) does.
        call = self.loss.call if isinstance(self.loss, keras.losses.Loss) else self.loss
        return super().update_state(call(y_true, y_pred), sample_weight=sample_weight)

    def get_config(self):
        return {
            **super().get_config(),
            "loss": keras.saving.serialize_keras_object(self.loss),
            "label_smoothing": self.label_smoothing,
        }
