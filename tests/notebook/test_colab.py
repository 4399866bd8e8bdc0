"""tpukit/notebook/colab.py, the notebooks' install cell: the "already installed" decision, runtime detection, the pip
plan per runtime, and the restart guard.

The decision is checked on fake distributions and on this environment (tpukit installed, TensorFlow in range: the
cell installs nothing). The guard is checked with a fake pip (exact commands, raise or not) and, against PyPI, with pip's real dry-run
resolution for the TPU and the CPU branch from this checkout (nothing is installed; skipped only when pypi.org is
unreachable). Neither proves an install on a real Colab TPU runtime (none here).
"""

import importlib.metadata
import json
import os
import socket
import subprocess
import sys

import keras  # noqa: F401  (imported in this process, as a notebook kernel would have it)
import pytest
from helpers import REPO
from packaging.specifiers import SpecifierSet

from tpukit.environment import versions
from tpukit.notebook import colab

GIT = "git+https://github.com/tpukit/tpukit.git"


def test_the_tpu_pins_are_the_pinned_row_of_tpukit_versions():
    row = versions.pinned_tpu()
    assert colab.TPU_PINS == (f"tensorflow-tpu=={row.tensorflow}", f"libtpu=={row.libtpu}")
    low, high = colab.TPU_PYTHONS
    for minor in range(8, 15):
        inside = low <= (3, minor) <= high
        assert inside == (f"3.{minor}" in SpecifierSet(row.python)), f"Python 3.{minor}"


@pytest.mark.parametrize(
    "env, files, google_pci, expected",
    [
        ({"COLAB_TPU_1VM": "1"}, [], False, "tpu"),
        ({"ISTPUVM": "1"}, [], False, "tpu"),
        ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, [], False, "tpu"),
        ({}, ["/dev/accel0"], False, "tpu"),
        ({}, ["/dev/vfio/0"], True, "tpu"),
        ({}, ["/dev/vfio/0"], False, "cpu"),  # any VFIO host has /dev/vfio/N
        ({"COLAB_TPU_1VM": ""}, ["/dev/nvidia0"], False, "gpu"),  # Colab GPU runtime
        ({"COLAB_TPU_1VM": ""}, [], False, "cpu"),
        (
            {"COLAB_TPU_ADDR": "10.0.0.2:8470"},
            [],
            False,
            "cpu",
        ),  # legacy TPU Node: this host is a client
    ],
)
def test_detect_runtime(env, files, google_pci, expected):
    assert colab.detect_runtime(env, files, google_pci) == expected


def test_install_plan_per_runtime(tmp_path):
    remove, requirements = colab.install_plan("tpu", GIT, {"tensorflow": "2.18.0"}, (3, 12))
    assert remove == ["tensorflow"]
    assert requirements == [f"tpukit[tpu] @ {GIT}", "tensorflow-tpu==2.19.1", "libtpu==0.0.10"]
    assert colab.install_plan("tpu", GIT, {"tensorflow-tpu": "2.19.1"}, (3, 10))[0] == []
    for runtime in ("gpu", "cpu"):
        assert colab.install_plan(runtime, GIT, {"tensorflow": "2.19.0"}, (3, 13)) == (
            [],
            [f"tpukit[tensorflow] @ {GIT}"],
        )
    wheel = tmp_path / "tpukit-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert colab.install_plan("cpu", str(wheel), {})[1] == [f"tpukit[tensorflow] @ file://{wheel}"]


def test_install_plan_errors_name_the_value_and_the_fix():
    with pytest.raises(RuntimeError, match=r"Python 3.10-3.12 only; this runtime runs Python 3.13"):
        colab.install_plan("tpu", GIT, {}, (3, 13))
    with pytest.raises(FileNotFoundError, match=r"TPUKIT_SOURCE='/no/such.whl' is not a URL.*Fix"):
        colab.install_plan("cpu", "/no/such.whl", {})
    with pytest.raises(ValueError, match="TPUKIT_SOURCE is empty. Fix"):
        colab.install_plan("cpu", "", {})
    with pytest.raises(ValueError, match="received runtime='tpu_vm'"):
        colab.install_plan("tpu_vm", GIT, {})


