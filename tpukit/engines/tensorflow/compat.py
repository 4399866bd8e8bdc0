"""The TensorFlow engine's checks, run when it is first used (never at `import tpukit`): Keras on the TensorFlow
backend, TensorFlow and Keras in the tested ranges.

TPU hosts run the `tensorflow-tpu` wheel, which stopped at 2.19.1 for Keras (and 2.18 on Google's TPU VM images)
while the CPU wheel is at 2.21, so tpukit supports a range rather than one version. The range is every TensorFlow
minor in `tpukit.environment.versions.COMBINATIONS` (where each row says where its knowledge comes from); setup.cfg's
`tensorflow` extra declares the same range.
"""

from __future__ import annotations

from tpukit.engines.keras.compat import ALLOW_UNTESTED_KERAS, check_keras
from tpukit.environment import backend, versions
from tpukit.environment.versions import KERAS_TESTED, MAX_TF_EXCLUSIVE, MIN_TF

__all__ = ["ALLOW_UNTESTED_KERAS", "KERAS_TESTED", "check_keras", "check_tensorflow"]


def check_tensorflow() -> str:
    """Imports TensorFlow and returns its version; raises ImportError with the fix if it is missing or out of range."""
    backend.require("tensorflow", "TensorFlow")
    try:
        import tensorflow as tf
    except ImportError as error:  # pragma: no cover - exercised only without TensorFlow installed
        raise ImportError(
            "tpukit needs TensorFlow, which is an extra so that TPU hosts keep their own build. Fix: "
            f'`pip install "{versions.tpukit_requirement("tensorflow")}"` on CPU/GPU, or '
            f'`pip install "{versions.tpukit_requirement("tpu")}"` on a TPU VM '
            f"(received: {error}); `python -m tpukit.doctor` says which this machine needs."
        ) from error
    version = tf.__version__
    low = ".".join(map(str, MIN_TF))
    high = ".".join(map(str, MAX_TF_EXCLUSIVE))
    if not (MIN_TF <= versions.minor(version) < MAX_TF_EXCLUSIVE):
        raise ImportError(
            f"tpukit supports TensorFlow >= {low} and < {high}; received tensorflow {version}. Fix: "
            f"`{versions.tensorflow_install_command()}` on CPU/GPU, or on a TPU VM the build in "
            "tpukit/environment/versions.py (`python -m tpukit.doctor` prints the command), then restart the runtime."
        )
    check_keras()
    return version
