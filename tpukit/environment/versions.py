"""Which TensorFlow / libtpu / Keras / Python combinations tpukit knows, and where each row's knowledge comes from.

One table, read by setup.cfg's extras (by hand: `tests/environment/test_install.py` resolves the extras with pip and fails if
they drift from it), by the TensorFlow engine's `compat` (the accepted TensorFlow and Keras ranges, checked when the
engine is first used) and by `python -m tpukit.doctor`, which reads installed versions from package metadata and so
works where TensorFlow is missing or broken. `tensorflow_install_command` and `keras_install_command` are the fixes
both print.

Nothing here has run on a TPU under tpukit. A TPU row says what an upstream source documents; a CPU row says what
tpukit's own fast suite passed on (`.ci/tf_matrix.sh`, on CPU, with `pip install ".[tensorflow,test]"`).
"""

from __future__ import annotations

import dataclasses

# The libtpu index that Google's TensorFlow TPU instructions add to pip. tensorflow-tpu 2.19.1 and its libtpu
# 0.0.10 are on PyPI, so the pinned row needs no index; 2.18.0 needs it (its libtpu==2.18.0 is only there).
LIBTPU_TF_INDEX = "https://storage.googleapis.com/libtpu-tf-releases/index.html"


@dataclasses.dataclass(frozen=True)
class Combination:
    """One known TensorFlow build and what it needs.

    Attributes:
        distribution: the pip distribution that provides the `tensorflow` module: "tensorflow-tpu" (TPU hosts)
            or "tensorflow" (CPU/GPU wheel).
        tensorflow: its exact version.
        libtpu: the exact libtpu version a TPU build needs (its own `Requires-Dist`); None for CPU/GPU wheels.
        python: the Python versions the wheels exist for (a pip specifier).
        pinned: True for the one TPU row the `tpu` extra installs (and the one CPU row CI runs).
        evidence: what is known and where from, with addresses a reader can open.
    """

    distribution: str
    tensorflow: str
    libtpu: str | None
    python: str
    pinned: bool
    evidence: str

    @property
    def is_tpu(self) -> bool:
        return self.distribution == "tensorflow-tpu"

    def install_command(self) -> str:
        """The pip command that installs exactly this build (in a notebook prefix it with `%`)."""
        if not self.is_tpu:
            return f'pip install "tensorflow=={self.tensorflow}"'
        index = "" if self.pinned else f" -f {LIBTPU_TF_INDEX}"
        return f'pip install "tensorflow-tpu=={self.tensorflow}" "libtpu=={self.libtpu}"{index}'


COMBINATIONS: tuple[Combination, ...] = (
    Combination(
        distribution="tensorflow-tpu",
        tensorflow="2.19.1",
        libtpu="0.0.10",
        python=">=3.10,<3.13",
        pinned=True,
        evidence=(
            "Keras pins tensorflow-tpu==2.19.1 in its TPU requirements and calls 2.19.1 'the last version of the "
            "TensorFlow that supports TPUs' (github.com/keras-team/keras requirements-tensorflow-tpu.txt, "
            "commit 87176a3; dependabot.yml keeps it there). The tensorflow-tpu 2.19.1 wheel itself requires "
            "libtpu==0.0.10 (its Requires-Dist on PyPI); its wheels exist for CPython 3.10-3.12 only. tpukit's "
            "fast suite passes on the CPU wheel tensorflow==2.19.1 (.ci/tf_matrix.sh); never run on a TPU here."
        ),
    ),
    Combination(
        distribution="tensorflow",
        tensorflow="2.21.0",
        libtpu=None,
        python=">=3.10",
        pinned=True,
        evidence="CPU/GPU wheel; tpukit's full suite runs on it in CI (.ci/run) and the fast suite in .ci/tf_matrix.sh.",
    ),
    Combination(
        distribution="tensorflow",
        tensorflow="2.20.0",
        libtpu=None,
        python=">=3.9",
        pinned=False,
        evidence="CPU/GPU wheel; tpukit's fast suite passes on it (.ci/tf_matrix.sh).",
    ),
    Combination(
        distribution="tensorflow",
        tensorflow="2.19.1",
        libtpu=None,
        python=">=3.9,<3.13",
        pinned=False,
        evidence="CPU/GPU wheel; tpukit's fast suite passes on it (.ci/tf_matrix.sh).",
    ),
)

