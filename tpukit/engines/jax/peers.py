"""A multi-process jax run ($TPUKIT_COORDINATOR_ADDRESS) that loses a process ends with a message, not a hang or
a C++ abort; a process that never joins is named while the others wait.

`join` starts JAX's cluster with recoverability on (a missed heartbeat no longer aborts every process) and a 10 s
heartbeat, logging who it waits for and stopping on SIGTERM/Ctrl-C. `_watch`, a daemon thread, asks the
coordination service once a second which processes are alive; one gone without saying it finished ends this
process through `stop`: the message (which process, the newest checkpoint, restart every process), then
`os._exit(1)` past JAX's shutdown barrier, which would wait for the lost process. `check_lost` turns a collective's
error during `fit` into the same message. At exit (`_finish`) every process says whether it finished or failed,
and process 0's service stays until the others have disconnected.

What JAX 0.10.2 does without this, and what stays out of reach (the coordinator's loss still aborts the others in
C++), is in docs/engines.md, "A lost process (jax engine)".
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

import jax
import keras

from tpukit.engines.jax import compat

logger = logging.getLogger("tpukit")

# The service marks a silent process lost after HEARTBEAT_SECONDS; processes wait JOIN_TIMEOUT_SECONDS for each
# other to join (JAX's `initialization_timeout`), logging the first waiting line after FIRST_JOIN_LOG_SECONDS.
HEARTBEAT_SECONDS = 10
JOIN_TIMEOUT_SECONDS = 300
FIRST_JOIN_LOG_SECONDS = 5.0
JOIN_LOG_SECONDS = 30.0
POLL_SECONDS = 1.0
FINISHED_WAIT_SECONDS = 30.0  # how long process 0 waits at exit for the others to disconnect
_FINISHED_KEY = "tpukit/finished/{}"
_FAILED_KEY = (
    "tpukit/failed/{}"  # a process that ends on its own error says so: named as such, not "lost"
)
FAILED_HOW = "stopped on an error of its own, in its log"
FAILED_GRACE_SECONDS = (
    10.0  # the others' wait before they stop for a failed process (it may be theirs too)
)


@dataclasses.dataclass
class _Cluster:
    """This process's place in the run and what the lost-process message needs."""

    address: str
    count: int
    index: int
    newest_step: Callable[[], int | None] | None = None
    checkpoint_dir: str | None = None
    step: int | None = None  # the newest training step this process finished (`Progress`)
    succeeded: bool = False  # the run reported (`succeeded`): at exit it says finished, else failed
    stopped: threading.Event = dataclasses.field(default_factory=threading.Event)


_CLUSTER: _Cluster | None = None


def lost_message(
    lost: list[int],
    count: int,
    step: int | None,
    newest: int | None,
    checkpoint_dir: str | None,
    how: str = "stopped answering",
) -> str:
    """The survivor's one message: which process was lost, the checkpoint kept, and the fix."""
    names = ", ".join(str(p) for p in lost)
    during = (
        f"{',' if 'log' in how else ''} during training step ~{step}" if step is not None else ""
    )
    where = f" in {checkpoint_dir}" if checkpoint_dir else ""
    if newest is None:
        kept = f"No checkpoint was found{where}."
        resume = "the run starts from the beginning"
    else:
        kept = f"The checkpoints are kept: newest ckpt step {newest}{where}."
        resume = f"the run resumes from step {newest}"
    who, it = ("process", "it") if len(lost) == 1 else ("processes", "they")
    if len(lost) > 1:
        how = how.replace("closed its", "closed their").replace(
            "of its own, in its log", "of their own, in their logs"
        )
    return (
        f"tpukit: lost {who} {names} of {count} ({it} {how}{during}). {kept} "
        f"Fix: restart every process with the same command; {resume}."
    )


def waiting_message(
    address: str, count: int, index: int, coordinator_up: bool, elapsed: float
) -> str:
    """The line a process logs while the others have not joined: the missing processes as far as it can tell."""
    others = [p for p in range(count) if p != index]
    if not coordinator_up and index != 0:
        missing = "process 0 (the coordinator)"
    elif len(others) == 1:
        missing = f"process {others[0]}"
    else:
        missing = "processes " + ", ".join(str(p) for p in others if p != 0 or not coordinator_up)
        missing += " (some may have joined: JAX does not say which)"
    return (
        f"tpukit: waiting for {missing} of {count} to join at {address} ({elapsed:.0f} s of "
        f"{JOIN_TIMEOUT_SECONDS} s); start it with TPUKIT_PROCESS_ID set, or stop with SIGTERM/Ctrl-C"
    )


