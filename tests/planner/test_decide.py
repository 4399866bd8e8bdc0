"""tpukit.planner.decide: the plan from facts alone (no engine, no data, no TensorFlow), and the flags it refuses.

The facts stand in for what an engine and a data source would find, so these cases include hardware this machine
does not have (a 32-core TPU on 4 hosts, 8 GPUs): they prove the decisions, not that such hardware behaves so.
"""

import os
import subprocess
import sys

import pytest
from helpers import REPO, digits_recipe

from tpukit import data
from tpukit.planner import (
    CheckpointFacts,
    DataFacts,
    Hardware,
    decide,
    eval_steps,
    worker_output_dir,
)
from tpukit.recipe import RecipeError, from_dict

CPU = Hardware("tensorflow", "default", 1, 1)
TPU_POD = Hardware("tensorflow", "tpu", 32, 4)
GPUS = Hardware("tensorflow", "mirrored", 8, 1, gpu_compute_capability=(8, 0))
DIGITS = DataFacts(train_examples=1437, eval_examples=360)


def recipe(**overrides):
    base = {"train.epochs": 2, "data.global_batch_size": 32, "runtime.verbose": 0}
    return from_dict(digits_recipe(**{**base, **overrides}), "digits_cnn.yaml")


def test_decide_on_a_tpu_slice_divides_the_batch_and_the_eval_pass_by_its_hosts():
    plan = decide(recipe(**{"data.global_batch_size": 256}), TPU_POD, DIGITS, CheckpointFacts())
    assert (plan.replicas, plan.per_replica_batch_size, plan.input_pipelines) == (32, 8, 4)
    assert (plan.steps_per_epoch, plan.total_steps) == (1437 // 256, 2 * (1437 // 256))
    # 4 pipelines read 90 eval examples each, in batches of 64: 2 global steps.
    assert plan.eval_steps == 2
    assert (plan.precision, plan.jit_compile) == ("mixed_bfloat16", False)
    assert "TPUStrategy compiles the whole step" in plan.jit_compile_reason


def test_decide_on_gpus_uses_the_compute_capability_the_engine_found():
    plan = decide(recipe(), GPUS, DIGITS, CheckpointFacts())
    assert plan.precision == "mixed_bfloat16" and "(8, 0)" in plan.precision_reason
    older = Hardware("tensorflow", "mirrored", 8, 1, gpu_compute_capability=(7, 0))
    assert decide(recipe(), older, DIGITS, CheckpointFacts()).precision == "mixed_float16"


def test_decide_resumes_from_the_newest_checkpoint_and_evaluates_one_without_resuming():
    found = CheckpointFacts(newest_step=44)
    assert decide(recipe(), CPU, DIGITS, found).resume_step == 44
    evaluating = decide(recipe(), CPU, DIGITS, found, mode="eval")
    assert (evaluating.resume_step, evaluating.training, evaluating.evaluating) == (0, False, True)


def test_a_non_chief_worker_plans_under_its_own_directory():
    worker = Hardware("tensorflow", "multi_worker", 2, 2, worker="worker1")
    out = worker_output_dir(worker.worker, "runs/x")
    plan = decide(
        recipe(**{"runtime.steps_per_execution": 1}),
        worker,
        DIGITS,
        CheckpointFacts(),
        output_dir=out,
    )
    assert plan.output_dir == os.path.join("runs/x", "worker1") and not plan.chief


@pytest.mark.parametrize(
    "mode,checkpoint,found,message",
    [
        (
            "train_and_eval",
            "runs/x/checkpoints/ckpt-44",
            CheckpointFacts(44, True),
            r"--checkpoint 'runs/x/checkpoints/ckpt-44' applies to mode eval only; received mode "
            r"'train_and_eval'.*Fix: drop --checkpoint, or add --mode eval",
        ),
        (
            "train",
            "ckpt-1",
            CheckpointFacts(1, True),
            r"applies to mode eval only; received mode 'train'",
        ),
        (
            "eval",
            "runs/x/ckpt-9",
            CheckpointFacts(44, False),
            r"no such checkpoint \(expected runs/x/ckpt-9.index\)",
        ),
        (
            "eval",
            None,
            CheckpointFacts(0, False),
            r"mode eval: no checkpoint in runs/run/checkpoints",
        ),
    ],
)
def test_flags_that_do_not_apply_or_point_nowhere_are_refused(mode, checkpoint, found, message):
    with pytest.raises(RecipeError, match=message):
        decide(recipe(), CPU, DIGITS, found, mode=mode, checkpoint=checkpoint)


def test_the_cli_refuses_checkpoint_outside_eval_before_anything_is_written(tmp_path):
    import tpukit

    with pytest.raises(RecipeError, match="applies to mode eval only"):
        tpukit.run(recipe(), str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt-1"))
    assert not (tmp_path / "out").exists()


def test_keras_loop_failure_found_by_the_engine_refuses_loop_keras():
    broken = Hardware(
        "tensorflow", "mirrored", 2, 1, keras_loop_failure="Keras' fit fails (#19246)"
    )
    with pytest.raises(
        RecipeError, match=r"runtime.loop=keras on this strategy: Keras' fit fails \(#19246\)"
    ):
        decide(
            recipe(**{"runtime.loop": "keras", "runtime.steps_per_execution": 4}),
            broken,
            DIGITS,
            CheckpointFacts(),
        )
    assert decide(recipe(**{"runtime.steps_per_execution": 4}), broken, DIGITS, CheckpointFacts())


@pytest.mark.parametrize(
    "examples,batch,pipelines", [(360, 32, 1), (360, 64, 4), (1, 8, 8), (1000, 48, 3)]
)
def test_the_planners_eval_steps_agree_with_the_data_pipelines(examples, batch, pipelines):
    assert eval_steps(examples, batch, pipelines) == data.eval_steps(examples, batch, pipelines)


def test_the_planner_and_the_recipe_loader_import_no_tensorflow_or_keras():
    """The decisions and the recipe files need no TensorFlow (the engine and the data are where it is loaded)."""
    code = (
        "import sys, tpukit.planner, tpukit.recipe.loading; "
        "loaded = [m for m in ('tensorflow', 'keras', 'jax') if m in sys.modules]; "
        "assert not loaded, loaded"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
