"""Model FLOPs utilization (MFU): the model's training FLOP/s as a fraction of the hardware's peak FLOP/s.

    mfu = model_flops_per_example(model) * examples_per_second / peak_flops

* Training FLOPs per example: counted by each engine from the forward pass (TensorFlow's profiler, XLA's cost
  analysis) times 3 (the backward pass is two matmuls per forward one). Only matrix operations are counted
  (MatMul, BatchMatMul, convolutions, Einsum), as in the PaLM paper's MFU (Chowdhery et al., 2022, appendix B).
* `device_peak_flops(...)`: on a TPU, Google's published bf16 peak per chip for every precision (its matrix units
  multiply in bf16); on a CPU or GPU, the matmul rate of the compute dtype, timed once and cached.
* `mfu(...)`: the ratio, or None when an input is unknown; `checked_mfu(...)` times a cached peak again when
  training ran faster than it, so a reported MFU is never above 1.

Nothing here raises during a training run: what cannot be computed is None, with a log line that says why."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import math
import os
import platform
import re
import time
from collections.abc import Callable

logger = logging.getLogger("tpukit")

# bf16 peak FLOP/s per chip, from Google's Cloud TPU documentation (the "Peak compute per chip" row):
#   v3:    123 teraflops (bf16)   https://cloud.google.com/tpu/docs/v3
#   v4:    275 teraflops (bf16)   https://cloud.google.com/tpu/docs/v4
#   v5e:   197 TFLOPs (bf16)      https://cloud.google.com/tpu/docs/v5e
#   v5p:   459 TFLOPs (bf16)      https://cloud.google.com/tpu/docs/v5p
#   v6e:   918 TFLOPs (bf16)      https://cloud.google.com/tpu/docs/v6e (Trillium)
#   tpu7x: 2307 TFLOPs (BF16)     https://docs.cloud.google.com/tpu/docs/tpu7x (Ironwood; the same page says
#          TensorFlow is not supported on TPU7x: the row is for reports and device-kind parsing)
#   v2:    45 TFLOP/s: no current Cloud TPU page gives a per-chip number for v2. 45 is Google's 2017 announcement
#          of 180 TFLOP/s per 4-chip Cloud TPU board, divided by 4 (Jouppi et al., "A Domain Specific
#          Supercomputer for Training Deep Neural Networks", CACM 2020, give 46). Treat v2 MFU as +-3%.
PEAK_BF16_FLOPS_PER_CHIP: dict[str, float] = {
    "v2": 45e12,
    "v3": 123e12,
    "v4": 275e12,
    "v5e": 197e12,
    "v5p": 459e12,
    "v6e": 918e12,
    "tpu7x": 2307e12,
}

# TensorFlow devices (TPUStrategy replicas) per chip. v2 and v3 chips have two TensorCores that TensorFlow shows
# as two TPU devices (a v3-8 has 4 chips and 8 replicas; cloud.google.com/tpu/docs/v3: "Each v3 TPU chip contains
# two TensorCores"). v4 chips also have two TensorCores (cloud.google.com/tpu/docs/v4), as do v5p chips, but they
# run fused as one "megacore" device, so a v4-8 (4 chips) has 4 replicas; this megacore mapping was not found in
# the pages cited here and is unverified on hardware by tpukit. v5e and v6e chips have one TensorCore
# (cloud.google.com/tpu/docs/v5e, v6e). TPU7x chips have two TensorCores (its docs page) shown as two devices
# (JAX's topology strings for TPU7x have a trailing dimension of 2, jax-ml/jax jax/_src/hardware_utils.py);
# unverified, and moot for TensorFlow, which TPU7x does not support. If a TPU reports another device count,
# fix this table, not the peaks.
TF_DEVICES_PER_CHIP: dict[str, int] = {
    "v2": 2,
    "v3": 2,
    "v4": 1,
    "v5e": 1,
    "v5p": 1,
    "v6e": 1,
    "tpu7x": 2,
}

# PCI device ids of Google's TPU chips (vendor 0x1ae0), as JAX reads them to find the chip without any runtime
# (jax-ml/jax jax/_src/hardware_utils.py, _TPU_PCI_DEVICE_IDS). 0x0027 is shared by v2 and v3: reported as "v3"
# only when nothing better is known would be a guess, so it maps to None.
TPU_PCI_DEVICE_IDS: dict[str, str | None] = {
    "0x0027": None,
    "0x005e": "v4",
    "0x0062": "v5p",
    "0x0063": "v5e",
    "0x006f": "v6e",
    "0x0076": "tpu7x",
}

# Keras dtype policy -> the dtype its matmuls compute in.
_COMPUTE_DTYPES = {
    "float32": "float32",
    "mixed_bfloat16": "bfloat16",
    "bfloat16": "bfloat16",
    "mixed_float16": "float16",
    "float16": "float16",
}


def tpu_generation(device_kind: str | None) -> str | None:
    """The `PEAK_BF16_FLOPS_PER_CHIP` key for a TPU device kind or accelerator type, or None if unknown.

    Accepts device kinds as runtimes report them ("TPU v4", "TPU v5 lite", "TPU v6e", "TPU7x") and accelerator
    types ("v3-8", "v5litepod-16", "v5p-8", "v6e-1", "tpu7x-8").
    """
    if not device_kind:
        return None
    lowered = device_kind.lower()
    if re.search(r"tpu\s*7x|ironwood|(^|\W)v7x?(\W|$)", lowered):
        return "tpu7x"
    text = lowered.replace("tpu", " ").replace("_", " ")
    if re.search(r"v6\s*(e|lite)|trillium", text):
        return "v6e"
    if re.search(r"v5\s*(e|lite)", text):
        return "v5e"
    if re.search(r"v5(p|\b|-)", text):  # the v5p runtime reports "TPU v5"
        return "v5p"
    match = re.search(r"v([234])(\b|-)", text)
    return f"v{match.group(1)}" if match else None


def pci_tpu_generation(root: str = "/sys/bus/pci/devices") -> str | None:
    """The TPU generation of the first Google PCI device under `root` with a known device id, or None."""
    for vendor_path in sorted(glob.glob(os.path.join(root, "*", "vendor"))):
        try:
            with open(vendor_path, encoding="ascii") as f:
                if f.read().strip().lower() != "0x1ae0":
                    continue
            with open(os.path.join(os.path.dirname(vendor_path), "device"), encoding="ascii") as f:
                generation = TPU_PCI_DEVICE_IDS.get(f.read().strip().lower())
        except OSError:
            continue
        if generation:
            return generation
    return None


def peak_dtype(precision: str, strategy_kind: str = "default") -> str:
    """The dtype whose peak MFU is measured against: "bfloat16" on a TPU, else the policy's compute dtype.

    Args:
        precision: the Keras dtype policy name the model trains with ("float32", "mixed_bfloat16", ...).
        strategy_kind: `tpukit.engines.tensorflow.strategy.kind_of(strategy)`.
    """
    if precision not in _COMPUTE_DTYPES:
        raise ValueError(
            f"peak_dtype: unknown precision {precision!r}; expected one of {sorted(_COMPUTE_DTYPES)}."
        )
    return "bfloat16" if strategy_kind == "tpu" else _COMPUTE_DTYPES[precision]


def detect_device_kind(strategy_kind: str) -> str | None:
    """Best-effort description of the accelerator behind a strategy kind (see `tpukit.engines.tensorflow.strategy.kind_of`).

    TPU: `$TPU_ACCELERATOR_TYPE` (set on GKE and the Colab/Kaggle TPU runtimes), else the `device_kind`
    TensorFlow reports for the first local TPU (TensorFlow documents device details for GPUs only, so this may
    be empty), else the chip generation read from the Google PCI device ids under /sys (`pci_tpu_generation`,
    a plain Cloud TPU VM); None when none says (e.g. a remote TPU Node).
    GPU: TensorFlow's device name of the first GPU. CPU: the processor model and core count.
    """
    import tensorflow as tf

    if strategy_kind == "tpu":
        if os.environ.get("TPU_ACCELERATOR_TYPE"):
            return os.environ["TPU_ACCELERATOR_TYPE"]
        try:
            devices = tf.config.list_physical_devices("TPU")
            details = tf.config.experimental.get_device_details(devices[0]) if devices else {}
        except Exception:  # noqa: BLE001 - details are optional for every device type
            details = {}
        return details.get("device_kind") or pci_tpu_generation()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        try:
            name = tf.config.experimental.get_device_details(gpus[0]).get("device_name")
        except Exception:  # noqa: BLE001 - details are optional: a GPU that cannot say is "unknown"
            name = None
        return f"GPU {name or 'unknown'}"
    return f"CPU {_cpu_model()} ({os.cpu_count()} logical cores)"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def default_cache_path() -> str:
    """`$XDG_CACHE_HOME/tpukit/peak_flops.json`, by default `~/.cache/tpukit/peak_flops.json`."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "tpukit", "peak_flops.json")


