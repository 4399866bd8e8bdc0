"""The quiet start (tpukit/environment/quiet.py): TensorFlow's C++ start-up lines are hidden, every other line of
stderr is written back in order, a user's TF_CPP_MIN_LOG_LEVEL is respected, and a process that dies inside the
quiet start still shows what it wrote. The filter is tested on the lines TensorFlow 2.21 printed on this CPU; the
file-descriptor capture on real writes to fd 2 (in this process, and in a child that aborts). The entry points'
own output is tests/test_cli.py's."""

import os
import subprocess
import sys

import pytest

from tpukit.environment import quiet

# What `python -m tpukit.train digits_cnn` printed before its first line on this CPU (TensorFlow 2.21.0), both
# copies: the second comes from tensorflow/python/profiler/internal/_pywrap_profiler_plugin.so.
TF_221_START = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795545357.807811    7761 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795545357.808155    7761 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
I0000 00:00:1795545357.895756    7761 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
E0000 00:00:1795545358.913279    7761 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795545359.983171    7761 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795545359.983904    7761 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
"""
# TensorFlow 2.19's CUDA wheel (tensorflow/tensorflow#100442), in both of its log formats.
TF_219_CUDA_START = """\
2025-09-17 14:44:05.157831: I external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] Could not find cuda drivers on your machine, GPU will not be used.
2025-09-17 14:44:05.176998: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:467] Unable to register cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered
E0000 00:00:1758131045.203198 3722035 cuda_dnn.cc:8579] Unable to register cuDNN factory: Attempting to register factory for plugin cuDNN when one has already been registered
E0000 00:00:1758131045.209828 3722035 cuda_blas.cc:1407] Unable to register cuBLAS factory: Attempting to register factory for plugin cuBLAS when one has already been registered
W0000 00:00:1758131437.322781 3722519 computation_placer.cc:177] computation placer already registered. Please check linkage and avoid linking the same target more than once.
"""
# TensorFlow 2.15-2.19's cuInit line, from cuda_driver.cc (2.20 moved it to cuda_platform.cc).
TF_216_CUINIT = (
    "2024-03-09 19:14:27.385862: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:282] failed call to "
    "cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected\n"
)
# libtpu 0.0.42.1 (jax[tpu]) starting JAX's TPU backend on a machine with no TPU (this project's 2-core VM).
LIBTPU_START = (
    "Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type, please set "
    "env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so may not properly initialize.\n"
    "WARNING: Logging before InitGoogle() is written to STDERR\n"
    "E0000 00:00:1795820456.281280    7056 common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected worker hostname "
    "'WARNING: could not determine TPU worker hostnames or IP addresses' from env var TPU_WORKER_HOSTNAMES.\n"
    "=== Source Location Trace: === \n"
    "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327\n"
)
# Lines that are not start-up noise: each must reach the user.
REAL = [
    "W0000 00:00:1795545358.1    7761 gpu_device.cc:2342] Cannot dlopen some GPU libraries.",
    "E0000 00:00:1795545358.2    7761 tpu_initializer.cc:41] could not open /dev/accel0: Device or resource busy",
    "F0000 00:00:1795545358.3    7761 cpu_feature_guard.cc:91] The TensorFlow library was compiled to use AVX",
    "/venv/lib/python3.11/site-packages/google/protobuf/runtime_version.py:98: UserWarning: Protobuf gencode version",
    "Traceback (most recent call last):",
]


def test_tensorflows_start_up_lines_are_hidden_and_every_other_line_is_kept_in_order():
    captured = TF_221_START + REAL[0] + "\n" + TF_219_CUDA_START + "\n".join(REAL[1:]) + "\n"
    assert quiet.kept_lines(captured, level=1) == "\n".join(REAL) + "\n"
    # Nothing of the start-up alone is kept, whatever the level.
    for level in (0, 1, 2):
        assert quiet.kept_lines(TF_221_START + TF_219_CUDA_START, level=level) == ""


def test_an_nvidia_driver_is_found_on_linux_and_on_wsl2(tmp_path):
    def machine(name, *files):
        root = tmp_path / name
        for path in files:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text("")
        return str(root)

    assert not quiet.nvidia_driver_present(machine("bare"))
    assert quiet.nvidia_driver_present(machine("linux", "proc/driver/nvidia/version"))
    assert quiet.nvidia_driver_present(machine("linux_dev", "dev/nvidiactl"))
    # WSL2: no /proc/driver/nvidia; the Windows driver's libcuda is mounted under /usr/lib/wsl/lib.
    wsl_nvidia = machine("wsl_nvidia", "dev/dxg", "usr/lib/wsl/lib/libcuda.so.1")
    assert quiet.nvidia_driver_present(wsl_nvidia)
    assert quiet.nvidia_driver_present(machine("wsl_no_dxg", "usr/lib/wsl/lib/libcuda.so"))
    # /dev/dxg alone is any vendor's GPU (Intel, AMD): no CUDA to explain.
    assert not quiet.nvidia_driver_present(
        machine("wsl_intel", "dev/dxg", "usr/lib/wsl/lib/libd3d12.so")
    )
    # So a WSL2 user whose CUDA is broken reads why: the cuInit error is kept.
    kept = quiet.kept_lines(
        TF_221_START, 1, cuda_is_noise=not quiet.nvidia_driver_present(wsl_nvidia)
    )
    assert [line.split("] ")[1][:22] for line in kept.splitlines()] == ["failed call to cuInit:"]


def test_cuda_lines_are_kept_where_an_nvidia_driver_is_installed():
    kept = quiet.kept_lines(TF_221_START, level=0, cuda_is_noise=False).splitlines()
    assert [line.split("] ")[1][:26] for line in kept] == [
        "Could not find cuda driver",
        "failed call to cuInit: INT",
        "Could not find cuda driver",
    ]


def test_the_users_level_hides_the_lines_below_it_and_no_other():
    info = "I0000 00:00:1.0    7 some_other_file.cc:1] an INFO line nobody listed"
    warning, error = REAL[0], REAL[1]
    lines = f"{info}\n{warning}\n{error}\n"
    assert quiet.kept_lines(lines, level=0) == lines
    assert quiet.kept_lines(lines, level=1) == f"{warning}\n{error}\n"
    assert quiet.kept_lines(lines, level=2) == f"{error}\n"
    assert quiet.kept_lines(lines, level=3) == ""


def test_verbose_and_the_default_level_leave_the_users_choice_alone():
    assert quiet.verbose({"TPUKIT_VERBOSE": "1"}) and quiet.verbose({"TPUKIT_VERBOSE": "yes"})
    assert quiet.verbose({"TF_CPP_MIN_LOG_LEVEL": "0"})  # the user asked for every C++ line
    assert not quiet.verbose({}) and not quiet.verbose({"TPUKIT_VERBOSE": "0"})
    environ = {}
    quiet.configure(environ)
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": "1"}
    for users in (
        {"TF_CPP_MIN_LOG_LEVEL": "3"},
        {"TF_CPP_MIN_LOG_LEVEL": "0"},
        {"TPUKIT_VERBOSE": "1"},
    ):
        environ = dict(users)
        quiet.configure(environ)
        assert environ == users


def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    """`code` in a fresh Python (no TensorFlow), with the user's settings `env` only."""
    base = {
        k: v for k, v in os.environ.items() if k not in ("TPUKIT_VERBOSE", "TF_CPP_MIN_LOG_LEVEL")
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=60,
    )


