"""The TensorFlow and Keras ranges tpukit was tested with are checked when the TensorFlow engine is first used
(issue 9; no longer at `import tpukit`, issue 17). Without TensorFlow: tests/tools/test_doctor_blocked_imports.py.
"""

import sys

import keras
import pytest
import tensorflow as tf
from helpers import REPO

from tpukit.engines.tensorflow import compat
from tpukit.environment import versions


def test_the_installed_keras_is_in_the_tested_range():
    assert compat.check_keras() == keras.__version__


@pytest.mark.parametrize("version", ["3.14.1", "3.16.0", "4.0.0"])
def test_a_keras_outside_the_tested_range_is_refused_with_the_install_command(monkeypatch, version):
    monkeypatch.setattr(keras, "__version__", version)
    with pytest.raises(ImportError) as info:
        compat.check_keras()
    assert f"received keras {version}" in str(info.value)
    assert 'Fix: `pip install "keras>=3.15,<3.16"`' in str(
        info.value
    ) and "TPUKIT_ALLOW_UNTESTED_KERAS=1" in str(info.value)


def test_the_escape_hatch_warns_instead(monkeypatch, caplog):
    monkeypatch.setattr(keras, "__version__", "3.16.0")
    monkeypatch.setenv("TPUKIT_ALLOW_UNTESTED_KERAS", "1")
    assert compat.check_keras() == "3.16.0"
    assert "tested with Keras >= 3.15 and < 3.16" in caplog.text


def test_setup_cfg_declares_the_same_keras_range():
    import configparser
    import os

    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))
    low, high = (".".join(map(str, v)) for v in compat.KERAS_TESTED)
    assert f"keras>={low},<{high}" in config["options"]["install_requires"]


def test_a_missing_keras_is_refused_with_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras", None)  # `import keras` raises ImportError
    with pytest.raises(
        ImportError, match='tpukit needs Keras 3 .*`pip install "keras>=3.15,<3.16"`'
    ):
        compat.check_keras()


@pytest.mark.parametrize("version", ["2.10.0", "2.18.1", "2.22.0"])
def test_a_tensorflow_outside_the_range_is_refused_with_the_install_command(monkeypatch, version):
    monkeypatch.setattr(tf, "__version__", version)
    with pytest.raises(ImportError) as info:
        compat.check_tensorflow()
    assert f"received tensorflow {version}" in str(info.value)
    assert f"Fix: `{versions.tensorflow_install_command()}` on CPU/GPU" in str(info.value)
    assert 'pip install "tensorflow>=2.19,<2.22"' == versions.tensorflow_install_command()


def test_the_installed_tensorflow_passes():
    assert compat.check_tensorflow() == tf.__version__


def test_the_keras_range_is_the_one_in_versions():
    assert compat.KERAS_TESTED is versions.KERAS_TESTED
    assert versions.keras_install_command() == 'pip install "keras>=3.15,<3.16"'
