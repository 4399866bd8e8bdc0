"""A quiet start: TensorFlow's and XLA's C++ start-up lines are hidden, every other line still reaches stderr.

Importing TensorFlow (2.19-2.21) and listing its devices prints oneDNN, CPU-feature and CUDA lines on any machine,
twice (the profiler plugin links its own copy of absl's logging); on a CPU machine the `E0000 ... cuInit` line reads
like a fault. `TF_CPP_MIN_LOG_LEVEL` cannot hide them: native code writes them before absl's logging is initialised
(tensorflow/tensorflow#100442). So `start_up()` points file descriptor 2 at a temporary file while TensorFlow is
imported and its devices listed, then writes back every captured line except those `NOISE` lists (the CUDA ones
only where no NVIDIA driver is installed) and C++ lines below the `TF_CPP_MIN_LOG_LEVEL` in force (1 by default).
If the process dies inside the block, a watchdog process (in its own session, so Ctrl-C never reaches it) writes
everything captured to the real stderr, unfiltered. Nothing is hidden with `TPUKIT_VERBOSE=1` (`tpukit --verbose`)
or a user's `TF_CPP_MIN_LOG_LEVEL=0`, and a level the user set is never changed. The entry points call this; what
TensorFlow prints after the start (TPU initialisation, XLA compiling) is left alone."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, MutableMapping

VERBOSE_VARIABLE = "TPUKIT_VERBOSE"
LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
# TensorFlow's levels: 0 everything, 1 no INFO, 2 no WARNING, 3 no ERROR. 1 keeps warnings and errors.
DEFAULT_LEVEL = "1"
SEVERITIES = "IWEF"  # a C++ log line's first letter, in TF_CPP_MIN_LOG_LEVEL's order

# A C++ log line: absl's format (TF 2.17+: `I0000 00:00:1795545357.807811    7761 port.cc:153] text`) or
# TensorFlow's older one (`2025-09-17 14:44:05.157831: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] text`).
_LOG_LINE = re.compile(
    r"^(?:(?P<absl>[IWEF])\d{4} \d\d:\d\d:[\d.]+\s+\d+ |\d{4}-\d\d-\d\d [\d:.]+: (?P<tf>[IWEF]) )"
    r"(?:\S*/)?(?P<source>[\w.+-]+):\d+\] (?P<text>.*)$"
)


@dataclasses.dataclass(frozen=True)
class Noise:
    """One start-up line that says nothing is wrong: the C++ file that logs it (None: a line without the log
    prefix) and its text, from the start (`re.match`)."""

    source: str | None
    text: re.Pattern
    why: str
    cuda: bool = False  # noise only where no NVIDIA driver is installed
    libtpu: bool = False  # noise only where no TPU is attached

    def matches(self, source: str | None, text: str) -> bool:
        return source == self.source and bool(self.text.match(text))


NOISE = (
    Noise(
        None,
        re.compile(
            r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to"
        ),
        "absl's notice that the lines after it come before logging is set up",
    ),
    Noise(
        "port.cc",
        re.compile(r"oneDNN custom operations are on"),
        "TensorFlow's x86 CPU kernels use oneDNN (results may differ in the last bits)",
    ),
    Noise(
        "cpu_feature_guard.cc",
        re.compile(r"This TensorFlow binary is optimized to use available CPU instructions"),
        "the wheel is built for a baseline CPU",
    ),
    Noise(
        None,
        re.compile(
            r"To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler"
        ),
        "the second line of cpu_feature_guard.cc's",
    ),
    Noise(
        "cudart_stub.cc",
        re.compile(r"Could not find cuda drivers on your machine, GPU will not be used"),
        "a CUDA build of TensorFlow on a machine without an NVIDIA driver",
        cuda=True,
    ),
    Noise(
        "cuda_platform.cc",
        re.compile(r"failed call to cuInit"),
        "the same, when TensorFlow lists its devices",
        cuda=True,
    ),
    Noise(
        "cuda_driver.cc",
        re.compile(r"failed call to cuInit"),
        "the same, from TensorFlow releases before 2.20",
        cuda=True,
    ),
    Noise(
        "cuda_dnn.cc",
        re.compile(
            r"Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one"
        ),
        "TensorFlow's and XLA's copies of the CUDA plugins both register (tensorflow/tensorflow#62075)",
    ),
    Noise(
        "cuda_fft.cc",
        re.compile(
            r"Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one"
        ),
        "the same, for cuFFT",
    ),
    Noise(
        "cuda_blas.cc",
        re.compile(
            r"Unable to register cuBLAS factory: Attempting to register factory for plugin cuBLAS when one"
        ),
        "the same, for cuBLAS",
    ),
    Noise(
        None,
        re.compile(
            r"Failed to find host bounds for accelerator type: WARNING: could not determine TPU"
        ),
        "libtpu (jax[tpu]) starting on a machine with no TPU: no TPU_ACCELERATOR_TYPE to read",
        libtpu=True,
    ),
    Noise(
        None,
        re.compile(r"WARNING: Logging before InitGoogle\(\) is written to STDERR"),
        "libtpu's notice that its logging is not set up yet",
        libtpu=True,
    ),
    Noise(
        "common_lib.cc",
        re.compile(
            r"INVALID_ARGUMENT: Error: unexpected worker hostname 'WARNING: could not determine TPU"
        ),
        "the same: no TPU_WORKER_HOSTNAMES to read",
        libtpu=True,
    ),
    Noise(
        None,
        re.compile(r"=== Source Location Trace: ===\s*$"),
        "the trace libtpu appends to those two",
        libtpu=True,
    ),
    Noise(
        None,
        re.compile(r"learning/\S+/libtpu_init_utils\.cc:\d+\s*$"),
        "the trace's one line",
        libtpu=True,
    ),
    Noise(
        "computation_placer.cc",
        re.compile(r"computation placer already registered"),
        "the same duplicate registration, in TensorFlow 2.19's CUDA wheels (tensorflow/tensorflow#100442)",
    ),
)

# Files an installed NVIDIA driver provides (Linux).
NVIDIA_DRIVER_FILES = ("/proc/driver/nvidia/version", "/dev/nvidiactl")
# WSL2 has neither: its GPU is the paravirtual /dev/dxg (any vendor's: an Intel or AMD GPU has it too), and the
# Windows NVIDIA driver mounts its CUDA library here (docs.nvidia.com/cuda/wsl-user-guide). The library alone says
# an NVIDIA driver is installed; a cuInit error then explains an unused GPU (/dev/dxg missing included).
WSL_CUDA_LIBRARIES = "/usr/lib/wsl/lib/libcuda.so*"


def nvidia_driver_present(root: str = "/") -> bool:
    """True where an NVIDIA driver is installed (Linux, or WSL2's from Windows): there a CUDA start-up error is
    worth reading. `root`: where the file system is (tests)."""

    def under_root(path: str) -> str:
        return os.path.join(root, path.lstrip("/"))

    return any(os.path.exists(under_root(path)) for path in NVIDIA_DRIVER_FILES) or bool(
        glob.glob(under_root(WSL_CUDA_LIBRARIES))
    )


def verbose(environ: Mapping[str, str] | None = None) -> bool:
    """True when nothing may be hidden: `TPUKIT_VERBOSE` is 1/true/yes/on, or the user set
    `TF_CPP_MIN_LOG_LEVEL=0` (every C++ line)."""
    environ = os.environ if environ is None else environ
    asked = environ.get(VERBOSE_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")
    return asked or environ.get(LEVEL_VARIABLE, "").strip() == "0"


def configure(environ: MutableMapping[str, str] | None = None) -> None:
    """Before TensorFlow is imported: C++ INFO lines off (`TF_CPP_MIN_LOG_LEVEL=1`) unless the user set the variable
    or asked for everything (`TPUKIT_VERBOSE=1`). Warnings and errors stay on."""
    environ = os.environ if environ is None else environ
    if not verbose(environ):
        environ.setdefault(LEVEL_VARIABLE, DEFAULT_LEVEL)


def _level(environ: Mapping[str, str]) -> int:
    try:
        return int(environ.get(LEVEL_VARIABLE, "0"))
    except ValueError:  # TensorFlow reads a non-number as 0
        return 0


def why_hidden(
    line: str, level: int = 0, cuda_is_noise: bool = True, libtpu_is_noise: bool = True
) -> str | None:
    """Why the quiet start hides `line`, or None when it keeps it: a known start-up line (`NOISE`, its `why`; the
    CUDA ones only when `cuda_is_noise`, libtpu's only when `libtpu_is_noise`), or a C++ log line whose severity is
    below `level` (a `TF_CPP_MIN_LOG_LEVEL`)."""
    match = _LOG_LINE.match(line)
    source, text = (match["source"], match["text"]) if match else (None, line)
    if match and SEVERITIES.index(match["absl"] or match["tf"]) < level:
        return f"{LEVEL_VARIABLE}={level} hides its severity"
    for noise in NOISE:
        if (
            noise.matches(source, text)
            and (cuda_is_noise or not noise.cuda)
            and (libtpu_is_noise or not noise.libtpu)
        ):
            return noise.why
    return None


def hidden(
    line: str, level: int = 0, cuda_is_noise: bool = True, libtpu_is_noise: bool = True
) -> bool:
    """Whether the quiet start hides `line` (`why_hidden` says why)."""
    return why_hidden(line, level, cuda_is_noise, libtpu_is_noise) is not None


def kept_lines(
    text: str, level: int = 0, cuda_is_noise: bool = True, libtpu_is_noise: bool = True
) -> str:
    """The lines of captured `text` the quiet start writes back (each with its line ending), in order."""
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not hidden(line.rstrip("\r\n"), level, cuda_is_noise, libtpu_is_noise)
    )


_active = False


@contextlib.contextmanager
def start_up() -> Iterator[None]:
    """Captures file descriptor 2 inside the block and writes back to `sys.stderr` what `kept_lines` keeps (see the
    module docstring). Does nothing when `verbose()`, inside another `start_up()`, where fd 2 cannot be
    redirected or where no temporary file can be made. Call `configure()` first, before anything imports TensorFlow."""
    global _active
    if _active or verbose():
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all (a daemon): nothing to keep quiet
        yield
        return
    try:
        captured = tempfile.TemporaryFile()
    except OSError:  # no writable temporary directory: a loud start rather than none
        captured = None
    if captured is None:
        os.close(saved)
        yield
        return
    watchdog = None
    _active = True  # only once the file exists: from here on the finally below resets it
    try:
        if "tensorflow" not in sys.modules:  # an import that may abort lies ahead
            watchdog = _watchdog(captured.fileno(), saved)
        _flush()
        os.dup2(captured.fileno(), 2)
        yield
    finally:
        _active = False
        _flush()
        os.dup2(saved, 2)
        os.close(saved)
        _release(watchdog)
        captured.seek(0)
        text = captured.read().decode("utf-8", errors="replace")
        captured.close()
        kept = kept_lines(text, _level(os.environ), not nvidia_driver_present(), not tpu_attached())
        if kept and sys.stderr is not None:
            sys.stderr.write(kept)
            sys.stderr.flush()


def _flush() -> None:
    with contextlib.suppress(Exception):  # a closed or replaced stream: nothing buffered to lose
        sys.stderr.flush()


# Run as `python -I -S -c WATCHDOG <fd>`: waits on its stdin; b"done" (the block ended) ends it, an end of file
# without it (the process died inside the block) makes it copy the captured file to its stderr, the real one. It
# ignores SIGINT (started in its own session, a terminal's Ctrl-C does not reach it anyway) and prints nothing of
# its own: no traceback of a watchdog may reach the user, whatever stops it.
WATCHDOG = (
    "import os, signal, sys\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "try:\n"
    "    if os.read(0, 4) != b'done':\n"
    "        fd, offset = int(sys.argv[1]), 0\n"
    "        while chunk := os.pread(fd, 1 << 16, offset):\n"
    "            os.write(2, chunk)\n"
    "            offset += len(chunk)\n"
    "except BaseException:\n"
    "    os._exit(1)\n"
)


def _watchdog(captured: int, stderr: int) -> subprocess.Popen | None:
    """The process that shows what was captured if this one dies inside the block (the import of TensorFlow can
    abort: no Python code runs after that). None where it cannot start."""
    if not sys.executable or not hasattr(os, "pread"):
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", WATCHDOG, str(captured)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            pass_fds=(captured,),
            # Not in the terminal's foreground process group: Ctrl-C signals tpukit, not its watchdog.
            start_new_session=True,
        )
    except OSError:
        return None


def _release(watchdog: subprocess.Popen | None) -> None:
    if watchdog is None:
        return
    with contextlib.suppress(OSError):  # it has ended already
        watchdog.stdin.write(b"done")
    with contextlib.suppress(OSError):
        watchdog.stdin.close()
    watchdog.wait()


GOOGLE_PCI_VENDOR = "0x1ae0"


def google_pci_devices(root: str = "/sys/bus/pci/devices") -> list[str]:
    """PCI devices whose vendor is Google (TPU chips), e.g. ['0000:00:04.0']; [] when none or no sysfs."""
    found = []
    for path in sorted(glob.glob(os.path.join(root, "*", "vendor"))):
        try:
            with open(path, encoding="ascii") as f:
                if f.read().strip().lower() == GOOGLE_PCI_VENDOR:
                    found.append(os.path.basename(os.path.dirname(path)))
        except OSError:
            continue
    return found


def tpu_attached(root: str = "/") -> bool:
    """Whether this machine has TPU chips attached: /dev/accel<n> (v2-v4), or /dev/vfio/<n> (v5e and later) backed
    by a Google PCI device (any host that passes a PCI device through VFIO has /dev/vfio/<n>), the rule of
    `tpukit.engines.tensorflow.strategy.tpu_device_files`."""
    if glob.glob(os.path.join(root, "dev", "accel[0-9]*")):
        return True
    vfio = glob.glob(os.path.join(root, "dev", "vfio", "[0-9]*"))
    return bool(vfio) and bool(
        google_pci_devices(os.path.join(root, "sys", "bus", "pci", "devices"))
    )


# Where no TPU is attached, libtpu may be loaded by several processes at once (a check beside a run, tests in
# parallel): without this the second fails on /tmp/libtpu_lockfile ("ABORTED: Internal error when accessing libtpu
# multi-process lockfile") and JAX falls back to the CPU. The compiled programs are the same with it (every row of
# `tpukit.planner.topologies`, libtpu 0.0.42.1).
LIBTPU_SHARED = ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def share_libtpu(environ: MutableMapping[str, str] | None = None, root: str = "/") -> bool:
    """Before JAX starts libtpu, on a machine with no TPU: lets other processes load it too (`LIBTPU_SHARED`; a
    value the user set is kept). Nothing is set where TPU chips are attached: there one process owns them. Returns
    whether it was set."""
    environ = os.environ if environ is None else environ
    if tpu_attached(root):
        return False
    environ.setdefault(*LIBTPU_SHARED)
    return True


def libtpu_installed() -> bool:
    """Whether JAX will load libtpu when it starts its backends (`jax[tpu]` installed, or TPU_LIBRARY_PATH)."""
    import importlib.util

    return (
        bool(os.environ.get("TPU_LIBRARY_PATH")) or importlib.util.find_spec("libtpu") is not None
    )
