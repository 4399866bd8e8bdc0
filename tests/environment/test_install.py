"""The package metadata resolves to working sets: `pip install --dry-run --ignore-installed --report` on this
checkout's extras (metadata only: nothing is installed; pip reads the package index, so this needs PyPI).

* `.[tpu]` resolves to a tensorflow-tpu / libtpu pair that is the pinned row of `tpukit/environment/versions.py`.
* `.[tensorflow]` with each declared TensorFlow pinned resolves to a tensorflow-metadata whose generated protobuf
  code the resolved protobuf can load (the TF 2.19.1 + tensorflow-metadata 1.21 break of issue 10).
* `.[jax]` (alone and with each declared TensorFlow's CPU build pinned) resolves to a JAX in the jax engine's tested
  range beside TensorFlow's CPU build, and no other wheel of the `tensorflow` module.
* `.[jax-tpu]` resolves to JAX's TPU build (jax, jaxlib and the libtpu jax's `tpu` extra pins) and tensorflow-cpu,
  never tensorflow-tpu (TensorFlow's TPU build and JAX cannot share one TPU).

Skipped only when the package index cannot be reached (the skip says so); any resolution failure or wrong pair
fails. This proves what pip would install, not that it runs: `.ci/tf_matrix.sh` runs the suite on each TensorFlow.
"""

from helpers import REPO  # noqa: I001
import json
import pathlib
import socket
import subprocess
import sys

import pytest
from packaging.requirements import Requirement

from tpukit.engines.jax.compat import JAX_TESTED
from tpukit.environment import versions

ROOT = pathlib.Path(REPO)


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
        return True
    except OSError:
        return False


def _name(metadata: dict) -> str:
    return metadata["name"].lower().replace("_", "-")


def resolve(*requirements: str) -> dict[str, str]:
    """{normalized name: version} pip would install for `requirements` into an empty environment."""
    return {name: metadata["version"] for name, metadata in resolve_metadata(*requirements).items()}


def resolve_metadata(*requirements: str) -> dict[str, dict]:
    """{normalized name: its metadata in pip's installation report (version, requires_dist, ...)}."""
    if not _index_reachable():
        pytest.skip("pypi.org:443 is unreachable: the dry-run resolution needs the package index")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--disable-pip-version-check",
        "--report",
        "-",
        *requirements,
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"pip could not resolve {requirements}:\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout)
    return {_name(item["metadata"]): item["metadata"] for item in report["install"]}


def _tuple(version: str) -> tuple[int, ...]:
    return tuple(
        int("".join(c for c in part if c.isdigit()) or 0) for part in version.split(".")[:3]
    )


def assert_tfds_metadata_loads(resolved: dict[str, str]) -> None:
    # tensorflow-metadata >= 1.18 carries protobuf 6.31 generated code, which refuses an older protobuf runtime
    # (github.com/tensorflow/metadata/issues/68).
    metadata, protobuf = resolved["tensorflow-metadata"], resolved["protobuf"]
    assert _tuple(metadata) < (1, 18) or _tuple(protobuf) >= (6, 31), (
        f"tensorflow-metadata {metadata} with protobuf {protobuf}: `import tensorflow_datasets` would break"
    )


@pytest.mark.network
def test_tpu_extra_resolves_to_the_pinned_row_of_the_version_table():
    resolved = resolve(".[tpu]")
    tensorflow_tpu, libtpu = resolved.get("tensorflow-tpu"), resolved.get("libtpu")
    row = versions.find("tensorflow-tpu", tensorflow_tpu, libtpu)
    assert row is not None, (
        f"[tpu] resolves to tensorflow-tpu {tensorflow_tpu} + libtpu {libtpu}: not a table row"
    )
    assert row == versions.pinned_tpu()
    assert (
        "tensorflow" not in resolved
    )  # the CPU wheel would overwrite the TPU build's `tensorflow` module
    assert_tfds_metadata_loads(resolved)


@pytest.mark.network
@pytest.mark.parametrize(
    "tensorflow", [c.tensorflow for c in versions.COMBINATIONS if not c.is_tpu]
)
def test_tensorflow_extra_resolves_to_a_working_set_on_every_declared_tensorflow(tensorflow):
    resolved = resolve(".[tensorflow]", f"tensorflow=={tensorflow}")
    assert resolved["tensorflow"] == tensorflow
    assert_tfds_metadata_loads(resolved)
    assert "tensorboard" in resolved  # tf.summary needs it; TF 2.21 stopped depending on it


def test_the_table_and_setup_cfg_agree():
    text = (ROOT / "setup.cfg").read_text()
    pinned = versions.pinned_tpu()
    assert f"tensorflow-tpu=={pinned.tensorflow}" in text and f"libtpu=={pinned.libtpu}" in text
    low = ".".join(map(str, versions.MIN_TF))
    high = ".".join(map(str, versions.MAX_TF_EXCLUSIVE))
    assert f"tensorflow>={low},<{high}" in text
    cpu_rows = {c.tensorflow for c in versions.COMBINATIONS if not c.is_tpu}
    assert all(versions.MIN_TF <= versions.minor(v) < versions.MAX_TF_EXCLUSIVE for v in cpu_rows)


def assert_jax_in_the_tested_range(resolved: dict[str, str]) -> None:
    low, high = JAX_TESTED
    for name in ("jax", "jaxlib"):
        assert low <= versions.minor(resolved[name]) < high, (
            f"{name} {resolved[name]} is outside the jax engine's tested range {JAX_TESTED}"
        )


CPU_TENSORFLOWS = [c.tensorflow for c in versions.COMBINATIONS if not c.is_tpu]


