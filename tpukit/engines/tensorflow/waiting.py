"""Bounded waits: a TPU to answer and a TF_CONFIG cluster's workers to start, each with a timeout, a progress line
every 30 s, and SIGTERM / Ctrl-C answered at once.

Why in Python, before calling TensorFlow: TensorFlow's connecting calls (`experimental_connect_to_cluster`, the
collective ops a `MultiWorkerMirroredStrategy` starts) block without a timeout while holding the GIL, so no log
line, timer or Python signal handler runs, and its coordination service then catches SIGTERM itself. So tpukit
waits for what TensorFlow would wait for (a TPU's gRPC handshake, every peer's port: `probe`, `wait_until`, with
each worker listening on its own port meanwhile: `Placeholder`) and runs the TPU system's initialization, which
releases the GIL, in a daemon thread (`call_bounded`). docs/tpu.md ("Why tpukit waits in Python") has the
TensorFlow 2.21 sources and the measurements behind this.

What remains unbounded: a peer or TPU that answers and then dies before TensorFlow finishes its handshake.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger("tpukit")

# How often a wait logs what it waits for.
LOG_INTERVAL_SECONDS = 30.0
# Time between two probes of the same address, and the longest one probe may take.
POLL_SECONDS = 0.5
PROBE_TIMEOUT_SECONDS = 2.0

# The client's HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 section 3.4): a gRPC server answers
# with its own SETTINGS frame (9-byte header, type 0x4) before anything else.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_SETTINGS = 0x4


class WaitInterrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived while tpukit waited for a TPU or for a cluster's workers: nothing was trained.

    A KeyboardInterrupt, like `tpukit.runner.TrainingInterrupted`: a script or notebook stops as on any Ctrl-C, no
    `except Exception` swallows it, and IPython shows its one line (`_render_traceback_`). `signum` is the
    signal; a command line exits `128 + signum`, as the shell reports a process that signal ended.
    """

    def __init__(self, signum: int, activity: str, elapsed: float):
        self.signum = signum
        name = signal.Signals(signum).name
        super().__init__(
            f"tpukit: stopped by {name} after {elapsed:.0f} s while waiting for {activity}; nothing was trained "
            "or written. Run the same command again to start over."
        )

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


@contextlib.contextmanager
def interruptible(activity: Callable[[], str]) -> Iterator[None]:
    """Inside the block, SIGTERM and SIGINT raise `WaitInterrupted` (its message says what was being waited for,
    from `activity()`); the previous handlers come back afterwards.

    Only in the main thread (Python delivers signals there; `signal.signal` refuses other threads), and only for a
    signal whose handler Python installed: one ignored (SIG_IGN, e.g. SIGINT under nohup) stays ignored, and one
    that C code installed (`getsignal` returns None: TensorFlow's own SIGTERM handler) cannot be put back, so it
    is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    start = time.monotonic()

    def stop(signum, frame):
        raise WaitInterrupted(signum, activity(), time.monotonic() - start)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(signum)
        if handler is None or handler == signal.SIG_IGN:
            continue
        previous[signum] = handler
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def parse_address(text: Any) -> tuple[str, int]:
    """`host:port` or `[IPv6]:port` -> (host, port); ValueError saying what is wrong otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"an address must be a string 'host:port', not {type(text).__name__}")
    if "://" in text:
        raise ValueError(
            f"{text!r} has a scheme: write host:port without '{text.split('://')[0]}://'"
        )
    if text.startswith("["):
        host, separator, port = text[1:].partition("]:")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{text!r} is not [IPv6 address]:port") from None
        if not separator:
            raise ValueError(f"{text!r} has no port: write [{host}]:port")
    else:
        host, separator, port = text.rpartition(":")
        if not separator:
            raise ValueError(f"{text!r} has no port: write host:port, e.g. {text or 'host'}:2222")
        if ":" in host:
            raise ValueError(f"{text!r}: an IPv6 address goes in brackets, e.g. [::1]:2222")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", host):
            raise ValueError(f"{text!r} has no valid host name or IP address before ':{port}'")
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"{text!r} has port {port!r}: a port is a number from 1 to 65535")
    return host, int(port)


def probe(
    host: str, port: int, timeout: float = PROBE_TIMEOUT_SECONDS, handshake: bool = False
) -> str:
    """One connection attempt to host:port, as a word:

    - 'open': it accepted a TCP connection (with `handshake`: and answered the HTTP/2 handshake, as gRPC does);
    - 'silent' (`handshake` only): it accepted the connection and said nothing within `timeout`;
    - 'not_grpc' (`handshake` only): it answered something that is not HTTP/2, or closed the connection;
    - 'refused': nothing listens there; 'unresolvable': the host name does not resolve;
    - 'timeout': no answer to the TCP connection within `timeout` (a firewall, or a machine that is down);
    - 'unreachable': any other network error (no route to the host, ...).
    """
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        return "refused"
    except socket.gaierror:
        return "unresolvable"
    except TimeoutError:
        return "timeout"
    except OSError:
        return "unreachable"
    with sock:
        if not handshake:
            return "open"
        try:
            sock.sendall(_HTTP2_PREFACE)
            reply = b""
            while len(reply) < 9:
                chunk = sock.recv(9 - len(reply))
                if not chunk:
                    break
                reply += chunk
        except TimeoutError:
            return "silent"
        except OSError:
            return "not_grpc"
    return "open" if len(reply) == 9 and reply[3] == _HTTP2_SETTINGS else "not_grpc"


