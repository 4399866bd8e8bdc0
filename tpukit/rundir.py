"""The run directory's own files, engine-neutral: one run at a time (`RunLock`), outputs written whole
(`write_text`: a temporary name, then a rename), outputs read back without dying on damage (`read_json`,
`read_yaml`), and the run's history (`runs.jsonl`, one line per run started in the directory).

    files = files_for(output_dir)           # os for local paths; the engine's file system for gs:// and the like
    with RunLock(output_dir, files) as lock:
        write_text(files, os.path.join(output_dir, "metrics.json"), text)

The lock, by file system:

* **Local disks** (and NFSv4): an exclusive `flock` on `output_dir/tpukit.lock` for the whole run. The kernel drops
  it when the process ends in any way, so a crash never leaves a stale lock; the file names the holder (host, pid,
  start time, command), which a refused run prints.
* **Object stores (`gs://`) and file systems without `flock`**: the file is a *lease* whose heartbeat a daemon
  thread refreshes every `HEARTBEAT_SECONDS`; a run refuses a lease younger than `STALE_AFTER_SECONDS` unless its
  holder is a dead process of this host. Two runs started within seconds can both miss each other's lease (no
  atomic create-if-absent); `break_lock=True` (`--break_lock`) takes over a lease whose holder is gone, as
  `terraform force-unlock` does for state locks on backends without locking.

Evaluating a checkpoint (`mode="eval"`) takes no lock: it only reads checkpoints and writes `eval_metrics.json`."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time
from typing import Any

logger = logging.getLogger("tpukit")

LOCK_NAME = "tpukit.lock"
HISTORY_NAME = "runs.jsonl"
HEARTBEAT_SECONDS = 60.0
STALE_AFTER_SECONDS = 300.0
# Temporary names carry this marker, so a run that holds the lock can clear what a killed writer left behind.
TEMPORARY_MARK = ".tpukit-tmp-"
WEIGHTS_SUFFIX = ".weights.h5"  # the extension Keras' `save_weights` requires
# Orbax writes a checkpoint step into `<name>.orbax-checkpoint-tmp[-<time>]/`, then renames it (a local disk).
ORBAX_TEMPORARY_MARK = ".orbax-checkpoint-tmp"
# A non-chief task's directory inside the run's (`tpukit.planner.worker_output_dir`).
WORKER_DIR = re.compile(r"worker\d+")


class RunLockedError(RuntimeError):
    """Another run holds the output directory. The message names it (host, pid, start time) and the way forward."""


class LeaseLostError(RunLockedError):
    """Another run took over this run's lease (its heartbeat was missing too long, or `--break_lock`): this run
    stopped without writing anything more into the directory, which is the other run's now."""


# Leases this process held and lost: the trainer checks after every execution (`check_leases`) and stops.
_LOST: list[tuple[str, Holder]] = []


def check_leases() -> None:
    """Raises LeaseLostError when a lease of this process was taken over; cheap enough to call every step."""
    if _LOST:
        directory, holder = _LOST[0]
        raise LeaseLostError(
            f"{directory} was taken over by another run ({holder.describe()}) while this one trained: its "
            "lease was not refreshed for too long, or that run was started with --break_lock. This run stopped "
            "without writing anything more there (the steps since its last checkpoint are lost), and that "
            "directory belongs to the other run now. Fix: let that run finish, or stop it and rerun this command "
            "to resume from the newest checkpoint."
        )


def is_remote(path: str) -> bool:
    """A `scheme://` path (gs://, s3://, hdfs://): the engine's file system reaches it, `os` does not."""
    return "://" in path


class LocalFiles:
    """The file operations the run directory needs, on this machine's file systems."""

    remote = False

    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def read_text(self, path: str) -> str:
        with open(path, encoding="utf-8") as f:
            return f.read()

    def write_text(self, path: str, text: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())  # the rename below must not land before the data does

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)  # atomic on POSIX: readers see the old file or the new one

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)

    def rmtree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []


