"""The activation estimate `tpukit check`'s memory rule uses, traced the jax engine's way: the non-weight operands
and the results of every matrix op (`dot_general`, convolution) of the forward pass at one device's batch, each
value once. These are what the backward pass of those ops reads; elementwise ops are assumed fused into them, as
XLA does on a TPU. Traced with `jax.make_jaxpr`, not run: nothing is allocated. The TensorFlow engine's twin traces
a `tf.function` graph (`tpukit.tools.check._activation_bytes`)."""

from __future__ import annotations

import jax
import numpy as np

_MATRIX_PRIMITIVES = ("dot_general", "conv_general_dilated")
# Ops that hand a weight on unchanged in value (a cast to the compute dtype, a reshape): their result is a weight too.
_PASS_THROUGH = (
    "convert_element_type",
    "reshape",
    "transpose",
    "broadcast_in_dim",
    "copy",
    "squeeze",
)


def _forward(model, batch: int):
    """`f(trainable, non_trainable, inputs)`: the model's training-mode forward pass, and the inputs' shapes."""
    inputs = model.inputs
    specs = [jax.ShapeDtypeStruct((batch, *t.shape[1:]), t.dtype) for t in inputs]
    if any(None in s.shape for s in specs):
        raise ValueError(
            f"the model's inputs have dynamic shapes ({[tuple(t.shape) for t in inputs]})"
        )
    names = [t.name for t in inputs]
    keyed = isinstance(getattr(model, "_inputs_struct", None), dict)

    def forward(trainable, non_trainable, xs):
        x = dict(zip(names, xs, strict=True)) if keyed else (xs[0] if len(xs) == 1 else list(xs))
        return model.stateless_call(trainable, non_trainable, x, training=True)[0]

    return forward, specs


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            inner = getattr(item, "jaxpr", item)
            if hasattr(inner, "eqns") and hasattr(inner, "invars"):
                yield inner


def _variable(value) -> bool:
    """A jaxpr variable, not a literal constant (which is neither hashable nor an activation)."""
    return not hasattr(value, "val")


def _walk(jaxpr, weights: set, sizes: dict) -> None:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        first = eqn.invars[0] if eqn.invars else None
        if name in _PASS_THROUGH and _variable(first) and first in weights:
            weights.update(eqn.outvars)
        elif name in _MATRIX_PRIMITIVES:
            for var in (*eqn.invars, *eqn.outvars):
                aval = getattr(var, "aval", None)
                if not _variable(var) or var in weights or not hasattr(aval, "shape"):
                    continue
                if jax.numpy.issubdtype(aval.dtype, jax.numpy.floating):
                    sizes[id(var)] = int(np.prod(aval.shape)) * aval.dtype.itemsize
        for inner in _sub_jaxprs(eqn):
            inner_weights = {
                inner_var
                for outer, inner_var in zip(eqn.invars, inner.invars, strict=False)
                if _variable(outer) and outer in weights
            }
            _walk(inner, inner_weights, sizes)


def activation_bytes(model, per_device_batch: int) -> float:
    """Estimated activation bytes of one device's training step at `per_device_batch` (see the module docstring).

    Raises:
        ValueError: the model's inputs have dynamic shapes.
    """
    forward, specs = _forward(model, per_device_batch)

    def shapes(variables):
        return [jax.ShapeDtypeStruct(tuple(v.shape), v.dtype) for v in variables]

    trainable = shapes(model.trainable_variables)
    other = shapes(model.non_trainable_variables)
    closed = jax.make_jaxpr(forward)(trainable, other, specs)
    jaxpr = closed.jaxpr
    weights = set(jaxpr.invars[: len(trainable) + len(other)]) | set(jaxpr.constvars)
    sizes: dict[int, int] = {}
    _walk(jaxpr, weights, sizes)
    return float(sum(sizes.values()))
