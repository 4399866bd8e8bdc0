"""`tpukit check`'s activation estimate traced the jax engine's way (`tpukit.engines.jax.activations`) equals the
TensorFlow engine's (`tpukit.tools.check._activation_bytes`) on the same models: the same matrix ops, the same
tensors counted once, weights left out, the compute dtype's size."""

import textwrap

import keras
import pytest
from helpers import run_jax_snippet

from tpukit.engines.keras.session import dtype_policy
from tpukit.tools.check import _activation_bytes

MODELS = textwrap.dedent(
    """
    import keras

    def models():
        yield "mlp", keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)]
        )
        yield "conv", keras.Sequential(
            [
                keras.Input((8, 8, 3)),
                keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                keras.layers.Flatten(),
                keras.layers.Dense(2),
            ]
        )
        inputs = keras.Input((6,), dtype="int32")
        x = keras.layers.Embedding(20, 8)(inputs)
        x = keras.layers.MultiHeadAttention(2, 4)(x, x)
        yield "attention", keras.Model(inputs, keras.layers.Dense(3)(x))
    """
)


def _in_jax(policy: str) -> dict:
    code = MODELS + textwrap.dedent(
        """
        import json, sys
        from tpukit.engines.jax.activations import activation_bytes

        keras.mixed_precision.set_global_policy(sys.argv[1])
        print("RESULT", json.dumps({name: activation_bytes(model, 32) for name, model in models()}))
        """
    )
    return run_jax_snippet(code, policy)


def _in_tensorflow(policy: str) -> dict:
    namespace: dict = {}
    exec(MODELS, namespace)  # noqa: S102 - the same model definitions as the JAX child's
    with dtype_policy(policy):
        return {name: _activation_bytes(model, 32) for name, model in namespace["models"]()}


@pytest.mark.integration
def test_the_jax_trace_counts_what_the_tensorflow_graph_counts():
    assert keras.backend.backend() == "tensorflow"
    for policy in ("float32", "mixed_bfloat16"):
        jax_bytes, tf_bytes = _in_jax(policy), _in_tensorflow(policy)
        assert (
            jax_bytes["mlp"]
            == tf_bytes["mlp"]
            == (32 * 8 + 2 * 32 * 16 + 32 * 4) * (4 if policy == "float32" else 2)
        )
        assert jax_bytes["conv"] == tf_bytes["conv"] > 0
        assert jax_bytes["attention"] > 0 and tf_bytes["attention"] > 0
        # attention: within 10% (a jaxpr and a TensorFlow graph place the casts and reshapes around its einsums
        # differently: 1% apart in float32, 9% in mixed_bfloat16)
        assert abs(jax_bytes["attention"] - tf_bytes["attention"]) <= 0.1 * tf_bytes["attention"]
