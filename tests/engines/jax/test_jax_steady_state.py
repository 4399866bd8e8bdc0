"""What keeps the jax engine's steady state as fast as plain Keras on JAX: its train and test steps compile once, in
the first epoch (on one device, where Keras' trainer under a one-device distribution recompiled the train step at
the second execution and again at the second epoch, and on a mesh), and `steps_per_execution: auto` is decided
from the built model's FLOPs (no throwaway model trained, nothing timed: the same value on every run). Three runs of
digits_cnn in one JAX process with 2 virtual CPU devices (`child.py`); nothing here measures speed.
"""

import os

import pytest
from helpers import expected_xla_cpu_flags, run_jax

RUN = ["train.epochs=3", "train.steps_per_epoch=4", "runtime.verbose=0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs with `steps_per_execution: auto` on one device (a 1x1 mesh), one with 2 on a 2x1 mesh."""
    configs = [
        {
            "name": name,
            "recipe": "digits_cnn",
            "overrides": [*RUN, f"runtime.mesh.data={data}", f"runtime.steps_per_execution={spe}"],
            "output_dir": str(tmp_path_factory.mktemp(name)),
        }
        for name, data, spe in (("auto", 1, "auto"), ("auto_again", 1, "auto"), ("mesh", 2, 2))
    ]
    code, results, output = run_jax({"runs": configs}, devices=2, all_results=True)
    assert code == 0 and len(results) == 3, output[-3000:]
    for result in results:
        assert "error" not in result, result
    return {result["name"]: result for result in results}


@pytest.mark.parametrize("name", ["auto", "mesh"])
@pytest.mark.integration
def test_the_train_and_test_steps_compile_once_in_the_first_epoch(runs, name):
    compiles = runs[name]["compiles"]  # [function, epoch of fit (None: outside fit)]
    assert [c for c in compiles if c[0] == "train_step"] == [["train_step", 0]], compiles
    assert [c for c in compiles if c[0] == "test_step"] == [["test_step", 0]], compiles
    # Nothing at all compiles once the first epoch is over: no new shapes, shardings or dtypes of the state.
    later = [c for c in compiles if c[1] not in (None, 0)]
    assert not later, later
    assert (
        runs[name]["metrics"]["step"] == 12
        and len(runs[name]["losses"]) == 12 // (runs[name]["metrics"]["steps_per_execution"])
    )


@pytest.mark.integration
def test_steps_per_execution_auto_is_the_same_on_two_runs_and_says_why(runs):
    first, again = runs["auto"]["metrics"], runs["auto_again"]["metrics"]
    assert first["steps_per_execution"] == again["steps_per_execution"]
    why = first["steps_per_execution_decision"]
    assert why == again["steps_per_execution_decision"]
    assert why["setting"] == "auto" and why["chosen"] == first["steps_per_execution"]
    assert why["steps_per_epoch"] == 4 and 4 % why["chosen"] == 0
    # From the model's FLOPs and the peak: a small CNN's 4 steps take far less than the 0.5 s target.
    assert why["flops_per_step"] == pytest.approx(first["flops_per_example"] * 64)
    assert why["peak_flops"] == first["peak_flops"] and why["chosen"] == 4
    assert "rule" in why


@pytest.mark.integration
def test_the_run_records_the_xla_cpu_flags_it_added(runs):
    # child.py starts with XLA_FLAGS naming the virtual devices only; on jaxlib 0.10 with TensorFlow 2.21 the engine
    # adds its flag (test_jax_xla_flags.py), elsewhere the reason says why not.
    recorded = runs["auto"]["metrics"]["xla_cpu_flags"]
    assert recorded["added"] == expected_xla_cpu_flags("--xla_force_host_platform_device_count=2")
    if recorded["added"]:
        assert recorded["reason"].startswith("jaxlib ")
    else:  # why not, flag by flag: another jaxlib, a TensorFlow that does not know it, an accelerator host
        assert recorded["reason"].startswith("--xla_cpu_experimental_ynn_fusion_type: ")


@pytest.mark.integration
def test_a_steps_per_execution_from_the_recipe_is_kept_and_recorded(runs):
    metrics = runs["mesh"]["metrics"]
    assert metrics["steps_per_execution"] == 2 and metrics["mesh"] == {"data": 2, "model": 1}
    assert metrics["steps_per_execution_decision"] == {"setting": 2, "rule": "set in the recipe"}


@pytest.mark.integration
def test_the_export_process_started_early_exports_and_ends(runs):
    for result in runs.values():
        exported = result["metrics"]["exported"]
        assert os.path.isdir(exported["saved_model"]) and os.path.isfile(exported["keras"])
        assert result["open_exports"] == 0


@pytest.mark.integration
def test_the_run_records_its_threefry_lowering(runs):
    # jax 0.10 gets the unrolled CPU lowering (test_jax_threefry.py); another jax says why not.
    from importlib import metadata

    from tpukit.engines.jax import cpu

    recorded = runs["auto"]["metrics"]["jax_cpu_threefry"]
    switch = os.environ.get(
        cpu.CPU_THREEFRY_ENV, ""
    )  # the child runs with this process's environment
    assert recorded == cpu.threefry_choice(metadata.version("jax"), switch).as_dict()
