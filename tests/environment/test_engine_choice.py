"""`runtime.engine: auto`: which engine a run trains with, from faked environments (TPU variables and device files,
tensorflow-tpu installed or not, TF_CONFIG, a Keras already imported), decided without importing TensorFlow,
Keras or JAX."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from tpukit.environment import backend, engine_choice

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NO_TPU = {}  # no TPU variables
JAX_REASON = "auto: a TPU is attached and no TensorFlow TPU build is installed"


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """This process as a fresh one on a faked machine: no Keras imported, no earlier auto decision, no TPU
    device files (a `tmp_path` root) unless a test makes them, and tensorflow-tpu installed only when a test
    says `installed.add("tensorflow-tpu")`."""
    installed: set[str] = set()
    real = engine_choice.quiet.tpu_attached

    def distribution(name):
        if name in installed:
            return object()
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(engine_choice.importlib.metadata, "distribution", distribution)
    monkeypatch.setattr(engine_choice, "keras_backend", lambda: None)
    monkeypatch.setattr(engine_choice, "_chosen", None)
    monkeypatch.setattr(engine_choice.quiet, "tpu_attached", lambda root="/": real(str(tmp_path)))
    for name in ("TF_CONFIG", "COLAB_TPU_1VM", "ISTPUVM", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID"):
        monkeypatch.delenv(name, raising=False)
    return installed


def _google_tpu_chip(root):
    """A v5e-style chip under `root`: /dev/vfio/0 backed by a Google PCI device."""
    (root / "dev" / "vfio").mkdir(parents=True)
    (root / "dev" / "vfio" / "0").write_text("")
    device = root / "sys" / "bus" / "pci" / "devices" / "0000:00:04.0"
    device.mkdir(parents=True)
    (device / "vendor").write_text(engine_choice.quiet.GOOGLE_PCI_VENDOR + "\n")


@pytest.mark.parametrize(
    "variables",
    [{"COLAB_TPU_1VM": "1"}, {"ISTPUVM": "1"}, {"TPU_ACCELERATOR_TYPE": "v5litepod-8"}],
    ids=["colab", "kaggle", "tpu_vm"],
)
def test_a_tpu_without_tensorflow_tpu_trains_on_jax(machine, monkeypatch, variables):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    assert engine_choice.resolve("auto") == engine_choice.EngineChoice("jax", JAX_REASON)


def test_a_tpu_with_tensorflow_tpu_trains_on_tensorflow(machine, monkeypatch):
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-8")
    machine.add("tensorflow-tpu")
    choice = engine_choice.resolve("auto")
    assert choice.engine == "tensorflow"
    assert choice.reason == "auto: a TPU is attached and a TensorFlow TPU build is installed"


def test_tpu_chips_are_found_by_their_device_files(machine, tmp_path):
    assert engine_choice.resolve("auto").engine == "tensorflow"  # no chip yet
    engine_choice._chosen = None
    _google_tpu_chip(tmp_path)
    assert engine_choice.tpu_present({}, str(tmp_path))
    assert engine_choice.resolve("auto").engine == "jax"


def test_a_vfio_device_that_is_not_google_is_no_tpu(tmp_path):
    (tmp_path / "dev" / "vfio").mkdir(parents=True)
    (tmp_path / "dev" / "vfio" / "0").write_text("")
    assert not engine_choice.tpu_present(NO_TPU, str(tmp_path))


def test_colabs_other_runtimes_are_not_tpus():
    """Colab sets COLAB_TPU_1VM="" on its CPU and GPU runtimes."""
    assert not engine_choice.tpu_environment({"COLAB_TPU_1VM": ""})
    assert engine_choice.tpu_environment({"COLAB_TPU_1VM": "1"})


def test_a_tf_config_cluster_trains_on_tensorflow_even_on_a_tpu(machine, monkeypatch):
    cluster = {"cluster": {"worker": ["a:2222", "b:2222"]}, "task": {"type": "worker", "index": 0}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    monkeypatch.setenv("COLAB_TPU_1VM", "1")
    assert engine_choice.resolve("auto") == engine_choice.EngineChoice(
        "tensorflow", "auto: $TF_CONFIG describes a cluster"
    )


@pytest.mark.parametrize("value", ["", "{}", '{"task": {"type": "worker", "index": 0}}'])
def test_a_tf_config_without_a_cluster_decides_nothing(value):
    assert not engine_choice.tf_config_cluster({"TF_CONFIG": value})


def test_a_malformed_tf_config_goes_to_the_engine_that_explains_it():
    assert engine_choice.tf_config_cluster({"TF_CONFIG": "{not json"})


def test_a_cpu_or_gpu_machine_trains_on_tensorflow_as_before(machine):
    assert engine_choice.resolve("auto") == engine_choice.EngineChoice(
        "tensorflow", "auto: no TPU is attached (GPUs or a CPU)"
    )


@pytest.mark.parametrize("backend_name", ["jax", "tensorflow"])
def test_a_keras_imported_already_decides_by_its_backend(machine, monkeypatch, backend_name):
    """First in the order: the backend is fixed at Keras' first import, even on a TPU with tensorflow-tpu."""
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-8")
    machine.add("tensorflow-tpu")
    choice = engine_choice.choose(backend=backend_name)
    assert choice.engine == backend_name
    assert choice.reason == f"auto: Keras was imported already, with the {backend_name} backend"


