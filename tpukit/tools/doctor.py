"""`python -m tpukit.doctor`: can this environment train, and if not, the exact command that fixes it.

    python -m tpukit.doctor              # human report; exit 0 when this environment can train
    python -m tpukit.doctor --json       # the same as one JSON object, for machines
    python -m tpukit.doctor --tpu=local  # connect to this TPU the way tpukit.connect(tpu=...) would

The steps, each an importable function tested against faked environments (tests/tools/test_doctor.py):

1. `detect_runtime`: Colab / Kaggle / Cloud TPU VM / GKE, a pod slice (several TPU hosts), a remote TPU Node,
   GPU or CPU, from environment variables, device files and PCI ids; nothing is initialized.
2. `check_versions`: tensorflow / tensorflow-tpu / libtpu / keras / jax / TFDS metadata, read with
   importlib.metadata (no import), against `tpukit.environment.versions`; a bad combination gets the exact install
   command and "then restart the runtime".
3. `check_import`: imports TensorFlow, when its version passed; a TensorFlow that is installed but does not import
   (a half-removed install, a protobuf or NumPy it was not built for) is a finding with the fix.
4. `check_accelerator`: connects the way `tpukit.connect` does (tpu="local" on TPU VMs, $TPU_NAME,
   $COLAB_TPU_ADDR) and reports the strategy, replica count and TPU topology; a failure carries the cause and fix
   from `tpukit.environment.diagnose`. Skipped, and reported as skipped, when TensorFlow failed step 2 or 3, or
   when only the jax engine can use this TPU (TensorFlow's CPU build has no TPU kernels).
5. `check_engines`: which engines can run here (`runtime.engine: tensorflow` or `jax`), each with the reason when
   not. Keras' backend is not checked: the CLI sets it from the recipe's engine. On a TPU VM whose JAX finds the
   TPU and that has no TensorFlow TPU build (Colab's and Kaggle's TPU runtimes ship JAX), step 2 recommends the jax
   engine, which keeps that JAX and its libtpu, instead of tensorflow-tpu, which would replace the libtpu.
6. `main`: prints the report and exits 0 when nothing failed, 1 otherwise (2 for bad flags).

Importing this module imports neither TensorFlow nor Keras, so the doctor runs where they are missing, broken or out
of range: tests/tools/test_doctor_blocked_imports.py runs it in such environments.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import sys

from tpukit.engines.jax import compat as jax_compat
from tpukit.engines.tensorflow import strategy
from tpukit.environment import diagnose, quiet, versions

RESTART = "then restart the runtime (Colab/Kaggle: Runtime > Restart session)"
DISTRIBUTIONS = (
    "tensorflow",
    "tensorflow-cpu",
    "tensorflow-tpu",
    "libtpu",
    "keras",
    "jax",
    "jaxlib",
    "keras-rs",  # the recommenders' embedding tables
    "jax-tpu-embedding",  # keras-rs' SparseCore path on JAX (not used by tpukit's jax engine yet)
    "tensorflow-datasets",
    "tensorflow-metadata",
    "protobuf",
)


@dataclasses.dataclass
class Finding:
    """One line of the report.

    Attributes:
        level: "ok", "warn" (can train, but read this), "fail" (cannot train) or "skip" (not checked, or an engine
            that cannot run here while the other one can; the message says why).
        topic: what was checked: a distribution ("tensorflow", "keras", ...), "accelerator", or an engine
            ("tensorflow engine", "jax engine").
        message: what was found, with the values received.
        fix: the command or step that fixes it, or None.
    """

    level: str
    topic: str
    message: str
    fix: str | None = None


@dataclasses.dataclass
class Runtime:
    """Where this process runs, judged without initializing anything."""

    platform: str  # "colab", "kaggle", "gke", "cloud_tpu_vm" or "other"
    accelerator: str  # "tpu_vm", "tpu_node", "gpu" or "cpu"
    pod_slice: bool = False
    hosts: int = 1
    worker_id: str | None = None
    accelerator_type: str | None = None
    tpu: str | None = None  # what tpukit.connect would pass to TPUClusterResolver
    evidence: list[str] = dataclasses.field(default_factory=list)


def _hosts(env: dict[str, str]) -> int:
    """TPU hosts in this slice: $TPU_WORKER_HOSTNAMES entries, else the product of $TPU_HOST_BOUNDS, else 1."""
    names = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if names:
        return len(names)
    bounds = env.get("TPU_HOST_BOUNDS", "")
    try:
        return math.prod(int(b) for b in bounds.split(",")) if bounds else 1
    except ValueError:
        return 1


def detect_runtime(
    env: dict[str, str] | None = None,
    tpu_device_files: list[str] | None = None,
    gpu_device_files: list[str] | None = None,
    colab_module: bool | None = None,
    kaggle_dir: bool | None = None,
) -> Runtime:
    """Detects the platform and accelerator. Every argument defaults to this machine (tests pass fakes)."""
    env = dict(os.environ) if env is None else env
    tpu_files = strategy.tpu_device_files() if tpu_device_files is None else tpu_device_files
    gpu_files = (
        [p for p in ("/dev/nvidia0", "/dev/dxg") if os.path.exists(p)]
        if gpu_device_files is None
        else gpu_device_files
    )
    colab = (
        importlib.util.find_spec("google.colab") is not None
        if colab_module is None
        else colab_module
    )
    kaggle = os.path.isdir("/kaggle/input") if kaggle_dir is None else kaggle_dir
    evidence = []
    if colab or "COLAB_RELEASE_TAG" in env or "COLAB_TPU_1VM" in env:
        platform = "colab"
        evidence.append("Colab (google.colab / $COLAB_RELEASE_TAG)")
    elif kaggle or "KAGGLE_KERNEL_RUN_TYPE" in env or "KAGGLE_URL_BASE" in env:
        platform = "kaggle"
        evidence.append("Kaggle ($KAGGLE_KERNEL_RUN_TYPE / /kaggle/input)")
    elif "KUBERNETES_SERVICE_HOST" in env and env.get("TPU_WORKER_ID") is not None:
        platform = "gke"
        evidence.append("GKE ($KUBERNETES_SERVICE_HOST with $TPU_WORKER_ID)")
    elif tpu_files or env.get("TPU_ACCELERATOR_TYPE"):
        platform = "cloud_tpu_vm"
    else:
        platform = "other"
    hosts = _hosts(env)
    runtime = Runtime(
        platform=platform,
        accelerator="cpu",
        hosts=hosts,
        pod_slice=hosts > 1,
        worker_id=env.get("TPU_WORKER_ID"),
        accelerator_type=env.get("TPU_ACCELERATOR_TYPE"),
        evidence=evidence,
    )
    # Without $TF_CONFIG: only the TPU part of the choice matters here, and a malformed TF_CONFIG is reported by
    # `check_accelerator` (connect validates it) as a finding with its fix, not raised.
    choice = strategy.choose(
        env={k: v for k, v in env.items() if k != "TF_CONFIG"},
        tpu_vm=strategy.tpu_vm_environment(env) or bool(tpu_files),
        gpus=0,
    )
    if choice.kind == "tpu":
        remote = choice.tpu.startswith("grpc://") or (choice.tpu != "local" and not tpu_files)
        runtime.accelerator = "tpu_node" if remote else "tpu_vm"
        runtime.tpu = choice.tpu
        evidence.append(choice.reason)
        if tpu_files:
            evidence.append(f"TPU device files: {', '.join(tpu_files[:4])}")
    elif gpu_files:
        runtime.accelerator = "gpu"
        evidence.append(f"GPU device files: {', '.join(gpu_files)}")
    else:
        evidence.append("no TPU or GPU device files, no TPU environment variables")
    if runtime.pod_slice:
        evidence.append(f"pod slice: {hosts} TPU hosts ($TPU_WORKER_HOSTNAMES / $TPU_HOST_BOUNDS)")
        if runtime.tpu == "local":
            # A pod slice is trained from every host, through its TPU name (the Cloud TPU API), not tpu="local".
            runtime.tpu = env.get("TPU_NAME") or None
    return runtime


def installed_versions() -> dict[str, str | None]:
    """{distribution: version or None} for `DISTRIBUTIONS`, from package metadata (nothing is imported)."""
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def _jax_libtpu_pin(requires: list[str] | None) -> str | None:
    """The libtpu version jax's `tpu` extra pins (e.g. 'libtpu==0.0.21; extra == "tpu"' -> '0.0.21')."""
    for requirement in requires or []:
        head = requirement.split(";")[0].replace(" ", "")
        if head.startswith("libtpu==") and "tpu" in requirement.split(";", 1)[-1]:
            return head.split("==", 1)[1]
    return None


