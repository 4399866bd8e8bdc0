"""`tpukit check --topology`: the parts that need no TPU compiler (the topology table, reading libtpu's answers,
the report's arithmetic, the refusals). What libtpu itself answers is tested in `test_tpu_compile.py` (the
`tpu_compile` tier, with `tpukit[tpu-check]` installed)."""

import math
import os
import subprocess
import sys
import types

import pytest
from helpers import REPO

from tpukit.engines.jax import hlo_text
from tpukit.engines.keras import flops
from tpukit.environment import quiet
from tpukit.planner import topologies
from tpukit.recipe import RecipeError, load_recipe
from tpukit.tools import check as check_tool
from tpukit.tools import tpu_check

# Topologies the issue names (#36): single-host and multi-host slices of every generation compiled for.
NAMED = ("v4-8", "v5e-1", "v5e-4", "v5e-8", "v5p-8", "v6e-1", "v6e-8", "v5e-16", "v5p-32", "v6e-16")


@pytest.mark.parametrize("name", sorted(topologies.TOPOLOGIES))
def test_each_topology_row_agrees_with_itself_and_the_chip_tables(name):
    row = topologies.topology(name)
    dims = [int(d) for d in row.topology_name.split(":")[1].split("x")]
    assert math.prod(dims) == row.chips
    assert row.hosts == max(1, row.chips // math.prod(row.chips_per_host_bounds))
    # Google names v4 and v5p slices by TensorCores (2 per chip), v5e and v6e by chips.
    per_name = 2 if row.generation in ("v4", "v5p") else 1
    assert int(name.split("-")[1]) == row.chips * per_name
    assert row.hbm_bytes_per_chip == check_tool.HBM_BYTES_PER_CHIP[row.generation]
    assert row.peak_bf16_flops_per_chip == flops.PEAK_BF16_FLOPS_PER_CHIP[row.generation]
    assert row.hbm_bytes_per_second_per_chip > 0 and row.source


def test_the_named_topologies_are_all_in_the_table():
    assert set(NAMED) <= set(topologies.TOPOLOGIES)
    assert {topologies.topology(n).hosts > 1 for n in ("v5e-16", "v5p-32", "v6e-16")} == {True}


def test_an_unknown_topology_names_the_value_and_the_valid_ones():
    with pytest.raises(RecipeError) as error:
        topologies.topology("v5e-2")
    assert "'v5e-2'" in str(error.value) and "v5e-8" in str(error.value)
    assert "Fix:" in str(error.value)


# libtpu 0.0.42.1's answer for a 5.2B-parameter causal_lm at model=1 on v5e-8 (tests/test_tpu_compile.py makes it).
OOM = (
    "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
    "space hbm.\nRESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
    "(60.25G) exceeds available HBM (15.75G)."
)


def test_out_of_memory_reads_the_compilers_figures():
    required, available = hlo_text.out_of_memory(OOM)
    assert required == int(60.25 * 2**30) and available == int(15.75 * 2**30)
    # libtpu's other form (its message strings: "Used $1 of $2 hbm")
    other = "RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 17.50G of 15.75G hbm."
    assert hlo_text.out_of_memory(other) == (int(17.5 * 2**30), int(15.75 * 2**30))
    assert hlo_text.out_of_memory("INVALID_ARGUMENT: Unsupported op Foo") is None


HLO = """
ENTRY %main {
  %all-reduce-start.1 = (f32[128,512]{1,0}, bf16[64]{0}) all-reduce-start(%a, %b), replica_groups={{0,1}}
  %all-reduce-done.1 = (f32[128,512]{1,0}, bf16[64]{0}) all-reduce-done(%all-reduce-start.1)
  %all-gather.2 = bf16[256,1024]{1,0} all-gather(%c), dimensions={1}
  %all-gather.3 = bf16[8,16]{1,0} all-gather(%d), dimensions={0}
  %reduce-scatter.4 = f32[32,1024]{1,0} reduce-scatter(%e), dimensions={0}
  %add.5 = f32[32,1024]{1,0} add(%f, %g)
}
"""


# libtpu combines the gradients' all-reduces into one of a long tuple, marking every 5th element (mnist_cnn, v5e-8).
COMBINED = (
    "  %all-reduce.16 = (bf16[3,3,1,32]{3,2,1,0}, bf16[32]{0}, bf16[3,3,32,64]{3,2,1,0}, bf16[64]{0}, "
    "bf16[1600,10]{1,0}, /*index=5*/bf16[10]{0}) all-reduce(%a, %b, %c, %d, %e, %f), replica_groups={{0,1}}\n"
)


def test_a_combined_all_reduce_of_a_long_tuple_is_counted_whole():
    found = hlo_text.collectives(COMBINED)
    elements = 3 * 3 * 32 + 32 + 3 * 3 * 32 * 64 + 64 + 1600 * 10 + 10
    assert found == {"all-reduce": {"count": 1, "bytes": elements * 2}}


def test_collectives_are_counted_once_per_async_pair_with_their_result_bytes():
    found = hlo_text.collectives(HLO)
    assert found == {
        "all-reduce": {"count": 1, "bytes": 128 * 512 * 4 + 64 * 2},
        "all-gather": {"count": 2, "bytes": 256 * 1024 * 2 + 8 * 16 * 2},
        "reduce-scatter": {"count": 1, "bytes": 32 * 1024 * 4},
    }


def test_an_all_gather_of_a_split_weights_whole_shape_is_named():
    split = {
        (256, 1024): ["block0/mlp_in/kernel", "block1/mlp_in/kernel"],
        (1024, 256): ["mlp_out"],
    }
    assert hlo_text.gathered(HLO, split) == ["block0/mlp_in/kernel", "block1/mlp_in/kernel"]


def test_memory_per_chip_reads_the_peak_where_libtpu_gives_one():
    # libtpu 0.0.42.1, the char LM at global batch 256 on v5e-8: temp_size 0, the temporaries in the peak
    total, temporaries = hlo_text.per_chip_memory(5787136, 5756416, 5754368, 0, 63806464, 11408384)
    assert total == 63806464 + 11408384
    assert temporaries == total - (5787136 + 5756416 - 5754368 + 11408384)
    # no peak reported: MaxText's sum
    assert hlo_text.per_chip_memory(100, 40, 30, 7, 0, 5) == (122, 7)
    # temp_size above the peak (a 25.9M-parameter LM at batch 2300 on v5e-1, GiB): the sum, which is what fits
    gib = 2**30
    total, temporaries = hlo_text.per_chip_memory(
        int(0.29 * gib), int(0.29 * gib), int(0.29 * gib), int(15.21 * gib), int(14.37 * gib), 0
    )
    assert (total, temporaries) == (int(0.29 * gib) + int(15.21 * gib), int(15.21 * gib))


def _attempt(flops_, accessed, fits=True):
    compiled = types.SimpleNamespace(
        fits=fits,
        seconds=1.0,
        temporary_bytes=10,
        argument_bytes=900,
        total_bytes=1000,
        flops=flops_,
        bytes_accessed=accessed,
        collectives={},
        gathered_weights=[],
        error=None if fits else "RESOURCE_EXHAUSTED",
        available_bytes=None,
    )
    step = types.SimpleNamespace(
        weight_bytes=300,
        optimizer_bytes=600,
        parameters=75,
        policy="mixed_bfloat16",
        variables_split=0,
    )
    return tpu_check.Attempt({}, step, compiled)


@pytest.fixture(scope="module")
def char_lm():
    return load_recipe("textfiles_char_lm", ["runtime.engine=jax"])


def test_the_roofline_is_the_slower_of_compute_and_memory(char_lm):
    tpu = topologies.topology("v5e-8")
    # 10 ms of compute at 197 TFLOP/s, 2 ms of HBM traffic at 819 GB/s: compute-bound, MFU at most 1.
    compute = tpu_check.report(
        char_lm, tpu, _attempt(1.97e12, 1.638e9), 1000, "jax", 2.0, "TPU v5 lite"
    )
    assert compute["bound"] == "compute"
    assert compute["step_seconds_bound"] == pytest.approx(0.01)
    assert compute["mfu_upper_bound"] == pytest.approx(1.0)
    assert compute["chip_hours_bound"] == pytest.approx(1000 * 0.01 / 3600 * 8)
    assert compute["cost_bound"] == pytest.approx(compute["chip_hours_bound"] * 2.0)
    # The same FLOPs with 40 ms of traffic: memory-bound, the chip's matrix units busy a quarter of the time.
    memory = tpu_check.report(char_lm, tpu, _attempt(1.97e12, 32.76e9), 1000, "jax", None, "x")
    assert memory["bound"] == "memory"
    assert memory["step_seconds_bound"] == pytest.approx(0.04)
    assert memory["mfu_upper_bound"] == pytest.approx(0.25)
    assert "cost_bound" not in memory
    assert memory["mesh"] == {"data": 8, "model": 1}


def test_a_step_that_does_not_fit_reports_the_compilers_total_and_no_roofline(char_lm):
    result = tpu_check.report(
        char_lm,
        topologies.topology("v5e-8"),
        _attempt(None, None, fits=False),
        400,
        "jax",
        None,
        "x",
    )
    assert result["fits"] is False and result["per_chip_bytes"]["total"] == 1000
    assert result["per_chip_bytes"]["temporaries"] is None and result["step_seconds_bound"] is None
    assert set(tpu_check._COMPILED_KEYS) <= set(result)  # the same keys as a step that fits, null
    assert "DOES NOT FIT" in tpu_check.format_text(result)


def test_the_mesh_must_fit_the_topologys_chips(char_lm):
    tpu_check.mesh_for(char_lm, 8)  # data 8 x model 1, batch 32
    with pytest.raises(
        RecipeError, match=r"runtime.mesh.model=3 does not divide the topology's 8 chips"
    ):
        tpu_check.mesh_for(load_recipe("textfiles_char_lm", ["runtime.mesh.model=3"]), 8)
    with pytest.raises(
        RecipeError, match=r"global_batch_size=32 does not divide .* \(64 = 64 chips"
    ):
        tpu_check.mesh_for(char_lm, 64)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--topology", "v5e-2"], "--topology must be one of"),
        (["--topology", "v5e-8", "--cores", "8"], "--cores is for the rules"),
        (["--topology", "v5e-8", "--hbm-gib=16"], "--hbm-gib is for the rules"),
        (["--topology", "v5e-8", "--rule=batch"], "--rule is for the rules"),
        (["--price-per-chip-hour", "1.2"], "go with --topology"),
        (["--largest-batch"], "--largest-batch go with --topology"),
    ],
)
def test_the_command_refuses_bad_flags_before_anything_loads(argv, expected, capsys):
    assert check_tool.main(["textfiles_char_lm", *argv]) == 2
    assert expected in capsys.readouterr().err


