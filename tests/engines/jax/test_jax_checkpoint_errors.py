"""The jax checkpointer's error handling without a run: Orbax's write errors that mean the output takes no writes
become `OSError`s with their errno (the run then stops with the output-directory message), other errors keep their
type; Orbax's own logs of an error it re-raises are dropped, other records kept."""

import errno
import logging
import os

import pytest

from tpukit.engines.jax import checkpoint


@pytest.mark.parametrize(
    "text, code",
    [
        (
            "RESOURCE_EXHAUSTED: Failed to write 150647 bytes to file 9: No space left on device [os_error_code='28']",
            errno.ENOSPC,
        ),
        ("Error writing: Disk quota exceeded", errno.EDQUOT),
        ("open failed: Read-only file system", errno.EROFS),
        ("PERMISSION_DENIED: Error writing gs://bucket/run/checkpoints/ckpt_4: 403", errno.EACCES),
    ],
)
def test_orbax_write_errors_become_oserrors_with_their_errno(text, code):
    with pytest.raises(OSError) as raised, checkpoint._as_os_errors("/out/checkpoints"):
        raise ValueError(text)
    assert raised.value.errno == code and os.strerror(code) in str(raised.value)
    assert "/out/checkpoints" in str(raised.value) and isinstance(
        raised.value.__cause__, ValueError
    )


def test_other_errors_keep_their_type():
    with pytest.raises(ValueError, match="a shape mismatch"), checkpoint._as_os_errors("/c"):
        raise ValueError("a shape mismatch")
    original = OSError(errno.EIO, "I/O error")
    with pytest.raises(OSError) as raised, checkpoint._as_os_errors("/c"):
        raise original
    assert raised.value is original


def _record(pathname: str, level: int, exc_info) -> logging.LogRecord:
    return logging.LogRecord("absl", level, pathname, 1, "failed", None, exc_info)


def test_orbax_error_logs_with_a_traceback_are_dropped_and_others_kept():
    keep = checkpoint._OrbaxErrorsRaised().filter
    try:
        raise ValueError("x")
    except ValueError as error:
        info = (ValueError, error, error.__traceback__)
    orbax = f"{os.sep}site-packages{os.sep}orbax{os.sep}checkpoint{os.sep}future.py"
    assert not keep(_record(orbax, logging.ERROR, info))
    assert keep(_record(orbax, logging.WARNING, None))  # Orbax's warnings stay
    assert keep(_record(orbax, logging.ERROR, None))  # an error without a traceback stays
    assert keep(_record(f"{os.sep}tensorflow{os.sep}x.py", logging.ERROR, info))  # not Orbax's


def _raised_in(filename: str, error: BaseException):
    """`error` with a traceback whose innermost frame runs code compiled as `filename`."""
    namespace: dict = {}
    exec(compile("def fail(error):\n    raise error\n", filename, "exec"), namespace)
    try:
        namespace["fail"](error)
    except BaseException as raised:  # noqa: BLE001 - returned for the test
        return raised


def test_an_asyncio_error_log_through_orbax_code_is_dropped():
    # asyncio's "Task exception was never retrieved" for the other writes of a failed save: logged by asyncio's
    # base_events.py, the traceback through Orbax's serialization.
    keep = checkpoint._OrbaxErrorsRaised().filter
    error = _raised_in(
        f"{os.sep}site-packages{os.sep}orbax{os.sep}serialization.py", ValueError("x")
    )
    info = (ValueError, error, error.__traceback__)
    assert not keep(_record(f"{os.sep}asyncio{os.sep}base_events.py", logging.ERROR, info))
    other = _raised_in(f"{os.sep}site-packages{os.sep}aiohttp{os.sep}client.py", ValueError("y"))
    assert keep(
        _record(
            f"{os.sep}asyncio{os.sep}base_events.py",
            logging.ERROR,
            (ValueError, other, other.__traceback__),
        )
    )


def test_late_callbacks_into_a_closed_event_loop_are_dropped_and_other_unraisables_kept():
    seen = []
    hook = checkpoint._LateWriteCallbacks(seen.append)

    def unraisable(error, obj=None):
        return type(
            "U", (), {"exc_value": error, "exc_traceback": error.__traceback__, "object": obj}
        )()

    late = _raised_in(
        f"{os.sep}asyncio{os.sep}base_events.py", RuntimeError("Event loop is closed")
    )
    hook(unraisable(late))
    assert (
        seen == []
    )  # tensorstore's write completing after Orbax's loop ended with the save's error
    elsewhere = _raised_in(f"{os.sep}mine{os.sep}code.py", RuntimeError("Event loop is closed"))
    other = _raised_in(f"{os.sep}asyncio{os.sep}base_events.py", RuntimeError("something else"))
    owned = _raised_in(
        f"{os.sep}asyncio{os.sep}base_events.py", RuntimeError("Event loop is closed")
    )
    for kept in (unraisable(elsewhere), unraisable(other), unraisable(owned, obj=object())):
        hook(kept)
    assert len(seen) == 3


def test_the_unraisable_hook_is_installed_once_and_chains(monkeypatch):
    previous = []
    monkeypatch.setattr("sys.unraisablehook", previous.append)
    checkpoint._quiet_orbax_errors()
    checkpoint._quiet_orbax_errors()
    import sys

    assert isinstance(sys.unraisablehook, checkpoint._LateWriteCallbacks)
    assert sys.unraisablehook.previous == previous.append
