"""`python -m tpukit.check`: one failing recipe per rule (built here), the verdict on every shipped recipe, the CLI.

What this proves: each rule fails on the input it exists for, with its fix, and passes on a good recipe; the
verdicts are computed on this CPU. What it does not prove: that a pass means the recipe trains on a TPU (XLA on a
CPU is a proxy; the memory rule is an estimate).
"""

import glob
import json
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import RECIPES, digits_recipe

import tpukit
from tpukit.environment import engine_choice
from tpukit.recipe import RecipeError, from_dict
from tpukit.tools import check as check_lib

# Recipes that fine-tune a KerasHub preset (a download): tests/engines/jax/test_llm_lora.py runs them on a tiny
# preset made there, on the jax engine they name.
PRESET_RECIPES = ("gemma_lora", "qwen_lora")
RECIPE_NAMES = sorted(
    os.path.basename(p)[: -len(".yaml")]
    for p in glob.glob(os.path.join(RECIPES, "*.yaml"))
    if os.path.basename(p)[: -len(".yaml")] not in PRESET_RECIPES
)
CHEAP = ("static_shapes", "batch", "input_ops", "input_paths")


def _rules(results):
    return {rule.name: rule for rule in results}


def _digits(**overrides):
    return from_dict(digits_recipe(**overrides), path="digits_test.yaml")


# ---- sources and models that break one rule each -------------------------------------------------------------


def _ragged_source(split="train", input_context=None, num_examples=64):
    """Features whose length varies per example: batches have a dynamic dimension."""
    return tf.data.Dataset.range(num_examples).map(
        lambda i: (tf.zeros([i % 3 + 1]), tf.cast(i % 2, tf.int32))
    )


def _python_source(split="train", input_context=None, num_examples=64):
    """Digits-shaped examples computed by tf.py_function (Python inside the input graph)."""

    def make(i):
        return np.full((8, 8, 1), float(i) / num_examples, np.float32)

    def example(i):
        image = tf.py_function(make, [i], tf.float32)
        image.set_shape((8, 8, 1))
        return image, tf.cast(i % 10, tf.int32)

    return tf.data.Dataset.range(num_examples).map(example)


class _StringLength(keras.layers.Layer):
    """String ops have no XLA kernel (on any device)."""

    def call(self, x):
        digits = tf.strings.length(tf.strings.as_string(x))
        return x + tf.cast(digits, x.dtype) * 0.0


def _strings_model(num_classes=10):
    inputs = keras.Input((8, 8, 1))
    hidden = keras.layers.Flatten()(_StringLength()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(hidden))


def _bf16_logits_model(num_classes=10):
    """The last layer follows the global policy, so under mixed_bfloat16 the logits are bfloat16."""
    inputs = keras.Input((8, 8, 1))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))


class _Float32Only(keras.layers.Layer):
    """Compiles and runs in float32; refuses to compute in another dtype (as an op without a bfloat16 kernel)."""

    def call(self, x):
        if self.compute_dtype != "float32":
            raise TypeError(f"_Float32Only computes in float32 only, not {self.compute_dtype}")
        return x


def _float32_only_model(num_classes=10):
    inputs = keras.Input((8, 8, 1))
    hidden = _Float32Only()(keras.layers.Flatten()(inputs))
    return keras.Model(inputs, keras.layers.Dense(num_classes, dtype="float32")(hidden))


@pytest.fixture(autouse=True)
def _registered():
    # Per test: conftest restores the registries after each test, so these names never reach other test files.
    tpukit.register_source("check_test_ragged", _ragged_source)
    tpukit.register_source("check_test_python", _python_source)
    tpukit.register_model("check_test_strings", _strings_model)
    tpukit.register_model("check_test_bf16_logits", _bf16_logits_model)
    tpukit.register_model("check_test_float32_only", _float32_only_model)


def _custom(model: str, source: str, **data):
    raw = digits_recipe()
    raw["model"] = {"name": model}
    raw["data"] = {
        "source": source,
        "global_batch_size": 64,
        "eval_split": None,
        "shuffle_buffer": 1,
        **data,
    }
    raw["train"]["steps_per_epoch"] = 1
    return from_dict(raw, path=f"{model}_{source}.yaml")