def test_a_keras_on_another_backend_is_passed_over(machine, monkeypatch):
    monkeypatch.setenv("ISTPUVM", "1")
    assert engine_choice.choose(backend="torch").engine == "jax"


def test_the_first_decision_keeps_its_reason_once_keras_loaded_its_backend(machine, monkeypatch):
    """The CLI resolves auto, sets the backend, Keras loads it; the plan resolves again and gives the first
    reason, not "Keras was imported already"."""
    monkeypatch.setenv("COLAB_TPU_1VM", "1")
    first = engine_choice.resolve("auto")
    monkeypatch.setattr(engine_choice, "keras_backend", lambda: "jax")
    assert engine_choice.resolve("auto") == first == engine_choice.EngineChoice("jax", JAX_REASON)
    # Keras loaded another backend than the one chosen (the user imported it first): its backend decides.
    monkeypatch.setattr(engine_choice, "keras_backend", lambda: "tensorflow")
    assert engine_choice.resolve("auto").engine == "tensorflow"


def test_an_explicit_engine_is_kept_whatever_the_machine(machine, monkeypatch):
    monkeypatch.setenv("COLAB_TPU_1VM", "1")
    assert engine_choice.resolve("tensorflow") == engine_choice.EngineChoice(
        "tensorflow", "the recipe's runtime.engine"
    )
    assert engine_choice.resolve("jax").engine == "jax"
    with pytest.raises(ValueError, match="received 'torch'"):
        engine_choice.resolve("torch")


def test_the_check_resolves_auto_as_a_run_on_the_tpu_would(machine):
    """`tpukit check` asks about a TPU from a CPU: auto by the TPU rule, from what is installed here."""
    assert engine_choice.for_tpu("auto").describe() == (
        "engine jax (auto: on a TPU, as no TensorFlow TPU build is installed here)"
    )
    machine.add("tensorflow-tpu")
    assert engine_choice.for_tpu("auto").engine == "tensorflow"
    assert engine_choice.for_tpu("jax").engine == "jax"


def test_use_engine_sets_the_backend_auto_chose(machine, monkeypatch):
    monkeypatch.setitem(sys.modules, "keras", None)
    del sys.modules["keras"]  # restored by monkeypatch: Keras "not imported" for this call
    monkeypatch.setenv("KERAS_BACKEND", "tensorflow")
    monkeypatch.setattr(backend, "_defaulted", "tensorflow")  # tpukit's default, replaced silently
    monkeypatch.setenv("ISTPUVM", "1")
    assert backend.use_engine("auto") == "jax"
    assert os.environ["KERAS_BACKEND"] == "jax"


def test_the_choice_imports_no_tensorflow_keras_or_jax():
    """In a fresh process on this machine (a CPU): the decision, and the backend it sets, with none of them
    imported."""
    code = (
        "import sys\n"
        "from tpukit.environment import backend, engine_choice\n"
        "print(engine_choice.resolve('auto').describe(), backend.use_default())\n"
        "print(sorted(m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "TF_CONFIG")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    expected = engine_choice.choose(env, backend=None)  # the same machine, seen from this process
    assert done.stdout.splitlines() == [
        f"{expected.describe()} {backend.BACKENDS[expected.engine]}",
        "[]",
    ]


@pytest.mark.parametrize("address", ["grpc://10.0.0.2:8470", "my-tpu-node"])
def test_a_runtime_tpu_to_connect_to_trains_on_tensorflow_even_without_tensorflow_tpu(
    machine, address
):
    choice = engine_choice.resolve("auto", tpu_address=address)
    assert choice.engine == "tensorflow"
    assert (
        choice.reason == f"auto: runtime.tpu={address!r} names a TPU that TPUStrategy connects to"
    )


def test_runtime_tpu_local_is_this_machines_tpu(machine, monkeypatch):
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    assert engine_choice.resolve("auto", tpu_address="local").engine == "jax"
    assert engine_choice.resolve("auto", tpu_address=None).engine == "jax"


def test_the_command_line_reads_runtime_tpu_for_auto(tmp_path):
    import yaml
    from helpers import digits_recipe

    from tpukit.recipe.loading import requested_runtime

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(digits_recipe()))
    assert requested_runtime(str(path)) == ("auto", None)
    assert requested_runtime(str(path), ["runtime.tpu=grpc://10.0.0.2:8470"]) == (
        "auto",
        "grpc://10.0.0.2:8470",
    )
    assert requested_runtime(str(path), ["runtime.engine=jax"]) == ("jax", None)
