"""The XLA:CPU flags the jax engine adds before JAX's backend starts, where the run's devices will be CPUs
(`tpukit.engines.jax.cpu.before_backends`): on the jaxlib they were measured on, a convolution's weight gradient compiles to XLA's own convolution instead of
YNNPACK's (the program itself is read, from a process of its own); the user's own XLA_FLAGS, the off switch, a
backend already started, another jaxlib and a host whose devices may be accelerators each leave $XLA_FLAGS as it was
and say why. Nothing here measures speed (benchmarks/vs_keras.py does; docs/engines.md has the measurements)."""

import os
import sys
import types

import pytest
from helpers import expected_xla_cpu_flags, run_jax_snippet

from tpukit.engines.jax import cpu

FLAG = "--xla_cpu_experimental_ynn_fusion_type=-individual_convolution"

# One process per case: XLA reads $XLA_FLAGS once, when JAX's backend starts.
CHILD = """
import json, os, sys
from tpukit.engines.jax import cpu
if sys.argv[1] == "started":
    import jax
    jax.devices()
flags = cpu.before_backends()
import jax, jax.numpy as jnp
def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")).sum()
weight_gradient = jax.jit(jax.grad(conv, 1)).lower(jnp.ones((8, 13, 13, 32)), jnp.ones((3, 3, 32, 64)))
program = weight_gradient.compile().as_text()
print("RESULT " + json.dumps({"flags": flags.as_dict(), "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                              "ynn": "__ynn_fusion" in program, "convolution": "convolution(" in program}))
"""


def _child(case: str = "", **env) -> dict:
    return run_jax_snippet(CHILD, case, drop=("XLA_FLAGS", cpu.CPU_XLA_FLAGS_ENV), **env)


needs_measured_jaxlib = pytest.mark.skipif(
    expected_xla_cpu_flags() != [FLAG],
    reason="the flag is added only on the jaxlib it was measured on, beside a TensorFlow that knows it "
    "(cpu.CPU_XLA_FLAGS); test_which_versions_get_the_flag covers the others",
)


@needs_measured_jaxlib
@pytest.mark.integration
def test_the_weight_gradient_compiles_to_xlas_convolution_with_the_flag_and_to_ynnpack_without():
    added = _child()
    assert added["flags"]["added"] == [FLAG] and added["XLA_FLAGS"] == FLAG
    assert added["convolution"] and not added["ynn"]
    # The control: the same program without the flag is YNNPACK's, so the flag is what changed it.
    off = _child(**{cpu.CPU_XLA_FLAGS_ENV: "0"})
    assert off["flags"] == {"added": [], "reason": f"none: {cpu.CPU_XLA_FLAGS_ENV}=0"}
    assert off["XLA_FLAGS"] == "" and off["ynn"]