def measure_matmul_flops(
    matrix_size: int = 2048,
    repeats: int = 5,
    device: str | None = None,
    timer=time.perf_counter,
    dtype: str = "float32",
) -> float:
    """FLOP/s of a `dtype` `matrix_size`-square matmul on `device` (default: TensorFlow's default device).

    One warm-up, then the best of `repeats` timed matmuls (best-of filters out other processes' noise). Each
    matmul is `2 * matrix_size**3` FLOPs; a scalar reduction of the product forces it to finish (GPUs run
    asynchronously) without copying the matrix to the host.
    """
    import tensorflow as tf

    if matrix_size < 1 or repeats < 1:
        raise ValueError(
            f"measure_matmul_flops: matrix_size and repeats must be >= 1; received "
            f"matrix_size={matrix_size}, repeats={repeats}."
        )
    with tf.device(device) if device else contextlib.nullcontext():
        a = tf.cast(tf.random.stateless_normal((matrix_size, matrix_size), seed=(1, 2)), dtype)
        b = tf.cast(tf.random.stateless_normal((matrix_size, matrix_size), seed=(3, 4)), dtype)
        tf.reduce_sum(tf.matmul(a, b)).numpy()  # warm-up: kernel selection, thread pool start
        best = math.inf
        for _ in range(repeats):
            start = timer()
            tf.reduce_sum(tf.matmul(a, b)).numpy()
            best = min(best, timer() - start)
    return 2.0 * matrix_size**3 / max(best, 1e-9)