class FakeDist:
    def __init__(
        self, version, direct_url=None, files=(), root="/site", top_level=None, requires=None
    ):
        self.version, self._direct, self.files, self._root = version, direct_url, list(files), root
        self._top, self.requires = top_level, requires

    def read_text(self, name):
        if name == "direct_url.json":
            return None if self._direct is None else json.dumps(self._direct)
        return self._top if name == "top_level.txt" else None

    def locate_file(self, path):
        return os.path.join(self._root, path)


def item(name, version, **extra):
    return {"metadata": {"name": name, "version": version}, **extra}


@pytest.mark.parametrize(
    "version, specifier, expected",
    [
        ("2.21.0", "<2.22,>=2.19", True),
        ("2.22.0", "<2.22,>=2.19", False),
        ("2.18.1", "<2.22,>=2.19", False),
        ("2.19", ">=2.19.0", True),  # missing release parts are zeros
        ("2.19.1", "==2.19.1", True),
        ("2.19.0", "==2.19.1", False),
        ("2.19.1rc0", "==2.19.*", True),
        ("2.20.1", "!=2.20.*", False),
        ("3.15.1", "~=3.15.0", True),
        ("3.16.0", "~=3.15.0", False),
        ("3.16", "~=3.15", True),
        ("1.0", "", True),  # no specifier: any version
        ("1.0", ">=1.0 and more", False),  # unreadable: unmet, so the install runs as before
    ],
)
def test_satisfies(version, specifier, expected):
    """Agrees with `packaging` (what pip uses) on every specifier packaging can read."""
    assert colab.satisfies(version, specifier) is expected
    if "and" not in specifier:
        assert SpecifierSet(specifier).contains(version, prereleases=True) is expected


TPUKIT_REQUIRES = [
    "keras<3.16,>=3.15",
    "numpy>=1.26",
    'tensorflow<2.22,>=2.19; extra == "tensorflow"',
    'tensorflow-tpu==2.19.1; extra == "tpu"',
    'libtpu==0.0.10; extra == "tpu"',
    'jax[tpu]<0.13,>=0.10; extra == "jax-tpu"',
    'tensorflow-cpu<2.22,>=2.19; extra == "jax-tpu"',
    'pytest>=7; extra == "test"',
    'tomli; python_version < "3.11"',  # judged by pip when it installed tpukit
]


def environment(**versions):
    """Fake `installed_distributions()`: tpukit 0.1.0 with TPUKIT_REQUIRES, and `name=version` pairs."""
    found = {"tpukit": FakeDist("0.1.0", requires=TPUKIT_REQUIRES)}
    found.update({name.replace("_", "-"): FakeDist(v) for name, v in versions.items() if v})
    return found


GOOD = {"keras": "3.15.1", "numpy": "2.1.0", "tensorflow": "2.21.0"}


@pytest.mark.parametrize(
    "runtime, versions, compatible, why",
    [
        (
            "cpu",
            GOOD,
            True,
            "tpukit 0.1.0 is already installed with what this CPU runtime needs "
            "(tensorflow 2.21.0, keras 3.15.1)",
        ),
        ("gpu", GOOD, True, "GPU runtime needs"),
        (
            "cpu",
            {**GOOD, "tensorflow": None},
            False,
            "not for this CPU runtime: tensorflow<2.22,>=2.19 (installed: none)",
        ),
        (
            "cpu",
            {**GOOD, "tensorflow": "2.18.0"},
            False,
            "tensorflow<2.22,>=2.19 (installed: 2.18.0)",
        ),
        ("cpu", {**GOOD, "keras": "3.16.0"}, False, "keras<3.16,>=3.15 (installed: 3.16.0)"),
        (
            "tpu",
            GOOD,
            False,
            "tensorflow-tpu==2.19.1 (installed: none); libtpu==0.0.10 (installed: "
            "none); tensorflow 2.21.0 (a CPU wheel)",
        ),
        (
            "tpu",
            {**GOOD, "tensorflow": None, "tensorflow_tpu": "2.19.1", "libtpu": "0.0.10"},
            True,
            "TPU runtime needs (tensorflow-tpu 2.19.1, libtpu 0.0.10, keras 3.15.1)",
        ),
        (
            "tpu",
            {**GOOD, "tensorflow_tpu": "2.19.1", "libtpu": "0.0.10"},
            False,
            "tensorflow 2.21.0 (a CPU wheel)",
        ),  # it would shadow the TPU build
    ],
)
def test_installed_tpukit_is_compatible_exactly_when_its_requirements_for_the_runtime_are_met(
    runtime, versions, compatible, why
):
    result = colab.installed_tpukit(runtime, environment(**versions), importable=True)
    assert result[0] is compatible and why in result[1], result


