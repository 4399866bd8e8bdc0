"""tpukit.planner.check_output_dir: an output directory that cannot be used is a RecipeError in the plan (exit 2, no
traceback), before any model is built, and nothing is created on disk. Issue 19: before, each case was a raw OSError
traceback from `os.makedirs` after the model was built (and a path too long left the parents that fit behind).

Real files, links and (where this user is root) a real unprivileged user; the read-only file system is faked.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from helpers import REPO, train_in_process

from tpukit.planner import check_output_dir
from tpukit.planner import output_dir as output_dir_lib
from tpukit.recipe import RecipeError


def tree(root):
    """Every entry under `root` (links not followed), with what it is and holds."""
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(top, name)
            if os.path.islink(path):
                found[path] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[path] = ("dir",)
            else:
                with open(path, "rb") as f:
                    found[path] = ("file", f.read())
    return found


FAST = (
    "--set",
    "train.epochs=1",
    "--set",
    "data.global_batch_size=32",
    "--set",
    "runtime.verbose=0",
)


def refused(output_dir, mode="train_and_eval"):
    with pytest.raises(RecipeError) as error:
        check_output_dir(output_dir, mode)
    return str(error.value)


@pytest.fixture
def place(tmp_path):
    """A directory holding a file, a dangling link and a link to the file; the test checks nothing changed."""
    (tmp_path / "afile").write_text("kept")
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    os.symlink(tmp_path / "afile", tmp_path / "tofile")
    before = tree(tmp_path)
    yield tmp_path
    assert tree(tmp_path) == before  # nothing created, nothing changed


def test_an_existing_file_is_refused(place):
    path = str(place / "afile")
    assert refused(path) == (
        f"output_dir={path!r} (--output_dir) is a file, not a directory, so tpukit cannot write its checkpoints, "
        f"logs and the model there. Fix: pass the path of a directory, or of one to create (e.g. '{path}_run'), "
        "or move that file away."
    )
    assert "so tpukit cannot write its evaluation metrics there" in refused(path, "eval")


def test_a_dangling_symlink_is_refused_and_its_target_named(place):
    path, target = str(place / "dangling"), str(place / "nowhere")
    assert refused(path) == (
        f"output_dir={path!r} (--output_dir) is a symbolic link to {target!r}, which does not exist (or is a loop "
        "of links), so tpukit cannot write its checkpoints, logs and the model there. Fix: pass the path of a "
        f"directory, or of one to create (e.g. '{path}_run'), or create the directory it points to (`mkdir -p "
        f"{target}`) or point the link at a directory."
    )


def test_a_symlink_loop_is_refused(tmp_path):
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    assert "is a symbolic link to" in refused(str(tmp_path / "a")) and "loop of links" in refused(
        str(tmp_path / "a")
    )


def test_a_symlink_to_a_file_is_refused(place):
    path = str(place / "tofile")
    assert refused(path).startswith(
        f"output_dir={path!r} (--output_dir) is a symbolic link to '{place / 'afile'}', which is a file, not a "
        "directory, so tpukit cannot write"
    )
    assert refused(path).endswith("or point the link at a directory.")


def test_a_path_under_a_file_is_refused(place):
    path = str(place / "afile" / "run" / "deeper")
    assert refused(path) == (
        f"output_dir={path!r} (--output_dir) cannot be created: '{place / 'afile'}' in its path is a file, not a "
        "directory, so nothing can be created under it. Fix: pass a path whose parents are directories, or move "
        "that file away."
    )


def test_a_path_under_a_dangling_symlink_is_refused(place):
    path = str(place / "dangling" / "run")
    assert refused(path).startswith(
        f"output_dir={path!r} (--output_dir) cannot be created: '{place / 'dangling'}' in its path is a symbolic "
        f"link to '{place / 'nowhere'}', which does not exist"
    )


def test_a_name_longer_than_the_file_system_allows_is_refused(place):
    name_max = os.pathconf(place, "PC_NAME_MAX")
    path = str(place / "new" / ("x" * (name_max + 1)) / "run")
    message = refused(path)
    assert (
        message.startswith("output_dir='/")
        and f"({len(path)} characters) (--output_dir)" in message
    )
    assert (
        f"has a name ('xxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxx') of {name_max + 1} bytes, longer than the {name_max} "
        f"bytes the file system of {str(place)!r} allows for one name. Fix: use names of at most {name_max} bytes."
    ) in message
    check_output_dir(str(place / "new" / ("x" * name_max)), "train")  # the longest name is fine


def test_a_path_longer_than_the_system_allows_is_refused_and_no_parent_is_created(place):
    path_max = os.pathconf(place, "PC_PATH_MAX")
    parts = (path_max // 200) + 1
    path = os.path.join(str(place), *["d" * 199] * parts)
    message = refused(path)
    assert (
        f"is {len(path)} bytes long as an absolute path, and tpukit writes files up to {output_dir_lib.INSIDE} "
        f"bytes deeper inside it; this system allows paths of {path_max - 1} bytes (PATH_MAX). Fix: use a path "
        f"of at most {path_max - 1 - output_dir_lib.INSIDE} bytes."
    ) in message
    assert f"({len(path)} characters)" in message


def test_a_parent_without_write_permission_is_refused(tmp_path, monkeypatch):
    # access() grants root everything, so the message is checked with it answering no (the real case follows).
    monkeypatch.setattr(output_dir_lib.os, "access", lambda path, mode: False)
    path = str(tmp_path / "new" / "run")
    assert refused(path) == (
        f"output_dir={path!r} (--output_dir) cannot be created: this user (uid {os.geteuid()}) has no permission "
        f"to write in {str(tmp_path)!r}, the nearest directory of that path that exists. Fix: pass a directory "
        "you can write in (the checkpoints, logs and the model go there), or grant write access to "
        f"{str(tmp_path)!r} (chmod / chown)."
    )
    assert refused(str(tmp_path)).startswith(
        f"output_dir={str(tmp_path)!r} (--output_dir) is a directory this user (uid {os.geteuid()}) has no "
        "permission to write in. Fix:"
    )
    assert not os.path.exists(tmp_path / "new")


def test_a_read_only_file_system_is_refused_for_a_new_directory_only(tmp_path, monkeypatch):
    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(output_dir_lib.os, "access", lambda path, mode: False)
    monkeypatch.setattr(output_dir_lib.os, "statvfs", lambda path: ReadOnly())
    path = str(tmp_path / "run")
    assert refused(path) == (
        f"output_dir={path!r} (--output_dir) cannot be created: {str(tmp_path)!r}, the nearest directory of "
        "that path that exists, is on a read-only file system. Fix: pass a directory on a writable file system, "
        "or remount that one read-write."
    )
    # An existing run's directory on a disk that turned read-only is left to the run, which names the
    # checkpoints it kept (exit 1: tests/engines/tensorflow/test_output_dir_faults.py).
    check_output_dir(str(tmp_path), "train")


def _as_nobody(code):
    """Runs `code` as an unprivileged user: this one when it is not root, else uid/gid 65534 (setpriv)."""
    if os.geteuid() != 0:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO
        )
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv: no unprivileged user to test the permission with")
    return subprocess.run(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


def test_a_directory_this_user_cannot_write_in_is_refused_for_real():
    with tempfile.TemporaryDirectory() as base:  # under /tmp, which every user may search
        os.chmod(base, 0o755)
        locked = os.path.join(base, "locked")
        os.mkdir(locked)
        os.chmod(locked, 0o555)
        code = (
            "from tpukit.planner import check_output_dir\n"
            "from tpukit.recipe import RecipeError\n"
            "print('imported')\n"
            f"for path in ({os.path.join(locked, 'run')!r}, {locked!r}):\n"
            "    try:\n"
            "        check_output_dir(path, 'train')\n"
            "        print('accepted', path)\n"
            "    except RecipeError as error:\n"
            "        print(error)\n"
        )
        result = _as_nobody(code)
        if "imported" not in result.stdout:
            pytest.skip(
                f"the unprivileged user cannot import tpukit from {REPO}: {result.stderr[-300:]}"
            )
        assert result.returncode == 0, result.stderr
        created, existing = result.stdout.splitlines()[1:]
        assert (
            created.startswith(
                f"output_dir={os.path.join(locked, 'run')!r} (--output_dir) cannot be created: this user (uid "
            )
            and f"no permission to write in {locked!r}, the nearest directory" in created
        )
        assert existing.startswith(
            f"output_dir={locked!r} (--output_dir) is a directory this user (uid "
        )
        assert os.listdir(locked) == []


def test_usable_directories_pass_and_nothing_is_created(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    os.symlink(tmp_path / "run", tmp_path / "link")
    before = tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    for path in (
        str(tmp_path / "run"),  # an existing run's directory (resumed)
        str(tmp_path / "link"),  # a link to a directory
        str(tmp_path / "link" / "deeper" / "new"),  # created under a link to a directory
        "relative/new",
        "run",
        "gs://bucket/runs/x",  # not checked here: the engine's file system reaches it
        "s3://b/" + "x" * 1000,
    ):
        for mode in ("train_and_eval", "train", "eval"):
            check_output_dir(path, mode)
    assert tree(tmp_path) == before


def test_eval_into_a_directory_that_does_not_exist_is_left_to_the_checkpoint_check(tmp_path):
    # With --checkpoint, eval writes eval_metrics.json into a new directory; without, `check_checkpoint` says
    # "mode eval: no checkpoint in ..." (tests/test_train_cli.py).
    check_output_dir(str(tmp_path / "new"), "eval")
    assert not os.path.exists(tmp_path / "new")


def test_an_empty_output_dir_is_refused():
    assert refused("") == (
        "output_dir='' (--output_dir) is empty. Fix: pass the directory for the checkpoints, logs and the model."
    )


# The command line: each case of issue 19, run as described, in this process (the plan stops it before anything is
# built): exit 2, one message, no traceback, nothing created or changed.
@pytest.mark.parametrize(
    "name, expected",
    [
        ("afile", "is a file, not a directory"),
        ("dangling", "is a symbolic link to"),
        ("afile/run", "in its path is a file, not a directory"),
        ("x" * 300, "of 300 bytes, longer than the 255 bytes"),
        ("/".join(["d" * 200] * 21), "(PATH_MAX). Fix: use a path of at most"),
    ],
    ids=["existing_file", "dangling_symlink", "under_a_file", "name_too_long", "path_too_long"],
)
def test_the_cli_refuses_each_case_before_building_anything(place, name, expected):
    result = train_in_process(
        "recipes/digits_cnn.yaml", "--output_dir", str(place / name), "--set", "train.epochs=1"
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "tpukit: error: output_dir=" in result.stderr and expected in result.stderr
    assert "(--output_dir)" in result.stderr and "Fix: " in result.stderr
    assert (
        "Traceback" not in result.stderr
    )  # and `place` checks that nothing was created or changed


@pytest.mark.integration
def test_the_same_command_finishes_once_the_file_is_moved_away(tmp_path):
    (tmp_path / "run").write_text("notes")
    args = ("recipes/digits_cnn.yaml", "--output_dir", str(tmp_path / "run"), *FAST)
    assert train_in_process(*args).returncode == 2
    os.rename(tmp_path / "run", tmp_path / "notes.txt")
    result = train_in_process(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert os.path.isfile(tmp_path / "run" / "metrics.json")
    assert (tmp_path / "notes.txt").read_text() == "notes"
