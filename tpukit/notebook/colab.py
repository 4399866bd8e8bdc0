"""The notebooks' install cell: tpukit for the runtime it finds, and a guard that stops "Run all" when the
runtime must restart.

A notebook cannot import tpukit before installing it, so its install cell holds the code between the two
`install cell` markers below verbatim, then calls `install_tpukit(TPUKIT_SOURCE, dry_run=INSTALL_DRY_RUN)`.
`tests/notebook/test_notebooks.py` fails when a notebook's cell drifts from this file; `python -m tpukit.notebook.colab` prints the
cell to paste. The block uses the standard library only.

What it does, in order:
0. `installed_tpukit`: when a compatible tpukit is already importable (Jupyter in a clone with `pip install -e`, a
   runtime where the user installed it, Colab after the restart this cell asked for), it installs nothing and says
   so in one line. Compatible: the importable `tpukit` is at least `TPUKIT_MIN_VERSION` and every requirement it
   declares for this runtime (its own and those of the extra below) is met, i.e. the install would change nothing
   tpukit needs. Otherwise, or with `force=True`:
1. `detect_runtime`: "tpu" (Colab/Kaggle TPU runtimes, Cloud TPU VMs), "gpu" or "cpu", from environment variables
   and device files, as `tpukit.engines.tensorflow.strategy.tpu_vm_present` and `tpukit.tools.doctor.detect_runtime` judge them.
   `choose_engine`: "jax" on a TPU without `tensorflow-tpu` installed (Colab's TPU runtime ships JAX, and TensorFlow
   and JAX cannot share one TPU), else "tensorflow"; the notebooks' next cell passes it to `tpukit.use_engine`.
2. `install_plan`: TPU with the TensorFlow engine -> `tpukit[tpu]` plus the pinned row of
   `tpukit/environment/versions.py` (removing a CPU TensorFlow wheel first: it writes the same `tensorflow` module);
   TPU with the jax engine -> `tpukit[jax-tpu]` (JAX's TPU build, kept when the runtime's is in range, and
   tensorflow-cpu for tf.data; a `tensorflow` wheel is removed first); GPU/CPU -> `tpukit[tensorflow]`, which keeps
   a preinstalled TensorFlow that is in range (Colab's GPU build keeps its CUDA setup).
3. pip resolves the plan first (`--dry-run --report`), so a plan that cannot resolve changes nothing.
4. `restart_reasons`: the installed distributions that pip would replace or remove and that this kernel has
   already imported (a module file of theirs is loaded). Only those need a restart: Python keeps the old code.
5. pip installs; when there are reasons, `RestartRuntime` is raised, which stops "Run all" with the fix.
"""

# --- install cell begins ---
import glob
import importlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import re
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
# The oldest tpukit the notebooks run on (the tpukit.notebook package, tpukit.load_model): an importable one at least
# this new, with its requirements for this runtime met, is used as it is. tests/notebook/test_colab.py keeps it <=
# the checkout's version.
TPUKIT_MIN_VERSION = "0.1.0"
# The tpukit extra each runtime installs (install_plan) and an installed tpukit must have met, with the TensorFlow
# engine; with the jax engine (only on a TPU, see choose_engine) it is JAX_EXTRA.
EXTRAS = {"tpu": "tpu", "gpu": "tensorflow", "cpu": "tensorflow"}
# The jax engine on a TPU: JAX's TPU build (a preinstalled one in range is kept) and tensorflow-cpu for tf.data.
JAX_EXTRA = "jax-tpu"
# JAX 0.10 (the oldest tpukit supports) requires CPython >= 3.11.
JAX_PYTHON = (3, 11)


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


def choose_engine(runtime=None, installed=None):
    """The engine the notebooks train with here: "jax" on a TPU without TensorFlow's TPU build (Colab's TPU
    runtime ships JAX and no tensorflow-tpu; TensorFlow and JAX cannot share one TPU), else "tensorflow". Judged
    without importing TensorFlow, Keras or JAX, so it runs before `tpukit.use_engine`.

    Args:
        runtime: "tpu", "gpu" or "cpu" (default: `detect_runtime()`).
        installed: the names (normalized) of the installed distributions (default: `installed_distributions()`).
    """
    runtime = runtime or detect_runtime()
    installed = installed_distributions() if installed is None else installed
    return "jax" if runtime == "tpu" and "tensorflow-tpu" not in installed else "tensorflow"


def extra_of(runtime, engine="tensorflow"):
    """The tpukit extra for a runtime and engine: "tpu", "tensorflow" or (jax on a TPU) JAX_EXTRA."""
    if engine == "jax":
        if runtime != "tpu":
            raise ValueError(
                f"the notebooks use the jax engine on a TPU only; received runtime={runtime!r}, engine='jax'."
            )
        return JAX_EXTRA
    return EXTRAS[runtime]


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