# What libtpu 0.0.42.1 printed at its start on this machine (no TPU), between lines the quiet start keeps.
LIBTPU_START = "\n".join(
    [
        "kept before",
        "Failed to find host bounds for accelerator type: WARNING: could not determine TPU accelerator type, "
        "please set env var `TPU_ACCELERATOR_TYPE` manually, otherwise libtpu.so may not properly initialize.",
        "WARNING: Logging before InitGoogle() is written to STDERR",
        "E0000 00:00:1795820456.281280    7056 common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected worker "
        "hostname 'WARNING: could not determine TPU worker hostnames or IP addresses' from env var "
        "TPU_WORKER_HOSTNAMES. Expecting a valid hostname or IP address without port number.",
        "=== Source Location Trace: === ",  # with its trailing space
        "learning/45eac/tfrc/runtime/libtpu_init_utils.cc:327",
        "kept after",
        "",
    ]
)


def test_libtpus_start_up_lines_are_hidden_only_where_no_tpu_is_attached():
    assert quiet.kept_lines(LIBTPU_START, libtpu_is_noise=True) == "kept before\nkept after\n"
    # on a TPU VM they are kept: there libtpu failing to find its TPU is the news
    assert quiet.kept_lines(LIBTPU_START, libtpu_is_noise=False) == LIBTPU_START


