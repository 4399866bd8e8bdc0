"""Precision and XLA choices per hardware kind (the decision only: no TPU or GPU exists here)."""

import pytest

from tpukit.planner.hardware import choose_jit_compile, choose_precision


@pytest.mark.parametrize(
    "kind, capability, expected",
    [
        ("tpu", None, "mixed_bfloat16"),
        ("one_device", (8, 0), "mixed_bfloat16"),  # A100 and newer: bfloat16 tensor cores
        ("mirrored", (7, 5), "mixed_float16"),  # T4 (Colab's free GPU): float16 tensor cores
        ("one_device", (6, 0), "float32"),
        ("default", None, "float32"),  # CPU: measured fastest
    ],
)
def test_auto_precision(kind, capability, expected):
    assert choose_precision("auto", kind, compute_capability=capability).value == expected


def test_explicit_precision_is_kept():
    decision = choose_precision("mixed_bfloat16", "default")
    assert decision.value == "mixed_bfloat16" and decision.reason == "set in the recipe"


@pytest.mark.parametrize(
    "kind, replicas, expected",
    [
        ("tpu", 8, False),  # TPUStrategy compiles the replicated step itself
        ("mirrored", 2, False),
        ("multi_worker", 4, False),
        ("mirrored", 1, True),
        ("one_device", 1, True),
        (
            "default",
            1,
            "auto",
        ),  # CPU: decided from the built model's layers (choose_cpu_jit_compile)
    ],
)
def test_auto_jit_compile(kind, replicas, expected):
    assert choose_jit_compile("auto", kind, replicas).value == expected
    assert type(choose_jit_compile("auto", kind, replicas).value) is type(expected)


def test_a_cpu_compiles_attention_models_with_xla_and_nothing_else():
    import keras

    from tpukit.models.layers import SelfAttention
    from tpukit.planner.hardware import choose_cpu_jit_compile

    class OwnAttention(keras.layers.MultiHeadAttention):  # a user's subclass counts
        pass

    for classes in (
        {keras.layers.Dense, keras.layers.MultiHeadAttention},
        {keras.layers.Embedding, SelfAttention},
        {keras.layers.Conv2D, OwnAttention},
        {keras.layers.GroupQueryAttention},
    ):
        decision = choose_cpu_jit_compile(classes)
        assert decision.value is True and "attention layers" in decision.reason
    for classes in (
        {keras.layers.Dense},
        {keras.layers.Conv2D, keras.layers.BatchNormalization},
        set(),
    ):
        decision = choose_cpu_jit_compile(classes)
        assert (
            decision.value is False
            and "no MultiHeadAttention, GroupedQueryAttention or SelfAttention" in decision.reason
        )


def test_forced_xla_over_mirrored_replicas_is_refused_with_the_fix():
    with pytest.raises(
        ValueError, match="jit_compile: true does not work with mirrored strategies over 2 replicas"
    ):
        choose_jit_compile(True, "mirrored", 2)
    assert choose_jit_compile(True, "default", 1).value is True
