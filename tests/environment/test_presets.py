"""A KerasHub preset that cannot be read (a missing directory, no network, no credentials, an unknown handle) is one
message naming the recipe key, the preset and the fix, from the data source, the model builder and `tpukit check`
alike; any other error passes unchanged."""

import socket

import pytest

from tpukit.environment import presets


def test_a_path_that_is_not_a_preset_directory_is_named_with_the_fix(tmp_path):
    with pytest.raises(presets.PresetError) as missing:
        presets.check_local(str(tmp_path / "nowhere"), "model.preset")
    message = str(missing.value)
    assert message.startswith(
        f"model.preset: {str(tmp_path / 'nowhere')!r} is not a KerasHub preset directory"
    )
    assert "(no such directory)" in message and "tiny_preset" in message and "Fix:" in message
    with pytest.raises(presets.PresetError, match=r"\(no config.json there\)"):
        presets.check_local(str(tmp_path), "model.preset")
    (tmp_path / "config.json").write_text("{}")
    presets.check_local(str(tmp_path), "model.preset")  # a preset directory
    presets.check_local("gemma_2b_en", "model.preset")  # a handle: KerasHub resolves it
    presets.check_local("hf://google/gemma-2b", "model.preset")


class ConnectionErrorOfRequests(OSError):
    """Stands for `requests.exceptions.ConnectionError` (its module is what is recognized)."""


ConnectionErrorOfRequests.__module__ = "requests.exceptions"


def _raised(error):
    raise error


@pytest.mark.parametrize(
    "error",
    [
        ConnectionErrorOfRequests(
            "HTTPSConnectionPool(host='api.kaggle.com', port=443): Max retries exceeded"
        ),
        ConnectionError("connection refused"),
        TimeoutError("timed out"),
        ValueError("Unknown preset identifier. A preset must be one of: 1) ..."),
        ValueError("Preset hf://google/gemma-2b has no config.json. Make sure the URI ..."),
    ],
)
def test_an_error_fetching_the_preset_becomes_one_message_with_the_fix(error):
    with pytest.raises(presets.PresetError) as raised:
        with presets.reading("gemma_2b_en", "model.preset"):
            _raised(error)
    message = str(raised.value)
    assert message.startswith(
        f"model.preset: 'gemma_2b_en' could not be read ({type(error).__name__}: "
    )
    assert str(error).splitlines()[0][:40] in message
    assert "KAGGLE_USERNAME" in message and "HF_TOKEN" in message
    assert (
        raised.value.__cause__ is None and raised.value.__suppress_context__
    )  # no chained traceback


def test_a_cause_deeper_in_the_chain_is_recognized():
    with pytest.raises(presets.PresetError):
        with presets.reading("gemma_2b_en", "model.preset"):
            try:
                raise socket.gaierror(-2, "Name or service not known")
            except OSError as lookup:
                raise RuntimeError("download failed") from lookup


@pytest.mark.parametrize(
    "error", [ValueError("sequence_length must be >= 2"), KeyError("use_sliding_window")]
)
def test_any_other_error_passes_unchanged(error):
    with pytest.raises(type(error)) as raised:
        with presets.reading("gemma_2b_en", "model.preset"):
            _raised(error)
    assert raised.value is error
