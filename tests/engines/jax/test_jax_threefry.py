"""jax's unrolled threefry lowering on XLA:CPU (`tpukit.engines.jax.cpu.use_unrolled_threefry_on_cpu`): after it,
a CPU program draws its random bits without the rolled while loop and draws the same bits (raw bits, and Keras'
dropout mask with a fixed seed, compared with the ones jax's own CPU lowering drew in the same process); the off
switch and another jax keep jax's lowering and say why; the engine registers it once its devices are known to be
CPUs, and a jax engine run records what it did. Nothing here measures speed (docs/engines.md has the measurements,
benchmarks/vs_keras.py the whole runs)."""

import pytest
from helpers import run_jax_snippet

from tpukit.engines.jax import cpu

# One process: a lowering rule, once registered, stays for the process.
CHILD = """
import json, sys
import jax, jax.numpy as jnp
import keras
from tpukit.engines.jax import cpu

def draw():
    # Fresh functions each time: jit caches a compiled program per function.
    bits = jax.jit(lambda key: jax.random.bits(key, (4096,)))
    dropout = jax.jit(lambda x: keras.random.dropout(x, 0.3, seed=7))
    key = jax.random.key(11)
    text = bits.lower(key).as_text()
    return (bits(key).tolist(), (dropout(jnp.ones((64, 48))) == 0).tolist(), "stablehlo.while" in text)

bits, mask, loop = draw()
if sys.argv[1] == "engine":  # as tpukit.run/fit get it: the engine's devices, known in `hardware`
    import tempfile
    import tpukit.engines
    engine = tpukit.engines.get("jax")
    engine.hardware(None, engine.Mesh(1, 1, jax.devices()[:1]), tempfile.mkdtemp())
    choice = cpu.ThreefryLowering(**cpu.report()["jax_cpu_threefry"])
else:
    choice = cpu.use_unrolled_threefry_on_cpu()
bits_after, mask_after, loop_after = draw()
print("RESULT " + json.dumps({
    "choice": choice.as_dict(), "same_bits": bits == bits_after, "same_mask": mask == mask_after,
    "dropped": sum(map(sum, mask)), "loop_before": loop, "loop_after": loop_after,
}))
"""


def _child(case: str = "direct", **env) -> dict:
    return run_jax_snippet(CHILD, case, drop=(cpu.CPU_THREEFRY_ENV,), **env)


def _measured_jax() -> bool:
    from importlib import metadata

    return cpu.threefry_choice(metadata.version("jax"), "").unrolled


@pytest.mark.skipif(
    not _measured_jax(), reason="the unrolled lowering is registered on jax 0.10 only"
)
@pytest.mark.integration
def test_the_unrolled_lowering_draws_the_same_bits_without_the_while_loop():
    result = _child()
    assert result["choice"]["unrolled"] is True, result
    assert result["loop_before"] is True and result["loop_after"] is False, result
    assert result["same_bits"] and result["same_mask"], result
    # A real dropout mask: about 30% of 3,072 entries dropped, not none or all.
    assert 700 < result["dropped"] < 1150, result


@pytest.mark.skipif(
    not _measured_jax(), reason="the unrolled lowering is registered on jax 0.10 only"
)
@pytest.mark.integration
def test_the_engine_registers_it_once_its_devices_are_cpus():
    result = _child("engine")
    assert result["choice"]["unrolled"] is True, result
    assert result["loop_before"] is True and result["loop_after"] is False, result
    assert result["same_bits"] and result["same_mask"], result


@pytest.mark.integration
def test_the_switch_keeps_jaxs_own_lowering():
    result = _child(**{cpu.CPU_THREEFRY_ENV: "rolled"})
    assert result["choice"] == {
        "unrolled": False,
        "reason": f"jax's rolled CPU lowering: {cpu.CPU_THREEFRY_ENV}=rolled",
    }
    assert result["loop_before"] is True and result["loop_after"] is True, result
    assert result["same_bits"] and result["same_mask"], result


def test_which_jax_versions_and_switch_values_get_it():
    assert cpu.threefry_choice("0.10.2", "").unrolled is True
    assert cpu.threefry_choice("0.10.2", " Unrolled ").unrolled is True
    assert cpu.threefry_choice("0.10.0", "off").unrolled is False
    other = cpu.threefry_choice("0.12.1", "")
    assert other == cpu.ThreefryLowering(
        False,
        "jax's rolled CPU lowering: the unrolled one was measured on jax 0.10 only; this is 0.12.1",
    )
    # A value that is neither on nor off (a typo) keeps jax's lowering and says which values there are.
    typo = cpu.threefry_choice("0.10.2", "roled")
    assert typo.unrolled is False and "='roled' is not one of rolled, 0, off" in typo.reason


def test_an_unknown_switch_value_is_logged(monkeypatch, caplog):
    monkeypatch.setenv(cpu.CPU_THREEFRY_ENV, "roled")
    with caplog.at_level("WARNING", logger="tpukit"):
        choice = cpu.use_unrolled_threefry_on_cpu.__wrapped__()  # not the process's cached answer
    assert choice.unrolled is False
    assert [r.getMessage() for r in caplog.records] == [f"tpukit: {choice.reason}."]


def test_a_report_applies_nothing(monkeypatch):
    # metrics.json reads what was done (`cpu.report`); registering then, after the steps were lowered, would record
    # what they never got.
    calls = []
    monkeypatch.setattr(cpu, "_threefry", None)  # no devices known in this process yet
    monkeypatch.setattr(cpu, "use_unrolled_threefry_on_cpu", lambda: calls.append(True))
    monkeypatch.setattr(cpu.compat, "register_unrolled_threefry_on_cpu", lambda: calls.append(True))
    recorded = cpu.report()["jax_cpu_threefry"]
    assert recorded["unrolled"] is False and "hardware() did not run" in recorded["reason"]
    assert not calls