def _read_cache(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            cache = json.load(f)
        return cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path: str, cache: dict) -> None:
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(cache, f, indent=2, sort_keys=True)
        os.replace(
            temporary, path
        )  # atomic: two processes measuring at once never leave half a file
    except OSError as error:
        logger.warning("tpukit: could not cache the measured peak FLOP/s in %s: %s", path, error)


def measured_peak_flops(
    device_kind: str,
    cache_path: str | None = None,
    matrix_size: int = 2048,
    dtype: str = "float32",
    *,
    measure: Callable[[int, str], float] | None = None,
    at_least: float | None = None,
) -> tuple[float, bool]:
    """The `dtype` matmul FLOP/s of this machine's default device: from the cache, else measured and cached.

    Args:
        device_kind: what the entry is cached under (`detect_device_kind`).
        measure: `measure(matrix_size, dtype) -> FLOP/s`; default `measure_matmul_flops` (TensorFlow's default
            device). The jax engine passes a JAX matmul for a GPU (TensorFlow's CPU build sees none).
        at_least: a rate this device has reached (training FLOP/s per device): a cached value below it was
            timed while other work used the cores, so the matmul is timed again and the higher value kept (the
            cache only ever rises), once per rate: a model that beats the matmul is not timed again at every run.

    Returns:
        (flops_per_second, from_cache). Without `at_least` (the call at build time, whose value
        `steps_per_execution: auto` decides with) it is the first value timed on this machine, whatever later
        timings found: so that decision never moves between runs. With `at_least` (for MFU): the highest timed.
    """
    path = cache_path or default_cache_path()
    key = f"{device_kind} | {dtype} matmul {matrix_size}x{matrix_size}"
    first_key, retimed_key = f"{key} | first", f"{key} | timed again for"
    cache = _read_cache(path)
    cached, first, retimed_for = (_positive(cache.get(k)) for k in (key, first_key, retimed_key))
    if cached is not None and at_least is None:
        return first or cached, True
    if cached is not None and (cached >= at_least or (retimed_for or 0.0) >= at_least):
        return cached, True
    measured = (measure or (lambda size, kind: measure_matmul_flops(size, dtype=kind)))(
        matrix_size, dtype
    )
    cache = _read_cache(path)  # another process may have written it meanwhile
    earlier = _positive(cache.get(key)) or 0.0
    cache[key] = max(measured, earlier, cached or 0.0)
    if at_least is not None:  # the value decisions were made with stays what they read
        cache.setdefault(first_key, earlier or cached or measured)
        cache[retimed_key] = max(at_least, _positive(cache.get(retimed_key)) or 0.0)
    _write_cache(path, cache)
    return (cache[key] if at_least is not None else cache.get(first_key, cache[key])), False


