"""The notebooks' install cell: tpukit for the runtime it finds, and a guard that stops "Run all" when the
runtime must restart.

A notebook cannot import tpukit before installing it, so its install cell holds the code between the two
`install cell` markers below verbatim, then calls `install_tpukit(TPUKIT_SOURCE, dry_run=INSTALL_DRY_RUN)`.
`tests/notebook/test_notebooks.py` fails when a notebook's cell drifts from this file; `python -m tpukit.notebook.colab` prints the
cell to paste. The block uses the standard library only.

What it does, in order:
1. `detect_runtime`: "tpu" (Colab/Kaggle TPU runtimes, Cloud TPU VMs), "gpu" or "cpu", from environment variables
   and device files, as `tpukit.engines.tensorflow.strategy.tpu_vm_present` and `tpukit.tools.doctor.detect_runtime` judge them.
2. `install_plan`: TPU -> `tpukit[tpu]` plus the pinned row of `tpukit/environment/versions.py` (removing a CPU TensorFlow
   wheel first: it writes the same `tensorflow` module); GPU/CPU -> `tpukit[tensorflow]`, which keeps a
   preinstalled TensorFlow that is in range (Colab's GPU build keeps its CUDA setup).
3. pip resolves the plan first (`--dry-run --report`), so a plan that cannot resolve changes nothing.
4. `restart_reasons`: the installed distributions that pip would replace or remove and that this kernel has
   already imported (a module file of theirs is loaded). Only those need a restart: Python keeps the old code.
5. pip installs; when there are reasons, `RestartRuntime` is raised, which stops "Run all" with the fix.
"""

# --- install cell begins ---
import glob
import importlib
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import tempfile

# The tested TPU build: the pinned row of tpukit/environment/versions.py (Keras' TPU requirements pin tensorflow-tpu 2.19.1,
# whose wheel requires libtpu 0.0.10; wheels for CPython 3.10-3.12). tests/notebook/test_colab.py keeps them equal.
TPU_PINS = ("tensorflow-tpu==2.19.1", "libtpu==0.0.10")
TPU_PYTHONS = ((3, 10), (3, 12))
# CPU/GPU wheels that write the same `tensorflow` module as tensorflow-tpu: removed before it is installed.
CPU_TENSORFLOWS = ("tensorflow", "tensorflow-cpu")
RESTART_HOW = "Runtime > Restart session (Kaggle: Run > Restart & clear cell outputs)"


class RestartRuntime(RuntimeError):
    """The install replaced packages this kernel had already imported: restart, then run all cells again."""


def normalize(name):
    """A distribution name as pip compares them: 'TensorFlow_TPU' -> 'tensorflow-tpu'."""
    return name.lower().replace("_", "-").replace(".", "-")


def _google_pci_device(root="/sys/bus/pci/devices"):
    for path in glob.glob(os.path.join(root, "*", "vendor")):
        try:
            with open(path, encoding="ascii") as f:
                if f.read().strip().lower() == "0x1ae0":
                    return True
        except OSError:
            continue
    return False


def detect_runtime(env=None, device_files=None, google_pci=None):
    """Which runtime this is: "tpu", "gpu" or "cpu", judged without importing TensorFlow.

    Args:
        env: environment variables (default: os.environ). Colab's TPU runtime sets COLAB_TPU_1VM=1, Kaggle's
            ISTPUVM=1, GKE and Cloud TPU VMs TPU_ACCELERATOR_TYPE / TPU_WORKER_ID.
        device_files: existing device files (default: /dev/accel*, /dev/vfio/N, /dev/nvidia0, /dev/dxg).
        google_pci: whether a Google PCI device is present (a /dev/vfio/N alone is any VFIO host).
    """
    env = os.environ if env is None else env
    if device_files is None:
        patterns = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*", "/dev/nvidia0", "/dev/dxg")
        device_files = [path for pattern in patterns for path in glob.glob(pattern)]
    if env.get("COLAB_TPU_1VM") == "1" or env.get("ISTPUVM") == "1":
        return "tpu"
    if env.get("TPU_ACCELERATOR_TYPE") or env.get("TPU_WORKER_ID"):
        return "tpu"
    if any(path.startswith("/dev/accel") for path in device_files):
        return "tpu"
    if any(path.startswith("/dev/vfio/") for path in device_files):
        if google_pci is None:
            google_pci = _google_pci_device()
        if google_pci:
            return "tpu"
    if any(path in ("/dev/nvidia0", "/dev/dxg") for path in device_files):
        return "gpu"
    return "cpu"


