"""The XLA:CPU flags the jax engine adds before JAX's backend starts (`tpukit.engines.jax.compat.use_cpu_xla_flags`):
on the jaxlib they were measured on, a convolution's weight gradient compiles to XLA's own convolution instead of
YNNPACK's (the program itself is read, from a process of its own); the user's own XLA_FLAGS, the off switch, a
backend already started and another jaxlib each leave $XLA_FLAGS as it was and say why. Nothing here measures speed
(benchmarks/vs_keras.py does; the measurements are in compat.py)."""

import os
import sys
import types

import pytest
from helpers import expected_xla_cpu_flags, run_jax_snippet

from tpukit.engines.jax import compat

FLAG = "--xla_cpu_experimental_ynn_fusion_type=-individual_convolution"

# One process per case: XLA reads $XLA_FLAGS once, when JAX's backend starts.
CHILD = """
import json, os, sys
from tpukit.engines.jax import compat
if sys.argv[1] == "started":
    import jax
    jax.devices()
flags = compat.use_cpu_xla_flags()
import jax, jax.numpy as jnp
def conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")).sum()
weight_gradient = jax.jit(jax.grad(conv, 1)).lower(jnp.ones((8, 13, 13, 32)), jnp.ones((3, 3, 32, 64)))
program = weight_gradient.compile().as_text()
print("RESULT " + json.dumps({"flags": flags.as_dict(), "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
                              "ynn": "__ynn_fusion" in program, "convolution": "convolution(" in program}))
"""


def _child(case: str = "", **env) -> dict:
    return run_jax_snippet(CHILD, case, drop=("XLA_FLAGS", compat.CPU_XLA_FLAGS_ENV), **env)


needs_measured_jaxlib = pytest.mark.skipif(
    expected_xla_cpu_flags() != [FLAG],
    reason="the flag is added only on the jaxlib it was measured on, beside a TensorFlow that knows it "
    "(compat.CPU_XLA_FLAGS); test_which_versions_get_the_flag covers the others",
)


@needs_measured_jaxlib
def test_the_weight_gradient_compiles_to_xlas_convolution_with_the_flag_and_to_ynnpack_without():
    added = _child()
    assert added["flags"]["added"] == [FLAG] and added["XLA_FLAGS"] == FLAG
    assert added["convolution"] and not added["ynn"]
    # The control: the same program without the flag is YNNPACK's, so the flag is what changed it.
    off = _child(**{compat.CPU_XLA_FLAGS_ENV: "0"})
    assert off["flags"] == {"added": [], "reason": f"none: {compat.CPU_XLA_FLAGS_ENV}=0"}
    assert off["XLA_FLAGS"] == "" and off["ynn"]


@needs_measured_jaxlib
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
def test_a_backend_started_before_the_engine_gets_no_flags_and_the_reason_says_how_to_get_them():
    started = _child("started")
    assert started["flags"]["added"] == [] and started["XLA_FLAGS"] == "" and started["ynn"]
    assert (
        "JAX's backend started before" in started["flags"]["reason"]
        and "Fix:" in started["flags"]["reason"]
    )


def test_which_versions_get_the_flag():
    assert compat.cpu_xla_flags("0.10.2", "2.21.0", "") == ([FLAG], [])
    assert compat.cpu_xla_flags("0.10.2", None, "") == ([FLAG], [])  # no TensorFlow in the process
    assert compat.cpu_xla_flags("0.12.1", "2.21.0", "") == (
        [],
        ["--xla_cpu_experimental_ynn_fusion_type: measured on jaxlib 0.10 only; this is 0.12.1"],
    )
    # TensorFlow 2.19.1 and 2.20.0 abort at their first XLA compile on a flag their XLA does not know.
    for tensorflow in ("2.19.1", "2.20.0"):
        wanted, skipped = compat.cpu_xla_flags("0.10.2", tensorflow, "")
        assert wanted == [] and f"TensorFlow {tensorflow}'s XLA does not know it" in skipped[0]
    assert compat.cpu_xla_flags("0.10.2", "2.21.0", FLAG.replace("convolution", "dot")) == (
        [],
        ["--xla_cpu_experimental_ynn_fusion_type: XLA_FLAGS sets it already"],
    )


def test_the_off_switch_says_how_it_was_set(monkeypatch):
    monkeypatch.setenv(compat.CPU_XLA_FLAGS_ENV, "off")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    flags = compat.use_cpu_xla_flags.__wrapped__()  # not the process's cached answer
    assert flags == compat.XlaFlags((), f"none: {compat.CPU_XLA_FLAGS_ENV}=off")
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


def test_an_accelerator_host_gets_none(monkeypatch, tmp_path):
    # A PJRT plugin as JAX discovers one (the `jax_plugins` namespace package); nothing here starts it.
    (tmp_path / "jax_plugins" / "some_gpu").mkdir(parents=True)
    (tmp_path / "jax_plugins" / "some_gpu" / "__init__.py").write_text("")
    namespace = types.ModuleType("jax_plugins")
    namespace.__path__ = [str(tmp_path / "jax_plugins")]
    monkeypatch.setitem(sys.modules, "jax_plugins", namespace)  # put back as it was after the test
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    assert "some_gpu" in compat._accelerator_plugins()
    monkeypatch.setenv(
        "JAX_PLATFORMS", "cpu"
    )  # the accelerator is not used: the CPU flags apply again
    assert compat._accelerator_plugins() == []
    monkeypatch.setenv("JAX_PLATFORMS", "")
    monkeypatch.setenv("TPU_LIBRARY_PATH", "/opt/libtpu.so")
    assert "libtpu" in compat._accelerator_plugins()
    if expected_xla_cpu_flags() == [FLAG]:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
        monkeypatch.delenv(compat.CPU_XLA_FLAGS_ENV, raising=False)
        flags = compat.use_cpu_xla_flags.__wrapped__()
        assert flags.added == () and "XLA_FLAGS" not in os.environ
        assert f"{FLAG}: an accelerator backend is installed (libtpu, some_gpu)" in flags.reason
