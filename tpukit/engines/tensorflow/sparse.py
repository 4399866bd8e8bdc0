"""Sparse (`tf.IndexedSlices`) gradients with repeated ids, combined before the optimizer sees them.

The gradient of an `Embedding` lookup on TensorFlow is a `tf.IndexedSlices` with one slice per occurrence of an
id in the batch. Keras 3's optimizers compute on it with sparse-aware ops that work slice by slice: Adam's
`ops.square(gradient)` (keras/src/optimizers/adam.py line 125; `elementwise_unary`,
keras/src/backend/tensorflow/sparse.py line 348) squares each occurrence before the sum, so the second moment of
a row looked up twice holds g1^2 + g2^2 instead of (g1 + g2)^2 and the row moves by up to sqrt(2) * lr in the
first step (tensorflow/tensorflow#28090). Lamb's second moment (keras/src/optimizers/lamb.py line 112), LARS'
gradient norm and `clipnorm` see the same per-occurrence squares. JAX, and TensorFlow with a dense gradient,
apply the optimizer to the summed gradient, as its definition says.

`combine_repeated_ids` sums the slices of each id (as TF1's `_deduplicate_indexed_slices` did: `tf.unique` and
`tf.math.unsorted_segment_sum`) at both places a sparse gradient reaches the optimizer:

* `optimizer.apply` (one replica's gradients, before clipping and the cross-replica all-reduce), and
* `optimizer.update_step` (one variable's gradient after the all-reduce; an all-reduce of `tf.IndexedSlices`
  concatenates the replicas' slices, `TFOptimizer._backend_update_step` in
  keras/src/backend/tensorflow/optimizer.py lines 113-125, so an id looked up on two replicas repeats again).

Every element-wise op Keras keeps sparse maps 0 to 0 (ops that do not are `densifying_unary`), so an optimizer
fed one slice per id computes what it computes on the dense gradient, while sparse-friendly updates (plain SGD)
stay scatters. Both are public methods wrapped on the instance (no subclass, so `get_config`, `model.keras` and
checkpoints are unchanged). Keras 3.15.1 line numbers; no private name is touched.

Under XLA (`dense=True`: `jit_compile`, or a TPU, where the step is compiled whole) the sum goes into a dense
gradient of the table's shape instead (`tf.convert_to_tensor`, an `unsorted_segment_sum` over the ids). `tf.unique`
compiles there only with a bounded dynamic size, and the padded slices made the optimizer's update slow: on a 2-core
x86 CPU (TF 2.21, Keras 3.15, Adam, XLA) keras-io's text classification transformer (20,000 x 32 table, 6,400 ids
per batch) took 128 ms per step with `tf.unique` against 14 ms dense or uncombined, and a causal LM (256 x 128
table, 4,096 ids) 53 ms against 50 ms (`benchmarks/vs_keras.py` rows). Adam's moments are updated densely either way
(`ops.subtract(gradient, m)` densifies); only plain SGD's scatter becomes a whole-table update. Not measured on a
TPU.
"""

from __future__ import annotations

import functools

import tensorflow as tf

# Marks a method this module wrapped, so that a second call wraps nothing.
_COMBINED = "_tpukit_combines_repeated_ids"


def combined_slices(gradient, dense: bool = False):
    """`gradient` with one slice per distinct index (the sum of its slices) if it is a `tf.IndexedSlices`, or
    with `dense` the dense gradient those sums make; anything else (a dense tensor, None) as it is."""
    if not isinstance(gradient, tf.IndexedSlices):
        return gradient
    if dense:
        return tf.convert_to_tensor(gradient)
    ids, position = tf.unique(gradient.indices)
    values = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(ids)[0])
    return tf.IndexedSlices(values, ids, gradient.dense_shape)


def _optimizers(optimizer):
    """`optimizer` and the optimizers it wraps (`LossScaleOptimizer.inner_optimizer`), outermost first."""
    while optimizer is not None:
        yield optimizer
        optimizer = getattr(optimizer, "inner_optimizer", None)


def _wrap(optimizer, method: str, combine) -> None:
    """Wraps `optimizer.<method>` on the instance so that its first argument goes through `combine` first."""
    original = getattr(optimizer, method)
    if getattr(original, _COMBINED, False):
        return

    @functools.wraps(original)
    def combined(first, *args, **kwargs):
        return original(combine(first), *args, **kwargs)

    setattr(combined, _COMBINED, True)
    setattr(optimizer, method, combined)


def combine_repeated_ids(optimizer, dense: bool = False):
    """Makes `optimizer` (and the optimizer a `LossScaleOptimizer` wraps) sum the gradient slices of repeated ids
    before each update; returns it.

    Idempotent (a second call wraps nothing, whatever its `dense`), and a no-op for dense gradients. The methods
    are wrapped on this instance only: an optimizer rebuilt from its config (a loaded `model.keras`) needs the call
    again.

    Args:
        optimizer: a Keras 3 optimizer on the TensorFlow backend (any class, built or not).
        dense: sum into a dense gradient (for a step compiled with XLA; see the module's docstring).

    Returns:
        `optimizer` itself.
    """
    for each in _optimizers(optimizer):
        _wrap(
            each, "apply", lambda grads: [combined_slices(g, dense) for g in grads]
        )  # one replica's gradients
        _wrap(
            each, "update_step", lambda g: combined_slices(g, dense)
        )  # one variable's, after the all-reduce
    return optimizer