# ---- one failing recipe per rule -----------------------------------------------------------------------------


def test_static_shapes_fails_on_a_dynamic_dimension():
    recipe = _custom("small_cnn", "check_test_ragged")
    rule = _rules(check_lib.check(recipe, rules=["static_shapes"]))["static_shapes"]
    assert rule.status == "fail"
    assert "train (8, None)" in rule.message and "drop_remainder" in rule.fix


def test_static_shapes_passes_with_one_cores_shapes():
    rule = _rules(check_lib.check(_digits(), cores=8, rules=["static_shapes"]))["static_shapes"]
    assert rule.status == "pass"
    # 64 global / 8 cores: each core's batch; eval adds the weights.
    assert "train (8, 8, 8, 1)" in rule.message and "eval (8,)" in rule.message


@pytest.mark.parametrize(
    "batch, cores, status, text",
    [
        (60, 8, "fail", "does not divide by the 8 replicas"),
        (96, 8, "fail", "12 is not a multiple of 8"),
        (64, 8, "warn", "8 per core is below 128"),
        (1024, 8, "pass", "1024 = 8 cores x 128 per core"),
        (1024, 16, "warn", "64 per core is below 128"),
    ],
)
def test_batch_rule(batch, cores, status, text):
    recipe = _digits(**{"data.global_batch_size": batch})
    rule = _rules(check_lib.check(recipe, cores=cores, rules=["batch"]))["batch"]
    assert rule.status == status, rule
    assert text in rule.message
    if "is not a multiple of 8" in rule.message:
        assert rule.fix.startswith("--set data.global_batch_size=64")


@pytest.mark.parametrize(
    "mesh, batch, status, text",
    [
        (
            {"data": "auto", "model": 2},
            64,
            "pass",
            "mesh data 4 x model 2 on 8 core(s): global batch 64 = 4 data",
        ),
        (
            {"data": "auto", "model": 3},
            64,
            "fail",
            "runtime.mesh.model=3 does not divide the 8 cores",
        ),
        ({"data": 8, "model": 2}, 64, "fail", "needs 16 cores; the target has 8"),
        ({"data": 2, "model": 2}, 64, "warn", "Only 4 of the 8 cores train"),
        (
            {"data": 8, "model": 1},
            60,
            "fail",
            "data.global_batch_size 60 does not divide by the mesh's data axis (8)",
        ),
    ],
)
def test_mesh_rule_on_the_jax_engine(mesh, batch, status, text):
    recipe = _digits(
        **{"runtime.engine": "jax", "runtime.mesh": mesh, "data.global_batch_size": batch}
    )
    results = check_lib.check(recipe, cores=8, rules=["batch"])
    assert [r.name for r in results] == ["mesh", "batch"]
    rule = _rules(results)["mesh"]
    assert rule.status == status, rule
    assert text in rule.message
    if status == "pass":
        # The batch rule counts per data shard: each of a shard's 2 devices sees its whole 16 examples.
        assert "64 = 4 cores x 16 per core" in _rules(results)["batch"].message
        assert "proxy for Keras on JAX" in rule.message


def test_no_mesh_rule_on_the_tensorflow_engine():
    tensorflow = _digits(**{"runtime.engine": "tensorflow"})
    assert [r.name for r in check_lib.check(tensorflow, rules=["batch"])] == ["batch"]


def test_auto_is_checked_as_the_engine_a_run_on_the_tpu_picks():
    """`runtime.engine: auto`: the jax engine on a TPU where no tensorflow-tpu is installed, so the mesh rule."""
    expected = ["mesh", "batch"] if engine_choice.for_tpu("auto").engine == "jax" else ["batch"]
    assert [r.name for r in check_lib.check(_digits(), rules=["batch"])] == expected


def test_input_ops_fails_on_py_function_and_names_the_op():
    recipe = _custom("small_cnn", "check_test_python")
    rule = _rules(check_lib.check(recipe, rules=["input_ops"]))["input_ops"]
    assert rule.status == "fail"
    assert "train: EagerPyFunc" in rule.message and "TFRecord" in rule.fix


