"""The tensorflow engine's CPU-only tuning, in one place: acts only when this run's devices are CPUs (no TPU
strategy, no GPU TensorFlow can use), where the CPU benchmark measured its gain (benchmarks/README.md); on a TPU or
GPU nothing here acts, and metrics.json says why (`report`).

- The heap alive once the devices are known, frozen for the garbage collector (`tpukit.engines.keras.gc_freeze`):
  the interpreter's exit then skips TensorFlow's and Keras' import-time objects.

    on_cpu = cpu.tune(kind)        # engine.hardware, once the strategy is known
    metrics.update(cpu.report())   # engine.report: what was applied, and why not
"""

from __future__ import annotations

import tensorflow as tf

from tpukit.engines.keras import gc_freeze

_heap: gc_freeze.Freeze | None = None


def accelerator(kind: str) -> str | None:
    """The accelerator a strategy of `kind` (`strategy.kind_of`) runs on: "TPU", "GPU" (one TensorFlow can use is
    here), or None for CPUs."""
    if kind == "tpu":
        return "TPU"
    return "GPU" if tf.config.list_physical_devices("GPU") else None


def tune(kind: str) -> bool:
    """The CPU tuning of a run with a strategy of `kind`: the frozen heap where its devices are CPUs, nothing
    elsewhere. Returns whether they are CPUs."""
    global _heap
    found = accelerator(kind)
    if found is None:
        _heap = gc_freeze.freeze_the_imports()
        return True
    _heap = gc_freeze.Freeze(False, f"not frozen: the devices are {found}s, not CPUs")
    return False


def report() -> dict:
    """What this process's CPU tuning did, for metrics.json: `gc_freeze` (`frozen`, `reason`)."""
    never = "the tensorflow engine's hardware() did not run in this process"
    return {"gc_freeze": (_heap or gc_freeze.Freeze(False, f"not frozen: {never}")).as_dict()}
