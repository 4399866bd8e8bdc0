"""The jax engine's SavedModel export, by a TensorFlow-backend process.

TF 2.21 cannot load SavedModels that jax >= 0.11 exports through jax2tf, so a run on the jax engine exports its
`model.keras` with `tpukit.engines.keras.export` in a process of Keras' TensorFlow backend. Almost all of that
process's time is its imports (TensorFlow, Keras) and interpreter teardown; loading and exporting a small model take
well under a second. So on CPUs (`tpukit.engines.jax.cpu.export_starts_early`) it starts when the run is built and
imports (the unused scikit-learn, matplotlib and JAX kept out, `main`) while this process builds the model and
compiles its first step; on Linux it is paused (SIGSTOP) while steps train, so that a small model's short build does
not leave the imports competing with the training steps, and continued (SIGCONT) when `fit` returns. Elsewhere it
starts when the run exports. It waits on its stdin for one line `["<model.keras>", "<output dir>"]`, runs the same
`main` as `python -m tpukit.engines.keras.export` (the same files), and exits without the interpreter's teardown
once they are written and closed. An empty stdin (the run stopped before exporting) ends it without writing
anything; on Linux the kernel kills it when the thread that started it ends, even by SIGKILL (`PR_SET_PDEATHSIG`),
so a paused one cannot outlive its run (`build` and `export` run on the caller's thread, as `tpukit.run` calls
them).

    export = SavedModelExport.start()   # in `build` on CPUs, else in `export`
    export.pause(); export.resume()     # around training (no-ops off Linux)
    failure = export.run(keras_path, output_dir)   # None once output_dir/saved_model is written
    export.close()                      # ends it if it was never asked (idempotent)

On an accelerator it starts at `export` (`tpukit.engines.jax.cpu`); benchmarks/README.md has what it saves on a CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile

# What `main` keeps out of this process's imports (see there).
UNUSED_HERE = ("sklearn", "matplotlib", "jax")

# Pausing needs the kernel to end a paused process whose parent died (PR_SET_PDEATHSIG): Linux only.
_PAUSABLE = sys.platform.startswith("linux") and hasattr(signal, "SIGSTOP")


class SavedModelExport:
    """One waiting TensorFlow-backend process: `run` asks it for one export, `close` ends it unasked."""

    def __init__(self, process: subprocess.Popen, log):
        self._process = process
        self._log = log  # its stdout and stderr, read back when it fails
        self._paused = False

    @classmethod
    def start(cls) -> SavedModelExport:
        return cls(*_started())

    def pause(self) -> None:
        """Stops it taking CPU (SIGSTOP) until `resume`; nothing off Linux or once it has ended."""
        if _PAUSABLE and not self._paused and self._process.poll() is None:
            self._process.send_signal(signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._process.send_signal(signal.SIGCONT)

    def run(self, keras_path: str, output_dir: str) -> str | None:
        """Exports `keras_path` to `output_dir/saved_model` and waits for it: None when done, else the last line
        the process printed (why it failed)."""
        self.resume()
        if self._process.poll() is not None:
            # It ended before it was asked (`_end_with_parent`, or its imports failed): a new one exports, or
            # prints why it cannot.
            self.close()
            self._process, self._log = _started()
        try:
            # The run's sys.path: the user's own modules (custom layers) are imported from where the run found them.
            self._process.stdin.write(json.dumps([keras_path, output_dir, sys.path]) + "\n")
            self._process.stdin.close()
        except OSError:  # it has ended already (BrokenPipeError): its output says why
            pass
        code = self._process.wait()
        if code == 0:
            self._close_log()
            return None
        self._log.seek(0)
        lines = self._log.read().strip().splitlines()
        self._close_log()
        last = (lines or [f"(no output; exit status {code})"])[-1][:500]
        imports = [line[:300] for line in lines if line.startswith("tpukit: could not import ")]
        # Why a user's module did not load, then why the export failed.
        return "; ".join([*imports, last])

    def close(self) -> None:
        """Ends the process if it is still waiting (or importing, or paused); nothing is written then."""
        if self._process.poll() is None:
            self._process.kill()  # SIGKILL ends a stopped process too
            self._process.wait()
        self._paused = False
        if self._process.stdin and not self._process.stdin.closed:
            try:
                self._process.stdin.close()
            except OSError:
                pass
        self._close_log()

    def _close_log(self) -> None:
        if not self._log.closed:
            self._log.close()


def _started() -> tuple[subprocess.Popen, object]:
    """A new waiting process, and the temporary file that takes its output."""
    environment = dict(os.environ, KERAS_BACKEND="tensorflow", JAX_PLATFORMS="cpu")
    environment.pop("XLA_FLAGS", None)  # virtual devices are the jax run's
    log = tempfile.TemporaryFile(mode="w+", prefix="tpukit-export-")
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            text=True,
        )
    except BaseException:
        log.close()
        raise
    return process, log


def _end_with_parent(parent: int) -> None:
    """Linux: this process gets SIGKILL when the one that started it ends (`prctl(PR_SET_PDEATHSIG)`), so it is
    never left paused; it ends now if that one has ended already."""
    if not _PAUSABLE:
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1  # <linux/prctl.h>
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0 or os.getppid() != parent:
        os._exit(1)  # no guarantee that a pause ends (or the parent is gone): export nothing


def main(argv: list[str]) -> int:
    """The waiting process: imports, then exports what its stdin's one line names (nothing on an empty line)."""
    _end_with_parent(int(argv[0]))
    os.environ["KERAS_BACKEND"] = "tensorflow"
    # Modules Keras and TensorFlow import when installed that loading and exporting a model never use (Keras'
    # scikit-learn wrappers and plot utilities, TFLite's JAX hooks): an import of a name set to None raises
    # ImportError, which each of them catches: a third of this process's imports (docs/performance.md).
    for unused in UNUSED_HERE:
        sys.modules.setdefault(unused, None)
    import keras  # noqa: F401 - imported now, while the run builds its model: `export.main` needs it

    import tpukit.models  # noqa: F401 - registers tpukit's layers for loading
    from tpukit.engines.keras import export

    line = sys.stdin.readline()
    if not line.strip():
        return 0
    keras_path, output_dir, *rest = json.loads(line)
    with keras.saving.custom_object_scope(_user_classes(keras_path, rest[0] if rest else [])):
        return export.main([keras_path, output_dir])