def temporary_name(path: str) -> str:
    """A sibling of `path` for writing it whole before the rename: same directory (a rename across file systems is a
    copy), unique per process and thread, and marked so `clear_temporaries` can remove what a killed writer left."""
    head, tail = os.path.split(path)
    stem, extension = os.path.splitext(tail)
    if tail.endswith(WEIGHTS_SUFFIX):
        stem, extension = tail[: -len(WEIGHTS_SUFFIX)], WEIGHTS_SUFFIX
    # The extension is kept last: Keras' `model.save` insists on a path ending in `.keras` (`save_weights` on one
    # ending in `.weights.h5`).
    return os.path.join(
        head,
        f"{stem}{TEMPORARY_MARK}{os.getpid()}-{threading.get_ident()}-{_HOST_TAG}{extension}",
    )


# Which host wrote a temporary (its pid means something only there): a short hash of the host name.
_HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def write_text(files, path: str, text: str) -> None:
    """Writes `path` whole: to a temporary name, then renamed over it. A SIGKILL or a full disk at any moment leaves
    the previous file (or none), never an empty or truncated one. On an object store every object is written whole
    anyway, so the rename (a copy there) adds nothing but safety on file systems mounted through it."""
    temporary = temporary_name(path)
    try:
        files.write_text(temporary, text)
        files.rename(temporary, path)
    except BaseException:
        with contextlib.suppress(Exception):
            files.remove(temporary)
        raise


def clear_temporaries(files, directory: str) -> list[str]:
    """Removes files that writers killed mid-write left in `directory` (see `temporary_name`); call it only while
    holding the directory's lock. Returns the names removed."""
    return _clear(
        files,
        directory,
        lambda name: TEMPORARY_MARK in name and not _writer_alive(name),
        "unfinished write(s) left by a stopped run",
    )


def clear_unfinished_checkpoints(files, checkpoint_dir: str) -> list[str]:
    """Removes what a killed save (SIGKILL, a second Ctrl-C, a lost host) left in `checkpoint_dir`: TensorFlow's
    `ckpt-N_temp` directories, Orbax's `ckpt_N.orbax-checkpoint-tmp-*` directories and tpukit's own temporaries
    (`ckpt-N.tpukit-tmp-*.npz`), each a whole checkpoint's size. Only a run's saves write there, so at its start,
    holding the run directory's lock, all are leftovers but a temporary of a live process of this host."""
    return _clear(files, checkpoint_dir, _unfinished_save, "unfinished checkpoint save(s)")


def clear_unfinished_saves(files, task_dir: str, checkpoint_dir: str, *, chief: bool) -> list[str]:
    """At a run's start, before anything saves: `clear_unfinished_checkpoints` over the checkpoint directories this
    process answers for. The chief clears its `checkpoints/` and every worker's (`workerN/checkpoints/`); another
    process only a checkpoint directory of its own (the tensorflow engine's workers), never one it shares with the
    chief (the jax engine's), where the chief clears. Returns the names removed."""
    own = os.path.join(task_dir, "checkpoints")
    mine = os.path.normpath(checkpoint_dir) == os.path.normpath(own)
    directories = [checkpoint_dir] if chief or mine else []
    if chief:
        workers = [name for name in files.listdir(task_dir) if WORKER_DIR.fullmatch(name)]
        directories += [os.path.join(task_dir, name, "checkpoints") for name in sorted(workers)]
    removed = []
    for directory in directories:
        removed += clear_unfinished_checkpoints(files, directory)
    return removed


def _unfinished_save(name: str) -> bool:
    if name.startswith("ckpt-") and "_temp" in name:
        return True
    if ORBAX_TEMPORARY_MARK in name:
        return True
    # Another host's temporary counts too: no save runs while this process starts under the lock.
    return TEMPORARY_MARK in name and not _writer_alive(name, other_hosts_alive=False)


def _clear(files, directory: str, leftover, what: str) -> list[str]:
    removed = []
    for name in files.listdir(directory):
        if leftover(name):
            path = os.path.join(directory, name)
            with contextlib.suppress(Exception):
                files.rmtree(path) if files.isdir(path) else files.remove(path)
                removed.append(name)
    if removed:
        logger.info(
            "tpukit: removed %d %s in %s: %s",
            len(removed),
            what,
            directory,
            ", ".join(sorted(removed)),
        )
    return removed