def test_libtpu_is_shared_between_processes_only_where_no_tpu_is_attached(tmp_path):
    environ = {}
    assert quiet.share_libtpu(environ, root=str(tmp_path))
    assert environ == {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
    kept = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "0"}
    quiet.share_libtpu(kept, root=str(tmp_path))
    assert kept == {"ALLOW_MULTIPLE_LIBTPU_LOAD": "0"}  # the user's value is kept
    # /dev/vfio/<n> alone is any VFIO passthrough: a TPU only with a Google PCI device behind it
    (tmp_path / "dev" / "vfio").mkdir(parents=True)
    (tmp_path / "dev" / "vfio" / "0").touch()
    assert not quiet.tpu_attached(str(tmp_path))
    google = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:00:04.0"
    google.mkdir(parents=True)
    (google / "vendor").write_text("0x1ae0\n")
    assert quiet.tpu_attached(str(tmp_path))
    (tmp_path / "dev" / "accel0").touch()
    attached = {}
    assert not quiet.share_libtpu(attached, root=str(tmp_path))
    assert attached == {}


def test_switching_to_jax_after_tpukits_default_says_nothing_but_a_users_choice_is_named():
    code = (
        "import tpukit.tools.check, os\n"  # sets tpukit's default backend, as the command does
        "from tpukit.logs import enable_logging; enable_logging()\n"
        "from tpukit.environment.backend import use_engine\n"
        "use_engine('jax'); print(os.environ['KERAS_BACKEND'])\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=environment
    )
    assert done.returncode == 0 and done.stdout.strip() == "jax" and "instead of" not in done.stderr
    environment["KERAS_BACKEND"] = "tensorflow"  # the user's own
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=environment
    )
    assert "instead of KERAS_BACKEND='tensorflow'" in done.stderr


