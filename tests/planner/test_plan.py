"""tpukit.plan: every decision of a run and every recipe error, with nothing built or written (issue 9)."""

import dataclasses

import faults
import keras
import pytest
from conftest import mirrored
from helpers import digits_recipe

import tpukit
from tpukit.recipe import RecipeError, from_dict


def recipe(**overrides):
    base = {"train.epochs": 2, "data.global_batch_size": 32, "runtime.verbose": 0}
    return from_dict(digits_recipe(**{**base, **overrides}), "digits_cnn.yaml")


def test_the_plan_holds_every_decision_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    plan = tpukit.plan(recipe(**{"runtime.steps_per_execution": 11}), output_dir=str(out))
    assert (plan.strategy_kind, plan.replicas, plan.input_pipelines) == ("default", 1, 1)
    assert (plan.global_batch_size, plan.per_replica_batch_size, plan.eval_global_batch_size) == (
        32,
        32,
        32,
    )
    assert (plan.train_examples, plan.eval_examples) == (1437, 360)
    assert (plan.steps_per_epoch, plan.total_steps) == (44, 88)
    # 12 eval steps: one pass, not padded to whole executions (Keras ends the last execution with the data)
    assert plan.steps_per_execution == 11 and plan.eval_steps == 12
    # on a CPU, XLA is decided once the model is built (from its layers: tests/test_run.py)
    assert (plan.precision, plan.jit_compile) == ("float32", "auto")
    assert plan.checkpoint_dir == str(out / "checkpoints") and plan.resume_step == 0
    assert not out.exists()
    text = plan.describe()
    assert (
        "global batch 32 = 1 replica(s) x 32 per replica" in text
        and "12 eval steps over 360 examples" in text
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.replicas = 2


def test_the_plan_on_two_replicas_and_without_evaluation(tmp_path):
    plan = tpukit.plan(recipe(), strategy=mirrored(2), mode="train", output_dir=str(tmp_path))
    assert (plan.replicas, plan.per_replica_batch_size, plan.strategy_kind) == (2, 16, "mirrored")
    assert plan.eval_steps is None and not plan.evaluating and plan.eval_examples == 0


def test_auto_steps_per_execution_stays_auto_in_the_plan_and_is_one_in_eval_mode(tmp_path):
    auto = recipe(**{"runtime.steps_per_execution": "auto"})
    assert tpukit.plan(auto, output_dir=str(tmp_path)).steps_per_execution == "auto"
    with faults.signals_at_step(3):
        tpukit.run(recipe(), str(tmp_path))  # a checkpoint to evaluate
    evaluating = tpukit.plan(auto, mode="eval", output_dir=str(tmp_path))
    assert evaluating.steps_per_execution == 1 and evaluating.eval_steps == 12


@pytest.mark.parametrize(
    "overrides,mode,strategy,message",
    [
        (
            {"data.global_batch_size": 63},
            "train_and_eval",
            2,
            "data.global_batch_size=63 does not divide by the 2 replicas",
        ),
        ({"data.global_batch_size": 4096}, "train_and_eval", None, "larger than the 1437 examples"),
        (
            {"runtime.steps_per_execution": 3},
            "train_and_eval",
            None,
            "steps_per_execution=3 does not divide steps_per_epoch=44",
        ),
        (
            {"train.export_best_by": "val_accuracy"},
            "train",
            None,
            "is a validation metric, but mode 'train'",
        ),
        ({"data.eval_split": None}, "eval", None, "mode eval needs data.eval_split"),
        ({}, "eval", None, "mode eval: no checkpoint in"),
        ({}, "predict", None, "mode must be one of train_and_eval, train, eval"),
    ],
)
def test_every_recipe_error_is_raised_by_the_plan(tmp_path, overrides, mode, strategy, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        tpukit.plan(
            recipe(**overrides),
            strategy=mirrored(strategy) if strategy else None,
            mode=mode,
            output_dir=str(tmp_path / "out"),
        )
    assert not (tmp_path / "out").exists()


def test_the_plan_reads_the_resume_step_and_refuses_a_steps_per_execution_that_cannot_resume(
    tmp_path,
):
    with faults.signals_at_step(5):
        assert tpukit.run(recipe(), str(tmp_path))["status"] == "preempted"
    assert tpukit.plan(recipe(), output_dir=str(tmp_path)).resume_step == 5
    with pytest.raises(
        RecipeError, match="does not divide the 39 steps left in the epoch this run resumes at"
    ):
        tpukit.plan(recipe(**{"runtime.steps_per_execution": 2}), output_dir=str(tmp_path))


@pytest.mark.integration
def test_a_run_restores_the_callers_global_dtype_policy(tmp_path):
    keras.mixed_precision.set_global_policy("mixed_float16")
    tpukit.run(recipe(**{"train.epochs": 1, "runtime.precision": "float32"}), str(tmp_path))
    assert keras.mixed_precision.global_policy().name == "mixed_float16"


@pytest.mark.parametrize(
    "kind,replicas,hosts,remote,refused",
    [
        ("tpu", 32, 4, False, True),
        ("tpu", 8, 1, True, True),
        ("tpu", 8, 1, False, False),
        ("mirrored", 2, 1, False, False),
    ],
)
def test_local_files_on_a_multi_host_or_remote_tpu_are_a_recipe_error(
    tmp_path, kind, replicas, hosts, remote, refused
):
    # Logic only (no TPU here): the plan applies tpukit.check's input_paths rule to the strategy it was given.
    from tpukit.planner import Hardware, check_input_paths

    local = from_dict(
        {
            "model": {"name": "small_cnn"},
            "data": {
                "source": "text_files",
                "file_pattern": str(tmp_path / "*.txt"),
                "global_batch_size": 32,
            },
            "train": {"epochs": 1, "learning_rate": 0.1},
        },
        "local.yaml",
    )
    io_device = "/job:localhost/replica:0/task:0/device:CPU:0" if remote else None
    hardware = Hardware("tensorflow", kind, replicas, hosts, io_device=io_device)
    if refused:
        with pytest.raises(
            RecipeError,
            match=r"not on gs://: data.file_pattern=.*Fix: copy the data to a Cloud Storage",
        ):
            check_input_paths(local, hardware)
    else:
        check_input_paths(local, hardware)
