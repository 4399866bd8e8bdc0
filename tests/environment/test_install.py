"""The package metadata resolves to working sets: `pip install --dry-run --ignore-installed --report` on this
checkout's extras (metadata only: nothing is installed; pip reads the package index, so this needs PyPI).

* `.[tpu]` resolves to a tensorflow-tpu / libtpu pair that is the pinned row of `tpukit/environment/versions.py`.
* `.[tensorflow]` with each declared TensorFlow pinned resolves to a tensorflow-metadata whose generated protobuf
  code the resolved protobuf can load (the TF 2.19.1 + tensorflow-metadata 1.21 break of issue 10).

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

from tpukit.environment import versions

ROOT = pathlib.Path(REPO)


def _index_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
        return True
    except OSError:
        return False


def resolve(*requirements: str) -> dict[str, str]:
    """{normalized name: version} pip would install for `requirements` into an empty environment."""
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
    return {
        item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
        for item in report["install"]
    }


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