def test_input_ops_sees_from_generator():
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(range(3)), output_signature=tf.TensorSpec((), tf.int32)
    )
    rule = check_lib.input_ops_rule({"train": dataset})
    assert rule.status == "fail" and "GeneratorDataset" in rule.message


def _text_files(pattern, **runtime):
    raw = {
        "model": {"name": "causal_lm", "vocab_size": 256, "sequence_length": 16, "num_layers": 1},
        "data": {
            "source": "text_files",
            "file_pattern": pattern,
            "sequence_length": 16,
            "global_batch_size": 1024,
        },
        "train": {"epochs": 1, "learning_rate": 0.001},
        "runtime": runtime,
    }
    return from_dict(raw, path="text_test.yaml")


@pytest.mark.parametrize(
    "pattern, cores, runtime, status",
    [
        ("data/*.txt", 8, {}, "pass"),  # one v5e host holds 8 cores: local files are fine
        ("data/*.txt", 16, {}, "fail"),  # 2 hosts
        ("data/*.txt", 8, {"tpu": "grpc://10.0.0.2:8470"}, "fail"),  # a remote TPU Node's host
        ("data/*.txt", 8, {"tpu": "my-pod"}, "fail"),  # a named TPU
        ("gs://bucket/text/*.txt", 64, {}, "pass"),
    ],
)
def test_input_paths_rule(pattern, cores, runtime, status):
    recipe = _text_files(pattern, **runtime)
    rule = _rules(check_lib.check(recipe, cores=cores, rules=["input_paths"]))["input_paths"]
    assert rule.status == status, rule
    if status == "fail":
        assert "data.file_pattern='data/*.txt'" in rule.message and "gs://" in rule.fix


def test_input_paths_knows_each_generations_host_size():
    recipe = _text_files("data/*.txt")
    # v4 and v5p hosts hold 4 chips, one device each; v3 hosts 4 chips of 2 cores; v5e/v6e hosts 8 chips.
    for tpu_type, single_host in (("v4", 4), ("v5p", 4), ("v3", 8), ("v5e", 8), ("v6e", 8)):
        for cores, status in ((single_host, "pass"), (2 * single_host, "fail")):
            rule = check_lib.input_paths_rule(recipe, check_lib.target_for(recipe, cores, tpu_type))
            assert rule.status == status, (tpu_type, cores, rule)


def test_input_paths_tfds_default_dir_is_local():
    raw = digits_recipe()
    raw["data"] = {"source": "tfds", "name": "mnist", "global_batch_size": 1024}
    raw["model"]["input_shape"] = [28, 28, 1]
    rule = check_lib.input_paths_rule(
        from_dict(raw), check_lib.target_for(from_dict(raw), 32, "v4")
    )
    assert rule.status == "fail" and "data.data_dir=null" in rule.message
    raw["data"]["try_gcs"] = True
    rule = check_lib.input_paths_rule(
        from_dict(raw), check_lib.target_for(from_dict(raw), 32, "v4")
    )
    assert rule.status == "warn" and "public gs:// copy" in rule.message


def test_xla_step_fails_on_an_op_xla_cannot_compile():
    recipe = _custom("check_test_strings", "digits")
    rules = _rules(check_lib.check(recipe, rules=["xla_step", "precision_step"]))
    rule = rules["xla_step"]
    assert rule.status == "fail", rule
    assert "does not compile with XLA" in rule.message and "AsString" in rule.message
    # The bfloat16 step failed, and so did the float32 one: XLA's failure, not the precision's.
    assert rules["precision_step"].status == "skip", rules["precision_step"]
    assert "did not compile with XLA either" in rules["precision_step"].message


def test_a_step_that_fails_only_in_bfloat16_fails_precision_step_not_xla_step():
    """One step in the TPU's precision answers both rules; when it fails, a float32 step tells them apart."""
    recipe = _custom("check_test_float32_only", "digits")
    rules = _rules(check_lib.check(recipe, rules=["xla_step", "precision_step"]))
    assert rules["xla_step"].status == "pass", rules["xla_step"]
    assert "compiled and ran on the CPU in float32" in rules["xla_step"].message
    precision = rules["precision_step"]
    assert precision.status == "fail", precision
    assert (
        "a mixed_bfloat16 train step failed (in float32 it compiled and ran)" in precision.message
    )


