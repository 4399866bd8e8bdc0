"""Per-hardware choices for speed (pure: the engine passes in what it found): the mixed-precision policy and whether the train step is compiled with XLA.

Measured with `benchmarks/precision_xla.py` on a 2-core x86 CPU (AVX512_BF16, oneDNN on), TF 2.21 / Keras 3.15,
digits_cnn: float32 without XLA is the fastest; XLA-compiled float32 ran at 0.3-0.6x of it and mixed_bfloat16 at
~0.5-1.0x with or without XLA (without oneDNN, bf16 without XLA was ~15x slower). So CPUs train in float32. Whether
XLA helps a CPU depends on the model (`choose_cpu_jit_compile`, decided once the model is built): it fuses the
softmax, masking and normalization around attention's small matmuls, and it loses to oneDNN's convolution and
large matmul kernels. The tests still compile every model with XLA on the CPU, as the TPU-readiness proxy. TPUs
always compile the step and are built for bfloat16. Keras' own `jit_compile="auto"` turns XLA off on every CPU-only
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
            "auto", "on a CPU: decided when the model is built, from its layers (attention: XLA)"
        )
    return Decision(
        True,
        "XLA-compiled train step on the GPU (Keras' 'auto' would turn it off under a strategy)",
    )


# Attention layers by class name, Keras' and tpukit's; a subclass counts (keras-hub's CachedMultiHeadAttention, a
# user's own), since the bases of every layer's class are read too.
# (keras.layers.GroupQueryAttention's class is named GroupedQueryAttention.)
ATTENTION_LAYERS = frozenset({"MultiHeadAttention", "GroupedQueryAttention", "SelfAttention"})


def choose_cpu_jit_compile(layer_classes) -> Decision:
    """`jit_compile` for a model on the CPU (the default strategy, `runtime.jit_compile: auto`), from the classes
    of its layers (every nested layer's class, with its bases).

    Measured on a 2-core x86 CPU (TF 2.21, Keras 3.15; `benchmarks/precision_xla.py` and the rows of
    `benchmarks/vs_keras.py`, XLA against no XLA at tpukit's steps_per_execution, the best of 3): XLA made the step
    1.21x (keras-io's text classification transformer) and 1.51x (causal_lm, 2 layers of width 128; 1.58x for the
    textfiles_char_lm recipe at steps_per_execution 1) and 1.45x (cifar10_vit's ViT on random images, batch 64)
    faster, and
    0.13x (a 784-128-10 MLP at batch 1024), 0.17x (keras-io's mnist_convnet), 0.57-0.76x (small CNNs) and 0.62x
    (ResNet-8) as fast.
    """
    names = {cls.__name__ for layer_class in layer_classes for cls in layer_class.__mro__}
    attention = sorted(names & ATTENTION_LAYERS)
    if attention:
        return Decision(
            True,
            f"the model has attention layers ({', '.join(attention)}): on a CPU XLA made such steps 1.2-1.6x "
            "faster (tpukit.planner.hardware)",
        )
    return Decision(
        False,
        "no MultiHeadAttention, GroupedQueryAttention or SelfAttention layer: on a CPU XLA made convolution and "
        "dense steps 1.3-8x slower (tpukit.planner.hardware)",
    )