def requirement(source, extra):
    """`tpukit[extra] @ URL` for a git URL, a wheel URL, or a local wheel / checkout path."""
    if not source:
        raise ValueError(
            "TPUKIT_SOURCE is empty. Fix: set it to a git URL (git+https://github.com/ORG/tpukit.git), a wheel's "
            "URL, or the path of a wheel or checkout on this runtime (no package named tpukit is on PyPI)."
        )
    if "://" in source:
        url = source
    else:
        path = pathlib.Path(source).expanduser()
        if not path.exists():
            raise FileNotFoundError(
                f"TPUKIT_SOURCE={source!r} is not a URL and no such file or directory exists here. Fix: upload "
                "the wheel (python -m build --wheel in a clone writes dist/tpukit-*.whl) or use the git URL."
            )
        url = path.resolve().as_uri()
    return f"tpukit[{extra}] @ {url}"


def install_plan(runtime, source, installed, python=None):
    """(distributions to uninstall first, requirements to install) for "tpu", "gpu" or "cpu".

    Args:
        installed: {normalized distribution name: version} of this environment.
        python: (major, minor) of the Python that will import TensorFlow (default: this one).
    """
    python = tuple(python or sys.version_info[:2])
    if runtime == "tpu":
        low, high = TPU_PYTHONS
        if not low <= python <= high:
            raise RuntimeError(
                f"{TPU_PINS[0]} has wheels for Python {low[0]}.{low[1]}-{high[0]}.{high[1]} only; this runtime "
                f"runs Python {python[0]}.{python[1]}. Fix: pick a runtime or image with a supported Python "
                "(on a Cloud TPU VM: a python3.12 venv)."
            )
        remove = [name for name in CPU_TENSORFLOWS if installed.get(name)]
        return remove, [requirement(source, "tpu"), *TPU_PINS]
    if runtime not in ("gpu", "cpu"):
        raise ValueError(f"runtime must be 'tpu', 'gpu' or 'cpu'; received runtime={runtime!r}.")
    return [], [requirement(source, "tensorflow")]


def installed_distributions():
    """{normalized name: importlib.metadata.Distribution} of this environment (the first on sys.path wins)."""
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found.setdefault(normalize(name), dist)
    return found


def _same_build(dist, item):
    """Whether pip's report `item` would install exactly the build of the installed `dist`."""
    text = dist.read_text("direct_url.json")
    info = item.get("download_info") or {}
    if text is None:  # installed from an index: the same version from an index is the same file
        return not item.get("is_direct")
    installed = json.loads(text)
    if "vcs_info" in installed and "vcs_info" in info:
        commit, wanted = installed["vcs_info"].get("commit_id"), info["vcs_info"].get("commit_id")
        return installed.get("url") == info.get("url") and commit is not None and commit == wanted
    if "archive_info" in installed and "archive_info" in info:
        have, want = installed["archive_info"], info["archive_info"]
        hashes = have.get("hashes") or have.get("hash")
        return bool(hashes) and hashes == (want.get("hashes") or want.get("hash"))
    return False  # a directory (or a different kind of source) may hold other code under the same version


def changes(report, before, remove=()):
    """{name: (installed version, new version or None)}: installed distributions the install replaces or removes.

    Args:
        report: pip's `--report` JSON for the install.
        before: `installed_distributions()` before it.
        remove: distributions uninstalled first.
    """
    changed = {normalize(name): (before[normalize(name)].version, None) for name in remove}
    for item in report.get("install", []):
        name, version = normalize(item["metadata"]["name"]), item["metadata"]["version"]
        dist = before.get(name)
        if dist is not None and (dist.version != version or not _same_build(dist, item)):
            changed[name] = (dist.version, version)
    return changed


def loaded_modules(dist, modules=None):
    """Names of the imported modules (default: sys.modules) whose files belong to `dist`."""
    modules = sys.modules if modules is None else modules
    by_file = {}
    for name, module in list(modules.items()):
        path = getattr(module, "__file__", None)
        # pip's editable-install finder is imported by a .pth file in every process: it is not the package.
        if path and not name.startswith("__editable__"):
            by_file[os.path.normpath(path)] = name
    found = {
        by_file[p]
        for p in (os.path.normpath(dist.locate_file(f)) for f in dist.files or ())
        if p in by_file
    }
    # An editable install (pip install -e) lists no module files: its top-level names stand for them.
    for top in (dist.read_text("top_level.txt") or "").split():
        if getattr(modules.get(top), "__file__", None):
            found.add(top)
    return sorted(found)


