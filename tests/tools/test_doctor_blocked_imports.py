"""`python -m tpukit.doctor` in the environments it exists for, each made real in a subprocess (issue 17).

TensorFlow missing (neither its module nor its package metadata can be found), installed but not importable,
out of range (a TensorFlow 2.10 package: module and metadata) and Keras out of range (a Keras 3.17 package): the
doctor exits 1 with the finding and the exact install command, and never prints a traceback. `--help` and
`import tpukit` need neither TensorFlow nor Keras.

Each case runs `python -c PRELUDE` (the prelude hides modules and distributions the way a site-packages without
them would, then runs `tpukit.doctor` as `python -m` does), so without a TensorFlow import each takes well under a
second; only the Keras case imports the real TensorFlow (the doctor still connects when only Keras is wrong).
"""

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO

import tpukit
from tpukit.environment import versions

# Hides top-level modules and distributions from the standard path finder, so `import tensorflow` raises
# ModuleNotFoundError and importlib.metadata finds no tensorflow distribution, as where it was never installed.
PRELUDE = textwrap.dedent(
    """
    import importlib.machinery, re, sys

    MODULES, DISTRIBUTIONS = {modules!r}, {distributions!r}

    def _name(dist):
        return re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()

    class Absent(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name.partition(".")[0] in MODULES:
                return None
            return super().find_spec(name, path, target)

        @classmethod
        def find_distributions(cls, *args, **kwargs):
            found = super().find_distributions(*args, **kwargs)
            return (d for d in found if _name(d) not in DISTRIBUTIONS)

    sys.meta_path[:] = [Absent if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
    """
)
RUN_DOCTOR = """
import runpy, sys
sys.argv = ["python -m tpukit.doctor", *{argv!r}]
runpy.run_module("tpukit.doctor", run_name="__main__", alter_sys=True)
"""
# Every distribution that provides the `tensorflow` module.
ABSENT_TF = {
    "modules": ["tensorflow"],
    "distributions": ["tensorflow", "tensorflow-cpu", "tensorflow-tpu"],
}
CLEARED = (
    "TPU_NAME",
    "COLAB_TPU_ADDR",
    "COLAB_TPU_1VM",
    "COLAB_RELEASE_TAG",
    "ISTPUVM",
    "TF_CONFIG",
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_HOST_BOUNDS",
    "KAGGLE_KERNEL_RUN_TYPE",
    "KUBERNETES_SERVICE_HOST",
    "KERAS_BACKEND",
    "PYTHONPATH",
)


def run(code, modules=(), distributions=(), path=None, env=None):
    """Runs `python -c code`, after the prelude when `modules` or `distributions` are to be hidden; `path` goes
    first on PYTHONPATH. Returns (exit code, stdout, stderr)."""
    environ = {k: v for k, v in os.environ.items() if k not in CLEARED}
    environ.update(TF_CPP_MIN_LOG_LEVEL="2", **(env or {}))
    if path:
        environ["PYTHONPATH"] = str(path)
    hidden = PRELUDE.format(modules=set(modules), distributions=set(distributions))
    script = (hidden if modules or distributions else "") + code
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environ,
        timeout=300,
    )
    return result.returncode, result.stdout, result.stderr


def doctor(*argv, **kwargs):
    return run(RUN_DOCTOR.format(argv=list(argv)), **kwargs)