def test_precision_step_fails_on_bfloat16_logits():
    recipe = _custom("check_test_bf16_logits", "digits")
    rule = _rules(check_lib.check(recipe, rules=["precision_step"]))["precision_step"]
    assert rule.status == "fail", rule
    assert "logits in bfloat16" in rule.message and "dtype='float32'" in rule.fix
    assert "compiled with XLA" not in rule.message  # the finding is the logits, not the compiler
    assert keras.mixed_precision.global_policy().name == "float32"  # restored


def test_memory_rule_thresholds():
    target = check_lib.target_for(_digits(), 8, "v5e")
    hbm = target.hbm_bytes_per_core
    assert hbm == 16e9  # one TensorCore per v5e chip (cloud.google.com/tpu/docs/v5e)
    assert check_lib.target_for(_digits(), 8, "v3").hbm_bytes_per_core == 16 * 2**30  # 2 cores/chip
    args = (target, 1000, 128, "adam")
    assert check_lib.memory_rule(hbm * 0.5, hbm * 0.4, *args).status == "pass"
    assert check_lib.memory_rule(hbm * 0.5, hbm * 0.6, *args).status == "warn"
    failed = check_lib.memory_rule(hbm * 1.01, 0, *args)
    assert failed.status == "fail" and "state alone does not fit" in failed.message


def test_memory_counts_the_built_optimizer_state():
    recipe = _digits(**{"data.global_batch_size": 1024})
    model = tpukit.models.small_cnn(**recipe.model.kwargs)
    params = model.count_params()
    # adamw: weights + gradients + 2 slots, float32 -> 16 bytes per parameter (all trainable here).
    state = 16 * params
    just_enough = check_lib.check(recipe, rules=["memory"], hbm_bytes=state * 1.001)
    rule = _rules(just_enough)["memory"]
    assert rule.status == "warn", rule  # state fits, activations do not
    assert f"{params:,} parameters" in rule.message
    rule = _rules(check_lib.check(recipe, rules=["memory"], hbm_bytes=state * 0.999))["memory"]
    assert rule.status == "fail", rule


@pytest.mark.integration
def test_a_good_recipe_passes_every_rule_and_logs_each_line_once():
    logger = logging.getLogger("tpukit")
    said = _Said()
    level = logger.level
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    try:
        results = check_lib.check(
            _digits(**{"data.global_batch_size": 1024, "runtime.engine": "tensorflow"})
        )
    finally:
        logger.removeHandler(said)
        logger.setLevel(level)
    assert [r.name for r in results] == list(check_lib.RULES)
    assert {r.name: r.status for r in results} == dict.fromkeys(check_lib.RULES, "pass")
    # The pipelines are built under two precisions and the model for the step and memory: lines come once each.
    assert "tpukit: caching training examples in memory (0.4 MB)" in said.lines
    assert any(line.startswith("tpukit: output 'logits': classification") for line in said.lines)
    assert len(said.lines) == len(set(said.lines)), said.lines


class _Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


# ---- the CLI -------------------------------------------------------------------------------------------------


def test_cli_report_json_and_exit_codes(capsys, tmp_path):
    path = tmp_path / "digits.yaml"
    import yaml

    path.write_text(yaml.safe_dump(digits_recipe()))
    assert check_lib.main([str(path), "--rule", "batch", "--rule", "input_paths"]) == 0
    out = capsys.readouterr().out
    # The header is the first line, once, before any rule's line.
    # runtime.engine auto, as a run on that TPU would resolve it
    auto = engine_choice.for_tpu("auto").describe()
    first = out.splitlines()[0]
    assert first.startswith(f"tpukit check: {path} for 8 core(s) of TPU v5e")
    assert first.endswith(f", {auto}")
    assert out.count("tpukit check: ") == 1
    assert (
        "[WARN] batch" in out
        and "a proxy for the TPU" in out
        and out.rstrip().endswith("(1 warning(s)).")
    )
    argv = [str(path), "--set", "data.global_batch_size=96", "--rule", "batch", "--json"]
    assert check_lib.main(argv) == 1
    report = json.loads(capsys.readouterr().out)
    statuses = {rule["name"]: rule["status"] for rule in report["rules"]}
    assert report["ok"] is False and statuses["batch"] == "fail"
    assert report["target"]["tpu_type"] == "v5e" and "proxy" in report["note"]