def _writer_alive(name: str, other_hosts_alive: bool = True) -> bool:
    """Whether the process that named this temporary (`temporary_name`: its pid and host follow the mark) may
    still be writing it: an evaluation (which takes no lock) may be, right now."""
    try:
        pid, _, rest = name.split(TEMPORARY_MARK, 1)[1].partition("-")
        pid, host = int(pid), rest.split("-")[1][:6]
    except (IndexError, ValueError):
        return False
    if host != _HOST_TAG:
        return other_hosts_alive  # another host's writer (a shared directory): its pid cannot be checked here
    return pid != os.getpid() and _pid_alive(pid)


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_json(files, path: str) -> Any | None:
    """`path` parsed as JSON; None, with a warning naming the file, when it is missing, empty or damaged."""
    return _read(files, path, json.loads, "JSON")


def read_yaml(files, path: str) -> Any | None:
    """`path` parsed as YAML (safe loader); None, with a warning naming the file, when it is missing or damaged."""
    import yaml

    return _read(files, path, yaml.safe_load, "YAML")


def _read(files, path: str, parse, kind: str) -> Any | None:
    if not files.exists(path):
        return None
    try:
        text = files.read_text(path)
        value = parse(text)
    except Exception as error:  # noqa: BLE001 - damage of any kind: unreadable, not UTF-8, not JSON/YAML
        logger.warning(
            "tpukit: %s is damaged and was ignored (%s: %s); it is rewritten when this run writes it",
            path,
            type(error).__name__,
            " ".join(str(error).split())[:200],
        )
        return None
    if value is None or (kind == "JSON" and not isinstance(value, dict)):
        logger.warning("tpukit: %s is empty or not a %s mapping and was ignored", path, kind)
        return None
    return value


# ---------------------------------------------------------------------------------------------------------------
# The lock.


@dataclasses.dataclass
class Holder:
    """Who holds a directory's lock (written into the lock file and into `runs.jsonl`)."""

    host: str
    pid: int
    started: str  # ISO 8601, UTC
    command: str
    heartbeat: float = 0.0  # time.time() of the last refresh (leases only)
    # Random per run: two containers sharing a host name and pid (hostNetwork, pid 1) are still told apart.
    token: str = ""

    @classmethod
    def me(cls) -> Holder:
        return cls(
            host=socket.gethostname(),
            pid=os.getpid(),
            started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            command=" ".join(sys.argv)[:300] or sys.executable,
            heartbeat=time.time(),
            token=secrets.token_hex(8),
        )

    def same_run(self, other: Holder | None) -> bool:
        return other is not None and (other.host, other.pid, other.token) == (
            self.host,
            self.pid,
            self.token,
        )

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            values = json.loads(text)
            return cls(
                **{f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
            )
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host!r}, started {self.started} ({self.command!r})"

    def on_this_host_and_gone(self) -> bool:
        return self.host == socket.gethostname() and not _pid_alive(self.pid)


_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
# File systems where a successful flock may be local to this host (FUSE mounts such as gcsfuse, SMB, 9p), and NFS
# mount options that make it so: the kernel grants the lock here and another host never sees it.
_LOCAL_ONLY_FLOCK_TYPES = ("fuse", "cifs", "smb", "9p", "vboxsf", "virtiofs")
_LOCAL_ONLY_FLOCK_OPTIONS = ("nolock", "local_lock=all", "local_lock=flock", "nobrl", "localflock")


