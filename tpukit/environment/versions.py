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


@dataclasses.dataclass(frozen=True)
class HostedRuntime:
    """A hosted TPU runtime users meet by name, as its public sources describe it (not run here: no TPU is)."""

    name: str
    chips: str
    python: str
    ships: str
    evidence: str


# `tpukit doctor` names these on their TPU runtimes. Neither has a TensorFlow TPU build: tpukit trains there with
# the jax engine.
HOSTED_RUNTIMES = {
    "colab": HostedRuntime(
        name="Colab's TPU runtime",
        chips="TPU v5e-1 (one chip, 16 GB HBM)",
        python="3.13",
        ships="JAX with its libtpu; no TensorFlow",
        evidence=(
            "github.com/googlecolab/colabtools/issues/5566 (v5e-1 in the free tier, Sep 2025), /issues/5164 (TPU "
            "runtimes ship JAX, TensorFlow no longer preinstalled), /issues/6081 (Python 3.13 since Aug 2026)"
        ),
    ),
    "kaggle": HostedRuntime(
        name="Kaggle's TPU runtime",
        chips="TPU v5e-8 (8 chips)",
        python="3.12",
        ships="jax[tpu] (unpinned when the image is built) with libtpu forced to 0.0.17, tensorflow-cpu 2.20.0",
        evidence=(
            "github.com/Kaggle/docker-python tpu/config.txt (python:3.12, TENSORFLOW_VERSION=2.20.0), "
            "tpu/requirements.in (jax[tpu], tensorflow-cpu; tensorflow-tpu disabled, b/447621961), tpu/Dockerfile "
            "(libtpu==0.0.17, 'compatible with both jax 0.7.2 and torch 2.8.0'), commit 42bb19d"
        ),
    ),
}


@dataclasses.dataclass(frozen=True)
class TestedStack:
    """A whole environment tpukit's tests ran on, and which tests: every range setup.cfg declares has its ends here
    (tests/environment/test_versions.py checks it)."""

    python: str
    packages: str
    ran: str


TESTED_STACKS = (
    TestedStack(
        "3.11", "tensorflow 2.21.0, keras 3.15.1, jax 0.10.2", "every test tier, in CI (.ci/run)"
    ),
    TestedStack(
        "3.11",
        "the same with jax[tpu] 0.10.2 and libtpu 0.0.42.1",
        "the tpu_compile tier and docs/compiled_for.md's v5e-8 rows, in CI: TPU programs compiled, none run",
    ),
    TestedStack(
        "3.13",
        "jax 0.12.0.1, tensorflow-cpu 2.21.0, keras 3.15.1, numpy 2.5.5 (`pip install .[jax,test]`)",
        "the jax engine's, the doctor's and the quiet start's tests and the main job on the jax engine, in CI "
        "(.ci/newest_stack.sh: a Debian trixie root)",
    ),
    TestedStack(
        "3.11",
        "tensorflow 2.19.1, keras 3.15.1",
        "the tensorflow engine's, the pipelines' and the environment's tests in CI; the default tier without "
        "the jax engine's tests by hand (.ci/tf_matrix.sh 2.19.1)",
    ),
    TestedStack(
        "3.11",
        "tensorflow 2.20.0, keras 3.15.1",
        "the default tier without the jax engine's tests, by hand (.ci/tf_matrix.sh 2.20.0)",
    ),
)

# Where tpukit comes from (no package named tpukit is on PyPI): the notebooks' TPUKIT_SOURCE.
SOURCE = "git+https://github.com/tpukit/tpukit.git"


def tpukit_requirement(extras: str) -> str:
    """The requirement every printed fix installs tpukit with, e.g. `tpukit[jax-tpu] @ git+https://...` (a bare
    `tpukit[jax-tpu]` fails: no package of that name is on PyPI)."""
    return f"tpukit[{extras}] @ {SOURCE}"


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


def _tpu_pythons() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """[low, high) of the Pythons the pinned TPU build has wheels for, from its `python` (">=3.10,<3.13")."""
    low, high = pinned_tpu().python.split(",")
    return tuple(map(int, low.removeprefix(">=").split("."))), tuple(
        map(int, high.removeprefix("<").split("."))
    )


def tensorflow_tpu_installable(python: tuple[int, int]) -> bool:
    """Whether the pinned TensorFlow TPU build has a wheel for this (major, minor) Python: tensorflow-tpu 2.19.1 has
    CPython 3.10-3.12 wheels, and none exists for 3.13 (Colab's TPU runtime), where only the jax engine runs."""
    low, high = _tpu_pythons()
    return low <= tuple(python[:2]) < high


def no_tensorflow_tpu_wheel(python: tuple[int, int]) -> str:
    """Why the tensorflow engine cannot use a TPU on this Python, and the fix (the jax engine)."""
    row, (low, high) = pinned_tpu(), _tpu_pythons()
    return (
        f"no TensorFlow TPU build installs on Python {python[0]}.{python[1]}: tensorflow-tpu {row.tensorflow} "
        f"has wheels for CPython {low[0]}.{low[1]}-{high[0]}.{high[1] - 1} only, "
        "and TensorFlow's TPU builds ended with 2.20.0. Fix: the jax engine, "
        f'`pip install "{tpukit_requirement("jax-tpu")}"` (it keeps a JAX already in range with the libtpu it pins), '
        "then train with "
        "`--set runtime.engine=jax`."
    )


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
