"""The JAX engine's checks, run when it is first used (never at `import tpukit`): JAX in the tested range, Keras on
the JAX backend, and TensorFlow (the CPU build: tf.data reads the input) importable; and the private JAX touches
the engine needs (`backends_started`, `register_unrolled_threefry_on_cpu`: `tpukit.engines.jax.cpu` uses them;
`coordination_client`: `tpukit.engines.jax.peers`).

JAX 0.10 is the newest release for CPython 3.11 (jax >= 0.11 needs Python >= 3.12); Keras 3.15's JAX trainer and
`keras.distribution` are tested on 8 virtual CPU devices (tests/engines/jax/) with the JAX releases of
`tpukit.environment.versions.TESTED_STACKS`.
"""

from __future__ import annotations

import contextlib
import os

from tpukit.environment import backend, quiet, versions

# Tested JAX minors: >= JAX_TESTED[0] and < JAX_TESTED[1] (setup.cfg's `jax` extra declares the same range; the
# stacks that ran are `tpukit.environment.versions.TESTED_STACKS`). Outside it the engine refuses to run unless
# $TPUKIT_ALLOW_UNTESTED_JAX=1.
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
        from tpukit.engines.keras.compat import allow_untested

        allow_untested(message, ALLOW_UNTESTED_JAX)
    return version


def backends_started() -> bool:
    """Whether JAX's backends have started (then XLA has read $XLA_FLAGS). Private, in jax 0.10-0.12:
    `jax._src.xla_bridge.backends_are_initialized`; False where this jax lacks it."""
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return False


def register_unrolled_threefry_on_cpu() -> str | None:
    """Registers jax's unrolled threefry2x32 lowering, which jax gives every platform but CPU, for XLA:CPU too
    (`tpukit.engines.jax.cpu` decides when); None once done, else why this jax has no rule to register. Private,
    jax 0.10: `jax/_src/random/threefry2x32.py`'s `_threefry2x32_lowering_rule` and `threefry2x32_p`."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32

        rule = threefry2x32._threefry2x32_lowering_rule
        primitive = threefry2x32.threefry2x32_p
    except (ImportError, AttributeError) as error:
        return str(error)
    mlir.register_lowering(primitive, rule, platform="cpu")
    return None


def coordination_client():
    """The JAX coordination service's client of this process (None before `jax.distributed.initialize`), which
    `tpukit.engines.jax.peers` asks which processes are alive. Private, jax 0.10:
    `jax._src.distributed.global_state.client` (its `get_live_nodes`, `key_value_set`, `key_value_try_get`); no
    public accessor (jax-ml/jax has none in 0.10-0.12)."""
    from jax._src import distributed

    return distributed.global_state.client


def check_jax() -> str:
    """Returns JAX's version after every check of this engine passes; raises ImportError naming the fix. Where
    `jax[tpu]` is installed on a machine with no TPU, JAX's backends start here, inside the quiet start
    (`start_backends_quietly`)."""
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
    start_backends_quietly()
    return version


def start_backends_quietly() -> bool:
    """Starts JAX's backends inside `quiet.start_up()` where libtpu is installed and no TPU is attached: libtpu then
    prints start-up warnings about the TPU it cannot find (no TPU_ACCELERATOR_TYPE, TPU_WORKER_HOSTNAMES), which the
    quiet start hides as it hides TensorFlow's. Not in a process that will join others (TPUKIT_COORDINATOR_ADDRESS,
    several TPU_WORKER_HOSTNAMES): JAX's distributed start must come before its backends; nor with JAX_PLATFORMS=cpu,
    where libtpu is not loaded (and the CPU's XLA flags are yet to be added: `tpukit.engines.jax.cpu`). Returns
    whether it did."""
    if (
        os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu"
        or quiet.tpu_attached()
        or not quiet.libtpu_installed()
        or os.environ.get("TPUKIT_COORDINATOR_ADDRESS")
        or "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
    ):
        return False
    import jax

    with quiet.start_up():
        jax.devices()
    return True


def layer_paths(model) -> list[str]:
    """The path of every layer in `model` (itself and nested ones, which `model.layers` does not list): a layout
    key `<layer path>/output` lays out that layer's output (Keras' `Layer.__call__` asks the distribution's
    `get_tensor_layout` for `current_path() + "/output"`). Keras 3 has no public recursive listing:
    `Layer._flatten_layers` (keras/src/layers/layer.py) is what `Layer.summary` walks; a layer not built yet has no
    path. Tested: Keras 3.15.x."""
    layers = model._flatten_layers(include_self=True, recursive=True)
    return [layer.path for layer in layers if getattr(layer, "path", None)]


# Keras minors `sharded_assign` was tested with (its patch reads `JaxVariable._layout`, `_direct_assign` and
# `KerasVariable.assign`'s contract): >= KERAS_SHARDED_ASSIGN[0] and < KERAS_SHARDED_ASSIGN[1].
KERAS_SHARDED_ASSIGN = ((3, 15), (3, 16))


@contextlib.contextmanager
def sharded_assign():
    """Inside, a variable with a layout assigned a host (numpy) value is filled shard by shard from the host: each
    device gets its slice (`jax.make_array_from_callback` with the variable's `NamedSharding`), and no device
    holds the whole value unless its layout says so.

    Why: Keras 3.15's `KerasVariable.assign(value)` converts `value` with `jnp.asarray` on JAX's default device (a
    full copy on one chip) before `_direct_assign` reshards it. KerasHub's `from_preset` fills every weight that
    way (`load_weights`: Keras' H5 store reads one variable into numpy, then `variable.assign(numpy)`), so a
    variable larger than one chip's memory runs it out of memory before it is sharded: keras-team/keras#21634
    (open). Host memory stays what the caller holds: one variable's numpy value at a time.

    Private Keras, patched on the class for the duration only: `keras.src.backend.jax.core.JaxVariable` (its
    `_layout`, `_direct_assign`; `assign` itself is `KerasVariable`'s). Tested: Keras 3.15.x (`KERAS_SHARDED_ASSIGN`);
    on another Keras the patch is not applied and Keras' own path runs (correct values, the one-device copy).
    Anything else (a JAX array, a traced value, a stateless scope, a variable without a layout) goes Keras' way."""
    import keras

    if not KERAS_SHARDED_ASSIGN[0] <= versions.minor(keras.__version__) < KERAS_SHARDED_ASSIGN[1]:
        yield False
        return
    import jax
    import numpy as np

    from tpukit.engines.keras import keras_private

    JaxVariable = keras_private.jax_variable_class()
    in_stateless_scope = keras_private.in_stateless_scope
    standardize_dtype = keras.backend.standardize_dtype

    inherited = JaxVariable.assign
    own = JaxVariable.__dict__.get("assign")

    def assign(self, value):
        layout = getattr(self, "_layout", None)
        if layout is None or not isinstance(value, np.ndarray) or in_stateless_scope():
            return inherited(self, value)
        sharding = getattr(layout, "backend_layout", layout)
        dtype = jax.dtypes.canonicalize_dtype(standardize_dtype(self._dtype))
        host = np.asarray(value, dtype=dtype)  # no copy when the dtype is already the variable's
        if host.shape != tuple(self.shape) or not isinstance(sharding, jax.sharding.Sharding):
            return inherited(self, value)  # Keras' own error for a wrong shape
        array = jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
        self._direct_assign(array)  # already laid out: Keras' `distribute_tensor` keeps it as it is
        return array

    JaxVariable.assign = assign
    try:
        yield True
    finally:
        if own is None:
            del JaxVariable.assign
        else:
            JaxVariable.assign = own