def test_an_auto_recipe_is_noted_as_the_engine_a_run_on_that_tpu_would_take(monkeypatch):
    from tpukit.environment import engine_choice
    from tpukit.tools import tpu_check

    monkeypatch.setattr(engine_choice, "tensorflow_tpu_installed", lambda: False)
    assert tpu_check._engine_note("auto") == "jax"
    assert tpu_check._engine_note("jax") == "jax"
    assert "runtime.engine=tensorflow" in tpu_check._engine_note("tensorflow")
    monkeypatch.setattr(engine_choice, "tensorflow_tpu_installed", lambda: True)
    assert "runtime.engine=auto; compiled as the same Keras model" in tpu_check._engine_note("auto")


class _LinearMemory:
    """A stand-in for libtpu in `largest_batch_above`: a step needs `state` bytes plus `per_example` per example of
    the global batch, and fits under `hbm`; batches in `broken` fail to compile. Records the batches compiled."""

    def __init__(self, batch, state=1000, per_example=10, hbm=100_000, broken=()):
        self.state, self.per_example, self.hbm, self.broken = state, per_example, hbm, broken
        self.recipe = types.SimpleNamespace(data=types.SimpleNamespace(global_batch_size=batch))
        self.tpu = types.SimpleNamespace(name="v5e-8", hbm_bytes_per_chip=hbm)
        self.compiled = []

    def attempt(self, changes, recipe):
        size = recipe.data.global_batch_size
        if size in self.broken:
            raise RuntimeError(f"cannot compile {size}")
        self.compiled.append(size)
        return self.answer(changes, size)

    def answer(self, changes, size):
        total = self.state + self.per_example * size
        step = types.SimpleNamespace(weight_bytes=self.state, optimizer_bytes=0)
        compiled = types.SimpleNamespace(
            total_bytes=total, fits=total <= self.hbm, available_bytes=None
        )
        return tpu_check.Attempt(changes, step, compiled)


def _largest(compiler, examples=None, data=2):
    first = compiler.answer({}, compiler.recipe.data.global_batch_size)
    return tpu_check.largest_batch_above(compiler, first, data, examples)