def fake_package(root, name, version, requires=()):
    """A package as pip leaves it: the module (with `__version__`) and its dist-info metadata."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(f'__version__ = "{version}"\n')
    (root / f"{name}-{version}.dist-info").mkdir()
    (root / f"{name}-{version}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    )


def assert_fails_with(result, *expected):
    """Exit 1, each expected text in the report, the verdict last, and no traceback on either stream."""
    code, out, err = result
    assert code == 1, out + err
    assert "Traceback" not in out + err, out + err
    for text in expected:
        assert text in out, out + err
    assert out.rstrip().endswith("NOT OK: fix the [FAIL] lines above."), out + err


ABSENT_TF_AND_JAX = {
    "modules": ["tensorflow", "jax"],
    "distributions": [*ABSENT_TF["distributions"], "jax", "jaxlib", "libtpu"],
}


@pytest.mark.parametrize(
    "env, hidden, command",
    [
        ({}, ABSENT_TF, versions.tensorflow_install_command()),
        # A TPU VM with no JAX either (a Python that has a tensorflow-tpu wheel): TensorFlow's TPU build.
        *(
            [({"ISTPUVM": "1"}, ABSENT_TF_AND_JAX, versions.pinned_tpu().install_command())]
            if versions.tensorflow_tpu_installable(sys.version_info[:2])
            else []
        ),
        # Beside the JAX this venv has (without its libtpu, even where `[tpu-check]` installed it), tensorflow-tpu
        # would replace that libtpu: the jax engine's install.
        (
            {"ISTPUVM": "1"},
            {**ABSENT_TF, "distributions": [*ABSENT_TF["distributions"], "libtpu"]},
            'pip install "jax[tpu]>=0.10,<0.13"',
        ),
    ],
    ids=lambda value: None,
)
def test_tensorflow_missing(env, hidden, command):
    result = doctor(**hidden, env=env)
    assert_fails_with(
        result,
        "[FAIL] tensorflow: TensorFlow is not installed.",
        f"fix: `{command}",
        "restart the runtime",
        "[SKIP] accelerator: not checked",
    )
    assert "tensorflow 2." not in result[1]  # no version of the TensorFlow this machine really has


def test_tensorflow_missing_as_json():
    code, out, err = doctor("--json", **ABSENT_TF)
    assert code == 1 and "Traceback" not in err, out + err
    report = json.loads(out)
    assert report["ok"] is False and report["versions"]["tensorflow"] is None
    assert [(f["level"], f["topic"]) for f in report["findings"]] == [
        ("fail", "tensorflow"),
        ("ok", "keras"),
        ("skip", "accelerator"),
        ("skip", "tpu compiler"),  # libtpu missing, or the jax engine cannot run without TensorFlow
        ("fail", "tensorflow engine"),
        ("fail", "jax engine"),
    ]
    assert report["engines"]["tensorflow"] == {
        "can_run": False,
        "reason": "TensorFlow is not installed.",
    }
    # Both engines read their input with tf.data (with or without JAX installed, the jax engine cannot run).
    assert not report["engines"]["jax"]["can_run"]


def test_tpu_runtime_with_jax_and_no_tensorflow_recommends_the_jax_engine(tmp_path):
    # Colab's TPU runtime as it ships (JAX with its libtpu, no TensorFlow): the fix adds TensorFlow's CPU build for
    # tf.data and trains with the jax engine, instead of tensorflow-tpu (which would replace JAX's libtpu).
    fake_package(tmp_path, "jax", "0.10.2", ['libtpu==0.0.42.*; extra == "tpu"'])
    fake_package(tmp_path, "libtpu", "0.0.42.1")
    env = {"COLAB_RELEASE_TAG": "release-colab_2026", "COLAB_TPU_1VM": "1"}
    result = doctor(**ABSENT_TF, path=tmp_path, env=env)
    assert_fails_with(
        result,
        "[FAIL] tensorflow: TensorFlow is not installed. This TPU runtime's JAX finds the TPU (jax 0.10.2, libtpu "
        "0.0.42.1)",
        'fix: `pip install "tensorflow-cpu>=2.19,<2.22"`, JAX and its libtpu stay (restart only if pip upgraded a package this session had imported); then '
        "train with the jax engine: `python -m tpukit.train RECIPE --set runtime.engine=jax`",
        "[SKIP] accelerator: not checked",
        "[FAIL] jax engine: cannot run here: tf.data reads the input and needs TensorFlow's CPU build",
    )
    assert versions.pinned_tpu().install_command() not in result[1]


def test_tensorflow_installed_but_not_importable():
    # Its metadata is there (as after a half-removed install), its module is not.
    result = doctor(modules=["tensorflow"])
    installed = importlib.metadata.version("tensorflow")  # what this test machine has
    assert_fails_with(
        result,
        f"[FAIL] tensorflow import: tensorflow {installed} is installed but `import tensorflow` failed: "
        "ModuleNotFoundError: No module named 'tensorflow'",
        f'fix: `pip install "tensorflow=={installed}" --force-reinstall`, then restart the runtime',
        "[SKIP] accelerator: not checked",
    )
    # The version line says the version is a tested one; the import line says the import failed: two topics.
    assert f"[OK  ] tensorflow: tensorflow {installed}" in result[1]


def test_tensorflow_out_of_range(tmp_path):
    fake_package(tmp_path, "tensorflow", "2.10.0")
    low, high = (".".join(map(str, v)) for v in (versions.MIN_TF, versions.MAX_TF_EXCLUSIVE))
    result = doctor(path=tmp_path)
    assert_fails_with(
        result,
        f"[FAIL] tensorflow: tensorflow 2.10.0 is outside tpukit's range [{low}, {high}).",
        f'fix: `pip install "tensorflow>={low},<{high}"`, then restart the runtime',
        "[SKIP] accelerator: not checked",
    )


@pytest.mark.integration
def test_keras_out_of_range(tmp_path):
    # The real TensorFlow, a Keras 3.17: the doctor names Keras and still connects (TensorFlow needs no Keras).
    fake_package(tmp_path, "keras", "3.17.0")
    low, high = (".".join(map(str, v)) for v in versions.KERAS_TESTED)
    result = doctor(path=tmp_path)
    assert_fails_with(
        result,
        f"[FAIL] keras: tpukit was tested with Keras >= {low} and < {high} (it patches private Keras internals); "
        "installed: 3.17.0.",
        f'fix: `pip install "keras>={low},<{high}"`, then restart the runtime',
        "[OK  ] accelerator: _DefaultDistributionStrategy with 1 replica(s).",
    )


def test_help_without_tensorflow_or_keras():
    code, out, err = doctor(
        "--help", modules=["tensorflow", "keras"], distributions=["tensorflow", "keras"]
    )
    assert code == 0 and not err, out + err
    assert out.startswith("usage: python -m tpukit.doctor") and "--json" in out and "--tpu" in out


def test_import_tpukit_imports_neither_tensorflow_nor_keras_and_sets_nothing():
    # Both installed and importable here: `import tpukit` (and the doctor's module) must leave them alone.
    code, out, err = run(
        "import logging, os, sys\n"
        "import tpukit\n"
        "assert 'KERAS_BACKEND' not in os.environ, os.environ['KERAS_BACKEND']\n"
        # The doctor's engine modules set the Keras backend default (a user's choice wins) before any import of
        # TensorFlow, which would fix the backend from ~/.keras/keras.json; they import neither.
        "import tpukit.tools.doctor\n"
        "assert os.environ.get('KERAS_BACKEND', 'tensorflow') == 'tensorflow'\n"
        "heavy = sorted(m for m in sys.modules if m.partition('.')[0] in ('tensorflow', 'keras', 'jax'))\n"
        "assert not heavy, heavy\n"
        "handlers = logging.getLogger('tpukit').handlers + logging.getLogger().handlers\n"
        "assert all(isinstance(h, logging.NullHandler) for h in handlers), handlers\n"
        "print('imported', tpukit.__version__)\n"
    )
    assert code == 0 and out == f"imported {tpukit.__version__}\n", out + err


def test_without_tensorflow_import_tpukit_works_and_connect_says_what_to_install():
    code, out, err = run(
        "import tpukit\n"
        "try:\n"
        "    tpukit.connect()\n"
        "except ImportError as error:\n"
        "    print('refused:', error)\n",
        **ABSENT_TF,
    )
    assert code == 0 and "Traceback" not in out + err, out + err
    assert (
        out.startswith("refused: tpukit needs TensorFlow") and "No module named 'tensorflow'" in out
    )
    assert (
        'pip install "tpukit[tensorflow] @ git+' in out and 'pip install "tpukit[tpu] @ git+' in out
    )
    assert "python -m tpukit.doctor" in out


# ---- the other command-line tools, in the same environments --------------------------------------------------

RUN_TOOL = """
import runpy, sys
sys.argv = ["python -m {module}", *{argv!r}]
runpy.run_module("{module}", run_name="__main__", alter_sys=True)
"""
TOOLS = {
    "tpukit.train": ["digits_cnn", "--output_dir", "{out}"],
    "tpukit.check": ["digits_cnn", "--cores", "8", "--tpu-type", "v5e"],
    "tpukit.smoke": ["--output_dir", "{out}"],
}


@pytest.mark.parametrize("module", sorted(TOOLS))
@pytest.mark.integration
def test_every_tool_without_tensorflow_says_what_to_install_and_writes_nothing(tmp_path, module):
    out = tmp_path / "out"
    argv = [a.format(out=out) for a in TOOLS[module]]
    code, stdout, err = run(RUN_TOOL.format(module=module, argv=argv), **ABSENT_TF)
    assert code == 1, stdout + err
    if module == "tpukit.check":
        # The check runs on the engine a TPU run would take: jax where no TensorFlow TPU build is installed.
        wanted = (
            "tpukit's jax engine reads its input with tf.data",
            'pip install "tpukit[jax] @ git+',
        )
    else:
        wanted = "tpukit: error: tpukit needs TensorFlow", 'pip install "tpukit[tensorflow] @ git+'
    assert all(text in err for text in wanted), err
    assert "Traceback" not in stdout + err
    assert not out.exists()


@pytest.mark.integration
def test_train_with_keras_out_of_range_says_what_to_install(tmp_path):
    fake_package(tmp_path, "keras", "3.17.0")
    out = tmp_path / "out"
    code, stdout, err = run(
        RUN_TOOL.format(module="tpukit.train", argv=["digits_cnn", "--output_dir", str(out)]),
        path=tmp_path,
    )
    assert code == 1, stdout + err
    assert "received keras 3.17.0" in err and versions.keras_install_command() in err, err
    assert "Traceback" not in stdout + err and not out.exists()