@pytest.mark.network
@pytest.mark.parametrize("tensorflow", [None, *CPU_TENSORFLOWS], ids=["default", *CPU_TENSORFLOWS])
def test_jax_extra_resolves_a_tested_jax_beside_tensorflows_cpu_build(tensorflow):
    # Unpinned, the extra itself must bring tensorflow-cpu; pinned, every declared TensorFlow must fit beside JAX.
    pins = [f"tensorflow-cpu=={tensorflow}"] if tensorflow else []
    resolved = resolve(".[jax]", *pins)
    assert_jax_in_the_tested_range(resolved)
    cpu = resolved.get("tensorflow-cpu")
    assert cpu is not None and versions.MIN_TF <= versions.minor(cpu) < versions.MAX_TF_EXCLUSIVE, (
        resolved
    )
    assert cpu == (tensorflow or cpu)
    # One wheel of the `tensorflow` module (the CUDA wheel would overwrite it), and nothing of a TPU runtime.
    assert not {"tensorflow", "tensorflow-tpu", "libtpu"} & resolved.keys()
    assert_tfds_metadata_loads(resolved)


@pytest.mark.network
def test_jax_tpu_extra_resolves_jax_with_its_own_libtpu_and_no_tensorflow_tpu():
    metadata = resolve_metadata(".[jax-tpu]")
    resolved = {name: item["version"] for name, item in metadata.items()}
    assert_jax_in_the_tested_range(resolved)
    assert resolved["jaxlib"] == resolved["jax"]  # jax's `tpu` extra pins its own jaxlib
    # The libtpu is the one jax's `tpu` extra asks for (e.g. jax 0.10.2: libtpu==0.0.42.*), so JAX finds the TPU.
    pins = [Requirement(text) for text in metadata["jax"].get("requires_dist", [])]
    (libtpu_pin,) = [
        r for r in pins if r.name == "libtpu" and r.marker and r.marker.evaluate({"extra": "tpu"})
    ]
    assert "libtpu" in resolved and libtpu_pin.specifier.contains(resolved["libtpu"]), (
        f"libtpu {resolved.get('libtpu')} for jax {resolved['jax']}, which pins {libtpu_pin}"
    )
    # TensorFlow for tf.data only: its CPU build, in range; never its TPU build, which would replace that libtpu.
    assert "tensorflow-tpu" not in resolved and "tensorflow" not in resolved
    cpu = resolved["tensorflow-cpu"]
    assert versions.MIN_TF <= versions.minor(cpu) < versions.MAX_TF_EXCLUSIVE
    assert_tfds_metadata_loads(resolved)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """This checkout's wheel, and a wheel of `promise` (TFDS requires it and PyPI has only its sdist): resolving for
    another Python (`--python-version`) takes wheels only."""
    if not _index_reachable():
        pytest.skip("pypi.org:443 is unreachable: the dry-run resolution needs the package index")
    folder = tmp_path_factory.mktemp("wheels")
    for source in (str(ROOT), "promise"):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--no-deps",
                "--quiet",
                "-w",
                str(folder),
                source,
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
    return folder


def resolve_for(python: str, wheels, extra: str, *pins: str) -> dict[str, str]:
    """{name: version} pip would install for this checkout's `extra` beside `pins` on CPython `python` here."""
    (tpukit,) = wheels.glob("tpukit-*.whl")
    metadata = resolve_metadata(
        "--python-version",
        python,
        "--only-binary=:all:",
        "--find-links",
        str(wheels),
        f"{tpukit}[{extra}]",
        *pins,
    )
    return {name: item["version"] for name, item in metadata.items()}


@pytest.mark.network
def test_on_kaggles_tpu_image_the_jax_tpu_extra_keeps_its_tensorflow_and_replaces_its_old_jax(
    wheels,
):
    """Kaggle's TPU image (Kaggle/docker-python tpu/): Python 3.12, tensorflow-cpu 2.20.0, jax[tpu] with libtpu
    forced to 0.0.17 (jax 0.6.2's pin; the image's JAX is 0.7.x). tpukit's extra keeps that TensorFlow; JAX below
    the tested range is replaced, with the libtpu the new JAX pins: what `tpukit doctor` says there."""
    resolved = resolve_for("3.12", wheels, "jax-tpu", "tensorflow-cpu==2.20.0")
    assert resolved["tensorflow-cpu"] == "2.20.0"
    assert_jax_in_the_tested_range(resolved)
    assert resolved["libtpu"] != "0.0.17" and "tensorflow-tpu" not in resolved


@pytest.mark.network
def test_on_colabs_python_3_13_the_jax_tpu_extra_resolves_to_wheels(wheels):
    """Wheels for CPython 3.13 only (pip evaluates the requirements' markers for the Python running it: the `tpu`
    extra's `python_version < "3.13"` is resolved on 3.13 itself by .ci/newest_stack.sh)."""
    jax = resolve_for("3.13", wheels, "jax-tpu")
    assert_jax_in_the_tested_range(jax)
    assert "libtpu" in jax and "tensorflow-tpu" not in jax


def test_the_jax_extras_declare_the_jax_engines_tested_range():
    text = (ROOT / "setup.cfg").read_text()
    jax = f">={'.'.join(map(str, JAX_TESTED[0]))},<{'.'.join(map(str, JAX_TESTED[1]))}"
    tensorflow = (
        f">={'.'.join(map(str, versions.MIN_TF))},<{'.'.join(map(str, versions.MAX_TF_EXCLUSIVE))}"
    )
    assert f"jax{jax}" in text and f"jax[tpu]{jax}" in text
    assert text.count(f"tensorflow-cpu{tensorflow}") == 2