@needs_measured_jaxlib
@pytest.mark.integration
def test_the_users_own_xla_flags_are_kept_and_others_are_added_to():
    mine = "--xla_cpu_experimental_ynn_fusion_type=-individual_dot"
    kept = _child(XLA_FLAGS=mine)
    assert kept["flags"]["added"] == [] and kept["XLA_FLAGS"] == mine
    assert "XLA_FLAGS sets it already" in kept["flags"]["reason"]
    other = _child(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert (
        other["XLA_FLAGS"] == f"--xla_force_host_platform_device_count=2 {FLAG}"
        and not other["ynn"]
    )


@needs_measured_jaxlib
@pytest.mark.integration
def test_a_backend_started_before_the_engine_gets_no_flags_and_the_reason_says_how_to_get_them():
    started = _child("started")
    assert started["flags"]["added"] == [] and started["XLA_FLAGS"] == "" and started["ynn"]
    assert (
        "JAX's backend started before" in started["flags"]["reason"]
        and "Fix:" in started["flags"]["reason"]
    )


def test_which_versions_get_the_flag():
    assert cpu.cpu_xla_flags("0.10.2", "2.21.0", "") == ([FLAG], [])
    assert cpu.cpu_xla_flags("0.10.2", None, "") == ([FLAG], [])  # no TensorFlow in the process
    assert cpu.cpu_xla_flags("0.12.1", "2.21.0", "") == (
        [],
        ["--xla_cpu_experimental_ynn_fusion_type: measured on jaxlib 0.10 only; this is 0.12.1"],
    )
    # TensorFlow 2.19.1 and 2.20.0 abort at their first XLA compile on a flag their XLA does not know.
    for tensorflow in ("2.19.1", "2.20.0"):
        wanted, skipped = cpu.cpu_xla_flags("0.10.2", tensorflow, "")
        assert wanted == [] and f"TensorFlow {tensorflow}'s XLA does not know it" in skipped[0]
    assert cpu.cpu_xla_flags("0.10.2", "2.21.0", FLAG.replace("convolution", "dot")) == (
        [],
        ["--xla_cpu_experimental_ynn_fusion_type: XLA_FLAGS sets it already"],
    )


def test_the_off_switch_says_how_it_was_set(monkeypatch):
    monkeypatch.setenv(cpu.CPU_XLA_FLAGS_ENV, "off")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    monkeypatch.setattr(cpu, "_flags", None)  # not the process's answer: put back after the test
    flags = cpu.before_backends()
    assert flags == cpu.XlaFlags((), f"none: {cpu.CPU_XLA_FLAGS_ENV}=off")
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


def _fake_plugin(monkeypatch, tmp_path, name: str) -> None:
    """A PJRT plugin as JAX discovers one (the `jax_plugins` namespace package); nothing here starts it."""
    (tmp_path / "jax_plugins" / name).mkdir(parents=True)
    (tmp_path / "jax_plugins" / name / "__init__.py").write_text("")
    namespace = types.ModuleType("jax_plugins")
    namespace.__path__ = [str(tmp_path / "jax_plugins")]
    monkeypatch.setitem(sys.modules, "jax_plugins", namespace)  # put back as it was after the test


def test_an_accelerator_host_gets_none(monkeypatch, tmp_path):
    _fake_plugin(monkeypatch, tmp_path, "jax_cuda12_plugin")
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    monkeypatch.setattr(cpu, "requested_platforms", lambda: [])  # JAX picks its platforms
    assert "jax_cuda12_plugin" in cpu.accelerator_plugins()
    assert cpu.accelerator_hints(root=str(tmp_path)) == [
        f"an accelerator backend is installed ({', '.join(cpu.accelerator_plugins())})"
    ]
    # JAX asked for the CPU alone: the accelerator is not used, and the CPU flags apply again.
    monkeypatch.setattr(cpu, "requested_platforms", lambda: ["cpu"])
    assert cpu.accelerator_hints(root=str(tmp_path)) == []
    monkeypatch.setattr(cpu, "requested_platforms", lambda: [])
    monkeypatch.setenv("TPU_LIBRARY_PATH", "/opt/libtpu.so")
    assert "libtpu" in cpu.accelerator_plugins()
    if expected_xla_cpu_flags() == [FLAG]:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
        monkeypatch.delenv(cpu.CPU_XLA_FLAGS_ENV, raising=False)
        monkeypatch.setattr(cpu, "_flags", None)
        flags = cpu.before_backends()
        assert flags.added == () and "XLA_FLAGS" not in os.environ
        assert f"{FLAG}: this run's devices may not be CPUs (an accelerator backend" in flags.reason


def test_an_attached_tpu_or_platforms_asked_for_are_hints(monkeypatch, tmp_path):
    for name in ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_ID", "COLAB_TPU_1VM", "ISTPUVM"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cpu, "accelerator_plugins", lambda: [])
    monkeypatch.setattr(cpu, "requested_platforms", lambda: [])
    assert cpu.accelerator_hints(root=str(tmp_path)) == []
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "accel0").write_text("")  # a v4 TPU chip's device file
    assert cpu.accelerator_hints(root=str(tmp_path)) == ["a TPU is attached"]
    monkeypatch.setattr(cpu, "requested_platforms", lambda: ["cuda", "cpu"])
    assert cpu.accelerator_hints(root=str(tmp_path)) == ["JAX is asked for cuda,cpu"]


def test_the_requested_platforms_are_jaxs():
    import jax

    before = jax.config.jax_platforms
    jax.config.update(
        "jax_platforms", "TPU, cpu"
    )  # as JAX_PLATFORMS sets it; nothing is started here
    try:
        assert cpu.requested_platforms() == ["tpu", "cpu"]
    finally:
        jax.config.update("jax_platforms", before)
