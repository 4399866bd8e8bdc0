"""Sparse (`tf.IndexedSlices`) gradients with repeated ids, combined before the optimizer sees them.

PLACEHOLDER being implemented (issue 18, item 6): `combine_repeated_ids(optimizer)` must make Keras' TensorFlow
optimizers apply one summed gradient per embedding row (tensorflow/tensorflow#28090).
"""

from __future__ import annotations


def combine_repeated_ids(optimizer):
    """Returns `optimizer`, made to sum the gradient slices of repeated ids before each update."""
    return optimizer