# TensorFlow 2.18 is not a row, so tpukit refuses it, although Google's newest TensorFlow TPU VM image is
# tpu-vm-tf-2.18.0-pjrt (cloud.google.com/tpu/docs/runtimes) and Keras pinned tensorflow-tpu==2.18.0 before 2.19.1
# (keras requirements-tensorflow-tpu.txt, commit 1d7c685). Why: (1) the tensorflow-tpu 2.18.0 wheel requires
# libtpu==2.18.0, which is not on PyPI (only on LIBTPU_TF_INDEX), so no pip extra can install it; (2) the CPU wheel
# tensorflow 2.18.1 requires tensorboard~=2.18.0 and tpukit requires tensorboard>=2.19, so `.[tensorflow]` with
# TF 2.18 does not resolve; (3) so tpukit's suite has never run on 2.18. On such an image, install the pinned row
# (`python -m tpukit.doctor` prints the command). To add 2.18: lower the tensorboard floor, add the rows, and run
# `.ci/tf_matrix.sh 2.18.1`.
#
# tensorflow-tpu 2.20.0 is on PyPI but is not a row: it requires libtpu~=0.0.14, so pip picks the newest libtpu
# (0.0.52 in 2026), and no upstream source documents any libtpu with it as working.


def pinned_tpu() -> Combination:
    """The TPU row the `tpu` extra installs."""
    return next(c for c in COMBINATIONS if c.is_tpu and c.pinned)


def find(distribution: str, tensorflow: str, libtpu: str | None = None) -> Combination | None:
    """The row for this installed build, or None. `libtpu` is compared only for TPU builds."""
    for combination in COMBINATIONS:
        if combination.distribution != distribution or combination.tensorflow != tensorflow:
            continue
        if combination.is_tpu and combination.libtpu != libtpu:
            continue
        return combination
    return None


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string like '2.19.1' or '2.20.0rc0'."""
    parts = version.split(".")
    return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)


# The TensorFlow range tpukit accepts when the engine is first used (tpukit.engines.tensorflow.compat) and declares in setup.cfg: every row's minor.
MIN_TF = min(minor(c.tensorflow) for c in COMBINATIONS)
MAX_TF_EXCLUSIVE = (
    max(minor(c.tensorflow) for c in COMBINATIONS)[0],
    max(minor(c.tensorflow) for c in COMBINATIONS)[1] + 1,
)

# The Keras minors tpukit was tested with, [low, high): the TensorFlow engine patches private Keras internals
# (every one is in tpukit/engines/tensorflow/keras_private.py: _should_eval, _maybe_symbolic_build, ...), which
# another minor may change. The suite runs on 3.15.1 with TF 2.19.1, 2.20.0 and 2.21.0 (.ci/tf_matrix.sh).
# setup.cfg's install_requires declares the same range (tests/engines/tensorflow/test_compat.py checks it).
KERAS_TESTED = ((3, 15), (3, 16))


def dotted(version: tuple[int, int]) -> str:
    """(2, 19) -> "2.19"."""
    return ".".join(map(str, version))


def tensorflow_install_command() -> str:
    """The pip command that installs a CPU/GPU TensorFlow in tpukit's range, e.g.
    `pip install "tensorflow>=2.19,<2.22"` (a TPU VM needs `pinned_tpu().install_command()` instead)."""
    return f'pip install "tensorflow>={dotted(MIN_TF)},<{dotted(MAX_TF_EXCLUSIVE)}"'


def keras_install_command() -> str:
    """The pip command that installs a Keras in `KERAS_TESTED`, e.g. `pip install "keras>=3.15,<3.16"`."""
    low, high = KERAS_TESTED
    return f'pip install "keras>={dotted(low)},<{dotted(high)}"'