def _libtpu_matches(pin: str, version: str) -> bool:
    """Whether libtpu `version` satisfies jax's pin: '0.0.42.*' takes 0.0.42 and 0.0.42.1, '0.0.21' only itself."""
    if pin.endswith(".*"):
        return version == pin[:-2] or version.startswith(pin[:-1])
    return version == pin


def _in_range(version: str | None, bounds) -> bool:
    return version is not None and bounds[0] <= versions.minor(version) < bounds[1]


TF_RANGE = (versions.MIN_TF, versions.MAX_TF_EXCLUSIVE)
JAX_ENGINE = "--set runtime.engine=jax"


def jax_finds_the_tpu(runtime: Runtime, installed: dict[str, str | None], jax_requires) -> bool:
    """A TPU VM with JAX and the libtpu its `tpu` extra pins, and no TensorFlow TPU build: Colab's and Kaggle's TPU
    runtimes ship this. The jax engine trains here as it is; the tensorflow engine would need tensorflow-tpu, whose
    libtpu replaces JAX's (TensorFlow's TPU build and JAX cannot share one TPU)."""
    pin, libtpu = _jax_libtpu_pin(jax_requires), installed.get("libtpu")
    return (
        runtime.accelerator == "tpu_vm"
        and not installed.get("tensorflow-tpu")
        and bool(installed.get("jax") and pin and libtpu and _libtpu_matches(pin, libtpu))
    )


def _jax_engine_fix(installed: dict[str, str | None], libtpu_ok: bool = True) -> str:
    """Trains with the runtime's JAX: installs only what the jax engine lacks (a JAX in range, with its libtpu;
    TensorFlow's CPU build for tf.data), then `--set runtime.engine=jax`. A restart only when something installed
    is replaced. `libtpu_ok`: false when the installed libtpu is not the one JAX's `tpu` extra pins."""
    packages, remove = [], ""
    if not libtpu_ok or not _in_range(installed.get("jax"), jax_compat.JAX_TESTED):
        low, high = (versions.dotted(b) for b in jax_compat.JAX_TESTED)
        packages.append(f'"jax[tpu]>={low},<{high}"')
    cpu = installed.get("tensorflow") or installed.get("tensorflow-cpu")
    if not _in_range(cpu, TF_RANGE):
        packages.append(
            f'"tensorflow-cpu>={versions.dotted(TF_RANGE[0])},<{versions.dotted(TF_RANGE[1])}"'
        )
        remove = "`pip uninstall -y tensorflow tensorflow-cpu` then " if cpu else ""
    train = f"train with the jax engine: `python -m tpukit.train RECIPE {JAX_ENGINE}`"
    if not packages:
        return train
    # Only replacing what is installed (the runtime's JAX, a TensorFlow) needs a restart, not adding a package.
    replaces = remove or (packages[0].startswith('"jax') and bool(installed.get("jax")))
    after = (
        RESTART
        if replaces
        else "JAX and its libtpu stay (restart only if pip upgraded a package this session had imported)"
    )
    return f"{remove}`pip install {' '.join(packages)}`, {after}; then {train}"


def _jax_out_of_range(jax: str) -> str:
    low, high = (versions.dotted(b) for b in jax_compat.JAX_TESTED)
    return f"jax {jax} is outside the range the jax engine was tested in (>={low},<{high})"


def _jax_platform(runtime: Runtime, installed: dict[str, str | None]) -> bool:
    """A TPU VM where the jax engine is the way, though its JAX does not find the TPU yet: a hosted runtime (Colab's
    and Kaggle's ship JAX and no TensorFlow TPU build), a JAX already installed (tensorflow-tpu would replace its
    libtpu: the two cannot share one TPU), or a Python with no tensorflow-tpu wheel."""
    return (
        runtime.platform in versions.HOSTED_RUNTIMES
        or bool(installed.get("jax"))
        or not versions.tensorflow_tpu_installable(_python())
    )


