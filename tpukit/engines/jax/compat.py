"""The JAX engine's checks, run when it is first used (never at `import tpukit`): JAX in the tested range, Keras on
the JAX backend, and TensorFlow (the CPU build: tf.data reads the input) importable.

JAX 0.10 is the newest release for CPython 3.11 (jax >= 0.11 needs Python >= 3.12); Keras 3.15's JAX trainer and
`keras.distribution` were measured with 0.10.2 on 8 virtual CPU devices (tests/engines/jax/).
"""

from __future__ import annotations

import logging
import os

from tpukit.environment import backend, versions

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
            'tpukit\'s jax engine needs JAX. Fix: `pip install "tpukit[jax]"` on CPU/GPU, or '
            '`pip install "tpukit[jax-tpu]"` on a TPU VM (a Colab or Kaggle TPU runtime has JAX already).'
        ) from None
    low, high = (".".join(map(str, v)) for v in JAX_TESTED)
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


def check_jax() -> str:
    """Returns JAX's version after every check of this engine passes; raises ImportError naming the fix."""
    backend.require("jax", "jax")
    version = installed_jax()
    from tpukit.engines.tensorflow.compat import check_keras

    check_keras()
    try:
        import tensorflow  # noqa: F401 - tf.data builds the input pipelines on every engine
    except ImportError as error:  # pragma: no cover - exercised only without TensorFlow installed
        raise ImportError(
            "tpukit's jax engine reads its input with tf.data, which needs TensorFlow's CPU build. Fix: "
            f'`pip install "tpukit[jax]"` (received: {error}).'
        ) from error
    return version