def wait_until(
    poll: Callable[[float], tuple[bool, str]],
    timeout: float,
    activity: str,
    limit: str,
    interval: float = POLL_SECONDS,
) -> tuple[bool, str, float]:
    """Calls `poll(seconds_left) -> (done, progress)` every `interval` s until it is done or `timeout` s have
    passed.

    Logs `waiting for {activity}: {progress}; {elapsed} s of {timeout} s ({limit})` after the first poll and every
    `LOG_INTERVAL_SECONDS` s (`limit` names the setting, e.g. `runtime.tpu_timeout_seconds`). SIGTERM/SIGINT raise
    `WaitInterrupted` (see `interruptible`). Returns (done, the last progress, elapsed s).
    """
    start = time.monotonic()
    progress = "not checked yet"
    with interruptible(lambda: f"{activity}; {progress}"):
        next_log = start
        while True:
            done, progress = poll(max(0.0, timeout - (time.monotonic() - start)))
            elapsed = time.monotonic() - start
            if done:
                return True, progress, elapsed
            if elapsed >= timeout:
                return False, progress, elapsed
            if time.monotonic() >= next_log:
                logger.info(
                    "tpukit: waiting for %s: %s; %.0f s of %.0f s (%s)",
                    activity,
                    progress,
                    elapsed,
                    timeout,
                    limit,
                )
                next_log += LOG_INTERVAL_SECONDS
            time.sleep(max(0.0, min(interval, timeout - elapsed)))


class BoundedCallTimeout(TimeoutError):
    """`call_bounded`'s function did not return in time (it goes on in its daemon thread)."""


def call_bounded(function: Callable[[], Any], timeout: float, activity: str) -> Any:
    """`function()` in a daemon thread, waited for in short joins: returns its result or raises its exception;
    logs what it waits for every `LOG_INTERVAL_SECONDS` s; raises `BoundedCallTimeout` after `timeout` s and
    `WaitInterrupted` on SIGTERM/SIGINT. Only for functions that release the GIL while they block (Python I/O,
    eagerly executed TensorFlow functions), or the waiting thread never runs."""
    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = function()
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = error

    thread = threading.Thread(target=target, name=f"tpukit: {activity}", daemon=True)
    start = time.monotonic()
    with interruptible(lambda: activity):
        thread.start()
        next_log = start + LOG_INTERVAL_SECONDS
        while thread.is_alive():
            elapsed = time.monotonic() - start
            if elapsed >= timeout:
                raise BoundedCallTimeout(f"{activity} did not finish within {timeout:.0f} s")
            thread.join(min(POLL_SECONDS, timeout - elapsed))
            if thread.is_alive() and time.monotonic() >= next_log:
                logger.info(
                    "tpukit: waiting for %s; %.0f s of %.0f s",
                    activity,
                    time.monotonic() - start,
                    timeout,
                )
                next_log += LOG_INTERVAL_SECONDS
    if "error" in box:
        raise box["error"]
    return box.get("result")


class Placeholder:
    """Listens on this worker's own cluster port while it waits for the others, so that they see it started.

    Accepted connections are closed at once (`drain`, called at every poll), so the listen backlog never fills.
    `close()` frees the port for TensorFlow's gRPC server. A port already taken is not an error here (another
    MultiWorkerMirroredStrategy in this process may hold it): `listening` is False then, and TensorFlow reports
    a port held by another program when it starts its server.
    """

    def __init__(self, port: int):
        self.port = port
        self._sock: socket.socket | None = None
        try:
            if socket.has_dualstack_ipv6():
                sock = socket.create_server(
                    ("", port), family=socket.AF_INET6, dualstack_ipv6=True, reuse_port=False
                )
            else:
                sock = socket.create_server(("", port))
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                logger.warning(
                    "tpukit: could not listen on this worker's port %d while waiting (%s)",
                    port,
                    error,
                )
            return
        sock.setblocking(False)
        self._sock = sock

    @property
    def listening(self) -> bool:
        return self._sock is not None

    def drain(self) -> None:
        while self._sock is not None:
            try:
                connection, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            connection.close()

    def close(self) -> None:
        if self._sock is not None:
            self.drain()
            self._sock.close()
            self._sock = None

    def __enter__(self) -> Placeholder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