def restart_reasons(changed, before, modules=None):
    """One line per changed distribution that this kernel imported: the restart is needed exactly then."""
    reasons = []
    for name, (old, new) in sorted(changed.items()):
        loaded = loaded_modules(before[name], modules)
        if loaded:
            shown = ", ".join(loaded[:3]) + (", ..." if len(loaded) > 3 else "")
            reasons.append(
                f"{name} {old} is imported in this kernel ({shown}) and becomes {new or 'uninstalled'}"
            )
    return reasons


def pip(args, run=subprocess.run):
    """Runs `python -m pip ARGS` in this kernel's Python; raises with pip's own message when it fails."""
    command = [sys.executable, "-m", "pip", *args]
    result = run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(
            f"pip failed (exit {result.returncode}): {' '.join(command[3:])}\n{(result.stderr or '')[-3000:]}"
        )
    return result


def install_tpukit(source, dry_run=False, runtime=None, pip_options=(), run=subprocess.run):
    """Installs tpukit and the TensorFlow for this runtime; raises `RestartRuntime` exactly when a restart is needed.

    Args:
        source: a git URL (git+https://github.com/ORG/tpukit.git), a wheel URL, or a local wheel or checkout.
        dry_run: resolve and report what would change (and whether that would need a restart); install nothing.
        runtime: "tpu", "gpu" or "cpu" (default: `detect_runtime()`).
        pip_options: extra pip options, e.g. ["--no-cache-dir"].
        run: `subprocess.run` (tests pass a fake).

    Returns:
        The restart reasons (empty when none): in a dry run, those a real install would raise.
    """
    runtime = runtime or detect_runtime()
    before = installed_distributions()
    remove, requirements = install_plan(runtime, source, {n: d.version for n, d in before.items()})
    print(
        f"tpukit install: {runtime.upper()} runtime -> pip install {' '.join(repr(r) for r in requirements)}"
    )
    quiet = ["--quiet", "--disable-pip-version-check", *pip_options]
    with tempfile.TemporaryDirectory() as tmp:
        report_path = os.path.join(tmp, "report.json")
        pip(["install", "--dry-run", "--report", report_path, *quiet, *requirements], run)
        with open(report_path, encoding="utf-8") as f:
            report = json.load(f)
    changed = changes(report, before, remove)
    reasons = restart_reasons(changed, before)
    new = sorted(
        f"{item['metadata']['name']} {item['metadata']['version']}"
        for item in report.get("install", [])
    )
    print(
        f"tpukit install: pip {'would install' if dry_run else 'installs'}: {', '.join(new) or 'nothing'}"
    )
    if remove:
        print(
            f"tpukit install: {'would uninstall' if dry_run else 'uninstalls'} first: {', '.join(remove)}"
        )
    if dry_run:
        if reasons:
            print("tpukit install: a real install would need a restart: " + "; ".join(reasons))
        return reasons
    if remove:
        pip(["uninstall", "--yes", *quiet, *remove], run)
    if report.get("install"):
        pip(["install", *quiet, *requirements], run)
    importlib.invalidate_caches()
    if reasons:
        raise RestartRuntime(
            f"Restart the runtime now ({RESTART_HOW}), then run all cells again: the install is kept and this "
            "cell will then pass. Python keeps the old code of what this kernel already imported: "
            + "; ".join(reasons)
            + "."
        )
    print(
        "tpukit install: done; no restart needed (nothing it replaced was imported in this kernel)."
    )
    return reasons


# --- install cell ends ---

CELL_HEADER = """\
#@title Install tpukit for this runtime { display-mode: "form" }
# The code is tpukit/notebook/colab.py's install block, verbatim (tests/notebook/test_notebooks.py keeps them equal).
# TPU runtime -> tpukit[tpu] + tensorflow-tpu/libtpu pinned in tpukit/environment/versions.py; GPU/CPU -> tpukit[tensorflow].
# It stops "Run all" with "Restart the runtime" only when the install replaced a package this kernel imported.
"""
CELL_CALL = "install_tpukit(TPUKIT_SOURCE, dry_run=INSTALL_DRY_RUN);\n"


def cell_source() -> str:
    """The install cell of the notebooks: header, this module's install block, the call."""
    with open(__file__, encoding="utf-8") as f:
        text = f.read()
    begin, end = "# --- install cell begins ---\n", "# --- install cell ends ---\n"
    block = text[text.index(begin) + len(begin) : text.index(end)].strip("\n")
    return CELL_HEADER + block + "\n\n\n" + CELL_CALL


if __name__ == "__main__":
    print(cell_source(), end="")