@pytest.mark.parametrize(
    "argv, text",
    [
        (["--set", "data.global_batch_sise=64"], "global_batch_sise"),
        (["--tpu-type", "v9"], "--tpu-type must be one of"),
        (["--cores", "0"], "--cores must be a positive integer"),
        (["--rule", "speed"], "unknown rule(s) 'speed'"),
    ],
)
def test_cli_bad_input_exits_2_without_traceback(argv, text, capsys):
    assert check_lib.main([os.path.join(RECIPES, "digits_cnn.yaml"), *argv]) == 2
    err = capsys.readouterr().err
    assert text in err and "Traceback" not in err


def test_check_raises_recipe_error_for_bad_arguments():
    with pytest.raises(RecipeError, match="--cores"):
        check_lib.check(_digits(), cores=-8)


# ---- every shipped recipe ------------------------------------------------------------------------------------

# The cheap rules on each recipe at its own size for 8 v5e cores, TFDS from tfds.testing.mock_data and files from
# small local copies. Recipes sized for a CPU fail `batch` on purpose; their headers give the TPU batch, and
# with it they pass (checked below). Streaming TFDS recipes fail `input_ops` here for a stated reason:
# tfds.testing.mock_data serves examples from a Python generator (GeneratorDataset), where real TFDS reads TFRecord
# files natively.
EXPECTED_BATCH = {
    "cifar10_resnet": "pass",  # 1024 = 8 x 128
    "cifar10_vit": "pass",
    "digits_cnn": "warn",  # 64 = 8 x 8: CPU-sized
    "imagenet_resnet50": "pass",  # 4096 = 8 x 512
    "imdb_transformer": "warn",  # 256 = 8 x 32
    "mnist_cnn": "pass",
    "movielens_100k_dcn": "pass",  # 1024 = 8 x 128
    "movielens_dcn": "pass",
    "synthetic_resnet50": "fail",  # 32 = 8 x 4: CPU-sized; the header's TPU command sets 1024
    "synthetic_transformer": "fail",  # 8 = 8 x 1; the header's TPU command sets 256
    "textfiles_char_lm": "fail",  # 32 = 8 x 4: a laptop recipe
    "tiny_shakespeare_char_lm": "warn",  # 128 = 8 x 16
}
TPU_BATCH = {"synthetic_resnet50": 1024, "synthetic_transformer": 256, "textfiles_char_lm": 64}
# TFDS recipes that stream examples (tiny_shakespeare reads its text whole into memory first, so it passes).
TFDS_RECIPES = {
    "cifar10_resnet",
    "cifar10_vit",
    "imdb_transformer",
    "mnist_cnn",
    "movielens_100k_dcn",
}
# Mock text is shorter than Tiny Shakespeare (123 windows, under one global batch of 128): fix the epoch instead.
MOCK_OVERRIDES = {"tiny_shakespeare_char_lm": ["train.steps_per_epoch=30"]}


@pytest.fixture(scope="module")
def local_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("check_data")
    for split, count in (("train", 2), ("validation", 1)):
        for i in range(count):
            with tf.io.TFRecordWriter(str(root / f"{split}-0000{i}-of-0000{count}")) as writer:
                for label in range(1, 9):
                    jpeg = tf.io.encode_jpeg(np.full((40, 40, 3), label * 20, np.uint8)).numpy()
                    feature = {
                        "image/encoded": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[jpeg])
                        ),
                        "image/class/label": tf.train.Feature(
                            int64_list=tf.train.Int64List(value=[label])
                        ),
                    }
                    example = tf.train.Example(features=tf.train.Features(feature=feature))
                    writer.write(example.SerializeToString())
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("def f(x):\n    return x + 1\n" * 2000)
    return {
        "imagenet_resnet50": [f"data.file_pattern={root}/{{split}}-*"],
        "textfiles_char_lm": [f"data.file_pattern={corpus}/*.txt"],
    }


def test_every_recipe_has_an_expected_verdict():
    assert sorted(EXPECTED_BATCH) == RECIPE_NAMES


