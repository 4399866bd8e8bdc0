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
