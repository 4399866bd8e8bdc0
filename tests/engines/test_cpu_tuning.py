"""The engines' CPU-only tuning (`tpukit/engines/jax/cpu.py`, `tpukit/engines/tensorflow/cpu.py`) acts only when the
run's devices are CPUs. On a faked accelerator (a TPU's environment variable, faked TPU or GPU devices) no XLA_FLAGS
are edited (or those added on a wrong guess are taken back), no lowering is registered, the heap is not frozen and
no SavedModel process starts before `export`, and metrics.json's entries say why; on the CPU, the control, each of
them acts, so a gate that let everything through or nothing would fail here. One process per case: each of them
holds for the rest of a process."""

from importlib import metadata

import pytest
from helpers import run_jax_snippet

from tpukit.engines.jax import cpu

# What stays the process's: $XLA_FLAGS, lowering rules, the frozen heap. Nothing of a TPU is started: the fake
# devices only say which platform they are, as a JAX device does.
JAX_CHILD = """
import gc, json, os, sys, tempfile, types
import jax
import tpukit.engines
from tpukit.engines.jax import cpu

before = os.environ.get("XLA_FLAGS")
engine = tpukit.engines.get("jax")  # the engine's checks: XLA:CPU flags decided before JAX's backends start
after_checks = os.environ.get("XLA_FLAGS")

class FakeTpu:
    platform, device_kind, id = "tpu", "TPU v5 lite", 0

devices = jax.devices()[:1] if sys.argv[1] == "cpu" else [FakeTpu()]
started = []

class NoProcess:  # the SavedModel's exporting process, counted instead of started
    def close(self):
        pass

engine.SavedModelExport.start = classmethod(lambda cls: started.append(True) or NoProcess())
hardware = engine.hardware(None, engine.Mesh(1, 1, devices), tempfile.mkdtemp())
the_plan = types.SimpleNamespace(training=True, chief=True, strategy_kind=hardware.kind)
engine._close_saved_model_export(engine._start_saved_model_export(the_plan))
# jax.random's program for this process's CPU: the rolled while loop unless the unrolled lowering is registered.
program = jax.jit(lambda key: jax.random.bits(key, (64,))).lower(jax.random.key(0)).as_text()
print("RESULT " + json.dumps({
    "kind": hardware.kind, "before": before, "after_checks": after_checks, "now": os.environ.get("XLA_FLAGS"),
    "frozen": gc.get_freeze_count(), "started_early": len(started), "while_loop": "stablehlo.while" in program,
    "report": cpu.report(),
}))
"""

SWITCHES = ("XLA_FLAGS", cpu.CPU_XLA_FLAGS_ENV, cpu.CPU_THREEFRY_ENV, "TPUKIT_GC_FREEZE")
TPU_VARIABLES = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "COLAB_TPU_1VM", "ISTPUVM")


def _jax(case: str, **env) -> dict:
    return run_jax_snippet(JAX_CHILD, case, drop=SWITCHES + TPU_VARIABLES, **env)


def _wanted_flags() -> list[str]:
    """The XLA:CPU flags this jaxlib and TensorFlow take on a CPU-only host."""
    import tensorflow as tf

    return cpu.cpu_xla_flags(metadata.version("jaxlib"), tf.__version__, "")[0]


def _unrolls() -> bool:
    return cpu.threefry_choice(metadata.version("jax"), "").unrolled


@pytest.mark.integration
def test_on_cpus_the_jax_engines_tuning_acts():
    result = _jax("cpu")
    report = result["report"]
    assert result["kind"] == "jax_cpu"
    wanted = _wanted_flags()
    assert report["xla_cpu_flags"]["added"] == wanted
    assert result["after_checks"] == (" ".join(wanted) or None) == result["now"]
    assert report["jax_cpu_threefry"]["unrolled"] is _unrolls()
    assert result["while_loop"] is not _unrolls()
    assert result["frozen"] > 100_000 and report["gc_freeze"]["frozen"] is True
    assert result["started_early"] == 1  # the exporting process starts at `build`