@pytest.mark.parametrize("name", RECIPE_NAMES)
@pytest.mark.integration
def test_shipped_recipe_cheap_rules(name, local_files):
    with tfds.testing.mock_data(num_examples=2048):
        overrides = [*local_files.get(name, []), *MOCK_OVERRIDES.get(name, [])]
        recipe = tpukit.load_recipe(name, overrides)
        results = _rules(check_lib.check(recipe, cores=8, tpu_type="v5e", rules=CHEAP))
    for rule_name in ("static_shapes", "input_paths"):
        assert results[rule_name].status == "pass", results[rule_name]
    if name in TFDS_RECIPES:
        assert results["input_ops"].status == "fail"
        assert "train: GeneratorDataset" in results["input_ops"].message
    else:
        assert results["input_ops"].status == "pass", results["input_ops"]
    assert results["batch"].status == EXPECTED_BATCH[name], results["batch"]
    if name in TPU_BATCH:
        recipe = tpukit.load_recipe(
            name, [*local_files.get(name, []), f"data.global_batch_size={TPU_BATCH[name]}"]
        )
        assert check_lib.batch_rule(recipe, check_lib.target_for(recipe), None).status in (
            "pass",
            "warn",
        )


def test_imagenet_recipe_on_a_pod_slice_needs_its_gs_paths(local_files):
    """The shipped path is gs:// (passes on 32 v4 cores); the local copy used above fails there."""
    shipped = tpukit.load_recipe("imagenet_resnet50")
    assert (
        check_lib.input_paths_rule(shipped, check_lib.target_for(shipped, 32, "v4")).status
        == "pass"
    )
    local = tpukit.load_recipe("imagenet_resnet50", local_files["imagenet_resnet50"])
    assert check_lib.input_paths_rule(local, check_lib.target_for(local, 32, "v4")).status == "fail"


# Recipes whose every rule runs at their TPU size on this 2-core, 24 GiB CPU. The others (ResNet-50 at 224 px, ViT,
# the GPT-2-small-shaped LM) exceed it: the imagenet_resnet50 step at 128 images per core was killed by the kernel's
# OOM killer at 21 GB. Their cheap rules run above; their XLA and memory rules need a bigger host.
FULL_SIZE_HERE = ["digits_cnn", "mnist_cnn", "textfiles_char_lm", "imdb_transformer"]


@pytest.mark.slow
@pytest.mark.parametrize("name", FULL_SIZE_HERE)
def test_shipped_recipe_full_check_at_full_size(name, local_files):
    """Every rule, at the recipe's own model size."""
    batch = [f"data.global_batch_size={TPU_BATCH[name]}"] if name in TPU_BATCH else []
    with tfds.testing.mock_data(num_examples=2048):
        overrides = [*local_files.get(name, []), *MOCK_OVERRIDES.get(name, []), *batch]
        recipe = tpukit.load_recipe(name, overrides)
        results = _rules(check_lib.check(recipe, cores=8, tpu_type="v5e"))
    failed = {n: r.message for n, r in results.items() if r.status == "fail"}
    if name in TFDS_RECIPES:
        assert set(failed) == {"input_ops"}  # mock_data's generator (see EXPECTED_BATCH)
    else:
        assert not failed


@pytest.mark.integration
def test_a_jax_recipe_is_checked_on_keras_jax_backend_as_the_jax_engine_trains():
    """`tpukit check` of a jax-engine recipe runs its rules on Keras' JAX backend (its own process: the backend is
    fixed at Keras' first import): the step compiled by XLA through JAX, the memory estimate traced as a jaxpr."""
    import subprocess
    import sys

    from helpers import REPO

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("KERAS_BACKEND", None)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpukit",
            "check",
            "digits_cnn",
            "--set",
            "runtime.engine=jax",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout[result.stdout.index("{") :])
    rules = {r["name"]: r for r in report["rules"]}
    assert "Keras' JAX backend" in rules["mesh"]["message"]
    assert (
        rules["xla_step"]["status"] == "pass" and "compiled and ran" in rules["xla_step"]["message"]
    )
    assert rules["precision_step"]["status"] == "pass"
    assert rules["memory"]["status"] == "pass" and "activations ~" in rules["memory"]["message"]
    assert "TensorFlow backend as a proxy" not in result.stdout