def test_start_up_captures_fd_2_and_writes_back_only_what_is_kept_in_order():
    code = (
        "import os, sys\n"
        "from tpukit.environment import quiet\n"
        "quiet.nvidia_driver_present = lambda: False\n"
        "quiet.configure()\n"
        "with quiet.start_up():\n"
        f"    os.write(2, {TF_221_START.encode()!r})\n"  # what native code writes, below Python
        f"    print({REAL[3]!r}, file=sys.stderr)\n"  # Python's own stderr, in between
        f"    os.write(2, {(REAL[0] + chr(10)).encode()!r})\n"
        "    os.write(1, b'inside\\n')\n"
        "print('after', file=sys.stderr)\n"
    )
    result = _child(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "inside\n"  # stdout is never touched
    assert result.stderr.splitlines() == [REAL[3], REAL[0], "after"]


@pytest.mark.parametrize(
    "users, shown",
    [
        ({}, False),
        ({"TPUKIT_VERBOSE": "0"}, False),
        ({"TF_CPP_MIN_LOG_LEVEL": "1"}, False),
        ({"TPUKIT_VERBOSE": "1"}, True),  # tpukit --verbose
        ({"TF_CPP_MIN_LOG_LEVEL": "0"}, True),  # the user asked TensorFlow for every line
    ],
)
def test_verbose_shows_the_start_up_lines_the_quiet_start_hides(users, shown, capfd, monkeypatch):
    for name in ("TPUKIT_VERBOSE", "TF_CPP_MIN_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in users.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(quiet, "nvidia_driver_present", lambda: False)
    with quiet.start_up():
        os.write(2, TF_221_START.encode())
        os.write(2, (REAL[0] + "\n").encode())
    assert capfd.readouterr().err == (TF_221_START if shown else "") + REAL[0] + "\n"


def test_no_temporary_file_means_a_loud_start_and_the_next_one_is_quiet(capfd, monkeypatch):
    for name in ("TPUKIT_VERBOSE", "TF_CPP_MIN_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(quiet, "nvidia_driver_present", lambda: False)

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as no_temporary_file:
        no_temporary_file.setattr(quiet.tempfile, "TemporaryFile", no_space)
        with quiet.start_up():
            os.write(2, TF_221_START.encode())
    assert capfd.readouterr().err == TF_221_START  # nothing is lost, nothing is hidden
    assert not quiet._active
    with quiet.start_up():  # not taken for a start inside another one
        os.write(2, TF_221_START.encode())
    assert capfd.readouterr().err == ""


def test_a_process_that_dies_inside_the_quiet_start_still_shows_what_it_wrote():
    # No TensorFlow in the child, so the watchdog starts (the import it guards lies ahead); abort() runs no Python.
    child = (
        "import os\n"
        "from tpukit.environment import quiet\n"
        "with quiet.start_up():\n"
        "    os.write(2, b'I0000 00:00:1.0    7 port.cc:153] oneDNN custom operations are on\\n')\n"
        "    os.write(2, b'The TensorFlow library was compiled to use AVX instructions\\n')\n"
        "    os.abort()\n"
    )
    result = _child(child)
    assert result.returncode == -6  # SIGABRT
    # Everything, unfiltered: a crash is no time to hide anything.
    assert result.stderr.splitlines() == [
        "I0000 00:00:1.0    7 port.cc:153] oneDNN custom operations are on",
        "The TensorFlow library was compiled to use AVX instructions",
    ]


def test_ctrl_c_in_the_quiet_start_prints_no_traceback_of_the_watchdog():
    # The child leads its own process group, as a shell's foreground job does, and signals that group as a
    # terminal's Ctrl-C does. No TensorFlow in the child, so the watchdog is running (blocked on its stdin).
    code = (
        "import os, signal, sys, time\n"
        "from tpukit.environment import quiet\n"
        "try:\n"
        "    with quiet.start_up():\n"
        "        time.sleep(1)\n"  # the watchdog's Python is up and waiting
        "        os.killpg(os.getpgrp(), signal.SIGINT)\n"
        "        time.sleep(10)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted', file=sys.stderr)\n"
        "    sys.exit(130)\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("TPUKIT_VERBOSE", "TF_CPP_MIN_LOG_LEVEL")
    }
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        start_new_session=True,  # its SIGINT must not reach pytest
    )
    assert (result.returncode, result.stderr) == (130, "interrupted\n")


@pytest.mark.parametrize("noise", quiet.NOISE, ids=lambda n: n.source or n.text.pattern[:20])
def test_every_listed_line_hides_a_line_tensorflow_printed_and_says_why(noise):
    assert len({n.why for n in quiet.NOISE}) == len(quiet.NOISE)  # each reason names one entry
    printed = (TF_221_START + TF_219_CUDA_START + TF_216_CUINIT + LIBTPU_START).splitlines()
    hidden_by_it = [line for line in printed if quiet.why_hidden(line) == noise.why]
    assert hidden_by_it, f"no line TensorFlow (or libtpu) printed is hidden by {noise}"
    for line in hidden_by_it:
        # Where an NVIDIA driver is installed a CUDA line explains an unused GPU: kept; the others never are.
        assert quiet.hidden(line, cuda_is_noise=False) is not noise.cuda
        # Where a TPU is attached libtpu's lines say why it was not found: kept; the others never are.
        assert quiet.hidden(line, libtpu_is_noise=False) is not noise.libtpu
    assert quiet.why_hidden(REAL[0]) is None and quiet.why_hidden(REAL[0], level=2) == (
        "TF_CPP_MIN_LOG_LEVEL=2 hides its severity"
    )


def test_the_notebooks_start_returns_its_engine_and_refuses_a_second_backend():
    import tpukit.notebook

    assert (
        tpukit.notebook.start("tensorflow") == "tensorflow"
    )  # Keras is loaded on TensorFlow here already
    with pytest.raises(ImportError, match="restart the runtime"):
        tpukit.notebook.start("jax")