def _nothing_acted(result: dict, why: str) -> None:
    report = result["report"]
    assert result["kind"] == "jax_tpu"
    assert result["now"] == result["before"] is None and report["xla_cpu_flags"]["added"] == []
    assert result["while_loop"] is True  # jax's own rolled lowering: nothing registered
    assert report["jax_cpu_threefry"] == {"unrolled": False, "reason": f"jax's own lowering: {why}"}
    assert result["frozen"] == 0
    assert report["gc_freeze"] == {"frozen": False, "reason": f"not frozen: {why}"}
    assert result["started_early"] == 0  # `export` starts it


@pytest.mark.integration
def test_on_a_tpu_host_no_xla_flags_are_added_and_nothing_else_acts():
    # A TPU VM's variable, JAX left to pick its platforms: the devices may be the TPU's, so no flag is added.
    result = _jax("tpu", JAX_PLATFORMS=None, TPU_ACCELERATOR_TYPE="v5litepod-8")
    assert result["after_checks"] is None
    reason = result["report"]["xla_cpu_flags"]["reason"]
    if _wanted_flags():
        assert "this run's devices may not be CPUs (a TPU is attached)" in reason, reason
    _nothing_acted(result, "the devices are tpu, not CPUs")


@pytest.mark.integration
def test_flags_added_on_a_wrong_guess_are_taken_back_once_the_devices_are_known():
    # JAX_PLATFORMS=cpu guesses CPUs; the devices (faked) are a TPU's.
    result = _jax("tpu")
    wanted = _wanted_flags()
    assert result["after_checks"] == (" ".join(wanted) or None)
    _nothing_acted(result, "the devices are tpu, not CPUs")
    if wanted:
        assert result["report"]["xla_cpu_flags"]["reason"] == (
            f"{' '.join(wanted)}: taken back, the devices are tpu, not CPUs"
        )


TF_CHILD = """
import gc, json, sys, tempfile
sys.path.insert(0, "tests")
import tensorflow as tf
from tpukit.engines.tensorflow import cpu

seen = {}
seen["tpu"] = [cpu.tune("tpu"), gc.get_freeze_count(), cpu.report()["gc_freeze"]]
real = tf.config.list_physical_devices
tf.config.list_physical_devices = lambda kind=None: ["GPU:0"] if kind == "GPU" else real(kind)  # a faked GPU
seen["gpu"] = [cpu.tune("mirrored"), gc.get_freeze_count(), cpu.report()["gc_freeze"]]
tf.config.list_physical_devices = real

import tpukit.engines
from helpers import digits_recipe
from tpukit.recipe import from_dict

engine = tpukit.engines.get("tensorflow")
recipe = from_dict(digits_recipe(), "digits_cnn.yaml")
hardware = engine.hardware(recipe, tf.distribute.get_strategy(), tempfile.mkdtemp())
seen["cpu"] = [hardware.kind, gc.get_freeze_count(), cpu.report()["gc_freeze"]]
print("RESULT " + json.dumps(seen))
"""


@pytest.mark.integration
def test_the_tensorflow_engine_freezes_the_heap_on_cpus_only():
    seen = run_jax_snippet(TF_CHILD, "", drop=SWITCHES, KERAS_BACKEND="tensorflow")
    assert seen["tpu"] == [
        False,
        0,
        {"frozen": False, "reason": "not frozen: the devices are TPUs, not CPUs"},
    ]
    assert seen["gpu"] == [
        False,
        0,
        {"frozen": False, "reason": "not frozen: the devices are GPUs, not CPUs"},
    ]
    kind, frozen, recorded = seen["cpu"]
    assert kind == "default" and frozen > 100_000 and recorded["frozen"] is True


def test_a_run_on_cpus_that_froze_nothing_says_why(monkeypatch):
    from tpukit.engines.keras import gc_freeze

    monkeypatch.setattr(gc_freeze, "_done", None)
    monkeypatch.setenv(gc_freeze.FREEZE_ENV, "0")
    assert gc_freeze.freeze_the_imports() == gc_freeze.Freeze(
        False, f"not frozen: {gc_freeze.FREEZE_ENV}=0"
    )


@pytest.mark.parametrize("kind", ["jax_tpu", "jax_gpu"])
def test_the_saved_model_process_starts_early_on_cpus_only(kind):
    assert cpu.export_starts_early("jax_cpu") is True
    assert cpu.export_starts_early(kind) is False