def test_installed_tpukit_not_installed_not_importable_or_too_old():
    assert colab.installed_tpukit("cpu", {}, importable=True) == (False, None)
    assert colab.installed_tpukit("cpu", environment(**GOOD), importable=False) == (False, None)
    old = {**environment(**GOOD), "tpukit": FakeDist("0.0.9", requires=TPUKIT_REQUIRES)}
    assert colab.installed_tpukit("cpu", old, importable=True) == (
        False,
        "tpukit 0.0.9 is installed, older than the 0.1.0 these notebooks need",
    )


def test_the_notebooks_need_at_most_this_tpukit_and_its_extras_exist():
    here = importlib.metadata.distribution("tpukit")
    assert colab.release(colab.TPUKIT_MIN_VERSION) <= colab.release(here.version)
    assert set(colab.EXTRAS.values()) <= set(here.metadata.get_all("Provides-Extra"))
    assert set(colab.EXTRAS) == {"tpu", "gpu", "cpu"}


def _no_pip(command, **kwargs):
    raise AssertionError(f"pip was run: {command}")


def test_install_cell_installs_nothing_here_and_says_so_in_one_line(capsys):
    """This environment has tpukit (editable) with TensorFlow and Keras in its range: the cell must not touch pip."""
    assert colab.install_tpukit(GIT, runtime="cpu", run=_no_pip) == []
    assert (
        colab.install_tpukit("", dry_run=True, runtime="gpu", run=_no_pip) == []
    )  # no source needed
    lines = capsys.readouterr().out.splitlines()
    version, tf_version = (
        importlib.metadata.version("tpukit"),
        importlib.metadata.version("tensorflow"),
    )
    assert lines[0] == (
        f"tpukit install: tpukit {version} is already installed with what this CPU runtime needs "
        f"(tensorflow {tf_version}, keras {importlib.metadata.version('keras')}); installing nothing "
        "(to install TPUKIT_SOURCE anyway: install_tpukit(TPUKIT_SOURCE, force=True))."
    )
    assert len(lines) == 2 and "GPU runtime" in lines[1]


def test_install_cell_runs_the_plan_when_tpukit_is_missing_incompatible_or_forced(capsys):
    requirement = f"tpukit[tensorflow] @ {GIT}"
    cases = [
        ({"keras": FakeDist("3.15.1")}, False, None),  # not installed: the plan, as before
        (
            environment(**{**GOOD, "tensorflow": "2.18.0"}),
            False,
            "tensorflow<2.22,>=2.19 (installed",
        ),
        (environment(**GOOD), True, "is already installed"),
    ]
    for installed, force, why in cases:
        calls = []
        report = {"install": [item("tpukit", "0.1.0", is_direct=True)]}
        run = fake_pip(report, calls)
        assert (
            colab.install_tpukit(GIT, runtime="cpu", run=run, force=force, installed=installed)
            == []
        )
        out = capsys.readouterr().out
        assert calls[0][:3] == ["install", "--dry-run", "--report"] and calls[0][-1] == requirement
        assert calls[1] == ["install", "--quiet", "--disable-pip-version-check", requirement]
        assert (
            f"tpukit install: CPU runtime, tensorflow engine -> pip install '{requirement}'" in out
        )
        assert "installing nothing" not in out
        first = out.splitlines()[0]
        if why is None:
            assert first.startswith(
                "tpukit install: CPU runtime, tensorflow engine -> pip install"
            ), out
        elif force:
            assert why in first and first.endswith("; force=True: installing anyway."), out
        else:
            assert first.startswith(
                "tpukit install: tpukit 0.1.0 is installed, but not for this CPU"
            )
            assert why in first and first.endswith("; installing."), out
    calls = []  # the TensorFlow engine on a TPU: the TPU plan, with the CPU wheel removed first
    run = fake_pip({"install": []}, calls)
    colab.install_tpukit(
        GIT, runtime="tpu", run=run, installed=environment(**GOOD), engine="tensorflow"
    )
    assert calls[0][-3:] == [f"tpukit[tpu] @ {GIT}", *colab.TPU_PINS]
    assert calls[1] == [
        "uninstall",
        "--yes",
        "--quiet",
        "--disable-pip-version-check",
        "tensorflow",
    ]