def stop(message: str, status: int = 1) -> None:
    """Prints `message`, flushes the logs and ends the process at once: JAX's runtime cannot be shut down cleanly
    after a peer is gone (its shutdown barrier waits for the lost process), so nothing else may run."""
    if _CLUSTER is not None:
        _CLUSTER.stopped.set()
    for handler in logging.getLogger().handlers + logger.handlers:
        try:
            handler.flush()
        except Exception:  # noqa: BLE001, S110 - a broken log handler must not keep the process alive
            pass
    sys.stdout.flush()
    os.write(2, (message + "\n").encode())
    os._exit(status)


def _coordinator_up(address: str) -> bool:
    """Whether process 0's port accepts a connection (True where the address cannot be read: nothing to say)."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return True
    except ValueError:
        return True
    except OSError:
        return False


def join(address: str, count: int, index: int) -> None:
    """`jax.distributed.initialize` with recoverability and a short heartbeat, connected in a daemon thread while
    this thread names who it waits for every `JOIN_LOG_SECONDS` and ends on SIGTERM/SIGINT (exit 128 + signal);
    then the watchdog and the exit protocol."""
    global _CLUSTER
    jax.config.update("jax_enable_recoverability", True)
    box: dict = {}

    def connect():
        try:
            jax.distributed.initialize(
                address,
                count,
                index,
                initialization_timeout=JOIN_TIMEOUT_SECONDS,
                heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
            )
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = error

    _wait(threading.Thread(target=connect, name="tpukit: join", daemon=True), address, count, index)
    if "error" in box:
        first = (str(box["error"]).strip().splitlines() or [""])[0][:300]
        stop(
            f"tpukit: the {count} processes did not all join at {address} within {JOIN_TIMEOUT_SECONDS} s "
            f"({type(box['error']).__name__}: {first}). Fix: start every process with the same "
            "TPUKIT_COORDINATOR_ADDRESS and TPUKIT_NUM_PROCESSES and its own TPUKIT_PROCESS_ID."
        )
    _CLUSTER = _Cluster(address, count, index)
    # keras.distribution.initialize would also share a random seed when none is set; the engine sets the recipe's
    # seed on every process before anything is built (`engine._build`).
    threading.Thread(target=_watch, args=(_CLUSTER,), name="tpukit: peers", daemon=True).start()
    # Registered after JAX's own atexit hook (its import), so it runs before JAX's shutdown.
    atexit.register(_finish, _CLUSTER)


def _wait(thread: threading.Thread, address: str, count: int, index: int) -> None:
    """Runs `thread` (the join) to its end, logging the waiting line; SIGTERM/SIGINT stop the process."""
    start = time.monotonic()

    def interrupted(signum, frame):
        stop(
            f"tpukit: stopped by {signal.Signals(signum).name} after {time.monotonic() - start:.0f} s while "
            f"waiting for the {count} processes to join at {address}; nothing was trained or written. Run the "
            "same command again on every process to start over.",
            128 + signum,
        )

    main = threading.current_thread() is threading.main_thread()
    previous = (
        {s: signal.signal(s, interrupted) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    )
    try:
        thread.start()
        next_log = start + FIRST_JOIN_LOG_SECONDS
        while thread.is_alive():
            thread.join(0.25)
            if thread.is_alive() and time.monotonic() >= next_log:
                elapsed = time.monotonic() - start
                logger.warning(
                    waiting_message(address, count, index, _coordinator_up(address), elapsed)
                )
                next_log += JOIN_LOG_SECONDS
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


def _client():
    return compat.coordination_client()


def _missing(cluster: _Cluster) -> tuple[list[int], str]:
    """The processes the service no longer sees and that did not say they finished, and how they went ("stopped
    with an error" when they said so); [0] if the service itself is unreachable (process 0 hosts it)."""
    client = _client()
    try:
        live = client.get_live_nodes(list(range(cluster.count)))
    except Exception:  # noqa: BLE001 - the coordination service is gone: process 0 with it
        return ([0] if cluster.index != 0 else []), "stopped answering"
    others = [p for p in range(cluster.count) if p != cluster.index]
    # A failed process 0 keeps its service up while the others leave (`_finish`): failed, though still live.
    failed = [p for p in others if _said(client, _FAILED_KEY, p)]
    if failed:
        return failed, FAILED_HOW
    gone = [p for p in others if p not in live and not _said(client, _FINISHED_KEY, p)]
    return gone, "stopped answering"


def _said(client, key: str, process: int) -> bool:
    """Whether `process` set `key` (`_finish`) before it left; a missing key raises NOT_FOUND."""
    try:
        return client.key_value_try_get(key.format(process)) is not None
    except Exception:  # noqa: BLE001 - NOT_FOUND, or the service gone: not said either way
        return False


def succeeded() -> None:
    """The run reported: at exit this process tells the others it finished (else that it failed)."""
    if _CLUSTER is not None:
        _CLUSTER.succeeded = True


def _watch(cluster: _Cluster) -> None:
    """The watchdog: once a second, a process lost ends this one with the message. A process that stopped on its
    own error is given `FAILED_GRACE_SECONDS` first: the same error (a recipe, a full shared disk) usually stops this
    process too, with its own message, and `_finish` then stands the watchdog down."""
    failed_since = None
    while not cluster.stopped.wait(POLL_SECONDS):
        lost, how = _missing(cluster)
        if how == FAILED_HOW and lost:
            failed_since = failed_since or time.monotonic()
            if time.monotonic() - failed_since < FAILED_GRACE_SECONDS:
                continue
        if lost and not cluster.stopped.is_set():
            _stop_lost(cluster, lost, how)


def _stop_lost(cluster: _Cluster, lost: list[int], how: str = "stopped answering") -> None:
    newest = None
    if cluster.newest_step is not None:
        try:
            newest = cluster.newest_step()
        except Exception:  # noqa: BLE001 - the message matters more than the checkpoint's step
            newest = None
    stop(lost_message(lost, cluster.count, cluster.step, newest, cluster.checkpoint_dir, how))


def watch_checkpoints(newest_step: Callable[[], int | None], checkpoint_dir: str | None) -> None:
    """Where the lost-process message finds the newest kept checkpoint (the engine's reader, called only then)."""
    if _CLUSTER is not None:
        _CLUSTER.newest_step, _CLUSTER.checkpoint_dir = newest_step, checkpoint_dir


def check_lost(error: BaseException) -> None:
    """Called with an error `fit` raised: if it is a collective's failure and a process is lost (the service
    marks it within `HEARTBEAT_SECONDS`), ends this process with the message; returns otherwise."""
    cluster = _CLUSTER
    if cluster is None or not isinstance(error, jax.errors.JaxRuntimeError):
        return
    deadline = time.monotonic() + HEARTBEAT_SECONDS + 3 * POLL_SECONDS
    while time.monotonic() < deadline:
        lost, how = _missing(cluster)
        if lost:
            _stop_lost(
                cluster, lost, how if how != "stopped answering" else "closed its connection"
            )
        time.sleep(POLL_SECONDS)


class Progress(keras.callbacks.Callback):
    """Keeps the training step the lost-process message names (one int, no device read)."""

    def __init__(self, start_step: int, steps_per_execution: int):
        super().__init__()
        self.step, self.per_call = start_step, max(1, int(steps_per_execution))

    def on_train_batch_end(self, batch, logs=None):
        self.step += self.per_call
        if _CLUSTER is not None:
            _CLUSTER.step = self.step


def _finish(cluster: _Cluster) -> None:
    """At exit: stop the watchdog; the other processes say they finished and disconnect; process 0 waits (up to
    `FINISHED_WAIT_SECONDS`) until they have, so its coordination service outlives their connections."""
    cluster.stopped.set()
    client = _client()
    if client is None:
        return
    try:
        key = _FINISHED_KEY if cluster.succeeded else _FAILED_KEY
        client.key_value_set(key.format(cluster.index), "1")
        if cluster.index != 0:
            jax.distributed.shutdown()
            return
        deadline = time.monotonic() + FINISHED_WAIT_SECONDS
        while time.monotonic() < deadline:
            if len(client.get_live_nodes(list(range(cluster.count)))) <= 1:
                return
            time.sleep(0.2)
    except Exception as error:  # noqa: BLE001 - exiting anyway; JAX's own shutdown follows
        logger.warning("tpukit: leaving the JAX cluster: %s", error)