def install_plan(runtime, source, installed, python=None, engine="tensorflow"):
    """(distributions to uninstall first, requirements to install) for "tpu", "gpu" or "cpu".

    Args:
        installed: {normalized distribution name: version} of this environment.
        python: (major, minor) of the Python that will import TensorFlow (default: this one).
        engine: "tensorflow", or "jax" (a TPU only: `choose_engine`).
    """
    python = tuple(python or sys.version_info[:2])
    if engine == "jax":
        extra = extra_of(runtime, engine)
        if python < JAX_PYTHON:
            raise RuntimeError(
                f"JAX 0.10 and later need Python {JAX_PYTHON[0]}.{JAX_PYTHON[1]} or newer; this runtime runs "
                f"Python {python[0]}.{python[1]}. Fix: pick a runtime or image with a newer Python (on a Cloud "
                "TPU VM: a python3.12 venv)."
            )
        # The `tensorflow` wheel writes the same module as the extra's tensorflow-cpu.
        return [name for name in ("tensorflow",) if installed.get(name)], [
            requirement(source, extra)
        ]
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


def release(version):
    """The release numbers of a version, for comparing: '2.19.1rc0' -> (2, 19, 1) (pre, post, dev, local ignored)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else ()


def satisfies(version, specifier):
    """Whether `version` meets a pip specifier such as '<2.22,>=2.19', compared by release numbers (enough for
    tpukit's own requirements). A clause this cannot read counts as unmet: the install then runs as before."""
    have = release(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        match = re.fullmatch(r"(~=|===|==|!=|<=|>=|<|>)\s*(\S+)", clause)
        if match is None:
            return False
        op, wanted = match.groups()
        if op == "===":
            ok = version.strip() == wanted
        elif wanted.endswith(".*"):
            prefix = release(wanted[:-2])
            same = (have + (0,) * len(prefix))[: len(prefix)] == prefix
            ok = op in ("==", "!=") and same == (op == "==")
        else:
            want = release(wanted)
            size = max(len(have), len(want))
            a, b = (v + (0,) * (size - len(v)) for v in (have, want))
            compare = {
                "==": a == b,
                "!=": a != b,
                "<=": a <= b,
                ">=": a >= b,
                "<": a < b,
                ">": a > b,
            }
            compare["~="] = a >= b and a[: len(want) - 1] == b[: len(want) - 1]
            ok = compare[op]
        if not ok:
            return False
    return True


def unmet_requirements(dist, extra, versions):
    """The requirements `dist` declares (its own and `extra`'s) that no installed distribution meets.

    Args:
        versions: {normalized distribution name: version} of this environment.
    A requirement under another environment marker (python_version, ...) was judged by pip when it installed `dist`.
    """
    unmet = []
    for text in dist.requires or ():
        spec, _, marker = text.partition(";")
        extras = {normalize(e) for e in re.findall(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)}
        if marker.strip() and normalize(extra) not in extras:
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)", spec)
        name, rest = normalize(match.group(1)), match.group(3).strip().strip("()").strip()
        have = versions.get(name)
        if have is None or not (rest.startswith("@") or satisfies(have, rest)):
            unmet.append(f"{spec.strip()} (installed: {have or 'none'})")
    return unmet


def installed_tpukit(runtime, before, importable=None, engine="tensorflow"):
    """(compatible, why): whether the tpukit already importable here can be used as it is; why is None when no
    tpukit is installed.

    Compatible means the install would change nothing tpukit needs: the tpukit module is importable, its distribution
    is at least TPUKIT_MIN_VERSION, every requirement it declares for this runtime is met (its own, e.g. Keras in
    its tested range, and its extra's: TensorFlow in its range on a GPU/CPU, the pinned tensorflow-tpu and libtpu
    on a TPU) and, on a TPU, no CPU TensorFlow wheel shadows the TPU build.

    Args:
        before: `installed_distributions()`.
        importable: whether the tpukit module can be found (default: `importlib.util.find_spec`, which imports nothing).
        engine: "tensorflow", or "jax" (a TPU only): the extra judged is then JAX_EXTRA's (JAX's TPU build and
            tensorflow-cpu).
    """
    dist = before.get("tpukit")
    if importable is None:
        importable = importlib.util.find_spec("tpukit") is not None
    if dist is None or not importable:
        return False, None
    versions = {name: d.version for name, d in before.items()}
    if not satisfies(dist.version, ">=" + TPUKIT_MIN_VERSION):
        return (
            False,
            f"tpukit {dist.version} is installed, older than the {TPUKIT_MIN_VERSION} these notebooks need",
        )
    unmet = unmet_requirements(dist, extra_of(runtime, engine), versions)
    if engine == "jax":
        if versions.get("tensorflow"):
            unmet.append(
                f"tensorflow {versions['tensorflow']} (the wheel that tensorflow-cpu replaces)"
            )
    elif runtime == "tpu":
        unmet += [
            f"{name} {versions[name]} (a CPU wheel)"
            for name in CPU_TENSORFLOWS
            if versions.get(name)
        ]
    if unmet:
        return (
            False,
            f"tpukit {dist.version} is installed, but not for this {runtime.upper()} runtime: "
            + "; ".join(unmet),
        )
    shown = (
        ("tensorflow-cpu", "jax", "libtpu", "keras")
        if engine == "jax"
        else ("tensorflow", "tensorflow-tpu", "libtpu", "keras")
    )
    key = [name for name in shown if versions.get(name)]
    found = ", ".join(f"{name} {versions[name]}" for name in key)
    return (
        True,
        f"tpukit {dist.version} is already installed with what this {runtime.upper()} runtime needs ({found})",
    )


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


def install_tpukit(
    source,
    dry_run=False,
    runtime=None,
    pip_options=(),
    run=subprocess.run,
    force=False,
    installed=None,
    engine=None,
):
    """Installs tpukit and the TensorFlow (or, on a TPU with JAX, the JAX) for this runtime, unless a compatible tpukit is already importable;
    raises `RestartRuntime` exactly when a restart is needed.

    Args:
        source: a git URL (git+https://github.com/ORG/tpukit.git), a wheel URL, or a local wheel or checkout.
        dry_run: resolve and report what would change (and whether that would need a restart); install nothing.
        runtime: "tpu", "gpu" or "cpu" (default: `detect_runtime()`).
        pip_options: extra pip options, e.g. ["--no-cache-dir"].
        run: `subprocess.run` (tests pass a fake).
        force: install from `source` even when a compatible tpukit is already importable.
        installed: `installed_distributions()` (tests pass fakes).
        engine: "tensorflow" or "jax" (default: `choose_engine()`, the engine the notebooks then train with).

    Returns:
        The restart reasons (empty when none): in a dry run, those a real install would raise.
    """
    runtime = runtime or detect_runtime()
    before = installed_distributions() if installed is None else installed
    engine = engine or choose_engine(runtime, before)
    if _keeps_installed_tpukit(runtime, before, engine, force):
        return []
    versions = {n: d.version for n, d in before.items()}
    remove, requirements = install_plan(runtime, source, versions, engine=engine)
    print(
        f"tpukit install: {runtime.upper()} runtime, {engine} engine -> pip install {' '.join(repr(r) for r in requirements)}"
    )
    quiet = ["--quiet", "--disable-pip-version-check", *pip_options]
    report = _pip_report(requirements, quiet, run)
    changed = changes(report, before, remove)
    reasons = restart_reasons(changed, before)
    _print_changes(report, remove, dry_run)
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


def _keeps_installed_tpukit(runtime, before, engine, force):
    """True when the importable tpukit is compatible and not `force`d: then nothing is installed. Says why in one
    line either way."""
    compatible, why = installed_tpukit(runtime, before, engine=engine)
    if compatible and not force:
        print(
            f"tpukit install: {why}; installing nothing "
            "(to install TPUKIT_SOURCE anyway: install_tpukit(TPUKIT_SOURCE, force=True))."
        )
        return True
    if why:
        print(
            f"tpukit install: {why}; {'force=True: installing anyway' if compatible else 'installing'}."
        )
    return False


def _pip_report(requirements, quiet, run):
    """pip's `--report` JSON for installing `requirements`, from a dry run that changes nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        report_path = os.path.join(tmp, "report.json")
        pip(["install", "--dry-run", "--report", report_path, *quiet, *requirements], run)
        with open(report_path, encoding="utf-8") as f:
            return json.load(f)


def _print_changes(report, remove, dry_run):
    """One line for what pip installs, and one for what is uninstalled first (if anything)."""
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


# --- install cell ends ---

CELL_HEADER = """\
#@title Install tpukit for this runtime { display-mode: "form" }
# The code is tpukit/notebook/colab.py's install block, verbatim (tests/notebook/test_notebooks.py keeps them equal).
# A compatible tpukit already importable here (a clone, a local Jupyter, this runtime after its restart) -> nothing.
# Else a TPU runtime with tensorflow-tpu -> tpukit[tpu] + tensorflow-tpu/libtpu pinned in
# tpukit/environment/versions.py; any other TPU runtime (Colab's ships JAX) -> tpukit[jax-tpu], for the jax engine;
# GPU/CPU -> tpukit[tensorflow].
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