def flock_is_local_only(directory: str, mounts: str | None = None) -> str | None:
    """Why a flock in `directory` would not be seen by other hosts (its mount's type or options), else None.

    Reads /proc/mounts (`mounts`: its text, for tests): the mount with the longest prefix of the directory's real
    path decides."""
    if mounts is None:
        try:
            with open("/proc/mounts", encoding="utf-8") as f:
                mounts = f.read()
        except OSError:
            return None
    path = os.path.realpath(directory)
    best = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point = fields[1].replace("\\040", " ")  # /proc/mounts escapes a space as \040
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        # >=: of two mounts on one point (autofs, then the NFS it mounts) the later line is the one in effect
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2], fields[3].split(","))
    if best is None:
        return None
    point, kind, options = best
    if kind.startswith(_LOCAL_ONLY_FLOCK_TYPES):
        return f"{point} is a {kind} mount"
    local = [o for o in options if o in _LOCAL_ONLY_FLOCK_OPTIONS]
    if local:
        return f"{point} is mounted with {','.join(local)}"
    return None


class RunLock:
    """One run at a time in `directory` (see the module docstring for how, on each kind of storage).

    `acquire` creates the directory if needed (the lock lives in it) and raises `RunLockedError` naming the holder.
    `release` removes the lock file. Usable as a context manager.
    """

    def __init__(
        self,
        directory: str,
        files=None,
        *,
        break_lock: bool = False,
        stale_after: float = STALE_AFTER_SECONDS,
        heartbeat: float = HEARTBEAT_SECONDS,
        lease: bool | None = None,
    ):
        self.directory = directory
        self.path = os.path.join(directory, LOCK_NAME)
        self.files = files or LocalFiles()
        self.break_lock = break_lock
        self.stale_after = stale_after
        self.heartbeat = heartbeat
        # A lease where flock cannot work or would not be seen by other hosts; `lease=True` forces one (tests).
        self.lease = lease
        if lease is None:
            local_only = None if self.files.remote else flock_is_local_only(directory)
            if local_only:
                logger.info(
                    "tpukit: %s: file locks there are not seen by other hosts; guarding %s with a lease",
                    local_only,
                    directory,
                )
            self.lease = self.files.remote or bool(local_only)
        self.holder: Holder | None = None
        self.lost: Holder | None = None  # the run that took a lease over from this one
        # Called (from the heartbeat thread) when the lease is lost: stops the run as SIGTERM does (saving its step).
        self.on_lost = lambda: _LOST.append((self.directory, self.lost))
        self._fd: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self.holder is not None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> Holder:
        if self.held:
            return self.holder
        self.files.makedirs(self.directory)
        me = Holder.me()
        if not self.lease:
            try:
                self._flock(me)
            except OSError as error:
                if error.errno not in _NO_FLOCK:
                    raise
                logger.warning(
                    "tpukit: %s does not support file locks (%s): guarding it with a lease file instead "
                    "(two runs started within seconds of each other may both start)",
                    self.directory,
                    os.strerror(error.errno),
                )
                self.lease = True
        if self.lease:
            self._take_lease(me)
        self.holder = me
        return me

    def _flock(self, me: Holder) -> None:
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
                os.close(fd)
                raise RunLockedError(self._refusal(Holder.parse(text), lease=False)) from None
            except OSError:
                os.close(fd)
                raise
            # The previous holder unlinks the file as it releases: a lock on the unlinked file guards nothing.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(dataclasses.asdict(me)).encode(), 0)
        self._fd = fd

    def _take_lease(self, me: Holder) -> None:
        current = None
        if self.files.exists(self.path):
            try:
                current = Holder.parse(self.files.read_text(self.path))
            except Exception:  # noqa: BLE001 - an unreadable lease is no lease
                current = None
        if current is not None and not self.break_lock:
            age = time.time() - float(current.heartbeat or 0)
            if current.on_this_host_and_gone():
                logger.warning(
                    "tpukit: taking over the lock of %s: its holder (%s) no longer runs",
                    self.directory,
                    current.describe(),
                )
            elif age < self.stale_after:
                raise RunLockedError(self._refusal(current, lease=True, age=age))
            else:
                logger.warning(
                    "tpukit: taking over the lock of %s: its holder (%s) last showed signs of life %.0f s ago "
                    "(stale after %.0f s)",
                    self.directory,
                    current.describe(),
                    age,
                    self.stale_after,
                )
        elif current is not None:
            logger.warning(
                "tpukit: --break_lock: taking over the lock of %s from %s",
                self.directory,
                current.describe(),
            )
        write_text(self.files, self.path, json.dumps(dataclasses.asdict(me)))
        self._thread = threading.Thread(
            target=self._beat, args=(me,), name="tpukit-lease", daemon=True
        )
        self._thread.start()

    def _beat(self, me: Holder) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                current = Holder.parse(self.files.read_text(self.path))
                if current is not None and not me.same_run(current):
                    self.lost = current
                    logger.error(
                        "tpukit: the lease of %s was taken over by %s (this run's heartbeat was missing for too "
                        "long, or --break_lock): stopping this run without writing more there",
                        self.directory,
                        current.describe(),
                    )
                    if self.on_lost is not None:
                        self.on_lost()
                    return
                if self._stop.is_set():
                    return  # released meanwhile: a write now would put back a lease nobody holds
                me.heartbeat = time.time()
                write_text(self.files, self.path, json.dumps(dataclasses.asdict(me)))
            except Exception as error:  # noqa: BLE001 - retried at the next beat; staleness takes 5 of them
                logger.warning(
                    "tpukit: could not refresh the lease of %s (%s: %s); retrying in %.0f s",
                    self.directory,
                    type(error).__name__,
                    str(error)[:200],
                    self.heartbeat,
                )

    def _refusal(self, holder: Holder | None, *, lease: bool, age: float = 0.0) -> str:
        who = holder.describe() if holder else "another process (it has not written its name yet)"
        message = f"{self.directory} is in use by another tpukit run: {who}. Two runs in one output directory "
        message += (
            "would train into the same checkpoints. Fix: wait for that run to finish (or stop it: "
        )
        message += (
            f"`kill {holder.pid}` on {holder.host!r}), "
            if holder
            else "wait for that run to finish, "
        )
        message += "or pass another --output_dir."
        if lease:
            message += (
                f" This directory is guarded by a lease (no file locks there), refreshed {age:.0f} s ago; it is "
                f"taken over once {self.stale_after:.0f} s pass without a refresh. If that run is gone for sure "
                "(its host was lost), pass --break_lock (tpukit.run/tpukit.fit: break_lock=True)."
            )
        return message

    def release(self) -> None:
        if not self.held:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)  # a beat in flight on a slow store finishes first
        try:
            if self._fd is not None:
                # Unlinked while still locked: a run waiting on this file sees the inode change and retries.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
                os.close(self._fd)
            else:
                current = None
                with contextlib.suppress(Exception):
                    current = Holder.parse(self.files.read_text(self.path))
                if self.holder.same_run(current):
                    self.files.remove(self.path)
        finally:
            self._fd = None
            self.holder = None


