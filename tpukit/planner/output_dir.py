"""`check_output_dir`: an output directory that cannot be used is a `RecipeError` in the plan, before any model is
built. Pure: `os` only, and nothing is created or written.

Without it, `os.makedirs` met these after the model was built, as raw OSError tracebacks: an existing file at the
path (FileExistsError), a symbolic link that leads nowhere (FileExistsError), a file among its parents
(NotADirectoryError), a name or a path longer than the file system allows (OSError: File name too long, after
creating the parents that fit), a parent this user cannot write in (PermissionError).
"""

from __future__ import annotations

import os
import stat

from tpukit.recipe import RecipeError

# tpukit writes files this many bytes deeper than the output directory at most: a non-chief worker's
# "/worker12", then "/logs/validation/events.out.tfevents.<time>.<host name, up to 64>.<pid>.<n>.v2" (~130) or
# "/checkpoints/ckpt-<step>_temp/part-00000-of-00001.data-00000-of-00001.tempstate<20 digits>" (~110).
INSIDE = 160
NAME_MAX, PATH_MAX = 255, 4096  # when the file system does not say (os.pathconf)


def check_output_dir(output_dir: str, mode: str = "train_and_eval") -> None:
    """Raises `RecipeError` (exit status 2 from the CLI; the message names `output_dir` / `--output_dir`, the
    value, the problem and the fix) when `output_dir` cannot be this run's output directory.

    Checked: the path is an existing file, a symbolic link that leads nowhere or to a file, or has a file (or such
    a link) among its parents; one of its names is longer than the file system allows (`NAME_MAX` of the nearest
    existing directory) or the path, with what tpukit writes inside it (`INSIDE`), longer than `PATH_MAX`; this
    user cannot create it (no write permission on, or a read-only file system at, the nearest existing directory)
    or, when it exists, cannot write in it for want of permission. A directory that exists on a file system that
    turned read-only is left to the run, which stops with `OutputDirError` naming the checkpoints it kept.

    gs:// and other `scheme://` paths are not checked here: this machine's `os` does not reach them (the engine's
    file system does, when the run writes).

    In mode "eval" a directory that does not exist yet is accepted here: with `--checkpoint` evaluating writes its
    `eval_metrics.json` into a new directory, and without it `check_checkpoint` refuses the run ("mode eval: no
    checkpoint in ...") before any model is built. Nothing is created or written.
    """
    if "://" in output_dir:
        return
    what = "evaluation metrics" if mode == "eval" else "checkpoints, logs and the model"
    if not output_dir.strip():
        raise _error(output_dir, "is empty", f"pass the directory for the {what}")
    path = os.path.abspath(output_dir)
    existing = _nearest_existing(path)
    if existing == path:
        _check_existing(output_dir, path, what)
        return
    _check_parent(output_dir, existing)
    _check_lengths(output_dir, path, existing)
    _check_writable(output_dir, existing, what, created=True)


def _error(output_dir: str, problem: str, fix: str) -> RecipeError:
    return RecipeError(f"output_dir={_shown(output_dir)} (--output_dir) {problem}. Fix: {fix}.")


def _shown(value: str, most: int = 120) -> str:
    """`repr(value)`, its middle cut out when it is longer than `most` characters."""
    if len(value) <= most:
        return repr(value)
    return f"{value[: most // 2]!r}...{value[-most // 3 :]!r} ({len(value)} characters)"


def _nearest_existing(path: str) -> str:
    """`path` if it exists (a dangling link counts), else its nearest ancestor that exists (`/` at worst). A
    parent that is a file, a name too long or a directory this user cannot search makes the deeper ones missing."""
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def _kind(path: str) -> str:
    mode = os.lstat(path).st_mode
    for test, name in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a directory"


def _not_a_directory(path: str) -> tuple[str, str]:
    """What the entry at `path`, which does not lead to a directory, is, and how to make it one."""
    if not os.path.islink(path):
        return f"{_kind(path)}, not a directory", "move that file away"
    target = os.readlink(path)
    if not os.path.exists(path):
        return (
            f"a symbolic link to {_shown(target)}, which does not exist (or is a loop of links)",
            "create the directory it points to (`mkdir -p "
            f"{os.path.join(os.path.dirname(path), target)}`) or point the link at a directory",
        )
    return (
        f"a symbolic link to {_shown(target)}, which is {_kind(os.path.realpath(path))}, not a directory",
        "point the link at a directory",
    )


def _check_existing(output_dir: str, path: str, what: str) -> None:
    if os.path.isdir(path):
        _check_writable(output_dir, path, what, created=False)
        return
    problem, fix = _not_a_directory(path)
    raise _error(
        output_dir,
        f"is {problem}, so tpukit cannot write its {what} there",
        f"pass the path of a directory, or of one to create (e.g. {_shown(output_dir.rstrip(os.sep) + '_run')}), "
        f"or {fix}",
    )


def _check_parent(output_dir: str, existing: str) -> None:
    """The nearest existing entry above a directory to create must be a directory (or a link to one)."""
    if os.path.isdir(existing):
        return
    problem, fix = _not_a_directory(existing)
    raise _error(
        output_dir,
        f"cannot be created: {_shown(existing)} in its path is {problem}, so nothing can be created under it",
        f"pass a path whose parents are directories, or {fix}",
    )


def _limit(path: str, name: str, default: int) -> int:
    try:
        value = os.pathconf(path, name)
    except (OSError, ValueError):
        return default
    return value if value and value > 0 else default


def _check_lengths(output_dir: str, path: str, existing: str) -> None:
    name_max = _limit(existing, "PC_NAME_MAX", NAME_MAX)
    for name in os.path.relpath(path, existing).split(os.sep):
        size = len(os.fsencode(name))
        if size > name_max:
            shown = name if len(name) <= 40 else f"{name[:20]}...{name[-12:]}"
            raise _error(
                output_dir,
                f"has a name ({shown!r}) of {size} bytes, longer than the {name_max} bytes the file system of "
                f"{_shown(existing)} allows for one name",
                f"use names of at most {name_max} bytes",
            )
    path_max = _limit(existing, "PC_PATH_MAX", PATH_MAX)
    size = len(os.fsencode(path))
    if size + INSIDE >= path_max:
        raise _error(
            output_dir,
            f"is {size} bytes long as an absolute path, and tpukit writes files up to {INSIDE} bytes deeper "
            f"inside it; this system allows paths of {path_max - 1} bytes (PATH_MAX)",
            f"use a path of at most {path_max - 1 - INSIDE} bytes",
        )


def _check_writable(output_dir: str, directory: str, what: str, created: bool) -> None:
    if os.access(directory, os.W_OK | os.X_OK):
        return
    read_only = _read_only(directory)
    if read_only and not created:
        return  # an existing run's directory on a disk that turned read-only: the run says what it kept
    where = (
        f"{_shown(directory)}, the nearest directory of that path that exists" if created else "it"
    )
    if read_only:
        raise _error(
            output_dir,
            f"cannot be created: {where}{',' if created else ''} is on a read-only file system",
            "pass a directory on a writable file system, or remount that one read-write",
        )
    problem = (
        f"cannot be created: this user (uid {os.geteuid()}) has no permission to write in {where}"
    )
    if not created:
        problem = f"is a directory this user (uid {os.geteuid()}) has no permission to write in"
    raise _error(
        output_dir,
        problem,
        f"pass a directory you can write in (the {what} go there), or grant write access to "
        f"{_shown(directory)} (chmod / chown)",
    )


def _read_only(directory: str) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False
