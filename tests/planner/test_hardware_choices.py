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


def test_a_cpu_compiles_attention_with_xla_only_where_the_run_earns_the_compile_back():
    import keras

    from tpukit.planner import hardware

    attention = {keras.layers.Dense, keras.layers.MultiHeadAttention}
    peak = 300e9
    per_step = 1.38e9  # keras-io's text transformer at batch 32

    def even(flops, peak_flops):
        """The steps whose estimated saving equals the compile: FLOPs at the assumed utilization, plus a fixed
        cost per step."""
        step = flops / (peak_flops * hardware.CPU_UTILIZATION_WITHOUT_XLA)
        step += hardware.CPU_STEP_OVERHEAD_SECONDS
        return hardware.XLA_CPU_COMPILE_SECONDS / (hardware.XLA_CPU_STEP_SAVING * step)

    def decide(steps, **counted):
        return hardware.choose_cpu_jit_compile(
            attention,
            **({"flops_per_step": per_step, "peak_flops": peak} | counted),
            train_steps=steps,
        )

    short = decide(160)  # the benchmark's 2 epochs of 80 steps: ~1 s saved, less than a compile
    assert short.value is False
    assert "its 160 training steps are estimated at 3.4 s without XLA" in short.reason
    assert "300 GFLOP/s, plus 3 ms per step" in short.reason
    assert "runtime.jit_compile: true" in short.reason
    long = decide(1564)  # keras-io's 2 epochs of 25,000 reviews
    assert long.value is True and "its 1564 training steps" in long.reason
    assert "more than the ~1.5 s its compile takes" in long.reason
    # the break-even, in whole steps
    steps = even(per_step, peak)
    assert decide(int(steps) - 1).value is False and decide(int(steps) + 1).value is True
    # more FLOPs per step or a slower machine: fewer steps earn the compile back
    for counted in ({"flops_per_step": 2 * per_step}, {"peak_flops": peak / 2}):
        fewer = even(counted.get("flops_per_step", per_step), counted.get("peak_flops", peak))
        assert fewer < steps / 1.5
        assert decide(int(fewer) + 1, **counted).value is True
        assert decide(int(fewer) - 1, **counted).value is False
    # a tiny model's steps cost more than their FLOPs: 4,800 steps of one small attention layer, which XLA trained
    # faster as a whole process (hardware.py's comment), get XLA
    assert decide(4800, flops_per_step=1.57e7).value is True
    assert decide(100, flops_per_step=1.57e7).value is False
    # nothing counted (a subclassed model, no measured peak): the layers alone decide, and the reason says so
    for steps, uncounted, missing in (
        (10, {"flops_per_step": None}, "no FLOP count for this model"),
        (10, {"peak_flops": None}, "no measured peak FLOP/s"),
        (None, {}, "no count of training steps"),
    ):
        decision = decide(steps, **uncounted)
        assert decision.value is True
        assert (
            f"the run's length was not weighed against XLA's compile: {missing}" in decision.reason
        )
    # no attention: no XLA, however long the run
    assert (
        hardware.choose_cpu_jit_compile(
            {keras.layers.Conv2D}, flops_per_step=1e12, peak_flops=peak, train_steps=10**6
        ).value
        is False
    )


def test_forced_xla_over_mirrored_replicas_is_refused_with_the_fix():
    with pytest.raises(
        ValueError, match="jit_compile: true does not work with mirrored strategies over 2 replicas"
    ):
        choose_jit_compile(True, "mirrored", 2)
    assert choose_jit_compile(True, "default", 1).value is True