def _positive(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def checked_mfu(
    flops_per_example: float | None,
    examples_per_second: float | None,
    peak_flops: float | None,
    peak_source: str,
    remeasure: Callable[[float], tuple[float | None, str]] | None = None,
) -> tuple[float | None, float | None, str]:
    """MFU against a peak that is not below the rate training reached: (mfu or None, peak FLOP/s, its source).

    A CPU's or GPU's peak is a matmul timed once per machine and cached; timed while other processes held the
    cores it is too low (a CI machine cached 118 GFLOP/s and then trained a small CNN at 138 GFLOP/s: MFU 117%).
    When training ran faster than the peak, `remeasure(achieved FLOP/s)` times the matmul again (the cache keeps
    the higher value) and MFU is taken against that; if training is still faster, there is no MFU, and the
    source says why. A TPU's peak comes from a table: no `remeasure`, and the ratio is reported as computed.
    """
    value = mfu(flops_per_example, examples_per_second, peak_flops)
    if value is None or value <= 1.0 or remeasure is None:
        return value, peak_flops, peak_source
    achieved = float(flops_per_example) * float(examples_per_second)
    try:
        peak_flops, peak_source = remeasure(achieved)
    except Exception as error:  # noqa: BLE001 - MFU is a report: it must never stop a run
        peak_source = f"{peak_source}; timing it again failed ({type(error).__name__}: {error})"
    value = mfu(flops_per_example, examples_per_second, peak_flops)
    if value is None or value > 1.0:
        return (
            None,
            peak_flops,
            (
                f"{peak_source}; training ran at {achieved / 1e9:.1f} GFLOP/s, above that peak (the matmul was "
                "timed while other work used the cores), so no MFU"
            ),
        )
    return value, peak_flops, peak_source


def device_peak_flops(
    strategy_kind: str,
    device_kind: str | None,
    num_devices: int,
    cache_path: str | None = None,
    *,
    matrix_size: int = 2048,
    precision: str = "float32",
    at_least: float | None = None,
) -> tuple[float | None, str]:
    """Peak FLOP/s of all the devices a strategy trains on, for the dtype that trains, and where it comes from.

    Args:
        strategy_kind: `tpukit.engines.tensorflow.strategy.kind_of(strategy)`: "tpu", "multi_worker", "mirrored", "one_device" or
            "default".
        device_kind: for a TPU, its device kind or accelerator type ("TPU v4", "v5litepod-8"; see
            `detect_device_kind`); for a CPU or GPU, the description the measurement is cached under (include
            the model name: a cache shared by several machine types keeps one entry each). None: detect it.
        num_devices: the devices (replicas) the strategy trains on: `strategy.num_replicas_in_sync`.
        cache_path: the JSON file of measured CPU/GPU peaks; default `default_cache_path()`.
        matrix_size: side of the square matmul used to measure a CPU or GPU.
        precision: the Keras dtype policy the model trains with ("float32", "mixed_bfloat16", ...): a CPU or
            GPU is measured in its compute dtype (`peak_dtype`); a TPU's peak is bf16 for every policy.
        at_least: FLOP/s that training reached on all the devices: a measured peak below it is timed again
            (`measured_peak_flops`); ignored for a TPU.

    Returns:
        (peak FLOP/s in total or None when unknown, source); the source names the dtype. TPU: bf16 peak per chip from
        `PEAK_BF16_FLOPS_PER_CHIP`, divided by `TF_DEVICES_PER_CHIP`, times `num_devices`. GPU: the measured
        matmul rate of one GPU in the compute dtype times `num_devices`. CPU: the measured rate of the host (TensorFlow's
        matmul already uses every core) times the number of hosts, so virtual CPU devices are not counted twice.
    """
    if num_devices < 1:
        raise ValueError(
            f"device_peak_flops: num_devices must be >= 1; received num_devices={num_devices}. "
            "Fix: pass strategy.num_replicas_in_sync."
        )
    dtype = peak_dtype(precision, strategy_kind)
    if device_kind is None:
        device_kind = detect_device_kind(strategy_kind)
    if strategy_kind == "tpu":
        generation = tpu_generation(device_kind)
        if generation is None:
            return None, (
                f"unknown TPU device kind {device_kind!r} (known: {', '.join(PEAK_BF16_FLOPS_PER_CHIP)}); "
                "no peak FLOP/s, so no MFU"
            )
        per_chip = PEAK_BF16_FLOPS_PER_CHIP[generation]
        per_device = per_chip / TF_DEVICES_PER_CHIP[generation]
        return per_device * num_devices, (
            f"TPU {generation} bfloat16 peak {per_chip / 1e12:g} TFLOP/s per chip (Cloud TPU docs; the MXUs multiply "
            f"in bf16 for {precision} too) / {TF_DEVICES_PER_CHIP[generation]} device(s) per chip x {num_devices} "
            "device(s)"
        )
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        units, unit_name = num_devices, "GPU(s)"
    else:
        units, unit_name = _cpu_hosts(num_devices), "host(s)"
    return units_peak_flops(
        device_kind, cache_path, matrix_size, dtype, units, unit_name, at_least=at_least
    )


def units_peak_flops(
    device_kind: str,
    cache_path: str | None,
    matrix_size: int,
    dtype: str,
    units: int,
    unit_name: str,
    *,
    at_least: float | None = None,
    measure: Callable[[int, str], float] | None = None,
    shown: str | None = None,
) -> tuple[float | None, str]:
    """`measured_peak_flops` of one unit (a GPU, or a host whose CPU devices share its cores) times `units`, and
    where it comes from (`shown`: the device named there, default `device_kind`); None and why when the
    measurement fails. Both engines' CPU/GPU peaks come from here."""
    try:
        per_unit, cached = measured_peak_flops(
            device_kind,
            cache_path,
            matrix_size,
            dtype,
            measure=measure,
            at_least=None if at_least is None else at_least / units,
        )
    except Exception as error:  # noqa: BLE001 - MFU is a report: it must never stop a run
        return None, f"measuring the peak FLOP/s failed ({type(error).__name__}: {error}); no MFU"
    how = "cached" if cached else ("timed again" if at_least is not None else "measured")
    return per_unit * units, (
        f"{how} {dtype} {matrix_size}x{matrix_size} matmul peak of {shown or device_kind}: "
        f"{per_unit / 1e9:.1f} GFLOP/s x {units} {unit_name}"
    )


def _cpu_hosts(num_devices: int) -> int:
    """Hosts behind `num_devices` CPU replicas: virtual CPU devices of one process share one host's cores."""
    import tensorflow as tf

    local = max(1, len(tf.config.list_logical_devices("CPU")))
    return max(1, num_devices // local)


def mfu(
    flops_per_example: float | None, examples_per_second: float | None, peak_flops: float | None
) -> float | None:
    """Model FLOPs utilization: `flops_per_example * examples_per_second / peak_flops`, or None if any is unknown.

    Args:
        flops_per_example: training FLOPs per example (`model_flops_per_example`).
        examples_per_second: measured training throughput over all devices.
        peak_flops: peak FLOP/s of all devices (`device_peak_flops`).
    """
    if not flops_per_example or not examples_per_second or not peak_flops or peak_flops <= 0:
        return None
    return float(flops_per_example) * float(examples_per_second) / float(peak_flops)