def _jax_platform_note(runtime: Runtime, installed: dict[str, str | None]) -> str:
    """Why `_jax_platform` sends this TPU VM to the jax engine, and what its JAX lacks."""
    python, hosted = _python(), versions.HOSTED_RUNTIMES.get(runtime.platform)
    if not versions.tensorflow_tpu_installable(python):
        why = f"no TensorFlow TPU build installs on Python {python[0]}.{python[1]}"
    elif hosted:
        why = f"{hosted.name} ships JAX and no TensorFlow TPU build"
    else:
        why = "TensorFlow's TPU build cannot share the TPU with the installed JAX: it brings its own libtpu"
    jax = installed.get("jax")
    if not jax:
        here = "JAX is not installed"
    elif not _in_range(jax, jax_compat.JAX_TESTED):
        here = _jax_out_of_range(jax)
    else:
        here = f"jax {jax} has libtpu {installed.get('libtpu') or 'none'}, not the one its `tpu` extra pins"
    return f"This TPU VM trains with the jax engine ({why}); {here}."


def _jax_engine_ready(installed: dict[str, str | None]) -> bool:
    """JAX in the jax engine's range and TensorFlow's CPU build in tpukit's: `_jax_engine_fix` installs nothing."""
    cpu = installed.get("tensorflow") or installed.get("tensorflow-cpu")
    return _in_range(installed.get("jax"), jax_compat.JAX_TESTED) and _in_range(cpu, TF_RANGE)


def _jax_engine_note(installed: dict[str, str | None]) -> str:
    python = _python()
    tensorflow = (
        f"The tensorflow engine would need tensorflow-tpu, whose libtpu {versions.pinned_tpu().libtpu} replaces "
        "JAX's."
        if versions.tensorflow_tpu_installable(python)
        else f"The tensorflow engine cannot run here: no TensorFlow TPU build installs on Python {python[0]}.{python[1]}."
    )
    return (
        f"This TPU runtime's JAX finds the TPU (jax {installed.get('jax')}, libtpu {installed.get('libtpu')}): the "
        f"jax engine trains on it with TensorFlow's CPU build for tf.data, keeping that libtpu. {tensorflow}"
    )


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def check_requirements(dist: str, requires: list[str] | None, version_of) -> list[Finding]:
    """Warnings for the installed distributions that `dist`'s own requirements (`Requires-Dist`) exclude.

    Catches e.g. protobuf 7 under TensorFlow 2.19 (which requires protobuf < 6): `pip install tpukit` without the
    extra that names TensorFlow lets pip upgrade protobuf for another package (googleapis-common-protos) and break
    the TensorFlow it does not see (tensorflow-tpu 2.19.1 still imported with protobuf 7.36 on this repository's CI
    machine, hence a warning, not a failure). Only unconditional requirements and those whose markers hold count.
    """
    from packaging.requirements import InvalidRequirement, Requirement

    findings = []
    for text in requires or []:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        installed = version_of(requirement.name)
        if (
            installed is None
            or not requirement.specifier
            or requirement.specifier.contains(installed, prereleases=True)
        ):
            continue
        findings.append(
            Finding(
                "warn",
                requirement.name,
                f"{dist} requires {requirement.name}{requirement.specifier} but {requirement.name} {installed} is "
                "installed (another package's install moved it past what TensorFlow declares; an untested "
                "combination, though TensorFlow may still import).",
                f'`pip install "{requirement.name}{requirement.specifier}"`, {RESTART}; install tpukit with the extra '
                "that names your TensorFlow ([tpu] or [tensorflow]) so pip keeps TensorFlow's bounds",
            )
        )
    return findings