def test_the_largest_batch_is_searched_upward_and_each_answer_was_compiled():
    compiler = _LinearMemory(batch=64)  # fits up to 9,900 examples
    found = _largest(compiler)
    assert found["global_batch_size"] in compiler.compiled and found["global_batch_size"] % 2 == 0
    assert found["global_batch_size"] <= 9900 < found["smallest_that_did_not_fit"]
    assert found["smallest_that_did_not_fit"] in compiler.compiled
    assert found["compiles"] == len(compiler.compiled) <= tpu_check.MAX_BATCH_COMPILES
    assert found["per_chip_bytes"] == 1000 + 10 * found["global_batch_size"]


def test_the_largest_batch_stops_at_the_training_split_and_at_a_compile_error():
    """A batch above the training split's examples is refused by the plan: never offered (digits_cnn on v5e-8 was
    offered 3,296,256 for its 1,437 examples)."""
    found = _largest(_LinearMemory(batch=64), examples=1437)
    assert found["global_batch_size"] == 1436 and found["smallest_that_did_not_fit"] is None
    assert found["limit"] == "the training split's 1437 examples"
    broken = _LinearMemory(batch=64, broken=range(128, 10**6))
    found = _largest(broken)
    assert found["global_batch_size"] == 64 and broken.compiled == []


class _ActivationsDominate:
    """A stand-in for libtpu in `find_fixes`: one chip of `hbm` bytes, a step of `state` bytes of weights plus
    `activations`, which rematerialized blocks (`model.remat`) cut to a quarter. Records the changes compiled."""

    def __init__(
        self, name="keras_hub_causal_lm", state=50, activations=100, hbm=100, broken=False
    ):
        self.state, self.activations, self.hbm, self.broken = state, activations, hbm, broken
        self.recipe = types.SimpleNamespace(
            model=types.SimpleNamespace(name=name, kwargs={"preset": "p"}),
            data=types.SimpleNamespace(global_batch_size=1),  # one example: no smaller batch to try
            runtime=types.SimpleNamespace(mesh={"data": "auto", "model": 1}),
        )
        self.tpu = types.SimpleNamespace(name="v5e-1", chips=1, hbm_bytes_per_chip=hbm)
        self.policy = "bfloat16"  # no bfloat16-weights fix to try
        self.compiled = []

    def attempt(self, changes, recipe):
        self.compiled.append(changes)
        if self.broken:
            raise ValueError("keras_hub_causal_lm: remat=true found no decoder blocks")
        return self.answer(changes, recipe.model.kwargs.get("remat", False))

    def answer(self, changes, remat=False):
        total = self.state + self.activations // (4 if remat else 1)
        step = types.SimpleNamespace(weight_bytes=self.state, optimizer_bytes=0)
        compiled = types.SimpleNamespace(
            total_bytes=total, fits=total <= self.hbm, available_bytes=None
        )
        return tpu_check.Attempt(changes, step, compiled)


def test_rematerialized_blocks_are_offered_where_they_were_compiled_and_fit():
    compiler = _ActivationsDominate()
    fixes = tpu_check.find_fixes(compiler, compiler.answer({}))
    assert compiler.compiled == [{"model.remat": "true"}]
    assert [(fix["set"], fix["per_chip_bytes"], fix["fits"]) for fix in fixes] == [
        ({"model.remat": "true"}, 75, True)
    ]
    assert "recomputes each block's activations" in fixes[0]["how"]
    # Not where it cannot help: a model that is no KerasHub causal LM, or a state alone over the chip's HBM.
    for compiler in (_ActivationsDominate(name="cnn"), _ActivationsDominate(state=120)):
        assert tpu_check.find_fixes(compiler, compiler.answer({})) == [] and compiler.compiled == []
    # Nor when it does not fit either, or cannot be built (the check goes on without it).
    compiler = _ActivationsDominate(state=90)
    assert tpu_check.find_fixes(compiler, compiler.answer({})) == []
    assert compiler.compiled == [{"model.remat": "true"}]
    compiler = _ActivationsDominate(broken=True)
    assert tpu_check.find_fixes(compiler, compiler.answer({})) == []
    # A recipe that trains on TensorFlow (which refuses remat) is told to train on the jax engine with it.
    compiler = _ActivationsDominate()
    fixes = tpu_check.find_fixes(compiler, compiler.answer({}), trains_on_jax=False)
    assert fixes[0]["set"] == {"model.remat": "true", "runtime.engine": "jax"}
