"""tpukit.rundir: one run per directory (flock on local disks, a lease elsewhere), outputs written whole, damaged
outputs read back with a warning, and the run history. No TensorFlow: plain files and real processes."""

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tpukit import rundir
from tpukit.rundir import Holder, LocalFiles, RunLock, RunLockedError

HOLD = textwrap.dedent(
    """
    import sys, time
    from tpukit.rundir import RunLock
    lock = RunLock(sys.argv[1], lease=sys.argv[2] == "lease")
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def _holder_process(directory, mode="flock"):
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory), mode], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_lock_in_the_same_directory_is_refused_naming_the_holder(tmp_path):
    first = RunLock(str(tmp_path / "run"))
    first.acquire()
    assert os.path.isfile(tmp_path / "run" / rundir.LOCK_NAME)
    with pytest.raises(RunLockedError) as refused:
        RunLock(str(tmp_path / "run")).acquire()
    message = str(refused.value)
    assert f"pid {os.getpid()}" in message and socket.gethostname() in message
    assert "--output_dir" in message and f"kill {os.getpid()}" in message
    first.release()
    assert not os.path.exists(tmp_path / "run" / rundir.LOCK_NAME)  # released: nothing left behind
    with RunLock(str(tmp_path / "run")):  # and free again
        pass


def test_a_lock_held_by_another_process_is_refused_and_freed_when_it_is_killed(tmp_path):
    process = _holder_process(tmp_path)
    try:
        with pytest.raises(RunLockedError, match=f"pid {process.pid} on host"):
            RunLock(str(tmp_path)).acquire()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    # SIGKILL runs no cleanup and leaves the lock file, but the kernel dropped the flock: no stale lock.
    assert os.path.exists(tmp_path / rundir.LOCK_NAME)
    lock = RunLock(str(tmp_path))
    assert lock.acquire().pid == os.getpid()
    lock.release()


def test_the_lock_file_names_its_holder(tmp_path):
    with RunLock(str(tmp_path)) as lock:
        written = Holder.parse((tmp_path / rundir.LOCK_NAME).read_text())
        assert (written.pid, written.host) == (os.getpid(), socket.gethostname())
        assert written.started == lock.holder.started


def _write_lease(directory, **fields):
    holder = {**Holder.me().__dict__, **fields}
    (directory / rundir.LOCK_NAME).write_text(json.dumps(holder))


def test_a_fresh_lease_is_refused_with_the_way_past_it(tmp_path):
    _write_lease(tmp_path, host="another-host", pid=4242, heartbeat=time.time() - 10)
    with pytest.raises(RunLockedError) as refused:
        RunLock(str(tmp_path), lease=True).acquire()
    message = str(refused.value)
    assert "pid 4242 on host 'another-host'" in message
    assert "--break_lock" in message and "300 s" in message


def test_a_stale_lease_is_taken_over_with_a_warning(tmp_path, caplog):
    _write_lease(tmp_path, host="another-host", pid=4242, heartbeat=time.time() - 301)
    with caplog.at_level(logging.WARNING, "tpukit"), RunLock(str(tmp_path), lease=True):
        assert Holder.parse((tmp_path / rundir.LOCK_NAME).read_text()).pid == os.getpid()
    assert re.search(
        r"last showed signs of life 30\d s ago", caplog.text
    )  # 301, or more on a slow machine


def test_a_lease_of_a_dead_process_of_this_host_is_taken_over(tmp_path, caplog):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lease(tmp_path, pid=dead.pid, heartbeat=time.time())
    with caplog.at_level(logging.WARNING, "tpukit"), RunLock(str(tmp_path), lease=True):
        pass
    assert "no longer runs" in caplog.text


def test_break_lock_takes_over_a_fresh_lease(tmp_path, caplog):
    _write_lease(tmp_path, host="another-host", pid=4242, heartbeat=time.time())
    with (
        caplog.at_level(logging.WARNING, "tpukit"),
        RunLock(str(tmp_path), lease=True, break_lock=True),
    ):
        pass
    assert "--break_lock" in caplog.text
    assert not os.path.exists(tmp_path / rundir.LOCK_NAME)  # ours, released


def test_a_lease_is_refreshed_while_it_is_held(tmp_path):
    with RunLock(str(tmp_path), lease=True, heartbeat=0.05) as lock:
        first = Holder.parse((tmp_path / rundir.LOCK_NAME).read_text()).heartbeat
        time.sleep(0.5)
        later = Holder.parse((tmp_path / rundir.LOCK_NAME).read_text()).heartbeat
        assert later > first and lock.held


def test_a_lease_held_by_a_live_process_refuses_another(tmp_path):
    process = _holder_process(tmp_path, "lease")
    try:
        with pytest.raises(RunLockedError, match=f"pid {process.pid}"):
            RunLock(str(tmp_path), lease=True).acquire()
    finally:
        process.kill()
        process.wait()


def test_write_text_keeps_the_previous_file_when_the_write_fails(tmp_path):
    path = str(tmp_path / "metrics.json")
    rundir.write_text(LocalFiles(), path, '{"step": 1}')

    class FullDisk(LocalFiles):
        def write_text(self, path, text):
            with open(path, "w") as f:
                f.write(text[:3])  # part of it reached the disk
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        rundir.write_text(FullDisk(), path, '{"step": 2}')
    assert json.loads(open(path).read()) == {"step": 1}
    assert os.listdir(tmp_path) == ["metrics.json"]  # the partial temporary file is gone


def test_temporaries_left_by_a_killed_writer_are_cleared(tmp_path):
    (tmp_path / f"model{rundir.TEMPORARY_MARK}123-4.keras").write_text("half")
    (tmp_path / f"saved_model{rundir.TEMPORARY_MARK}123-4").mkdir()
    (tmp_path / "model.keras").write_text("whole")
    removed = rundir.clear_temporaries(LocalFiles(), str(tmp_path))
    assert len(removed) == 2 and os.listdir(tmp_path) == ["model.keras"]


@pytest.mark.parametrize("text", ["", '{"step": 4', "\x00\x00", "[1, 2]"])
def test_a_damaged_json_output_is_read_as_missing_with_a_warning(tmp_path, caplog, text):
    path = tmp_path / "metrics.json"
    path.write_text(text)
    with caplog.at_level(logging.WARNING, "tpukit"):
        assert rundir.read_json(LocalFiles(), str(path)) is None
    assert str(path) in caplog.text


def test_the_history_gets_one_line_per_run_and_survives_damage(tmp_path, caplog):
    files = LocalFiles()
    rundir.append_history(files, str(tmp_path), {"run": 1})
    rundir.append_history(files, str(tmp_path), {"run": 2})
    assert rundir.history(files, str(tmp_path)) == [{"run": 1}, {"run": 2}]
    (tmp_path / rundir.HISTORY_NAME).write_text('{"run": 1}\n{"ru')  # torn by hand
    with caplog.at_level(logging.WARNING, "tpukit"):
        rundir.append_history(files, str(tmp_path), {"run": 3})
    assert rundir.history(files, str(tmp_path)) == [{"run": 3}]
    assert (tmp_path / (rundir.HISTORY_NAME + ".damaged")).exists()
    assert "damaged" in caplog.text


MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
gcsfuse-bucket /gcs fuse.gcsfuse rw,nosuid,nodev 0 0
server:/export /mnt/nfs3 nfs rw,vers=3,nolock 0 0
server:/export /mnt/nfs4 nfs4 rw,vers=4.2 0 0
//host/share /mnt/smb cifs rw,nobrl 0 0
"""


@pytest.mark.parametrize(
    "directory, reason",
    [
        ("/gcs/runs/x", "/gcs is a fuse.gcsfuse mount"),
        ("/mnt/nfs3/runs/x", "/mnt/nfs3 is mounted with nolock"),
        ("/mnt/smb/x", "/mnt/smb is a cifs mount"),
        ("/mnt/nfs4/runs/x", None),  # NFSv4 carries flock to the server (as byte-range locks)
        ("/home/me/runs/x", None),
    ],
)
def test_mounts_whose_locks_other_hosts_cannot_see_get_a_lease(directory, reason):
    assert rundir.flock_is_local_only(directory, MOUNTS) == reason


def test_the_later_of_two_mounts_on_one_point_decides():
    mounts = (
        "systemd-1 /mnt/shared autofs rw 0 0\nsrv:/export /mnt/shared nfs rw,vers=3,nolock 0 0\n"
    )
    assert (
        rundir.flock_is_local_only("/mnt/shared/runs", mounts)
        == "/mnt/shared is mounted with nolock"
    )


def test_a_lease_of_another_container_with_the_same_host_and_pid_is_not_ours(tmp_path):
    me = Holder.me()
    twin = Holder(**{**me.__dict__, "token": "another-run"})
    assert me.same_run(me) and not me.same_run(twin)


def test_a_lost_lease_stops_training_without_writing(tmp_path):
    rundir._LOST.append((str(tmp_path), Holder(**{**Holder.me().__dict__, "pid": 4242})))
    try:
        with pytest.raises(rundir.LeaseLostError, match="taken over by another run .pid 4242"):
            rundir.check_leases()
    finally:
        rundir._LOST.clear()
    rundir.check_leases()  # nothing lost: no error


def test_a_lease_holder_that_lost_its_lease_stops(tmp_path, caplog):
    lock = RunLock(str(tmp_path), lease=True, heartbeat=0.05)
    stopped = []
    lock.on_lost = lambda: stopped.append(True)
    with caplog.at_level(logging.ERROR, "tpukit"):
        lock.acquire()
        _write_lease(
            tmp_path, host="another-host", pid=4242, heartbeat=time.time()
        )  # --break_lock elsewhere
        deadline = time.time() + 10
        while not stopped and time.time() < deadline:
            time.sleep(0.05)
        lock.release()
    assert stopped and lock.lost.pid == 4242
    assert "taken over by pid 4242 on host 'another-host'" in caplog.text
    # Released without removing the other run's lease.
    assert Holder.parse((tmp_path / rundir.LOCK_NAME).read_text()).pid == 4242


def test_a_temporary_of_a_live_writer_is_left_alone(tmp_path):
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = (
            tmp_path / f"eval_metrics{rundir.TEMPORARY_MARK}{process.pid}-1-{rundir._HOST_TAG}.json"
        )
        live.write_text("{}")  # an evaluation writing now (it takes no lock)
        elsewhere = tmp_path / f"metrics{rundir.TEMPORARY_MARK}999999-1-abcdef.json"
        elsewhere.write_text(
            "{}"
        )  # another host's writer (a shared directory): its pid means nothing here
        assert rundir.clear_temporaries(LocalFiles(), str(tmp_path)) == []
        assert live.exists() and elsewhere.exists()
    finally:
        process.kill()
        process.wait()
    assert rundir.clear_temporaries(LocalFiles(), str(tmp_path)) == [
        live.name
    ]  # its writer is gone


def test_unfinished_checkpoint_saves_are_cleared(tmp_path):
    (tmp_path / "ckpt-112_temp").mkdir()
    (tmp_path / "ckpt-112_temp" / "part-00000-of-00001.data-00000-of-00001").write_text("half")
    (tmp_path / "ckpt-100.index").write_text("whole")
    (tmp_path / "checkpoint").write_text("state")
    assert rundir.clear_unfinished_checkpoints(LocalFiles(), str(tmp_path)) == ["ckpt-112_temp"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-100.index"]
