"""Per-hardware choices for speed (pure: the engine passes in what it found): the mixed-precision policy and whether the train step is compiled with XLA.

Measured with `benchmarks/precision_xla.py` on a 2-core x86 CPU (AVX512_BF16, oneDNN on), TF 2.21 / Keras 3.15,
digits_cnn: float32 without XLA is the fastest; XLA-compiled float32 ran at 0.3-0.6x of it and mixed_bfloat16 at
~0.5-1.0x with or without XLA (without oneDNN, bf16 without XLA was ~15x slower). So CPUs train in float32. Whether
XLA helps a CPU depends on the model (`choose_cpu_jit_compile`, decided once the model is built): it fuses the
softmax, masking and normalization around attention's small matmuls, and it loses to oneDNN's convolution and
large matmul kernels; and on the run's length, since its compile (seconds) is paid once per run. The tests still
compile every model with XLA on the CPU, as the TPU-readiness proxy. TPUs always compile the step and are built for
bfloat16. Keras' own `jit_compile="auto"` turns XLA off on every CPU-only
machine and under every tf.distribute strategy, including a single GPU, so tpukit decides.
"""

from __future__ import annotations

import dataclasses
import logging

logger = logging.getLogger("tpukit")


@dataclasses.dataclass(frozen=True)
class Decision:
    value: object
    reason: str


def choose_precision(
    requested: str, kind: str, compute_capability: tuple[int, int] | None = None
) -> Decision:
    """The Keras dtype policy name for `requested` ('auto' or a policy) on a strategy `kind`."""
    if requested != "auto":
        if requested == "mixed_bfloat16" and kind in ("default", "jax_cpu"):
            logger.warning(
                "tpukit: mixed_bfloat16 on a CPU was 2-15x slower than float32 in our measurements "
                "(benchmarks/precision_xla.py); runtime.precision: auto picks float32 there"
            )
        return Decision(requested, "set in the recipe")
    if kind in ("tpu", "jax_tpu"):
        return Decision("mixed_bfloat16", "TPUs compute in bfloat16 natively")
    if kind in ("one_device", "mirrored", "multi_worker", "jax_gpu"):
        capability = compute_capability  # found by the engine (`Hardware.gpu_compute_capability`)
        if capability is not None:
            if tuple(capability) >= (8, 0):
                return Decision(
                    "mixed_bfloat16",
                    f"GPU compute capability {capability} has bfloat16 tensor cores",
                )
            if tuple(capability) >= (7, 0):
                return Decision(
                    "mixed_float16", f"GPU compute capability {capability} has float16 tensor cores"
                )
            return Decision(
                "float32", f"GPU compute capability {capability} has no fast half precision"
            )
    return Decision(
        "float32", "on this kind of CPU float32 was the fastest (benchmarks/precision_xla.py)"
    )


def choose_jit_compile(requested, kind: str, replicas: int) -> Decision:
    """Whether to pass `jit_compile=True` to `model.compile` for `requested` (True/False/'auto')."""
    multi_device_mirrored = kind in ("mirrored", "multi_worker") and replicas > 1
    if requested is True and multi_device_mirrored:
        raise ValueError(
            f"runtime.jit_compile: true does not work with {kind} strategies over {replicas} replicas in Keras 3 "
            "(one XLA cluster cannot touch another device's variables). Fix: set runtime.jit_compile: auto."
        )
    if kind.startswith("jax_"):
        if requested is False:
            return Decision(
                False, "set in the recipe (Keras then runs JAX op by op: for debugging only)"
            )
        return Decision(True, "Keras on JAX compiles every step with XLA (jax.jit)")
    if requested != "auto":
        return Decision(bool(requested), "set in the recipe")
    if kind == "tpu":
        return Decision(False, "TPUStrategy compiles the whole step with XLA itself")
    if multi_device_mirrored:
        return Decision(False, f"XLA cannot span the {replicas} replicas of a {kind} strategy")
    if kind == "default":
        return Decision(
            "auto",
            "on a CPU: decided when the model is built, from its layers and the run's length (attention "
            "layers in a run long enough to earn the compile back: XLA)",
        )
    return Decision(
        True,
        "XLA-compiled train step on the GPU (Keras' 'auto' would turn it off under a strategy)",
    )


# Attention layers by class name, Keras' and tpukit's; a subclass counts (keras-hub's CachedMultiHeadAttention, a
# user's own), since the bases of every layer's class are read too.
# (keras.layers.GroupQueryAttention's class is named GroupedQueryAttention.)
ATTENTION_LAYERS = frozenset({"MultiHeadAttention", "GroupedQueryAttention", "SelfAttention"})