def _user_classes(keras_path: str, search_path: list[str]) -> dict:
    """The classes of `keras_path`'s config that live in the user's own importable modules (`"module": "mylayers"`),
    imported with the run's `sys.path`: Keras' loader imports only Keras' packages and finds other classes only
    when registered in this process. A class defined in the script that ran (no module in the config) cannot be
    imported here; loading then fails with Keras' "Could not locate class", which the run reports with the fix."""
    import importlib
    import zipfile

    # The run's own order, so a module of the user's named like an installed one resolves as it did in the run.
    sys.path[:0] = [entry for entry in search_path if entry not in sys.path]
    # The modules kept out of this process's imports (`main`) may be what a user's module imports (jax).
    for unused in UNUSED_HERE:
        if unused in sys.modules and sys.modules[unused] is None:
            del sys.modules[unused]
    with zipfile.ZipFile(keras_path) as archive:
        config = json.loads(archive.read("config.json"))
    found: dict = {}

    def walk(node) -> None:
        if isinstance(node, dict):
            module, name = node.get("module"), node.get("class_name")
            if (
                isinstance(module, str)
                and isinstance(name, str)
                and module.split(".")[0] not in ("keras", "tpukit", "builtins")
            ):
                try:
                    value = getattr(importlib.import_module(module), name, None)
                except Exception as error:  # noqa: BLE001 - said, then Keras names the class it misses
                    print(f"tpukit: could not import {module}: {type(error).__name__}: {error}")
                    value = None
                if value is not None:
                    found[name] = value
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(config)
    return found


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Every file is written and closed: skip the interpreter's teardown of TensorFlow (~1 s) the run would wait on.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
