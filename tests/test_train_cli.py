"""The README's main command, end to end in a subprocess: `python -m tpukit.train recipes/digits_cnn.yaml`.

The training run and its resume are real subprocesses (what a user types); the bad-input cases run the same
`main` in this process (`train_in_process`): they stop before anything is built, so a subprocess would add only its
TensorFlow start-up."""

import glob
import json
import os

import pytest
from helpers import run_cli, train_in_process

from tpukit.environment import engine_choice

FAST = [
    "--set",
    "train.epochs=1",
    "--set",
    "data.global_batch_size=32",
    "--set",
    "train.warmup_steps=5",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    output_dir = str(tmp_path_factory.mktemp("digits"))
    result = run_cli("recipes/digits_cnn.yaml", "--output_dir", output_dir, *FAST)
    return output_dir, result


def snapshot(output_dir):
    files = sorted(glob.glob(os.path.join(output_dir, "**", "*"), recursive=True))
    return {f: os.path.getmtime(f) for f in files if os.path.isfile(f)}


@pytest.mark.integration
def test_one_epoch_trains_evaluates_and_writes_every_output(trained):
    output_dir, result = trained
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(output_dir, "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["steps_per_epoch"] == 1437 // 32 == metrics["step"]
    assert metrics["eval_examples"] == 360
    assert metrics["eval"]["accuracy"] > 0.5  # chance is 0.1
    assert 0 < metrics["eval"]["loss"] < 2.3  # below the untrained log(10)
    assert metrics["examples_per_second"] > 0 and metrics["time_to_first_step_seconds"] > 0
    assert (
        metrics["jit_compile"] is False
        and metrics["precision"] == "float32"
        and metrics["replicas"] == 1
    )
    for path in ("recipe.yaml", "model.keras", "checkpoints/checkpoint"):
        assert os.path.isfile(os.path.join(output_dir, path)), path
    assert glob.glob(os.path.join(output_dir, "logs", "train", "events.out.tfevents.*"))
    # what the user reads: the chosen strategy, the batch split, a progress bar, the accuracy and the speed
    assert "tpukit: engine tensorflow, 1 replica on 1 CPU" in result.stderr
    # runtime.engine: auto (the default), resolved as on this machine, with its reason in the plan and metrics.json
    auto = engine_choice.choose(backend=None)
    assert metrics["engine"] == auto.engine == "tensorflow", auto
    assert metrics["engine_reason"] == auto.reason
    assert f"{auto.describe()}\n" in result.stderr
    assert "global batch 32 = 1 replica(s) x 32 per replica" in result.stderr
    assert "44/44" in result.stdout
    assert (
        "tpukit: done (done, step 44). eval accuracy" in result.stdout
        and "examples/s" in result.stdout
    )


@pytest.mark.integration
def test_rerunning_the_same_command_resumes_instead_of_starting_over(trained):
    output_dir, _ = trained
    result = run_cli("recipes/digits_cnn.yaml", "--output_dir", output_dir, *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(os.path.join(output_dir, "metrics.json")) as f:
        metrics = json.load(f)
    assert metrics["resumed_from_step"] == metrics["step"] == 44  # nothing trained twice
    assert "all 1 epochs are done already" in result.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["--set", "train.epoch=3"],
            "unknown key train.epoch (received 3). Did you mean 'epochs'?",
        ),
        (["--set", "train.epochs=many"], "train.epochs must be an integer; received 'many' (str)"),
        (
            ["--set", "data.global_batch_size=5000"],
            "data.global_batch_size=5000 is larger than the 1437 examples",
        ),
        (
            ["--set", "data.eval_split=validation"],
            "data: digits: unknown split 'validation'; valid splits: train, test",
        ),
        (
            ["--mode", "train", "--set", "train.early_stopping_patience=2"],
            "'val_loss' (train.early_stopping_metric",
        ),
        (
            ["--mode", "eval", "--checkpoint", "/nonexistent/ckpt-3"],
            "--checkpoint '/nonexistent/ckpt-3': no such checkpoint",
        ),
        # issue 8: refused at load time, not trained until the NaN guard gives up (exit 1, outputs written)
        (
            ["--set", "train.learning_rate=.nan"],
            "train.learning_rate must be a finite number; received nan",
        ),
        (
            ["--set", "train.trust_coefficient=0.01"],
            "key train.trust_coefficient (received 0.01) does not apply",
        ),
        (["--mode=bogus"], "flag --mode=bogus: value should be one of <train_and_eval|train|eval>"),
    ],
)
@pytest.mark.integration
def test_bad_input_exits_2_with_a_message_and_leaves_outputs_intact(trained, args, expected):
    output_dir, _ = trained
    before = snapshot(output_dir)
    result = train_in_process("recipes/digits_cnn.yaml", "--output_dir", output_dir, *args)
    assert result.returncode == 2
    assert "tpukit: error:" in result.stderr and expected in result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(output_dir) == before


def test_missing_recipe_file_exits_2(tmp_path):
    result = train_in_process("recipes/nope.yaml", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert (
        "recipe 'recipes/nope.yaml' not found" in result.stderr and "Traceback" not in result.stderr
    )
    assert not os.path.exists(tmp_path / "out")


def test_a_recipe_that_is_not_utf8_exits_2(tmp_path):
    recipe = tmp_path / "latin1.yaml"
    with open("recipes/digits_cnn.yaml", "rb") as f:
        recipe.write_bytes("# r\u00e9sum\u00e9\n".encode("latin-1") + f.read())
    result = train_in_process(str(recipe), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert f"tpukit: error: {recipe}: not UTF-8 text (byte 0xe9 at line 1" in result.stderr
    assert "Traceback" not in result.stderr and not os.path.exists(tmp_path / "out")


@pytest.mark.integration
def test_rerunning_a_finished_run_keeps_its_training_measurements(trained):
    output_dir, _ = trained
    with open(os.path.join(output_dir, "metrics.json")) as f:
        metrics = json.load(f)
    assert (
        metrics["examples_per_second"] > 0 and metrics["train"]["loss"] > 0
    )  # from the first, training run


def test_a_shipped_recipes_placeholder_exits_2_with_the_key_and_the_fix_before_connecting(tmp_path):
    result = train_in_process("imagenet_resnet50", "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2
    assert (
        "data.file_pattern='gs://YOUR_BUCKET/imagenet/{split}-*' is the recipe's placeholder (YOUR_BUCKET)"
        in result.stderr
    )
    assert "Fix: add --set 'data.file_pattern=gs://your-bucket/imagenet/{split}-*'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "out")
