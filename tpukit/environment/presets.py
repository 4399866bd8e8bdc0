"""Where a KerasHub preset comes from (a local directory, a Kaggle handle, `hf://`), and what to say when it cannot be
read: a missing directory, no network, no credentials or an unknown handle become one message naming the recipe key
and the fix, where KerasHub raises a network library's traceback or a list of every kind of handle it knows. Pure:
no KerasHub import (the data source and the model builder both read presets, and neither imports the other)."""

import contextlib
import os

# Libraries whose errors mean the preset could not be fetched (KerasHub downloads with kagglehub and huggingface_hub).
_FETCHING = ("requests", "urllib3", "urllib", "http", "socket", "kagglehub", "huggingface_hub")
FIX = (
    "Fix: a local preset directory (written by save_to_preset; tpukit.models.hub.tiny_preset makes a tiny one "
    "offline), or, for a Kaggle handle such as gemma_2b_en, network access and Kaggle credentials (KAGGLE_USERNAME "
    "and KAGGLE_KEY, or ~/.kaggle/kaggle.json; Colab's secrets) with the model's license accepted on kaggle.com; for "
    "hf://, network access and HF_TOKEN where the model is gated."
)


class PresetError(ValueError):
    """A preset that cannot be read: its message names the recipe key, the preset and the fix."""


def looks_local(preset: str) -> bool:
    """A path rather than a handle: it starts with /, ./, ../ or ~, or has a path separator and no scheme."""
    return preset.startswith(("/", "./", "../", "~")) or (os.sep in preset and "://" not in preset)


def check_local(preset: str, key: str) -> None:
    """A path that is not a preset directory (no config.json): KerasHub would try it as a Kaggle handle and fail with
    a network error or its list of handle kinds; this says what is missing instead."""
    if looks_local(preset) and not os.path.isfile(
        os.path.join(os.path.expanduser(preset), "config.json")
    ):
        raise PresetError(
            f"{key}: {preset!r} is not a KerasHub preset directory "
            f"({'no config.json there' if os.path.isdir(os.path.expanduser(preset)) else 'no such directory'}). "
            + FIX
        )


def _cannot_fetch(error: BaseException) -> bool:
    seen = error
    while seen is not None:
        module = type(seen).__module__.split(".")[0]
        if module in _FETCHING or isinstance(seen, (ConnectionError, TimeoutError)):
            return True
        # KerasHub's messages for a handle it cannot resolve or reach (hf:// offline).
        if isinstance(seen, (ValueError, FileNotFoundError)) and (
            "Unknown preset identifier" in str(seen) or "has no config.json" in str(seen)
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


@contextlib.contextmanager
def reading(preset: str, key: str):
    """Around KerasHub's `from_preset(preset)`: an error that means the preset could not be fetched becomes a
    `PresetError` naming `key`, the preset and the fix; any other error passes as it is."""
    check_local(preset, key)
    try:
        yield
    except Exception as error:
        if not _cannot_fetch(error):
            raise
        lines = str(error).strip().splitlines()
        raise PresetError(
            f"{key}: {preset!r} could not be read ({type(error).__name__}: {lines[0][:200] if lines else ''}). "
            + FIX
        ) from None
