"""The TensorFlow engine's checks, run when it is first used (never at `import tpukit`): Keras on the TensorFlow
backend, TensorFlow and Keras in the tested ranges.

TPU hosts run the `tensorflow-tpu` wheel, which stopped at 2.19.1 for Keras (and 2.18 on Google's TPU VM images)
while the CPU wheel is at 2.21, so tpukit supports a range rather than one version. The range is every TensorFlow
minor in `tpukit.environment.versions.COMBINATIONS` (where each row says where its knowledge comes from); setup.cfg's
`tensorflow` extra declares the same range.
"""

from __future__ import annotations

import os

from tpukit.environment import backend
from tpukit.environment.versions import MAX_TF_EXCLUSIVE, MIN_TF


def _version_tuple(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1])


def check_tensorflow() -> str:
    """Imports TensorFlow and returns its version; raises ImportError with the fix if it is missing or out of range."""
    backend.require("tensorflow", "TensorFlow")
    try:
        import tensorflow as tf
    except ImportError as error:  # pragma: no cover - exercised only without TensorFlow installed
        raise ImportError(
            "tpukit needs TensorFlow, which is an extra so that TPU hosts keep their own build. Fix: "
            "`pip install 'tpukit[tensorflow]'` on CPU/GPU, or `pip install 'tpukit[tpu]'` on a TPU VM "
            f"(received: {error})."
        ) from error
    version = tf.__version__
    low = ".".join(map(str, MIN_TF))
    high = ".".join(map(str, MAX_TF_EXCLUSIVE))
    if not (MIN_TF <= _version_tuple(version) < MAX_TF_EXCLUSIVE):
        raise ImportError(
            f"tpukit supports TensorFlow >= {low} and < {high}; received tensorflow {version}. Fix: "
            f"`pip install 'tensorflow>={low},<{high}'` on CPU/GPU, or on a TPU VM the build in tpukit/environment/versions.py "
            "(`python -m tpukit.doctor` prints the command), then restart the runtime."
        )
    check_keras()
    return version


# tpukit patches private Keras internals (trainer._should_eval, _maybe_symbolic_build, _autoconvert_optionals,
# keras.src.tree, TensorBoard._log_epoch_metrics; see loop.py, trainer.py, callbacks.py). They were tested with these
# Keras minors only (the suite on 3.15.1, with TF 2.19.1, 2.20.0 and 2.21.0: .ci/tf_matrix.sh). setup.cfg declares
# the same range.
KERAS_TESTED = ((3, 15), (3, 16))  # [low, high)
ALLOW_UNTESTED_KERAS = "TPUKIT_ALLOW_UNTESTED_KERAS"


def check_keras() -> str:
    """Returns Keras' version; raises ImportError outside `KERAS_TESTED` unless $TPUKIT_ALLOW_UNTESTED_KERAS=1."""
    import logging

    import keras

    version = keras.__version__
    low, high = (".".join(map(str, v)) for v in KERAS_TESTED)
    if KERAS_TESTED[0] <= _version_tuple(version) < KERAS_TESTED[1]:
        return version
    message = (
        f"tpukit was tested with Keras >= {low} and < {high} (it patches private Keras internals); received keras "
        f"{version}. Fix: `pip install 'keras>={low},<{high}'` and restart the runtime"
    )
    if os.environ.get(ALLOW_UNTESTED_KERAS) == "1":
        logging.getLogger("tpukit").warning(
            "tpukit: %s (continuing: %s=1).", message, ALLOW_UNTESTED_KERAS
        )
        return version
    raise ImportError(f"{message}, or set {ALLOW_UNTESTED_KERAS}=1 to try it anyway.")


