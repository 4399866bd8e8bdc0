"""Sparse (`tf.IndexedSlices`) gradients with repeated ids, combined before the optimizer sees them.

An `Embedding` gradient on TensorFlow has one slice per occurrence of an id, and Keras 3's sparse-aware optimizer
ops work slice by slice: Adam's `ops.square(gradient)` squares each occurrence before the sum, so a row looked up
twice moves by up to sqrt(2) * lr (tensorflow/tensorflow#28090); Lamb, LARS and `clipnorm` see the same squares.
`combine_repeated_ids` sums each id's slices (`tf.unique` + `unsorted_segment_sum`, as TF1 did) where a sparse
gradient reaches the optimizer: `optimizer.apply` (per replica) and `optimizer.update_step` (after the all-reduce,
which concatenates the replicas' slices). Both are public methods wrapped on the instance: no subclass, so
`get_config`, `model.keras` and checkpoints are unchanged. Under XLA (`dense=True`) the sum becomes a dense
gradient instead: `tf.unique` compiles there only with a bounded dynamic size, and its padded slices slow the
update (docs/performance.md). Read from Keras 3.15.1 (`keras/src/optimizers/adam.py`).

Which variables get sparse gradients is known only where the gradients are: `watch_sparse_gradients` calls back,
when the train step is traced, with the paths of the variables whose gradient is a `tf.IndexedSlices` (an
`Embedding` not tied to an output matmul, a `tf.gather`/`ops.take` of a variable), so that the engine can say the
model trains differently from plain Keras-TF exactly when it does."""

from __future__ import annotations

import functools

import tensorflow as tf

# Marks a method this module wrapped, so that a second call wraps nothing.
_COMBINED = "_tpukit_combines_repeated_ids"
_WATCHED = "_tpukit_watches_sparse_gradients"


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


def sparse_variables(grads, variables=None) -> list[str]:
    """The paths of the variables whose gradient in `grads` (`optimizer.apply`'s arguments) is a
    `tf.IndexedSlices`; positions (`#3`) where the variables were not passed."""
    variables = list(variables) if variables is not None else [None] * len(grads)
    return [
        getattr(variable, "path", None) or f"#{index}"
        for index, (gradient, variable) in enumerate(zip(grads, variables, strict=False))
        if isinstance(gradient, tf.IndexedSlices)
    ]


def watch_sparse_gradients(optimizer, on_sparse):
    """Wraps `optimizer.apply` (the outermost optimizer's: it sees the model's gradients first) so that it calls
    `on_sparse(paths)` with `sparse_variables` of its arguments whenever any gradient is sparse: once per trace of
    the train step (per replica on several), and on every eager step. Idempotent; returns `optimizer`."""
    original = optimizer.apply
    if getattr(original, _WATCHED, False):
        return optimizer

    @functools.wraps(original)
    def watched(grads, *args, **kwargs):
        paths = sparse_variables(grads, args[0] if args else kwargs.get("trainable_variables"))
        if paths:
            on_sparse(paths)
        return original(grads, *args, **kwargs)

    setattr(watched, _WATCHED, True)
    optimizer.apply = watched
    return optimizer
