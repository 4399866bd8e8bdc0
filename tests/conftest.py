"""Test setup: 8 virtual CPU devices (so multi-replica tests run on a 2-core machine), quiet TF logs, tmp dirs.

The virtual devices must be configured before TensorFlow initializes, which is why this runs at import time.
The default strategy still uses one device (/cpu:0), so single-device tests are unaffected.
"""

import functools
import os
import tempfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The measured CPU peak (for MFU) is cached per machine; a value cached while the machine was loaded makes the
# reported MFU too high. Each test session measures its own (0.2 s) into a fresh cache, which its subprocesses share.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tpukit-test-cache-")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

VIRTUAL_CPUS = 8
_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * VIRTUAL_CPUS
)


@functools.cache
def mirrored(num_replicas: int) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy over the first `num_replicas` virtual CPUs, one per device count per process.

    Cached because each MirroredStrategy numbers its collective all-reduce groups from 1: a second 2-replica
    strategy in the same process makes the next training step fail with "joining a group that is already full".
    """
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(num_replicas)])


@pytest.fixture
def strategy_2():
    return mirrored(2)


@pytest.fixture(autouse=True)
def _float32_policy():
    """Tests that change the global dtype policy must not leak it into the next test."""
    import keras

    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(autouse=True)
def _registries_restored():
    """Names a test registers (register_model/register_source, module:function names, tpukit.fit) do not leak into
    the next test."""
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    saved = dict(MODELS), dict(SOURCES)
    yield
    for registry, before in zip((MODELS, SOURCES), saved, strict=True):
        registry.clear()
        registry.update(before)