def test_changes_count_only_a_different_build_of_an_installed_distribution():
    vcs = {
        "url": "https://github.com/tpukit/tpukit.git",
        "vcs_info": {"vcs": "git", "commit_id": "abc"},
    }
    before = {
        "numpy": FakeDist("2.0.2"),
        "keras": FakeDist("3.15.1"),
        "tpukit": FakeDist("0.1.0", direct_url=vcs),
        "libtpu": FakeDist("0.0.21"),
        "tensorflow": FakeDist("2.18.0"),
        "local": FakeDist("1.0", direct_url={"url": "file:///src", "dir_info": {}}),
    }
    report = {
        "install": [
            item("numpy", "2.1.3"),  # another version
            item("Keras", "3.15.1", is_direct=False),  # the same version from the index: same file
            item("tpukit", "0.1.0", is_direct=True, download_info=vcs),  # the same commit
            item("libtpu", "0.0.10"),
            item("tensorflow_tpu", "2.19.1"),  # not installed before: nothing of it can be loaded
            item(
                "local", "1.0", is_direct=True, download_info={"url": "file:///src", "dir_info": {}}
            ),
        ]
    }
    assert colab.changes(report, before, ["tensorflow"]) == {
        "tensorflow": ("2.18.0", None),
        "numpy": ("2.0.2", "2.1.3"),
        "libtpu": ("0.0.21", "0.0.10"),
        "local": ("1.0", "1.0"),  # a directory may hold other code under the same version
    }
    other_commit = {**vcs, "vcs_info": {"vcs": "git", "commit_id": "def"}}
    report = {"install": [item("tpukit", "0.1.0", is_direct=True, download_info=other_commit)]}
    assert colab.changes(report, before) == {"tpukit": ("0.1.0", "0.1.0")}


def test_restart_reasons_only_for_distributions_whose_modules_are_loaded():
    class Module:
        def __init__(self, path):
            self.__file__ = path

    modules = {
        "numpy": Module("/site/numpy/__init__.py"),
        "numpy.linalg": Module("/site/numpy/linalg/__init__.py"),
        "__editable___tpukit_0_1_0_finder": Module("/site/__editable___tpukit_0_1_0_finder.py"),
        "google": object(),  # a namespace package has no __file__
    }
    before = {
        "numpy": FakeDist("2.0.2", files=["numpy/__init__.py", "numpy/linalg/__init__.py"]),
        "libtpu": FakeDist("0.0.21", files=["libtpu/__init__.py"]),
        "tpukit": FakeDist(
            "0.1.0", files=["__editable___tpukit_0_1_0_finder.py"], top_level="tpukit\n"
        ),
        "protobuf": FakeDist("5.29.0", files=["google/protobuf/__init__.py"], top_level="google\n"),
    }
    changed = {name: (dist.version, "9") for name, dist in before.items()}
    assert colab.restart_reasons(changed, before, modules) == [
        "numpy 2.0.2 is imported in this kernel (numpy, numpy.linalg) and becomes 9"
    ]
    modules["tpukit"] = Module(
        "/src/tpukit/__init__.py"
    )  # an editable install: found by its top-level name
    assert [r.split()[0] for r in colab.restart_reasons(changed, before, modules)] == [
        "numpy",
        "tpukit",
    ]


