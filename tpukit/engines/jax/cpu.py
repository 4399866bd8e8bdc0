"""The jax engine's CPU-only tuning, in one place. Each piece acts only when this run's devices are CPUs, where the
CPU benchmark measured its gain (docs/engines.md, benchmarks/README.md); on a TPU or GPU nothing here registers,
freezes, starts a process or edits $XLA_FLAGS, and metrics.json says why (`report`).

- XLA:CPU flags in $XLA_FLAGS (`CPU_XLA_FLAGS`). XLA reads them once, when JAX's backends start, so they are added
  at the engine's first use, judged from what is knowable without starting them (`accelerator_hints`), and taken
  back by `tune` if the devices turn out not to be CPUs.
- jax's unrolled threefry lowering on XLA:CPU (`use_unrolled_threefry_on_cpu`), registered by `tune` before any
  step is lowered.
- The heap alive once the devices are known, frozen for the garbage collector (`tpukit.engines.keras.gc_freeze`).
- The SavedModel's exporting process started by `build` and paused while steps train (`export_starts_early`,
  `ExportWaitsWhileTraining`); on an accelerator `export` starts it.

    cpu.before_backends()          # compat.check_jax, just before JAX's backends may start
    on_cpu = cpu.tune(devices)     # engine.hardware, once the devices are known
    metrics.update(cpu.report())   # engine.report: what was applied, and why not
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import os
import pkgutil
from importlib import metadata

import keras

from tpukit.engines.jax import compat
from tpukit.engines.jax.saved_model import SavedModelExport
from tpukit.engines.keras import gc_freeze
from tpukit.environment import engine_choice, versions

logger = logging.getLogger("tpukit")

_OFF = ("0", "off", "false", "no")

# ---- what this run's devices will be, before JAX's backends start -------------------------------------------------


def requested_platforms() -> list[str]:
    """The platforms JAX is asked for, in order (jax.config's `jax_platforms`, which $JAX_PLATFORMS sets); [] when
    JAX picks them itself."""
    import jax

    value = jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS", "")
    return [p.strip().lower() for p in str(value).split(",") if p.strip()]


def accelerator_plugins() -> list[str]:
    """The accelerator backends JAX may load here, from what is installed (nothing is started): `libtpu` (or
    $TPU_LIBRARY_PATH) and PJRT plugins (the `jax_plugins` namespace and entry points: `jax_cuda12_plugin`,
    ROCm's, ...)."""
    found = []
    if os.environ.get("TPU_LIBRARY_PATH") or importlib.util.find_spec("libtpu") is not None:
        found.append("libtpu")
    try:
        import jax_plugins  # the namespace package JAX discovers PJRT plugins in (jax/_src/xla_bridge.py)

        found += [module.name for module in pkgutil.iter_modules(jax_plugins.__path__)]
    except ImportError:
        pass
    found += [entry.name for entry in metadata.entry_points(group="jax_plugins")]
    return sorted(set(found))


def accelerator_hints(root: str = "/") -> list[str]:
    """Why this run's devices may be a TPU's or a GPU's, judged without starting JAX's backends; [] where they will
    be CPUs. Platforms asked for (`requested_platforms`) decide alone; else an attached TPU (its variables or its
    chips' device files: `engine_choice.tpu_present`) or an installed accelerator backend (`accelerator_plugins`:
    without one JAX cannot use a GPU). `root`: where the file system is (tests)."""
    platforms = requested_platforms()
    if platforms:
        if platforms == ["cpu"] * len(platforms):
            return []
        return [f"JAX is asked for {','.join(platforms)}"]
    hints = []
    if engine_choice.tpu_present(root=root):
        hints.append("a TPU is attached")
    plugins = accelerator_plugins()
    if plugins:
        hints.append(f"an accelerator backend is installed ({', '.join(plugins)})")
    return hints


# ---- XLA:CPU flags ------------------------------------------------------------------------------------------------

# (flag, value, the jaxlib minors it was measured on [low, high), the oldest TensorFlow minor whose XLA knows it). An
# XLA that does not know a flag aborts its process when it first reads $XLA_FLAGS: jaxlib's at its backend's start,
# TensorFlow's at its first XLA compile (this process imports TensorFlow for tf.data, and the processes it starts
# inherit the variable), so a flag is added only where both know it.
#
# `-individual_convolution`: jaxlib 0.10's XLA:CPU hands each convolution to YNNPACK, whose convolution weight
# gradients were 4-5x slower than XLA's own; whole convolutional models trained 1.3-1.5x faster without it, and a model
# without convolutions compiles to the same program (docs/engines.md, "XLA:CPU flags", has the measurements). Only
# the order of a convolution's sums changes.
CPU_XLA_FLAGS = (
    (
        "--xla_cpu_experimental_ynn_fusion_type",
        "-individual_convolution",
        ((0, 10), (0, 11)),
        (2, 21),
    ),
)
CPU_XLA_FLAGS_WHY = (
    "XLA's own convolutions, whose weight gradients were 4-5x faster than YNNPACK's on jaxlib 0.10"
)
CPU_XLA_FLAGS_ENV = "TPUKIT_XLA_CPU_FLAGS"  # 0/off: add none


@dataclasses.dataclass(frozen=True)
class XlaFlags:
    """What this process did to $XLA_FLAGS: the flags it added, and why (none) otherwise."""

    added: tuple[str, ...]
    reason: str

    def as_dict(self) -> dict:
        return {"added": list(self.added), "reason": self.reason}


def cpu_xla_flags(
    jaxlib: str, tensorflow: str | None, xla_flags: str
) -> tuple[list[str], list[str]]:
    """(the `CPU_XLA_FLAGS` to add for these jaxlib and TensorFlow versions and this $XLA_FLAGS, why each other one is
    not added). `tensorflow`: None where it is not installed."""
    wanted, skipped = [], []
    for name, value, (low, high), oldest_tensorflow in CPU_XLA_FLAGS:
        if name in xla_flags:
            skipped.append(f"{name}: XLA_FLAGS sets it already")
        elif not low <= versions.minor(jaxlib) < high:
            skipped.append(
                f"{name}: measured on jaxlib {versions.dotted(low)} only; this is {jaxlib}"
            )
        elif tensorflow is not None and versions.minor(tensorflow) < oldest_tensorflow:
            skipped.append(
                f"{name}: TensorFlow {tensorflow}'s XLA does not know it (it would stop at its first XLA compile); "
                f"TensorFlow >= {versions.dotted(oldest_tensorflow)} does"
            )
        else:
            wanted.append(f"{name}={value}")
    return wanted, skipped


_flags: XlaFlags | None = None  # the process's: XLA reads $XLA_FLAGS once
_xla_flags_before: str | None = None  # $XLA_FLAGS as it was before flags were added (None: unset)


def before_backends() -> XlaFlags:
    """Adds the `CPU_XLA_FLAGS` this jaxlib and TensorFlow take (`cpu_xla_flags`) to $XLA_FLAGS where this run's
    devices will be CPUs (`accelerator_hints` finds none), unless the user set them (or turned them off with
    $TPUKIT_XLA_CPU_FLAGS=0) or JAX's backends started already (then XLA has read its flags). Once per process; they
    apply to XLA:CPU compiles, for the rest of the process and the processes it starts."""
    global _flags, _xla_flags_before
    if _flags is not None:
        return _flags
    switch = os.environ.get(CPU_XLA_FLAGS_ENV, "").strip()
    if switch.lower() in _OFF:
        _flags = XlaFlags((), f"none: {CPU_XLA_FLAGS_ENV}={switch}")
        return _flags
    try:
        jaxlib = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        _flags = XlaFlags((), "none: jaxlib is not installed")
        return _flags
    try:
        import tensorflow

        tensorflow_version = tensorflow.__version__
    except ImportError:
        tensorflow_version = None
    current = os.environ.get("XLA_FLAGS")
    wanted, skipped = _flags_for_this_run(jaxlib, tensorflow_version, current or "")
    if wanted:
        _xla_flags_before = current
        os.environ["XLA_FLAGS"] = " ".join([current or "", *wanted]).strip()
    beside = f"TensorFlow {tensorflow_version}" if tensorflow_version else "no TensorFlow"
    _flags = XlaFlags(
        tuple(wanted), "; ".join(skipped) or f"jaxlib {jaxlib}, {beside}: {CPU_XLA_FLAGS_WHY}"
    )
    return _flags


def _flags_for_this_run(
    jaxlib: str, tensorflow: str | None, current: str
) -> tuple[list[str], list[str]]:
    """`cpu_xla_flags`, then none where the devices may not be CPUs or JAX's backends started; logs why not."""
    wanted, skipped = cpu_xla_flags(jaxlib, tensorflow, current)
    hints = accelerator_hints() if wanted else []
    if hints:
        # An accelerator's own XLA reads XLA_FLAGS too, and whether it knows these was not checked.
        skipped.append(
            f"{' '.join(wanted)}: this run's devices may not be CPUs ({'; '.join(hints)}); JAX_PLATFORMS=cpu "
            "trains on the CPU with them"
        )
        wanted = []
    late = bool(wanted) and compat.backends_started()
    if late:
        skipped.append(
            f"{' '.join(wanted)}: JAX's backend started before tpukit's jax engine was first used, and XLA had "
            "read its flags then. Fix: run no JAX code before the first tpukit.run/fit (a model built outside the "
            "function you hand tpukit.fit, jax.devices()), or set XLA_FLAGS before Python starts"
        )
        wanted = []
    if skipped and not wanted:
        # Only a late start is the user's to fix; another jaxlib or an accelerator is no news to them.
        logger.log(
            logging.INFO if late else logging.DEBUG,
            "tpukit: no XLA:CPU flags added (%s)",
            "; ".join(skipped),
        )
    return wanted, skipped


def _take_back_xla_flags(why: str) -> None:
    """$XLA_FLAGS as it was before `before_backends` added flags on a guess the devices proved wrong: the processes
    this one starts do not inherit them (the accelerator's programs never read XLA:CPU's flags)."""
    global _flags
    if _flags is None or not _flags.added:
        return
    if _xla_flags_before is None:
        os.environ.pop("XLA_FLAGS", None)
    else:
        os.environ["XLA_FLAGS"] = _xla_flags_before
    _flags = XlaFlags((), f"{' '.join(_flags.added)}: taken back, {why}")


# ---- jax's threefry lowering on XLA:CPU -----------------------------------------------------------------------------

# jax's threefry2x32 (the PRNG behind every `jax.random` draw, hence Keras' dropout on JAX) lowers on CPU to a
# rolled `fori_loop` of its five rounds (jax/_src/random/threefry2x32.py, "since the unrolled lowering is large"),
# which XLA:CPU runs op by op outside every fusion; every other platform gets the unrolled rounds. They compute the
# same bits (tests/engines/jax/test_jax_threefry.py compares them) and fuse with the ops around them: +4% on keras-io's
# text transformer, +10% on an MLP with dropout (docs/engines.md, "Random bits on XLA:CPU"). jax 0.10's internals.
THREEFRY_UNROLLED_JAX = ((0, 10), (0, 11))  # jax minors [low, high) measured
CPU_THREEFRY_ENV = "TPUKIT_JAX_CPU_THREEFRY"  # rolled: keep jax's own CPU lowering


@dataclasses.dataclass(frozen=True)
class ThreefryLowering:
    """Whether this process registered the unrolled lowering for XLA:CPU (`unrolled`), and why (not)."""

    unrolled: bool
    reason: str

    def as_dict(self) -> dict:
        return {"unrolled": self.unrolled, "reason": self.reason}


_THREEFRY_OFF = ("rolled", "0", "off", "false", "no")
_THREEFRY_ON = ("", "unrolled", "1", "on", "true", "yes")


def threefry_choice(jax_version: str, switch: str) -> ThreefryLowering:
    """Whether this jax (and $TPUKIT_JAX_CPU_THREEFRY's value `switch`) gets the unrolled CPU lowering, and why. A
    value that is neither on nor off keeps jax's lowering, and the reason names the values it takes."""
    value = switch.strip().lower()
    if value in _THREEFRY_OFF:
        return ThreefryLowering(
            False, f"jax's rolled CPU lowering: {CPU_THREEFRY_ENV}={switch.strip()}"
        )
    if value not in _THREEFRY_ON:
        return ThreefryLowering(
            False,
            f"jax's rolled CPU lowering: {CPU_THREEFRY_ENV}={switch.strip()!r} is not one of "
            f"{', '.join(v for v in _THREEFRY_OFF + _THREEFRY_ON if v)} (unset: unrolled where measured)",
        )
    low, high = THREEFRY_UNROLLED_JAX
    if not low <= versions.minor(jax_version) < high:
        return ThreefryLowering(
            False,
            f"jax's rolled CPU lowering: the unrolled one was measured on jax {versions.dotted(low)} only; "
            f"this is {jax_version}",
        )
    return ThreefryLowering(
        True,
        f"jax {jax_version}: threefry2x32's five rounds unrolled on CPU, as on TPUs and GPUs (the same bits; "
        "they fuse with the ops around them instead of running as a while loop)",
    )


@functools.cache  # the process's: a lowering rule is registered once
def use_unrolled_threefry_on_cpu() -> ThreefryLowering:
    """Registers jax's unrolled threefry2x32 lowering for XLA:CPU where `threefry_choice` says so. It applies to
    CPU programs lowered after it, for the rest of the process; the random bits are the same."""
    switch = os.environ.get(CPU_THREEFRY_ENV, "")
    choice = threefry_choice(metadata.version("jax"), switch)
    if not choice.unrolled:
        if switch.strip().lower() not in _THREEFRY_OFF + _THREEFRY_ON:
            logger.warning("tpukit: %s.", choice.reason)
        return choice
    missing = compat.register_unrolled_threefry_on_cpu()
    if missing is not None:
        return ThreefryLowering(
            False,
            f"jax's rolled CPU lowering: this jax has no unrolled rule to register ({missing})",
        )
    return choice


# ---- the run's devices known: apply or decline, and report ----------------------------------------------------------

_threefry: ThreefryLowering | None = None
_heap: gc_freeze.Freeze | None = None


def tune(devices) -> bool:
    """The CPU tuning of a run on `devices` (JAX devices): where all are CPUs, jax's unrolled threefry lowering and
    the frozen heap; elsewhere nothing, and XLA:CPU flags `before_backends` added on a wrong guess are taken back.
    Returns whether the devices are CPUs. Call it before the run's first step is lowered."""
    global _threefry, _heap
    platforms = sorted({device.platform for device in devices})
    before_backends()  # a no-op after the engine's checks; else it records that the backends had started
    if platforms == ["cpu"]:
        _threefry = use_unrolled_threefry_on_cpu()
        _heap = gc_freeze.freeze_the_imports()
        return True
    why = f"the devices are {', '.join(platforms)}, not CPUs"
    _take_back_xla_flags(why)
    _threefry = ThreefryLowering(False, f"jax's own lowering: {why}")
    _heap = gc_freeze.Freeze(False, f"not frozen: {why}")
    return False


def report() -> dict:
    """What this process's CPU tuning did, for metrics.json: `xla_cpu_flags` (`added`, `reason`),
    `jax_cpu_threefry` (`unrolled`, `reason`) and `gc_freeze` (`frozen`, `reason`). Reading it applies nothing:
    a lowering registered after the steps were lowered would record what they never got."""
    never = "the jax engine's hardware() did not run in this process"
    return {
        "xla_cpu_flags": (_flags or XlaFlags((), f"none: {never}")).as_dict(),
        "jax_cpu_threefry": (
            _threefry or ThreefryLowering(False, f"jax's rolled CPU lowering: {never}")
        ).as_dict(),
        "gc_freeze": (_heap or gc_freeze.Freeze(False, f"not frozen: {never}")).as_dict(),
    }


# ---- the SavedModel's exporting process ---------------------------------------------------------------------------


def export_starts_early(strategy_kind: str) -> bool:
    """Whether `build` starts the SavedModel's exporting process, whose imports then overlap the build and the first
    step's compilation (`saved_model`), paused while steps train (`ExportWaitsWhileTraining`): on CPUs only, where
    it shortened the export phase by seconds (benchmarks/README.md). Elsewhere `export` starts it."""
    return strategy_kind == "jax_cpu"


class ExportWaitsWhileTraining(keras.callbacks.Callback):
    """Pauses the early-started exporting process from the end of each `fit` segment's first execution (its imports
    ran beside the build and the first step's compilation) to the segment's end, so that on a small model, whose
    build is short, they take no CPU from the training steps (`saved_model.SavedModelExport.pause`)."""

    def __init__(self, export: SavedModelExport):
        super().__init__()
        self.export = export

    def on_train_batch_end(self, batch, logs=None):
        self.export.pause()  # once: a no-op while paused

    def on_train_end(self, logs=None):
        self.export.resume()
