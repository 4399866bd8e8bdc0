"""Per-hardware choices for speed (pure: the engine passes in what it found): the mixed-precision policy and whether the train step is compiled with XLA.

Measured with `benchmarks/precision_xla.py` on a 2-core x86 CPU (AVX512_BF16, oneDNN on), TF 2.21 / Keras 3.15,
digits_cnn: float32 without XLA is the fastest; XLA-compiled float32 ran at 0.3-0.6x of it and mixed_bfloat16 at
~0.5x with or without XLA (without oneDNN, bf16 without XLA was ~15x slower). So CPUs train in
float32 without XLA; the tests still compile every model with XLA on the CPU, as the TPU-readiness proxy. TPUs
always compile the step and are built for bfloat16. Keras' own `jit_compile="auto"` turns XLA off under every
tf.distribute strategy, including a single GPU, so tpukit decides.
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
            False, "on this kind of CPU XLA made the step 2-3x slower (benchmarks/precision_xla.py)"
        )
    return Decision(
        True,
        "XLA-compiled train step on the GPU (Keras' 'auto' would turn it off under a strategy)",
    )