def append_history(files, directory: str, record: dict) -> None:
    """Adds one line to `directory/runs.jsonl` (rewritten whole, so it is never torn). A damaged history is kept
    under another name, with a warning, and a new one started."""
    path = os.path.join(directory, HISTORY_NAME)
    lines: list[str] = []
    if files.exists(path):
        try:
            text = files.read_text(path)
            lines = [line for line in text.splitlines() if line.strip()]
            for line in lines:
                json.loads(line)
        except Exception as error:  # noqa: BLE001 - damaged: keep it aside, start again
            aside = path + ".damaged"
            logger.warning(
                "tpukit: %s is damaged (%s); kept as %s and started anew",
                path,
                type(error).__name__,
                aside,
            )
            with contextlib.suppress(Exception):
                files.rename(path, aside)
            lines = []
    lines.append(json.dumps(record, default=str))
    write_text(files, path, "\n".join(lines) + "\n")


def history(files, directory: str) -> list[dict]:
    """The records of `runs.jsonl` (the readable ones; a damaged line is skipped with a warning)."""
    path = os.path.join(directory, HISTORY_NAME)
    if not files.exists(path):
        return []
    records = []
    for number, line in enumerate(files.read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            logger.warning("tpukit: %s line %d is damaged and was skipped", path, number)
    return records
