"""`tpukit check --topology` and `tpukit.check` against libtpu, the real TPU compiler, on this CPU (the
`tpu_compile` tier: `pip install -e ".[tpu-check]"`, then `pytest -m tpu_compile`; .ci/run does both).

What these prove: libtpu compiles the jax engine's training step for abstract TPU devices, its memory plan per chip
moves as it must (a larger batch needs more temporaries, a model axis of 2 halves the split weights, a model too
large for a v5e chip is refused with the compiler's own out-of-memory and the fix it suggests then fits), and the
model's variables are never allocated on the host. Not a run on a TPU: no speed, input pipeline or interconnect.
"""

import json
import os
import resource
import subprocess
import sys

import pytest
from helpers import REPO, run_jax_snippet

pytestmark = pytest.mark.tpu_compile

CHAR_LM = "textfiles_char_lm"


def _environment(**extra) -> dict:
    environment = {
        k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "JAX_PLATFORMS")
    }
    environment.update(TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return environment


def _check(*args, timeout=600) -> tuple[int, dict | str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "tpukit", "check", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_environment(),
        timeout=timeout,
    )
    out = (
        json.loads(done.stdout) if "--json" in args and done.stdout.startswith("{") else done.stdout
    )
    return done.returncode, out, done.stderr


def test_the_char_lm_compiles_for_a_v5e_8_on_a_data_4_model_2_mesh():
    status, report, stderr = _check(
        CHAR_LM,
        "--topology",
        "v5e-8",
        "--set",
        "runtime.engine=jax",
        "--set",
        "runtime.mesh.model=2",
        "--json",
    )
    assert status == 0, stderr[-3000:]
    assert report["device_kind"] == "TPU v5 lite"
    assert (report["topology"], report["chips"], report["hosts"]) == ("v5e-8", 8, 1)
    assert report["mesh"] == {"data": 4, "model": 2} and report["fits"] is True
    assert report["precision"] == "mixed_bfloat16" and report["variables_split"] > 0
    per_chip = report["per_chip_bytes"]
    assert (
        per_chip["weights"] > 0 and per_chip["optimizer"] > per_chip["weights"]
    )  # AdamW: two slots
    assert per_chip["temporaries"] >= 0
    assert per_chip["total"] >= per_chip["weights"] + per_chip["optimizer"]
    assert report["hbm_bytes_per_chip"] == 16e9
    assert report["flops_per_step"] > 0 and report["bytes_accessed_per_step"] > 0
    assert report["step_seconds_bound"] > 0 and report["bound"] in ("compute", "memory")
    assert 0 < report["mfu_upper_bound"] <= 1
    assert report["collectives"]["all-reduce"]["count"] > 0  # the data axis' gradient reduction
    assert report["steps"] == 400 and report["chip_hours_bound"] > 0
    assert report["compiler"]["libtpu"]
    # libtpu's start-up warnings are hidden on a machine with no TPU
    assert "TPU_ACCELERATOR_TYPE" not in stderr and "TPU_WORKER_HOSTNAMES" not in stderr


# One JAX process for the memory-plan properties: libtpu and the abstract devices are loaded once.
PROPERTIES = r"""
import json, sys
import tpukit
tpukit.use_engine("jax")
from tpukit.recipe import load_recipe
from tpukit.tools import tpu_check

def check(topology, *sets, fixes=False, largest_batch=False):
    recipe = load_recipe("textfiles_char_lm", ["runtime.engine=jax", *sets])
    return tpu_check.check_topology(recipe, topology, fixes=fixes, largest_batch=largest_batch)

result = {}
result["batch"] = [check("v5e-8", f"data.global_batch_size={b}") for b in (256, 512)]
result["model"] = [check("v5e-8", f"runtime.mesh.model={m}") for m in (1, 2)]
big = ["model.hidden_dim=1024", "model.mlp_dim=4096", "model.num_heads=8", "model.num_layers=2"]
result["too_large"] = check("v5e-1", "data.global_batch_size=8192", *big, fixes=True)
fix = result["too_large"].get("fixes", [{}])[0].get("set", {})
result["fix"] = check("v5e-1", *[f"{k}={v}" for k, v in fix.items()], *big) if fix else None
# From a quarter of that batch, upward: the largest batch found to fit, and the smallest found not to, compiled again.
if fix:
    start = max(1, fix["data.global_batch_size"] // 4)
    result["largest"] = check("v5e-1", f"data.global_batch_size={start}", *big, largest_batch=True)
    above = result["largest"].get("largest_batch", {}).get("smallest_that_did_not_fit")
    result["above"] = check("v5e-1", f"data.global_batch_size={above}", *big) if above else None
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def properties():
    return run_jax_snippet(PROPERTIES, "", timeout=1200, JAX_PLATFORMS=None)


def test_doubling_the_global_batch_grows_the_temporaries(properties):
    small, large = properties["batch"]
    assert small["fits"] and large["fits"]
    assert large["per_chip_bytes"]["temporaries"] > small["per_chip_bytes"]["temporaries"] > 0
    assert large["flops_per_step"] == pytest.approx(2 * small["flops_per_step"], rel=0.1)


def test_a_model_axis_of_2_halves_the_split_weights_per_chip(properties):
    whole, split = properties["model"]
    assert whole["variables_split"] == 0 and split["variables_split"] > 0
    # The char LM's split weights are >99% of its parameters: weights and Adam slots per chip halve.
    for key in ("weights", "optimizer"):
        ratio = split["per_chip_bytes"][key] / whole["per_chip_bytes"][key]
        assert 0.45 <= ratio <= 0.55, (key, ratio)
    # ... and so does what the compiler lays out as the step's arguments (the state and the batch), within 10%
    ratio = split["per_chip_bytes"]["arguments"] / whole["per_chip_bytes"]["arguments"]
    assert 0.45 <= ratio <= 0.55, ratio
    # the compiler's arguments are the state as tpukit counts it per chip, plus the batch and the metrics (<1%)
    counted = split["per_chip_bytes"]["weights"] + split["per_chip_bytes"]["optimizer"]
    assert counted <= split["per_chip_bytes"]["arguments"] <= counted * 1.01


def test_a_step_too_large_for_a_v5e_chip_is_refused_and_the_batch_it_suggests_fits(properties):
    refused = properties["too_large"]
    assert refused["fits"] is False
    assert "RESOURCE_EXHAUSTED" in refused["out_of_memory"]
    assert refused["per_chip_bytes"]["total"] > refused["hbm_bytes_per_chip"] * 0.9
    batch_fixes = [f for f in refused["fixes"] if "data.global_batch_size" in f["set"]]
    assert batch_fixes and batch_fixes[0]["fits"]
    suggested = batch_fixes[0]["set"]["data.global_batch_size"]
    assert 1 <= suggested < 8192
    assert properties["fix"]["fits"] is True
    assert properties["fix"]["global_batch_size"] == suggested


def test_python_api_compiles_a_users_own_model(tmp_path):
    code = r"""
import json, sys
import numpy as np
import tpukit
tpukit.use_engine("jax")
import keras

def build_model():
    return keras.Sequential([keras.Input((32,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)])

x = np.random.rand(512, 32).astype("float32"); y = np.random.randint(0, 10, 512)
report = tpukit.check(build_model, x, y, topology="v6e-8", batch_size=256, optimizer="adamw", learning_rate=1e-3)
print("RESULT " + json.dumps({k: report[k] for k in ("fits", "device_kind", "mesh", "parameters", "per_chip_bytes")}))
"""
    report = run_jax_snippet(code, "", timeout=600, JAX_PLATFORMS=None)
    assert report["fits"] is True and report["device_kind"] == "TPU v6 lite"
    assert report["mesh"] == {"data": 8, "model": 1}
    assert report["parameters"] == 32 * 256 + 256 + 256 * 10 + 10
    assert (
        report["per_chip_bytes"]["weights"] == report["parameters"] * 4
    )  # float32 variables, whole per chip


FIVE_B = [
    "--set",
    "model.hidden_dim=4096",
    "--set",
    "model.mlp_dim=16384",
    "--set",
    "model.num_heads=32",
    "--set",
    "model.num_layers=26",
]


def test_a_5b_parameter_model_is_refused_on_v5e_8_at_model_1_and_its_model_axis_fix_is_compiled():
    status, report, stderr = _check(
        CHAR_LM,
        "--topology",
        "v5e-8",
        "--set",
        "runtime.engine=jax",
        *FIVE_B,
        "--json",
        timeout=600,
    )
    host_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert status == 1, stderr[-3000:]
    assert report["parameters"] > 5e9 and report["fits"] is False
    assert (
        report["per_chip_bytes"]["total"] > 16 * 2**30
    )  # libtpu's figure: more than a v5e chip's 16 GiB
    # float32 weights alone are 21 GB; the check never allocated them. ru_maxrss of the children is the largest
    # peak of any child this test process waited for, this check's included: an upper bound on its own.
    assert host_peak < report["parameters"] * 4 / 2
    fixes = {tuple(sorted(f["set"].items())): f for f in report["fixes"]}
    model_fix = [f for key, f in fixes.items() if key and key[0][0] == "runtime.mesh.model"]
    assert model_fix and model_fix[0]["fits"] and model_fix[0]["per_chip_bytes"] < 16e9


def test_a_step_that_fits_reports_the_largest_batch_found_to_fit(properties):
    """`--largest-batch`: searched upward from a batch that fits, each candidate compiled; the batch it reports fits,
    the next one it tried does not, and it lands near the batch the downward fix search found (both within 1/8 of
    the largest that fits when their compiles sufficed)."""
    report, suggested = properties["largest"], properties["fix"]["global_batch_size"]
    assert report["fits"] and report["global_batch_size"] == max(1, suggested // 4)
    largest = report["largest_batch"]
    assert largest["compiles"] <= 5
    assert report["global_batch_size"] < largest["global_batch_size"]
    assert largest["per_chip_bytes"] <= report["hbm_bytes_per_chip"]
    assert suggested // 2 <= largest["global_batch_size"] <= suggested * 2
    assert largest["smallest_that_did_not_fit"] > largest["global_batch_size"]
    assert properties["above"]["fits"] is False