def test_loaded_modules_of_a_real_distribution():
    assert "keras" in colab.loaded_modules(importlib.metadata.distribution("keras"))


def fake_pip(report: dict, calls: list):
    def run(command, capture_output=True, text=True):
        calls.append(command[3:])
        if "--report" in command:
            with open(command[command.index("--report") + 1], "w") as f:
                json.dump(report, f)
        return subprocess.CompletedProcess(command, 0, "", "")

    return run


def _not_loaded_distribution() -> str:
    """An installed distribution none of whose modules this process imported (for the no-restart case)."""
    for name in ("ruff", "wheel", "pip"):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if not colab.loaded_modules(dist):
            return name
    raise AssertionError("no installed distribution without loaded modules found")


def test_install_raises_restart_exactly_when_a_loaded_distribution_changes(capsys):
    keras_version = importlib.metadata.version("keras")
    calls = []
    report = {"install": [item("keras", "3.10.0"), item("tpukit", "0.1.0", is_direct=True)]}
    with pytest.raises(colab.RestartRuntime) as raised:
        colab.install_tpukit(GIT, runtime="cpu", run=fake_pip(report, calls), force=True)
    message = str(raised.value)
    assert message.startswith("Restart the runtime now (Runtime > Restart session")
    assert (
        f"keras {keras_version} is imported in this kernel (keras" in message
        and "becomes 3.10.0" in message
    )
    requirement = f"tpukit[tensorflow] @ {GIT}"
    assert calls[0][:3] == ["install", "--dry-run", "--report"] and calls[0][-1] == requirement
    assert calls[1] == [
        "install",
        "--quiet",
        "--disable-pip-version-check",
        requirement,
    ]  # installed anyway

    name = _not_loaded_distribution()
    calls.clear()
    report = {"install": [item(name, "0.0.1")]}
    assert colab.install_tpukit(GIT, runtime="cpu", run=fake_pip(report, calls), force=True) == []
    assert "no restart needed" in capsys.readouterr().out
    assert len(calls) == 2

    calls.clear()  # a dry run installs nothing and raises nothing, but says what a real install would need
    report = {"install": [item("keras", "3.10.0")]}
    reasons = colab.install_tpukit(
        GIT, runtime="cpu", dry_run=True, run=fake_pip(report, calls), force=True
    )
    assert len(calls) == 1 and reasons and reasons[0].startswith(f"keras {keras_version}")
    assert "a real install would need a restart" in capsys.readouterr().out


def test_pip_failure_names_the_command_and_pip_message():
    def failing(command, capture_output=True, text=True):
        return subprocess.CompletedProcess(
            command, 1, "", "ERROR: No matching distribution found for x"
        )

    with pytest.raises(RuntimeError, match=r"pip failed \(exit 1\): install x\nERROR: No matching"):
        colab.pip(["install", "x"], failing)


def test_the_cell_is_the_module_block_and_runs_standalone(tmp_path):
    """The cell's code has no tpukit import: it runs in a bare Python (here: its definitions and the plan)."""
    cell = colab.cell_source()
    assert "import tpukit" not in cell and "from tpukit" not in cell
    assert cell.endswith("install_tpukit(TPUKIT_SOURCE, dry_run=INSTALL_DRY_RUN);\n")
    script = cell.replace(colab.CELL_CALL, "") + (
        f"print(install_plan('tpu', {GIT!r}, {{}}, (3, 11))[1])\nprint(detect_runtime({{}}, [], False))\n"
        "print(installed_tpukit('cpu', installed_distributions())[0], 'tpukit' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"['tpukit[tpu] @ {GIT}', 'tensorflow-tpu==2.19.1', 'libtpu==0.0.10']",
        "cpu",
        "True False",  # tpukit is installed here, and the decision imported none of it
    ]


def _pypi() -> None:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
    except OSError:
        pytest.skip("pypi.org:443 is unreachable: the dry-run resolution needs the package index")


