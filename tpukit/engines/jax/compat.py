"""The JAX engine's checks, run when it is first used (never at `import tpukit`): JAX in the tested range, Keras on
the JAX backend, and TensorFlow (the CPU build: tf.data reads the input) importable; and the XLA:CPU flags the
engine adds before JAX's backend starts (`use_cpu_xla_flags`); and jax's unrolled threefry lowering on CPU
(`use_unrolled_threefry_on_cpu`).

JAX 0.10 is the newest release for CPython 3.11 (jax >= 0.11 needs Python >= 3.12); Keras 3.15's JAX trainer and
`keras.distribution` were measured with 0.10.2 on 8 virtual CPU devices (tests/engines/jax/).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os

from tpukit.environment import backend, quiet, versions

# Tested JAX minors: >= JAX_TESTED[0] and < JAX_TESTED[1] (setup.cfg's `jax` extra declares the same range): 0.10.2
# measured here (CPython 3.11); 0.12 is what issue 20's measurements used (CPython 3.12). Outside it the engine
# refuses to run unless $TPUKIT_ALLOW_UNTESTED_JAX=1.
JAX_TESTED = ((0, 10), (0, 13))
ALLOW_UNTESTED_JAX = "TPUKIT_ALLOW_UNTESTED_JAX"


def installed_jax() -> str:
    """JAX's version; raises ImportError with the install command if it is missing or out of range. Imports
    nothing heavy (the doctor calls it)."""
    from importlib import metadata

    try:
        version = metadata.version("jax")
    except metadata.PackageNotFoundError:
        raise ImportError(
            "tpukit's jax engine needs JAX. Fix: "
            f'`pip install "{versions.tpukit_requirement("jax")}"` on CPU/GPU, or '
            f'`pip install "{versions.tpukit_requirement("jax-tpu")}"` on a TPU VM (a Colab or Kaggle TPU runtime '
            "has JAX already)."
        ) from None
    low, high = (versions.dotted(v) for v in JAX_TESTED)
    if not JAX_TESTED[0] <= versions.minor(version) < JAX_TESTED[1]:
        message = (
            f"tpukit's jax engine was tested with jax >= {low} and < {high}; received jax {version}. Fix: "
            f'`pip install "jax>={low},<{high}"` and restart the runtime'
        )
        if os.environ.get(ALLOW_UNTESTED_JAX) == "1":
            logging.getLogger("tpukit").warning(
                "tpukit: %s (continuing: %s=1).", message, ALLOW_UNTESTED_JAX
            )
            return version
        raise ImportError(f"{message}, or set {ALLOW_UNTESTED_JAX}=1 to try it anyway.")
    return version


# XLA:CPU flags the engine adds to $XLA_FLAGS: (flag, value, the jaxlib minors it was measured on [low, high), the
# oldest TensorFlow minor whose XLA knows it). An XLA that does not know a flag aborts its process when it first
# reads $XLA_FLAGS: jaxlib's at its backend's start, TensorFlow's at its first XLA compile (the jax engine's process
# imports TensorFlow for tf.data, and the processes it starts inherit the variable), so a flag is added only where
# both know it. TensorFlow 2.19.1 and 2.20.0 abort on the one below ("Unknown flag in XLA_FLAGS"); 2.21.0 takes it.
#
# `-individual_convolution`: jaxlib 0.10.2's XLA:CPU hands each convolution to YNNPACK, which computes a
# convolution's weight gradient (a convolution whose window is the whole output image, batch as its features) 4-5x
# slower than XLA's own Eigen convolution: 21-22 ms against 4.4-4.5 ms for the gradient of a 3x3, 32 -> 64 channel
# convolution on a batch of 128 13x13 images; the forward pass moved by up to 2x either way between runs (2.4 ->
# 3.6 ms in one, 5.5 -> 2.5 ms in a reviewer's). Whole models, plain Keras on JAX, training examples/s:
# keras-io's mnist_convnet 1,480-1,550 -> 1,900-2,030, resnet_cifar-8 550-590 -> 810-890; `evaluate` unchanged within
# noise (mnist_convnet 40-42k, ResNet 4.0-4.2k); a model without convolutions compiles to the same program. All on
# the 2-core "Intel(R) Xeon(R) Processor" VM of 2026-11-27. Nothing here changes what is computed beyond the order
# of a convolution's sums. (jaxlib 0.10.0 gave this convolution to XLA's own code already: the flag changes nothing
# there.)
CPU_XLA_FLAGS = (
    (
        "--xla_cpu_experimental_ynn_fusion_type",
        "-individual_convolution",
        ((0, 10), (0, 11)),
        (2, 21),
    ),
)
CPU_XLA_FLAGS_WHY = "XLA's own convolutions, whose weight gradients were 4-5x faster than YNNPACK's on jaxlib 0.10.2"
CPU_XLA_FLAGS_ENV = "TPUKIT_XLA_CPU_FLAGS"  # 0/off: add none


@dataclasses.dataclass(frozen=True)
class XlaFlags:
    """What `use_cpu_xla_flags` did in this process: the flags it added to $XLA_FLAGS, and why (none) otherwise."""

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


def _accelerator_plugins() -> list[str]:
    """The accelerator backends JAX may load here, from what is installed (nothing is started): `libtpu` (or
    $TPU_LIBRARY_PATH) and PJRT plugins (the `jax_plugins` namespace and entry points, e.g. CUDA's). Empty with
    JAX_PLATFORMS=cpu. Their XLA reads $XLA_FLAGS too, and whether theirs knows the CPU flags was not checked, so an
    accelerator host gets none (its steps do not run on XLA:CPU anyway)."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return []
    import importlib.util
    import pkgutil
    from importlib import metadata

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


def _backend_started() -> bool:
    # jax._src.xla_bridge.backends_are_initialized: private, in jax 0.10 (the range CPU_XLA_FLAGS are added for).
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


@functools.cache  # the process's: XLA reads $XLA_FLAGS once, when JAX's first backend starts
def use_cpu_xla_flags() -> XlaFlags:
    """Adds the `CPU_XLA_FLAGS` this jaxlib and TensorFlow take (`cpu_xla_flags`) to $XLA_FLAGS unless the user set
    them (or turned them off with $TPUKIT_XLA_CPU_FLAGS=0), an accelerator backend is installed
    (`_accelerator_plugins`) or JAX's backend already started (then XLA has read its flags). They apply to XLA:CPU
    compiles only (a TPU or GPU program is unaffected), for the rest of the process and the processes it starts."""
    switch = os.environ.get(CPU_XLA_FLAGS_ENV, "").strip()
    if switch.lower() in ("0", "off", "false", "no"):
        return XlaFlags((), f"none: {CPU_XLA_FLAGS_ENV}={switch}")
    from importlib import metadata

    try:
        jaxlib = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        return XlaFlags((), "none: jaxlib is not installed")
    try:
        import tensorflow

        tensorflow_version = tensorflow.__version__
    except ImportError:
        tensorflow_version = None
    current = os.environ.get("XLA_FLAGS", "")
    wanted, skipped = cpu_xla_flags(jaxlib, tensorflow_version, current)
    plugins = _accelerator_plugins() if wanted else []
    if plugins:
        skipped.append(
            f"{' '.join(wanted)}: an accelerator backend is installed ({', '.join(plugins)}), whose XLA reads "
            "XLA_FLAGS too; JAX_PLATFORMS=cpu trains on the CPU with them"
        )
        wanted = []
    late = bool(wanted) and _backend_started()
    if late:
        skipped.append(
            f"{' '.join(wanted)}: JAX's backend started before tpukit's jax engine was first used, and XLA had "
            "read its flags then. Fix: run no JAX code before the first tpukit.run/fit (a model built outside the "
            "function you hand tpukit.fit, jax.devices()), or set XLA_FLAGS before Python starts"
        )
        wanted = []
    if wanted:
        os.environ["XLA_FLAGS"] = " ".join([current, *wanted]).strip()
    elif skipped:
        # Only a late start is the user's to fix; another jaxlib or an accelerator backend is no news to them.
        logging.getLogger("tpukit").log(
            logging.INFO if late else logging.DEBUG,
            "tpukit: no XLA:CPU flags added (%s)",
            "; ".join(skipped),
        )
    beside = f"TensorFlow {tensorflow_version}" if tensorflow_version else "no TensorFlow"
    return XlaFlags(
        tuple(wanted), "; ".join(skipped) or f"jaxlib {jaxlib}, {beside}: {CPU_XLA_FLAGS_WHY}"
    )


# jax's threefry2x32 (the PRNG behind every `jax.random` draw, hence Keras' dropout on JAX) lowers on CPU to a
# rolled `fori_loop` of its five rounds (jax/_src/random/threefry2x32.py, `_threefry2x32_cpu_lowering_rule`, "since
# the unrolled lowering is large"); every other platform gets the unrolled rounds. XLA:CPU runs that while loop op by
# op over the whole array of counters, outside every fusion. The unrolled rounds compute the same bits (uint32 adds,
# rotations and xors in the same order: tests/engines/jax/test_jax_threefry.py compares them) and fuse with the ops
# around them. Measured with jaxlib 0.10.2 on the 2-core "Intel(R) Xeon(R) Processor" VM of 2026-11-27, the two
# lowerings' models in one process, 6 alternating epochs each (plain Keras on JAX, training examples/s): keras-io's
# text transformer (dropout on 32x200x32 activations) 664-683 -> 690-724 (+3.9%); TensorFlow's quickstart MLP
# (Dropout(0.2) on 1024x128) 246-277k -> 274-316k (+10%); keras-io's mnist_convnet 1,783-1,893 -> 1,770-1,928
# (+0.9%, noise); the first epoch, compile included, no slower (text transformer 7.3 -> 5.7 s, MLP 0.8 -> 0.6 s).
# The profile of the text transformer's step: the two while loops (3.9 ms) and the add fusions feeding them (3.3 ms)
# gave way to fusions of about a tenth of that. Private to jax 0.10 (the rule's name and the `cpu` registration).
THREEFRY_UNROLLED_JAX = ((0, 10), (0, 11))  # jax minors [low, high) measured
CPU_THREEFRY_ENV = "TPUKIT_JAX_CPU_THREEFRY"  # rolled: keep jax's own CPU lowering


@dataclasses.dataclass(frozen=True)
class ThreefryLowering:
    """What `use_unrolled_threefry_on_cpu` did in this process: `unrolled` true when it registered the unrolled
    lowering for XLA:CPU, and why (not)."""

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
    """Registers jax's unrolled threefry2x32 lowering for XLA:CPU (see `THREEFRY_UNROLLED_JAX`) where
    `threefry_choice` says so. It applies to programs lowered after it, for the rest of the process, on CPU only (a
    TPU or GPU program already gets it); the random bits are the same."""
    from importlib import metadata

    switch = os.environ.get(CPU_THREEFRY_ENV, "")
    choice = threefry_choice(metadata.version("jax"), switch)
    if not choice.unrolled:
        if switch.strip().lower() not in _THREEFRY_OFF + _THREEFRY_ON:
            logging.getLogger("tpukit").warning("tpukit: %s.", choice.reason)
        return choice
    try:
        # Private, jax 0.10: the unrolled rule jax registers for every platform but CPU.
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32

        rule = threefry2x32._threefry2x32_lowering_rule
        primitive = threefry2x32.threefry2x32_p
    except (ImportError, AttributeError) as error:
        return ThreefryLowering(
            False, f"jax's rolled CPU lowering: this jax has no unrolled rule to register ({error})"
        )
    mlir.register_lowering(primitive, rule, platform="cpu")
    return choice


def threefry_lowering() -> ThreefryLowering:
    """What `use_unrolled_threefry_on_cpu` did in this process (for metrics.json), without doing it: registering the
    rule after the steps were lowered would record what they never got."""
    if use_unrolled_threefry_on_cpu.cache_info().currsize:
        return use_unrolled_threefry_on_cpu()
    return ThreefryLowering(
        False, "jax's rolled CPU lowering: the jax engine's checks (check_jax) did not run"
    )


def check_jax() -> str:
    """Returns JAX's version after every check of this engine passes, with the XLA:CPU flags added
    (`use_cpu_xla_flags`) and jax's unrolled threefry lowering on CPU (`use_unrolled_threefry_on_cpu`); raises
    ImportError naming the fix. Where `jax[tpu]` is installed on a machine with no TPU, JAX's backends start here,
    inside the quiet start (`start_backends_quietly`)."""
    backend.require("jax", "jax")
    quiet.share_libtpu()
    version = installed_jax()
    from tpukit.engines.keras.compat import check_keras

    check_keras()
    try:
        import tensorflow  # noqa: F401 - tf.data builds the input pipelines on every engine
    except ImportError as error:  # pragma: no cover - exercised only without TensorFlow installed
        raise ImportError(
            "tpukit's jax engine reads its input with tf.data, which needs TensorFlow's CPU build. Fix: "
            f'`pip install "{versions.tpukit_requirement("jax")}"` (received: {error}).'
        ) from error
    use_cpu_xla_flags()
    use_unrolled_threefry_on_cpu()
    start_backends_quietly()
    return version


def start_backends_quietly() -> bool:
    """Starts JAX's backends inside `quiet.start_up()` where libtpu is installed and no TPU is attached: libtpu then
    prints start-up warnings about the TPU it cannot find (no TPU_ACCELERATOR_TYPE, TPU_WORKER_HOSTNAMES), which the
    quiet start hides as it hides TensorFlow's. Not in a process that will join others (TPUKIT_COORDINATOR_ADDRESS,
    several TPU_WORKER_HOSTNAMES): JAX's distributed start must come before its backends. Returns whether it did."""
    if (
        quiet.tpu_attached()
        or not quiet.libtpu_installed()
        or os.environ.get("TPUKIT_COORDINATOR_ADDRESS")
        or "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
    ):
        return False
    import jax

    with quiet.start_up():
        jax.devices()
    return True