def _version_or_none(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_versions(
    runtime: Runtime,
    installed: dict[str, str | None],
    jax_requires: list[str] | None = None,
    tf_requires: list[str] | None = None,
    version_of=None,
) -> list[Finding]:
    """Checks the installed distributions against `tpukit.environment.versions` for this runtime.

    Args:
        runtime: from `detect_runtime`.
        installed: {distribution: version or None}, see `installed_versions`.
        jax_requires: jax's `Requires-Dist` lines (its `tpu` extra pins a libtpu: with it JAX finds the TPU, and
            the advice on a TPU VM without tensorflow-tpu is the jax engine).
        tf_requires: the installed TensorFlow distribution's `Requires-Dist` lines.
        version_of: `name -> version or None` for any distribution; default: `installed`, then package metadata.
    """
    if version_of is None:
        version_of = lambda name: installed[name] if name in installed else _version_or_none(name)  # noqa: E731
    findings = _check_tensorflow(runtime, installed, jax_requires)
    tf_cpu = installed.get("tensorflow") or installed.get("tensorflow-cpu")
    tf_tpu = installed.get("tensorflow-tpu")
    tf_dist = (
        "tensorflow-tpu"
        if tf_tpu
        else ("tensorflow" if installed.get("tensorflow") else "tensorflow-cpu")
    )
    if tf_cpu or tf_tpu:
        findings += check_requirements(tf_dist, tf_requires, version_of)

    findings += _check_keras(installed)
    findings += _check_tfds_metadata(installed)
    findings += _check_jax(installed, jax_requires)
    return findings


TPU_COMPILER = "tpu compiler"


def check_tpu_compiler(
    installed: dict[str, str | None],
    jax_requires: list[str] | None,
    jax_engine_problem: str | None = None,
) -> list[Finding]:
    """Whether `tpukit check RECIPE --topology NAME` can compile for TPUs here: JAX in the jax engine's range with
    the libtpu its `tpu` extra pins (the TPU compiler; no TPU needed), and the jax engine able to run (it builds the
    step; `jax_engine_problem` says why not). Read from package metadata only."""
    jax_version, libtpu = installed.get("jax"), installed.get("libtpu")
    install = f'pip install "{versions.tpukit_requirement("tpu-check")}"'
    if jax_engine_problem and libtpu and jax_version:
        return [
            Finding(
                "skip",
                TPU_COMPILER,
                f"libtpu {libtpu} is installed, but TPU compilation builds the step with the jax engine, which "
                "cannot run here (its line below says why).",
            )
        ]
    if not libtpu or not jax_version:
        missing = " and ".join(n for n, v in (("jax", jax_version), ("libtpu", libtpu)) if not v)
        return [
            Finding(
                "skip",
                TPU_COMPILER,
                f"TPU compilation (tpukit check RECIPE --topology v5e-8) is not available: {missing} not installed.",
                install,
            )
        ]
    pin = _jax_libtpu_pin(jax_requires)
    if not _in_range(jax_version, jax_compat.JAX_TESTED) or (
        pin and not _libtpu_matches(pin, libtpu)
    ):
        wanted = f"the libtpu {pin} it pins" if pin else "its libtpu"
        return [
            Finding(
                "warn",
                TPU_COMPILER,
                f"libtpu {libtpu} with jax {jax_version}: TPU compilation needs a jax in the jax engine's range "
                f"with {wanted}.",
                install,
            )
        ]
    return [
        Finding(
            "ok",
            TPU_COMPILER,
            f"libtpu {libtpu} with jax {jax_version}: `tpukit check RECIPE --topology v5e-8` compiles the "
            "training step for TPUs here, with or without a TPU.",
        )
    ]


def _tpu_fix() -> str:
    if not versions.tensorflow_tpu_installable(_python()):
        return versions.no_tensorflow_tpu_wheel(_python())
    return f"`{versions.pinned_tpu().install_command()}`, {RESTART}"


def _cpu_fix() -> str:
    return f"`{versions.tensorflow_install_command()}`, {RESTART}"


def _check_tensorflow(
    runtime: Runtime, installed: dict[str, str | None], jax_requires: list[str] | None = None
) -> list[Finding]:
    """The TensorFlow build against this runtime: a TPU build on a TPU VM (or, where JAX finds the TPU, the CPU
    build the jax engine reads its input with), the declared range elsewhere."""
    findings = []
    tpu_fix = _tpu_fix()
    cpu_fix = _cpu_fix()
    tf_cpu = installed.get("tensorflow") or installed.get("tensorflow-cpu")
    tf_tpu = installed.get("tensorflow-tpu")
    wants_tpu_build = runtime.accelerator == "tpu_vm"

    if not tf_cpu and not tf_tpu and jax_finds_the_tpu(runtime, installed, jax_requires):
        findings.append(
            Finding(
                "fail",
                "tensorflow",
                f"TensorFlow is not installed. {_jax_engine_note(installed)}",
                _jax_engine_fix(installed),
            )
        )
    elif not tf_cpu and not tf_tpu and wants_tpu_build and _jax_platform(runtime, installed):
        findings.append(
            Finding(
                "fail",
                "tensorflow",
                f"TensorFlow is not installed. {_jax_platform_note(runtime, installed)}",
                _jax_engine_fix(installed, libtpu_ok=False),
            )
        )
    elif not tf_cpu and not tf_tpu:
        findings.append(
            Finding(
                "fail",
                "tensorflow",
                "TensorFlow is not installed.",
                tpu_fix if wants_tpu_build else cpu_fix,
            )
        )
    elif wants_tpu_build:
        findings += _check_tpu_build(runtime, installed, jax_requires)
    else:
        findings += _check_other_build(runtime, installed)
    return findings


def _check_tpu_build(
    runtime: Runtime, installed: dict[str, str | None], jax_requires: list[str] | None = None
) -> list[Finding]:
    """On a TPU VM: the TensorFlow build must be tensorflow-tpu with its libtpu (the pinned row), unless JAX finds
    the TPU: then the CPU build in range is what the jax engine needs (a warning: the tensorflow engine cannot)."""
    pinned = versions.pinned_tpu()
    tpu_fix = _tpu_fix()
    tf_cpu = installed.get("tensorflow") or installed.get("tensorflow-cpu")
    tf_tpu = installed.get("tensorflow-tpu")
    libtpu = installed.get("libtpu")
    if not tf_tpu:
        return [_cpu_wheel_on_tpu_vm(runtime, installed, jax_requires, tf_cpu, tpu_fix)]
    if tf_cpu:
        return [
            Finding(
                "fail",
                "tensorflow",
                f"both tensorflow-tpu {tf_tpu} and the CPU/GPU wheel tensorflow {tf_cpu} are installed; they "
                "write the same `tensorflow` module, so which one imports depends on the install order.",
                f"`pip uninstall -y tensorflow tensorflow-cpu tensorflow-tpu` then {tpu_fix}",
            )
        ]
    return [_tpu_row(tf_tpu, libtpu, pinned, tpu_fix)]


def _cpu_wheel_on_tpu_vm(
    runtime: Runtime,
    installed: dict[str, str | None],
    jax_requires: list[str] | None,
    tf_cpu: str | None,
    tpu_fix: str,
) -> Finding:
    """A TPU VM with only the CPU/GPU TensorFlow wheel: fine for the jax engine where JAX finds the TPU (a warning
    while it is not ready), else a failure with the fix for the engine that can use this TPU."""
    if jax_finds_the_tpu(runtime, installed, jax_requires):
        return Finding(
            "warn" if _jax_engine_ready(installed) else "fail",
            "tensorflow",
            f"this TPU VM's TensorFlow is the CPU/GPU wheel (tensorflow {tf_cpu}), which has no TPU kernels: "
            f"the tensorflow engine cannot use the TPU. {_jax_engine_note(installed)}",
            _jax_engine_fix(installed),
        )
    if _jax_platform(runtime, installed):
        return Finding(
            "fail",
            "tensorflow",
            f"this TPU VM's TensorFlow is the CPU/GPU wheel (tensorflow {tf_cpu}), which has no TPU kernels. "
            + _jax_platform_note(runtime, installed),
            _jax_engine_fix(installed, libtpu_ok=False),
        )
    return Finding(
        "fail",
        "tensorflow",
        f"this is a TPU VM but the installed TensorFlow is the CPU/GPU wheel (tensorflow {tf_cpu}), "
        "which has no TPU kernels ('No OpKernel was registered to support Op "
        "ConfigureDistributedTPU').",
        f"`pip uninstall -y tensorflow tensorflow-cpu` then {tpu_fix}",
    )


def _tpu_row(
    tf_tpu: str, libtpu: str | None, pinned: versions.Combination, tpu_fix: str
) -> Finding:
    """tensorflow-tpu alone: its version with libtpu's is the pinned row (ok), another known row (a warning), or
    no known row (a failure listing the known ones)."""
    row = versions.find("tensorflow-tpu", tf_tpu, libtpu)
    if row is None:
        return Finding(
            "fail",
            "tensorflow",
            f"tensorflow-tpu {tf_tpu} with libtpu {libtpu} is not a combination tpukit knows to work "
            f"(tpukit/environment/versions.py; known: "
            + ", ".join(
                f"{c.tensorflow}+libtpu {c.libtpu}" for c in versions.COMBINATIONS if c.is_tpu
            )
            + ").",
            tpu_fix,
        )
    level = "ok" if row.pinned else "warn"
    note = (
        ""
        if row.pinned
        else f" (known from upstream, not the pinned row: {pinned.install_command()})"
    )
    return Finding(
        level,
        "tensorflow",
        f"tensorflow-tpu {tf_tpu} + libtpu {libtpu}: a known row{note}.",
    )


def _check_other_build(runtime: Runtime, installed: dict[str, str | None]) -> list[Finding]:
    """Elsewhere: a TensorFlow in the declared range (and the TPU build for a TPU Node)."""
    findings = []
    cpu_fix = _cpu_fix()
    low, high = (".".join(map(str, v)) for v in (versions.MIN_TF, versions.MAX_TF_EXCLUSIVE))
    tf_cpu = installed.get("tensorflow") or installed.get("tensorflow-cpu")
    tf_tpu = installed.get("tensorflow-tpu")
    libtpu = installed.get("libtpu")
    version = tf_cpu or tf_tpu
    if not (versions.MIN_TF <= versions.minor(version) < versions.MAX_TF_EXCLUSIVE):
        findings.append(
            Finding(
                "fail",
                "tensorflow",
                f"tensorflow {version} is outside tpukit's range [{low}, {high}).",
                cpu_fix,
            )
        )
    elif (
        versions.find("tensorflow", version) is None
        and versions.find("tensorflow-tpu", version, libtpu) is None
    ):
        findings.append(
            Finding(
                "warn",
                "tensorflow",
                f"tensorflow {version} is in range but not a tested row of tpukit/environment/versions.py.",
            )
        )
    else:
        findings.append(Finding("ok", "tensorflow", f"tensorflow {version}: a tested row."))
    if runtime.accelerator == "tpu_node" and not tf_tpu:
        findings.append(
            Finding(
                "warn",
                "tensorflow",
                "a remote TPU Node is driven over gRPC by this TensorFlow; TPU Nodes "
                "are Google's legacy architecture (Colab and Kaggle moved to TPU VMs).",
            )
        )

    return findings


def _check_keras(installed: dict[str, str | None]) -> list[Finding]:
    findings = []
    keras_version = installed.get("keras")
    low, high = (".".join(map(str, v)) for v in versions.KERAS_TESTED)
    fix = f"`{versions.keras_install_command()}`, {RESTART}"
    if not keras_version:
        findings.append(
            Finding(
                "fail",
                "keras",
                f"Keras is not installed; tpukit needs Keras >= {low} and < {high}.",
                fix,
            )
        )
    elif not versions.KERAS_TESTED[0] <= _version_tuple(keras_version) < versions.KERAS_TESTED[1]:
        findings.append(
            Finding(
                "fail",
                "keras",
                f"tpukit was tested with Keras >= {low} and < {high} (it patches private Keras internals); "
                f"installed: {keras_version}.",
                fix,
            )
        )
    else:
        findings.append(Finding("ok", "keras", f"keras {keras_version}."))

    return findings


def _check_tfds_metadata(installed: dict[str, str | None]) -> list[Finding]:
    findings = []
    metadata = installed.get("tensorflow-metadata")
    protobuf = installed.get("protobuf")
    if (
        metadata
        and protobuf
        and _version_tuple(metadata) >= (1, 18)
        and _version_tuple(protobuf) < (6, 31)
    ):
        findings.append(
            Finding(
                "fail",
                "tensorflow-datasets",
                f"tensorflow-metadata {metadata} needs protobuf >= 6.31 but protobuf {protobuf} is installed "
                "(TensorFlow 2.19 holds it below 6): `import tensorflow_datasets` loses tfds.builder "
                "(github.com/tensorflow/metadata/issues/68).",
                f'`pip install "tensorflow-metadata<1.18"`, {RESTART}',
            )
        )

    return findings


def _check_jax(installed: dict[str, str | None], jax_requires: list[str] | None) -> list[Finding]:
    findings = []
    tf_tpu = installed.get("tensorflow-tpu")
    libtpu = installed.get("libtpu")
    jax_version = installed.get("jax")
    if jax_version and tf_tpu:
        wanted = _jax_libtpu_pin(jax_requires)
        if wanted and libtpu and not _libtpu_matches(wanted, libtpu):
            findings.append(
                Finding(
                    "warn",
                    "jax",
                    f"jax {jax_version} expects libtpu {wanted} but tensorflow-tpu installed libtpu {libtpu}: JAX "
                    "will not find the TPU in this runtime (TensorFlow, and tpukit, still do). "
                    + diagnose.explain("cloud_tpu_init failed"),
                )
            )
    return findings


def _reinstall_fix(installed: dict[str, str | None]) -> str:
    """Reinstalls the installed TensorFlow build, with its dependencies, at the same version."""
    tf_tpu = installed.get("tensorflow-tpu")
    row = versions.find("tensorflow-tpu", tf_tpu, installed.get("libtpu")) if tf_tpu else None
    if row is not None:
        command = row.install_command()
    else:
        dist = (
            "tensorflow-tpu"
            if tf_tpu
            else ("tensorflow" if installed.get("tensorflow") else "tensorflow-cpu")
        )
        version = tf_tpu or installed.get("tensorflow") or installed.get("tensorflow-cpu")
        command = f'pip install "{dist}=={version}"'
    return f"`{command} --force-reinstall`, {RESTART}"


def check_import(
    installed: dict[str, str | None], import_module=importlib.import_module
) -> list[Finding]:
    """Imports TensorFlow, which package metadata says is installed; a failure is a finding, never a traceback.

    A TensorFlow whose metadata is present may still fail to import: files removed by another install, or a
    protobuf or NumPy it was not built for (each raises its own exception type, hence the broad catch).

    Args:
        installed: {distribution: version or None}, see `installed_versions`.
        import_module: `name -> module`; tests pass one that raises.

    Returns:
        [] when TensorFlow imports, else one "fail" finding with the error, its known cause if any, and the fix.
    """
    try:
        import_module("tensorflow")
    except Exception as error:  # noqa: BLE001 - ImportError, TypeError (protobuf), AttributeError (NumPy), ...
        version = (
            installed.get("tensorflow-tpu")
            or installed.get("tensorflow")
            or installed.get("tensorflow-cpu")
        )
        message = (
            f"tensorflow {version} is installed but `import tensorflow` failed: "
            f"{type(error).__name__}: {str(error)[:600]}"
        )
        explanation = diagnose.explain(error)
        if explanation:
            message += f" {explanation}"
        return [Finding("fail", "tensorflow import", message, _reinstall_fix(installed))]
    return []


def _default_connect(tpu: str | None):
    import tensorflow as tf

    choice = strategy.choose(tpu)
    built = strategy.build(choice)
    details = {
        "strategy": type(built).__name__,
        "replicas": int(built.num_replicas_in_sync),
        "reason": choice.reason,
    }
    topology = strategy.tpu_topology(choice.tpu) if choice.kind == "tpu" else None
    if topology is not None:
        details["topology"] = {
            "mesh_shape": [int(d) for d in topology.mesh_shape],
            "num_tasks": int(topology.num_tasks),
            "num_tpus_per_task": int(topology.num_tpus_per_task),
        }
    if strategy.kind_of(built) == "tpu":
        details["hosts"] = int(built.extended.num_hosts)
    details["tpu_build"] = strategy.tensorflow_has_tpu_support()
    details["tensorflow"] = tf.__version__
    return details


def check_accelerator(
    runtime: Runtime, tpu: str | None = None, connect=_default_connect
) -> tuple[dict, list[Finding]]:
    """Connects as `tpukit.connect` would and reports what was found.

    Args:
        runtime: from `detect_runtime`.
        tpu: an explicit TPU (name, grpc://host:port or "local"), as `--tpu`; None: as detected.
        connect: `tpu -> dict` with "strategy", "replicas" and optionally "topology"/"hosts"; raises on failure.
    """
    wanted = tpu or runtime.tpu
    if runtime.pod_slice and not wanted:
        return {}, [
            Finding(
                "fail",
                "accelerator",
                f"this is a pod slice of {runtime.hosts} TPU hosts: TensorFlow reaches the slice's hosts through "
                "the slice's TPU name (TPUClusterResolver), which is not set. (Where to start the program on a "
                "slice, one host or all, is Google's Cloud TPU pod-slice guide's call; tpukit has not run on one.)",
                "set $TPU_NAME to the slice's name on every host (or pass --tpu=NAME), and "
                f'`pip install "{versions.tpukit_requirement("tpu,tpu-name")}"` (the Cloud TPU API client)',
            )
        ]
    # The ways that work in practice: the TPU asked for or detected, then, for a TPU by name, the attached TPU ("local":
    # Colab and Kaggle TPU VMs need it, and a stale $TPU_NAME or $COLAB_TPU_ADDR is a common cause of failure).
    attempts = [wanted] + (
        ["local"]
        if runtime.accelerator in ("tpu_vm", "tpu_node")
        and wanted != "local"
        and not str(wanted).startswith("grpc://")
        else []
    )
    failures, details = [], None
    for attempt in attempts:
        try:
            details = connect(attempt)
            break
        except Exception as error:  # noqa: BLE001 - every failure is reported, none is raised
            explanation = diagnose.explain(error)
            message = f"connecting with tpu={attempt!r} failed: {type(error).__name__}: {str(error)[:600]}"
            if explanation and explanation not in message:
                message += f" {explanation}"
            failures.append(message)
    if details is None:
        return {}, [Finding("fail", "accelerator", " Then: ".join(failures))]
    findings = []
    if failures:
        findings.append(
            Finding(
                "warn",
                "accelerator",
                f"{failures[0]} It worked with tpu='local'.",
                "use --tpu local (or TPU_NAME=local, tpukit.connect(tpu='local')), and unset the stale setting",
            )
        )
    expected_tpu = runtime.accelerator in ("tpu_vm", "tpu_node") or tpu
    got_tpu = details.get("strategy", "").startswith("TPU")
    line = f"{details.get('strategy')} with {details.get('replicas')} replica(s)"
    if details.get("topology"):
        topo = details["topology"]
        line += (
            f", TPU mesh {'x'.join(map(str, topo['mesh_shape']))}, {topo['num_tasks']} host(s) x "
            f"{topo['num_tpus_per_task']} TPU device(s)"
        )
    if expected_tpu and not got_tpu:
        findings.append(
            Finding(
                "fail",
                "accelerator",
                f"a TPU was expected ({runtime.accelerator}) but connect() gave {line}.",
                "see the warning above it: usually the TensorFlow build (the tensorflow check)",
            )
        )
    else:
        findings.append(Finding("ok", "accelerator", line + "."))
    return details, findings


def _tensorflow_failed(findings: list[Finding]) -> bool:
    return any(
        f.level == "fail" and f.topic in ("tensorflow", "tensorflow import") for f in findings
    )


def _tensorflow_dist(installed: dict[str, str | None]) -> str | None:
    """The installed distribution that provides the `tensorflow` module (the TPU build first), or None."""
    return next(
        (d for d in ("tensorflow-tpu", "tensorflow", "tensorflow-cpu") if installed.get(d)), None
    )


def _failed(findings: list[Finding], *topics: str) -> str | None:
    """The message of the first failed finding about one of `topics`, or None."""
    return next((f.message for f in findings if f.level == "fail" and f.topic in topics), None)


def _tensorflow_engine_problem(
    runtime: Runtime, installed: dict[str, str | None], findings
) -> str | None:
    """Why the tensorflow engine cannot run here (TensorFlow and Keras in range, TensorFlow imports, the TPU build
    on a TPU VM, the connection), or None."""
    problem = _failed(
        findings, "tensorflow", "tensorflow import", "keras", "tensorflow-datasets", "accelerator"
    )
    if problem is None and runtime.accelerator == "tpu_vm" and not installed.get("tensorflow-tpu"):
        problem = "on a TPU VM it needs TensorFlow's TPU build (tensorflow-tpu); the CPU/GPU wheel has no TPU kernels."
        if not versions.tensorflow_tpu_installable(_python()):
            problem = f"on a TPU VM it needs TensorFlow's TPU build, and {versions.no_tensorflow_tpu_wheel(_python())}"
    return problem


def _jax_tpu_problem(
    runtime: Runtime, installed: dict[str, str | None], jax_requires
) -> str | None:
    """Why JAX would not train on this TPU VM's TPU (TensorFlow's TPU build, or not the libtpu jax pins), or None."""
    libtpu, pin = installed.get("libtpu"), _jax_libtpu_pin(jax_requires)
    if installed.get("tensorflow-tpu"):
        return (
            f"tensorflow-tpu {installed['tensorflow-tpu']} is installed: TensorFlow's TPU build and JAX cannot "
            f"share one TPU, and it brought the libtpu TensorFlow needs ({libtpu}). Fix: a fresh runtime without "
            f'tensorflow-tpu, then `pip install "{versions.tpukit_requirement("jax-tpu")}"`.'
        )
    if not jax_finds_the_tpu(runtime, installed, jax_requires):
        low, high = (versions.dotted(b) for b in jax_compat.JAX_TESTED)
        return (
            f"JAX would not find the TPU: jax {installed.get('jax')} needs the libtpu its `tpu` extra pins ({pin}); "
            f'installed: {libtpu or "none"}. Fix: `pip install "jax[tpu]>={low},<{high}"`, {RESTART}.'
        )
    return None


def _jax_engine_problem(
    runtime: Runtime, installed: dict[str, str | None], findings, jax_requires
) -> str | None:
    """Why the jax engine cannot run here (`tpukit.engines.jax.compat.installed_jax`, Keras in range, TensorFlow in
    range for tf.data; on a TPU VM, JAX's own libtpu and no TensorFlow TPU build), or None."""
    try:
        jax_compat.installed_jax()
    except ImportError as error:
        if runtime.accelerator != "tpu_vm":
            return str(error)
        # On a TPU the fix is JAX's TPU build, with the libtpu it pins, never a CPU JAX.
        jax, (low, high) = installed.get("jax"), (versions.dotted(b) for b in jax_compat.JAX_TESTED)
        if not jax:
            return f'JAX is not installed. Fix: `pip install "{versions.tpukit_requirement("jax-tpu")}"`.'
        return (
            f"{_jax_out_of_range(jax)}. Fix: "
            f'`pip install "jax[tpu]>={low},<{high}"` (JAX\'s TPU build with the libtpu it pins), {RESTART}.'
        )
    problem = _failed(findings, "keras", "tensorflow-datasets")
    if problem is None and runtime.accelerator == "tpu_vm":
        problem = _jax_tpu_problem(runtime, installed, jax_requires)
    if problem:
        return problem
    dist = _tensorflow_dist(installed)
    bounds = f">={versions.dotted(TF_RANGE[0])},<{versions.dotted(TF_RANGE[1])}"
    if dist is None:
        return (
            "tf.data reads the input and needs TensorFlow's CPU build, which is not installed. Fix: "
            f'`pip install "tensorflow-cpu{bounds}"`.'
        )
    if not _in_range(installed[dist], TF_RANGE):
        return (
            f"tf.data reads the input with TensorFlow {bounds}; installed: {dist} {installed[dist]}. Fix: "
            f'`pip install "{dist}{bounds}"`, {RESTART}.'
        )
    problem = _failed(findings, "tensorflow import")
    return problem and f"tf.data needs TensorFlow, which does not import: {problem}"


def check_engines(
    runtime: Runtime,
    installed: dict[str, str | None],
    findings: list[Finding],
    jax_requires: list[str] | None = None,
) -> dict[str, str | None]:
    """{engine: None when it can run here, else why not (with the fix)}, from the findings of the other steps.

    Keras' backend is not a condition: the CLI sets KERAS_BACKEND from the recipe's `runtime.engine`.
    """
    return {
        "tensorflow": _tensorflow_engine_problem(runtime, installed, findings),
        "jax": _jax_engine_problem(runtime, installed, findings, jax_requires),
    }


def engine_findings(
    problems: dict[str, str | None], installed: dict[str, str | None]
) -> list[Finding]:
    """One line per engine: "ok" when it can run, else "skip" when the other can and "fail" when none can."""
    tensorflow = installed.get(_tensorflow_dist(installed) or "")
    how = {
        "tensorflow": f"runtime.engine: tensorflow (auto picks it except on a TPU without tensorflow-tpu); "
        f"tensorflow {tensorflow}",
        "jax": f"`{JAX_ENGINE}` (runtime.engine: jax); jax {installed.get('jax')}, tf.data on tensorflow {tensorflow}",
    }
    unusable = "skip" if None in problems.values() else "fail"
    return [
        Finding("ok", f"{name} engine", f"can run: {how[name]}.")
        if problem is None
        else Finding(unusable, f"{name} engine", f"cannot run here: {problem}")
        for name, problem in problems.items()
    ]


def _python() -> tuple[int, int]:
    return sys.version_info[:2]


def hosted_runtime(
    runtime: Runtime, installed: dict[str, str | None], jax_requires: list[str] | None = None
) -> dict | None:
    """On Colab's or Kaggle's TPU runtime: its name, what it ships (`versions.HOSTED_RUNTIMES`), the engine tpukit
    trains with there (jax: neither has a TensorFlow TPU build) and the install command, saying whether that keeps
    the runtime's JAX and libtpu (a JAX in the jax engine's tested range) or replaces them (then a restart). None
    elsewhere."""
    known = versions.HOSTED_RUNTIMES.get(runtime.platform)
    if known is None or runtime.accelerator != "tpu_vm":
        return None
    jax, libtpu = installed.get("jax"), installed.get("libtpu")
    low, high = (versions.dotted(b) for b in jax_compat.JAX_TESTED)
    if _in_range(jax, jax_compat.JAX_TESTED) and jax_finds_the_tpu(
        runtime, installed, jax_requires
    ):
        effect = f"keeps this runtime's jax {jax} and libtpu {libtpu}"
    else:
        effect = (
            f"replaces this runtime's jax {jax or 'none'} and libtpu {libtpu or 'none'} with jax[tpu] >={low},<{high} "
            "and the libtpu it pins (the jax engine was tested in that range, and JAX finds the TPU only with the "
            "libtpu it pins); restart the runtime after it"
        )
    return {
        "name": known.name,
        "chips": known.chips,
        "ships": known.ships,
        "engine": "jax",
        "install": f'pip install "{versions.tpukit_requirement("jax-tpu")}"',
        "install_effect": effect,
        "train": f"python -m tpukit.train RECIPE {JAX_ENGINE}",
        "sources": known.evidence,
    }


def diagnose_environment(
    tpu: str | None = None,
    connect=_default_connect,
    import_module=importlib.import_module,
    **detect_kwargs,
) -> dict:
    """The whole report as a JSON-ready dict: runtime, versions, accelerator, findings and `ok`.

    Args:
        tpu: as `check_accelerator`'s.
        connect: as `check_accelerator`'s.
        import_module: as `check_import`'s.
        **detect_kwargs: passed to `detect_runtime` (tests fake the machine with them).
    """
    runtime = detect_runtime(**detect_kwargs)
    installed = installed_versions()
    try:
        jax_requires = importlib.metadata.requires("jax") if installed.get("jax") else None
    except importlib.metadata.PackageNotFoundError:
        jax_requires = None
    tf_dist = _tensorflow_dist(installed)
    # A distribution listed but gone (removed since, or the tests' faked versions) has no requirements to read.
    try:
        tf_requires = importlib.metadata.requires(tf_dist) if tf_dist else None
    except importlib.metadata.PackageNotFoundError:
        tf_requires = None
    findings = check_versions(runtime, installed, jax_requires, tf_requires)
    accelerator: dict = {}
    # TensorFlow's import and first device listing print C++ start-up lines on every machine: hidden, the rest kept.
    with quiet.start_up():
        if not _tensorflow_failed(findings):
            findings += check_import(installed, import_module)
    if _tensorflow_failed(findings):
        findings.append(
            Finding(
                "skip",
                "accelerator",
                "not checked: connecting needs a TensorFlow that tpukit supports and that imports (see the "
                "[FAIL] tensorflow line above).",
            )
        )
    elif jax_finds_the_tpu(runtime, installed, jax_requires):
        findings.append(
            Finding(
                "skip",
                "accelerator",
                "not checked: the doctor connects through TensorFlow, whose CPU build has no TPU kernels; the jax "
                "engine finds the TPU through JAX when it starts.",
            )
        )
    else:
        # A TPU's connection can take minutes and its warnings say why it hangs: never held back until it ends
        # (quiet.py leaves TPU initialisation alone); a CPU's or GPU's device listing is start-up chatter.
        tpu_here = tpu is not None or runtime.accelerator in ("tpu_vm", "tpu_node")
        with contextlib.nullcontext() if tpu_here else quiet.start_up():
            accelerator, more = check_accelerator(runtime, tpu, connect)
        findings += more
    problems = check_engines(runtime, installed, findings, jax_requires)
    findings += check_tpu_compiler(installed, jax_requires, problems.get("jax"))
    findings += engine_findings(problems, installed)
    return {
        "ok": not any(f.level == "fail" for f in findings),
        "runtime": dataclasses.asdict(runtime),
        "hosted": hosted_runtime(runtime, installed, jax_requires),
        "python": sys.version.split()[0],
        "versions": installed,
        "accelerator": accelerator,
        "engines": {
            name: {"can_run": problem is None, "reason": problem}
            for name, problem in problems.items()
        },
        "findings": [dataclasses.asdict(f) for f in findings],
    }


def _hosted_lines(hosted: dict | None) -> list[str]:
    if not hosted:
        return []
    return [
        f"  {hosted['name']}: {hosted['chips']}; ships {hosted['ships']}. tpukit trains here with the "
        f"{hosted['engine']} engine (`{hosted['train']}`).",
        f"  install: `{hosted['install']}` ({hosted['install_effect']}).",
    ]


def format_report(report: dict) -> str:
    """The human-readable report."""
    runtime = report["runtime"]
    where = {"tpu_vm": "TPU VM", "tpu_node": "remote TPU Node", "gpu": "GPU", "cpu": "CPU"}[
        runtime["accelerator"]
    ]
    lines = [
        f"tpukit doctor: {runtime['platform']} runtime, accelerator: {where}"
        + (f" ({runtime['accelerator_type']})" if runtime["accelerator_type"] else "")
        + (
            f", pod slice of {runtime['hosts']} hosts (this is worker {runtime['worker_id']})"
            if runtime["pod_slice"]
            else ""
        ),
        "  evidence: " + "; ".join(runtime["evidence"]),
        *_hosted_lines(report.get("hosted")),
        "  python "
        + report["python"]
        + ", "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v),
    ]
    for finding in report["findings"]:
        lines.append(f"[{finding['level'].upper():4}] {finding['topic']}: {finding['message']}")
        if finding["fix"]:
            lines.append(f"       fix: {finding['fix']}")
    lines.append(
        "OK: this environment can train." if report["ok"] else "NOT OK: fix the [FAIL] lines above."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "python -m tpukit.doctor") -> int:
    """Runs the doctor and prints its report.

    Args:
        argv: the command-line arguments (default: sys.argv[1:]).
        prog: the command's name in its usage line (`tpukit doctor` passes its own).

    Returns:
        0 when this environment can train, 1 when a check failed (argparse exits with 2 for bad flags).
    """
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object instead of the report"
    )
    parser.add_argument(
        "--tpu", default=None, help="a TPU name, grpc://host:port or 'local' (default: detect)"
    )
    args = parser.parse_args(argv)
    quiet.configure()  # before TensorFlow is imported: its C++ INFO lines off unless the user says otherwise
    report = diagnose_environment(tpu=args.tpu)
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else format_report(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