@pytest.mark.network  # pip resolves against PyPI (~5-15 s)
def test_dry_run_tpu_branch_resolves_the_pinned_pair_and_needs_a_restart_here(capsys):
    """This process imported the CPU TensorFlow: the TPU branch uninstalls it, so a restart is needed."""
    _pypi()
    reasons = colab.install_tpukit(REPO, dry_run=True, runtime="tpu", engine="tensorflow")
    out = capsys.readouterr().out
    would = out.split("pip would install: ", 1)[1].splitlines()[0].split(", ")
    assert "tensorflow_tpu 2.19.1" in would or "tensorflow-tpu 2.19.1" in would, out
    assert "libtpu 0.0.10" in would and "tpukit 0.1.0" in would
    assert "would uninstall first: tensorflow" in out
    tf_version = importlib.metadata.version("tensorflow")
    assert any(
        r.startswith(f"tensorflow {tf_version} is imported") and "uninstalled" in r for r in reasons
    )


@pytest.mark.network  # pip resolves against PyPI (~5-15 s)
def test_dry_run_cpu_branch_keeps_the_imported_tensorflow_and_keras(capsys):
    """TensorFlow 2.21 is in tpukit's range: pip keeps it, so importing it before the cell needs no restart."""
    _pypi()
    reasons = colab.install_tpukit(REPO, dry_run=True, runtime="cpu", force=True)
    out = capsys.readouterr().out
    assert f"pip install 'tpukit[tensorflow] @ file://{REPO}'" in out
    would = out.split("pip would install: ", 1)[1].splitlines()[0]
    assert "tpukit 0.1.0" in would and "tensorflow " not in would and "keras " not in would
    assert not any(r.startswith(("tensorflow ", "keras ")) for r in reasons), reasons


@pytest.mark.network  # pip resolves against PyPI (~5-15 s)
def test_dry_run_tpu_branch_without_the_tensorflow_tpu_build_resolves_the_jax_extra(capsys):
    """A TPU runtime with no tensorflow-tpu (Colab's): the jax engine's extra, JAX's TPU build (its libtpu) and
    tensorflow-cpu; the `tensorflow` wheel this process imported is removed first, so a restart is needed."""
    _pypi()
    reasons = colab.install_tpukit(REPO, dry_run=True, runtime="tpu")
    out = capsys.readouterr().out
    assert f"TPU runtime, jax engine -> pip install 'tpukit[jax-tpu] @ file://{REPO}'" in out
    would = out.split("pip would install: ", 1)[1].splitlines()[0].split(", ")
    assert any(w.startswith("libtpu ") for w in would), out
    assert any(w.startswith(("tensorflow_cpu ", "tensorflow-cpu ")) for w in would), out
    assert not any(w.startswith(("tensorflow_tpu", "tensorflow-tpu")) for w in would), out
    assert "would uninstall first: tensorflow" in out
    assert any(r.startswith("tensorflow ") and "uninstalled" in r for r in reasons), reasons


@pytest.mark.parametrize(
    "runtime, installed, expected",
    [
        (
            "tpu",
            {"jax": "0.10.2", "libtpu": "0.0.42.1", "tensorflow-cpu": "2.21.0"},
            "jax",
        ),  # Colab's TPU
        ("tpu", {}, "jax"),  # a bare TPU VM: the install cell then installs the jax engine's extra
        ("tpu", {"tensorflow-tpu": "2.19.1", "libtpu": "0.0.10"}, "tensorflow"),
        ("tpu", {"tensorflow-tpu": "2.19.1", "jax": "0.10.2"}, "tensorflow"),
        ("gpu", {"jax": "0.10.2", "tensorflow": "2.21.0"}, "tensorflow"),
        ("cpu", {"jax": "0.10.2"}, "tensorflow"),
    ],
)
def test_choose_engine_is_jax_exactly_on_a_tpu_without_tensorflow_tpu(runtime, installed, expected):
    assert colab.choose_engine(runtime, installed) == expected


