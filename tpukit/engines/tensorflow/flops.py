"""The TensorFlow engine's FLOP count: training FLOPs per example from the traced forward pass, counted with
TensorFlow's profiler (matrix operations only, x3 for the backward pass; `tpukit.engines.keras.flops` says why and
holds the peaks and MFU both engines share)."""

from __future__ import annotations

import logging
import math

from tpukit.engines.tensorflow import keras_private

logger = logging.getLogger("tpukit")

# The matrix operations counted by `model_flops_per_example` with TensorFlow's flops registry. Einsum has no
# registry entry (Keras' EinsumDense and MultiHeadAttention emit it), so it is counted here (`_einsum_flops`).
_MATRIX_OP_TYPES = (
    "MatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Conv2D",
    "Conv3D",
    "DepthwiseConv2dNative",
    "Conv2DBackpropInput",
)
# Ops whose bodies live in other functions, which the profiler does not descend into: a graph with them would be
# undercounted, so it is not counted at all.
_NESTED_OP_TYPES = (
    "While",
    "StatelessWhile",
    "If",
    "StatelessIf",
    "Case",
    "StatelessCase",
    "PartitionedCall",
    "StatefulPartitionedCall",
)

# Forward + backward: the backward pass does two matmuls (input and weight gradients) per forward matmul.
TRAINING_FLOPS_PER_FORWARD_FLOP = 3


def _input_signature(model):
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ValueError(
            f"model {getattr(model, 'name', model)!r} has no symbolic inputs (a subclassed model never called on "
            "a keras.Input); build it as a functional model to count its FLOPs."
        )
    specs = []
    for tensor in inputs:
        shape = tuple(tensor.shape[1:])
        if any(dim is None for dim in shape):
            raise ValueError(
                f"input {tensor.name!r} has a dynamic shape (None, {', '.join(str(d) for d in shape)}); the FLOPs "
                "of a dynamic shape are unknown. Give the model static input shapes."
            )
        specs.append(tf.TensorSpec((1, *shape), tensor.dtype))
    return specs


def _einsum_flops(graph) -> int:
    """FLOPs of the Einsum ops of `graph`: 2 * the product of every index size (one multiply-add per term)."""
    total = 0
    for op in graph.get_operations():
        if op.type != "Einsum":
            continue
        equation = op.get_attr("equation")
        equation = (equation.decode() if isinstance(equation, bytes) else equation).replace(" ", "")
        operands = equation.split("->")[0].split(",")
        shapes = [tuple(t.shape) for t in op.inputs]
        if "." in equation or len(operands) != len(shapes) or any(None in s for s in shapes):
            raise ValueError(
                f"cannot count the FLOPs of Einsum {op.name!r} with equation {equation!r} and input "
                f"shapes {shapes} (ellipsis or dynamic shape)"
            )
        sizes = {}
        for letters, shape in zip(operands, shapes, strict=True):
            sizes.update(zip(letters, shape, strict=True))
        total += 2 * math.prod(sizes.values())
    return total


def forward_flops(model) -> int:
    """Forward-pass FLOPs of one example through `model` (matrix operations only; see the module docstring).

    Traces `model(x, training=False)` with a batch of 1 (nothing runs, no variable is read, so a model built
    under any strategy works) and asks TensorFlow's profiler for the FLOPs of its matrix ops.

    Raises:
        ValueError: the model has no static input shapes, or its graph has ops whose FLOPs cannot be counted.
    """
    import tensorflow as tf

    from tpukit.engines.keras.export import keyed_inputs

    specs = _input_signature(model)
    if keyed_inputs(model):
        names = [t.name for t in model.inputs]
        function = tf.function(lambda *xs: model(dict(zip(names, xs, strict=True)), training=False))
    elif len(specs) == 1:
        function = tf.function(lambda x: model(x, training=False))
    else:
        function = tf.function(lambda *xs: model(list(xs), training=False))
    graph = function.get_concrete_function(*specs).graph
    nested = sorted({op.type for op in graph.get_operations()} & set(_NESTED_OP_TYPES))
    if nested:
        raise ValueError(
            f"the traced model contains {nested} ops, whose bodies the profiler does not count"
        )
    matrix_ops = [f"^{name}$" for name in _MATRIX_OP_TYPES]
    return keras_private.profiled_float_ops(graph, matrix_ops) + _einsum_flops(graph)


def model_flops_per_example(model) -> float | None:
    """Training FLOPs per example: 3 x the forward matrix-op FLOPs (see the module docstring), or None.

    Args:
        model: a functional `keras.Model` with static input shapes (the batch dimension may be None).

    Returns:
        FLOPs per example for one training step (forward + backward), or None when they cannot be counted
        (dynamic shapes, a subclassed model, control flow); the reason is logged.
    """
    try:
        forward = forward_flops(model)
    except Exception as error:  # noqa: BLE001 - MFU is a report: it must never stop a run
        logger.warning(
            "tpukit: model FLOPs not counted, so no MFU is reported: %s: %s",
            type(error).__name__,
            error,
        )
        return None
    if forward <= 0:
        logger.warning(
            "tpukit: model FLOPs not counted: the profiler found no matrix operations in the model"
        )
        return None
    return float(TRAINING_FLOPS_PER_FORWARD_FLOP * forward)