# What XLA costs and saves an attention model's run on a CPU, for `choose_cpu_jit_compile`'s estimate. Measured on a
# 2-core x86 CPU (TF 2.21, Keras 3.15, tpukit.fit / tpukit.run, each with XLA and without, two or three processes
# each, 2026-11-27):
# - compiling took 1.2 s more before the first step (causal_lm, 2 layers of width 128, batch 32) and 2.7 s more over
#   the run (keras-io's text classification transformer, batch 32: 2.2 s for the train function, 0.5 s for the
#   evaluation's);
# - the steady step was 1.14-1.19x (text transformer) and 1.49-1.53x (causal_lm) as fast with XLA: XLA saves 12-33%
#   of the time the training steps take without it;
# - without XLA those steps reached 17% and 29% of the measured matmul peak (`flops.device_peak_flops`);
# - a step has a cost its FLOPs do not count (dispatching the graph's ops): a model of one MultiHeadAttention layer
#   on 16x32 inputs, batch 32, took 3.5 ms per step without XLA, of which its FLOPs at 25% of the peak are 0.2 ms
#   (4,800 steps: 18.2-18.8 s whole process without XLA, 15.9-16.0 s with it; found by the review of e16cffa).
# The constants lean toward XLA within those ranges (a cheap compile, a large saving: XLA once the steps are estimated
# at 5 s without it), since a wrong "off" costs up to a third of every step of the run and a wrong "on" one compile.
# They decide both rows as measured: causal_lm's 40 steps (6.6 s estimated; 1.9 s saved for 1.2 s of compile) with
# XLA, the text transformer's 160 (3.4 s estimated; 0.4 s saved for 2.7 s) without.
XLA_CPU_COMPILE_SECONDS = 1.5
XLA_CPU_STEP_SAVING = 0.3
CPU_UTILIZATION_WITHOUT_XLA = 0.25
CPU_STEP_OVERHEAD_SECONDS = 0.003


def attention_layers(layer_classes) -> list[str]:
    """The names of `ATTENTION_LAYERS` among `layer_classes` and their bases, sorted."""
    names = {cls.__name__ for layer_class in layer_classes for cls in layer_class.__mro__}
    return sorted(names & ATTENTION_LAYERS)


def choose_cpu_jit_compile(
    layer_classes,
    *,
    flops_per_step: float | None = None,
    peak_flops: float | None = None,
    train_steps: int | None = None,
) -> Decision:
    """`jit_compile` for a model on the CPU (the default strategy, `runtime.jit_compile: auto`), from the classes
    of its layers (every nested layer's class, with its bases) and, for a model with attention, the run's length.

    Measured on a 2-core x86 CPU (TF 2.21, Keras 3.15; `benchmarks/precision_xla.py` and the rows of
    `benchmarks/vs_keras.py`, XLA against no XLA at tpukit's steps_per_execution, the best of 3): XLA made the step
    1.21x (keras-io's text classification transformer) and 1.51x (causal_lm, 2 layers of width 128; 1.58x for the
    textfiles_char_lm recipe at steps_per_execution 1) and 1.45x (cifar10_vit's ViT on random images, batch 64)
    faster, and
    0.13x (a 784-128-10 MLP at batch 1024), 0.17x (keras-io's mnist_convnet), 0.57-0.76x (small CNNs) and 0.62x
    (ResNet-8) as fast.

    XLA's compile is paid once per run: a run whose `train_steps` are estimated (each step at `flops_per_step` over
    the devices' `peak_flops` at `CPU_UTILIZATION_WITHOUT_XLA`, plus `CPU_STEP_OVERHEAD_SECONDS`) to take less than
    `XLA_CPU_COMPILE_SECONDS / XLA_CPU_STEP_SAVING` without XLA trains without it. The estimate is for the whole
    run, not for what is left of it, so a resumed run makes the choice its first part made (and computes the same
    way). The step is not timed: the peak is the machine's matmul rate, timed once and cached
    (`flops.measured_peak_flops`), so the same model, batch and machine get the same choice, except where the cache
    cannot be kept and each run times the peak under its own load. Without a FLOP count or a peak, attention alone
    decides, and the reason says the run's length was not weighed.
    """
    attention = attention_layers(layer_classes)
    if not attention:
        return Decision(
            False,
            "no MultiHeadAttention, GroupedQueryAttention or SelfAttention layer: on a CPU XLA made convolution and "
            "dense steps 1.3-8x slower (tpukit.planner.hardware)",
        )
    layers = (
        f"the model has attention layers ({', '.join(attention)}): on a CPU XLA made such steps 1.2-1.6x "
        "faster (tpukit.planner.hardware)"
    )
    if not (flops_per_step and peak_flops and train_steps):
        missing = (
            "FLOP count for this model"
            if not flops_per_step
            else "measured peak FLOP/s"
            if not peak_flops
            else "count of training steps"
        )
        return Decision(
            True,
            f"{layers} (the run's length was not weighed against XLA's compile: no {missing})",
        )
    step = flops_per_step / (peak_flops * CPU_UTILIZATION_WITHOUT_XLA) + CPU_STEP_OVERHEAD_SECONDS
    seconds = train_steps * step
    saved = seconds * XLA_CPU_STEP_SAVING
    estimate = (
        f"its {train_steps} training steps are estimated at {seconds:.1f} s without XLA ({flops_per_step:.3g} "
        f"FLOPs per step at {CPU_UTILIZATION_WITHOUT_XLA:.0%} of a measured {peak_flops / 1e9:.0f} GFLOP/s, "
        f"plus {CPU_STEP_OVERHEAD_SECONDS * 1e3:g} ms per step), so XLA would save about {saved:.1f} s"
    )
    if saved < XLA_CPU_COMPILE_SECONDS:
        return Decision(
            False,
            f"{layers}, but {estimate}, less than the ~{XLA_CPU_COMPILE_SECONDS:g} s its compile takes: a run "
            "this short trains faster without XLA (runtime.jit_compile: true compiles it anyway)",
        )
    return Decision(
        True,
        f"{layers}; {estimate}, more than the ~{XLA_CPU_COMPILE_SECONDS:g} s its compile takes",
    )
