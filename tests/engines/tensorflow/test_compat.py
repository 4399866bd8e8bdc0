"""The TensorFlow and Keras ranges tpukit was tested with are checked at import (issue 9)."""

from helpers import REPO  # noqa: I001
import keras
import pytest

from tpukit.engines.tensorflow import compat


def test_the_installed_keras_is_in_the_tested_range():
    assert compat.check_keras() == keras.__version__


@pytest.mark.parametrize("version", ["3.14.1", "3.16.0", "4.0.0"])
def test_a_keras_outside_the_tested_range_is_refused_with_the_install_command(monkeypatch, version):
    monkeypatch.setattr(keras, "__version__", version)
    with pytest.raises(ImportError) as info:
        compat.check_keras()
    assert f"received keras {version}" in str(info.value)
    assert "pip install 'keras>=3.15,<3.16'" in str(
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