@pytest.mark.parametrize(
    "env, files, expected",
    [
        ({"COLAB_TPU_1VM": "1"}, [], "jax"),  # Colab's TPU runtime
        ({"TPU_ACCELERATOR_TYPE": "v5litepod-8"}, [], "jax"),
        ({}, ["/dev/accel0"], "jax"),
        ({}, ["/dev/nvidia0"], "tensorflow"),
        ({}, [], "tensorflow"),
    ],
)
def test_choose_engine_from_a_faked_machine(env, files, expected):
    runtime = colab.detect_runtime(env, files, google_pci=False)
    assert colab.choose_engine(runtime, {"jax": "0.10.2"}) == expected


def test_choose_engine_imports_neither_tensorflow_nor_keras_nor_jax():
    """The notebooks call it before `tpukit.use_engine`: it must not load Keras (which fixes its backend)."""
    script = (
        "import sys, tpukit.notebook\n"
        "print(tpukit.notebook.choose_engine(), tpukit.notebook.choose_engine('tpu'))\n"
        "print(sorted(m for m in ('keras', 'tensorflow', 'jax') if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("COLAB_TPU_1VM", "ISTPUVM")}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0, result.stderr
    # This CPU: tensorflow; a TPU here would be jax (tensorflow-tpu is not installed in this venv).
    assert result.stdout.splitlines() == ["tensorflow jax", "[]"]


def test_install_plan_for_the_jax_engine_on_a_tpu():
    assert colab.install_plan(
        "tpu", GIT, {"tensorflow": "2.21.0", "jax": "0.10.2"}, (3, 12), "jax"
    ) == (
        ["tensorflow"],
        [f"tpukit[jax-tpu] @ {GIT}"],
    )
    assert colab.install_plan("tpu", GIT, {"tensorflow-cpu": "2.21.0"}, (3, 11), "jax") == (
        [],
        [f"tpukit[jax-tpu] @ {GIT}"],
    )
    with pytest.raises(RuntimeError, match=r"Python 3.11 or newer; this runtime runs Python 3.10"):
        colab.install_plan("tpu", GIT, {}, (3, 10), "jax")
    with pytest.raises(ValueError, match=r"on a TPU only; received runtime='cpu', engine='jax'"):
        colab.install_plan("cpu", GIT, {}, (3, 12), "jax")


def test_install_cell_on_a_tpu_without_tensorflow_tpu_plans_the_jax_extra(capsys):
    calls = []
    run = fake_pip({"install": []}, calls)
    colab.install_tpukit(GIT, runtime="tpu", run=run, installed=environment(**GOOD))
    assert calls[0][-1] == f"tpukit[jax-tpu] @ {GIT}"
    assert calls[1] == [
        "uninstall",
        "--yes",
        "--quiet",
        "--disable-pip-version-check",
        "tensorflow",
    ]
    assert (
        f"TPU runtime, jax engine -> pip install 'tpukit[jax-tpu] @ {GIT}'"
        in capsys.readouterr().out
    )


def test_the_jax_extra_exists():
    here = importlib.metadata.distribution("tpukit")
    assert colab.JAX_EXTRA in here.metadata.get_all("Provides-Extra")


def test_installed_tpukit_for_the_jax_engine_judges_the_jax_extra():
    colab_tpu = {"keras": "3.15.1", "numpy": "2.1.0", "jax": "0.10.2", "tensorflow_cpu": "2.21.0"}
    ok, why = colab.installed_tpukit("tpu", environment(**colab_tpu), importable=True, engine="jax")
    assert ok and why.endswith("(tensorflow-cpu 2.21.0, jax 0.10.2, keras 3.15.1)"), why
    ok, why = colab.installed_tpukit(
        "tpu", environment(**{**colab_tpu, "jax": "0.9.0"}), importable=True, engine="jax"
    )
    assert not ok and "jax[tpu]<0.13,>=0.10 (installed: 0.9.0)" in why, why
    ok, why = colab.installed_tpukit(
        "tpu", environment(**{**colab_tpu, "tensorflow": "2.21.0"}), importable=True, engine="jax"
    )
    assert not ok and "tensorflow 2.21.0 (the wheel that tensorflow-cpu replaces)" in why, why
