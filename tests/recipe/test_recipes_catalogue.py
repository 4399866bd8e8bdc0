"""Every recipe in recipes/: loads strictly, its model fits its data, and it trains on 1 and on 2 replicas.

No network here: TFDS recipes read `tfds.testing.mock_data`, the TFRecord recipe reads a few tiny JPEG records
written to a temporary directory, text recipes read a small local corpus. Models are shrunk with `--set`-style
overrides for the training steps (the recipe's own sizes are checked against its data in the shape test).
The two offline recipes are also trained for real: digits_cnn to >= 97% held-out accuracy, textfiles_char_lm to a
held-out loss clearly below the unigram (byte-frequency) entropy of its training split.
"""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from conftest import mirrored
from helpers import RECIPES, run_jax

import tpukit
from tpukit import data
from tpukit.data import text
from tpukit.models import MODELS

# Recipes that fine-tune a KerasHub preset (a download): tests/engines/jax/test_llm_lora.py runs them on a tiny
# preset made there, on the jax engine they name.
PRESET_RECIPES = ("gemma_lora", "qwen_lora")
RECIPE_NAMES = sorted(
    os.path.basename(p)[: -len(".yaml")]
    for p in glob.glob(os.path.join(RECIPES, "*.yaml"))
    if os.path.basename(p)[: -len(".yaml")] not in PRESET_RECIPES
)

TINY_TRANSFORMER = [
    "model.num_layers=1",
    "model.hidden_dim=32",
    "model.num_heads=2",
    "model.mlp_dim=64",
]
# Per recipe: overrides that keep two training steps fast (the data and model shapes stay consistent).
SMALL = {
    "digits_cnn": [],
    "mnist_cnn": [],
    "cifar10_resnet": ["model.depth=8", "model.width=4"],
    "cifar10_vit": ["model.patch_size=8", *TINY_TRANSFORMER],
    "imdb_transformer": ["model.sequence_length=32", "data.sequence_length=32", *TINY_TRANSFORMER],
    "tiny_shakespeare_char_lm": [
        "model.sequence_length=8",
        "data.sequence_length=8",
        *TINY_TRANSFORMER,
    ],
    "textfiles_char_lm": ["model.sequence_length=16", "data.sequence_length=16", *TINY_TRANSFORMER],
    "imagenet_resnet50": [
        "model.input_shape=[32,32,3]",
        "data.image_size=[32,32]",
        "data.split_sizes=null",
    ],
    "movielens_dcn": ["data.num_ratings=2000"],
    "movielens_100k_dcn": [],
    "synthetic_resnet50": [
        "model.input_shape=[32,32,3]",
        "data.input_shape=[32,32,3]",
        "model.num_classes=10",
        "data.num_classes=10",
        "data.num_examples=16",
    ],
    "synthetic_transformer": [
        "model.vocab_size=64",
        "data.num_classes=64",
        "model.sequence_length=16",
        "data.input_shape=[16]",
        "data.label_shape=[16]",
        "data.num_examples=16",
        *TINY_TRANSFORMER,
    ],
}
NUM_IMAGE_CLASSES = 10
# ResNet-50 takes ~30 s a case here (compile and export of 25M parameters, even on 32x32 images);
# imagenet_resnet50 trains the same model on both strategies in the fast suite.
SLOW_TO_TRAIN = ("synthetic_resnet50", "imagenet_resnet50")  # ResNet-50: ~50 s per row here


def test_every_recipe_has_small_overrides_and_a_documenting_header():
    assert sorted(SMALL) == RECIPE_NAMES
    for name in RECIPE_NAMES:
        with open(os.path.join(RECIPES, f"{name}.yaml"), encoding="utf-8") as f:
            header = f.read().split("\nmodel:")[0]
        assert header.startswith(f"# {name}: "), name
        assert (
            "python -m tpukit.train" in header and "smoke test:" in header and "Measured" in header
        ), name


def _write_jpeg_records(path, labels, seed):
    """One TFRecord file of JPEGs of varying sizes in the TF/TPU ImageNet layout (1-based labels)."""
    rng = np.random.default_rng(seed)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label in labels:
            height, width = rng.integers(24, 48, size=2)
            jpeg = tf.io.encode_jpeg(
                rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            ).numpy()
            feature = {
                "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
                "image/class/label": tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[int(label)])
                ),
            }
            writer.write(
                tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
            )


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    """Overrides that point the recipes reading files at small local copies."""
    root = tmp_path_factory.mktemp("recipe_data")
    for i in range(2):
        _write_jpeg_records(
            root / f"train-0000{i}-of-00002", np.arange(1, NUM_IMAGE_CLASSES + 1), seed=i
        )
    _write_jpeg_records(root / "validation-00000-of-00001", np.arange(1, 7), seed=2)
    corpus = root / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"part{i}.txt").write_text(f"def f{i}(x):\n    return x + {i}\n" * 40)
    return {
        "imagenet_resnet50": [
            f"data.file_pattern={root}/{{split}}-*",
            f"model.num_classes={NUM_IMAGE_CLASSES}",
        ],
        "textfiles_char_lm": [f"data.file_pattern={corpus}/*.txt"],
    }


@pytest.fixture
def mock_tfds():
    with tfds.testing.mock_data(num_examples=64):
        yield


def _load(name, *overrides):
    return tpukit.load_recipe(os.path.join(RECIPES, f"{name}.yaml"), list(overrides))


@pytest.mark.parametrize("name", RECIPE_NAMES)
@pytest.mark.integration
def test_model_matches_the_pipeline_at_full_size(name, local_data, mock_tfds):
    """The recipe's own model accepts its data's features and has a logit for every label."""
    # Only what must point at local files changes: model and data sizes are the recipe's.
    recipe = _load(name, *[o for o in local_data.get(name, []) if o.startswith("data.")])
    if name == "imagenet_resnet50":
        recipe.data.options["label_offset"] = -1  # labels 1..10 in the files -> 0..9 < 1000 logits
    model = MODELS[recipe.model.name](**recipe.model.kwargs)
    source = data.SOURCES[recipe.data.source]
    examples = source(split=recipe.data.train_split, input_context=None, **recipe.data.options)
    features, labels = examples.element_spec
    if isinstance(
        features, dict
    ):  # named inputs (a recommender): ids below each table's vocabulary
        tables = recipe.model.kwargs["tables"]
        assert set(model.input) == set(tables) and set(tables) <= set(features), name
        batch, ratings = next(iter(examples.batch(512)))
        for key, table in tables.items():
            assert features[key].dtype == tf.int32 and features[key].shape == (), (name, key)
            assert 0 <= int(tf.reduce_min(batch[key])), (name, key)
            assert int(tf.reduce_max(batch[key])) < table["vocabulary_size"], (name, key)
        # A rating: one float32 score per example.
        assert labels.dtype == tf.float32 and labels.shape == () and model.output_shape == (None, 1)
        assert 1.0 <= float(tf.reduce_min(ratings)) and float(tf.reduce_max(ratings)) <= 5.0, name
        return
    assert tuple(model.input_shape[1:]) == tuple(features.shape), name
    assert model.inputs[0].dtype == ("int32" if features.dtype.is_integer else "float32"), name
    # Classification: (C,) logits for a scalar label; language models: (T, V) logits for (T,) labels.
    assert tuple(model.output_shape[1:-1]) == tuple(labels.shape), name
    assert labels.dtype == tf.int32, name
    _, label_batch = next(iter(examples.batch(8)))
    assert (
        0 <= int(tf.reduce_min(label_batch))
        and int(tf.reduce_max(label_batch)) < model.output_shape[-1]
    ), name


def _training_cases():
    """Every recipe on the default strategy; on 2 replicas too in the slow tier (tests/test_run.py trains on 2
    replicas in the default tier)."""
    for replicas, label in ((1, "default"), (2, "mirrored2")):
        for name in RECIPE_NAMES:
            slow = name in SLOW_TO_TRAIN or replicas == 2
            yield pytest.param(
                name, replicas, id=f"{name}-{label}", marks=[pytest.mark.slow] if slow else []
            )


@pytest.mark.parametrize("name,replicas", _training_cases())
@pytest.mark.integration
def test_trains_two_steps(name, replicas, local_data, mock_tfds, tmp_path):
    overrides = [
        "train.epochs=1",
        "train.steps_per_epoch=2",
        "data.global_batch_size=4",
        "runtime.steps_per_execution=1",  # one step per call: the smallest program
        "runtime.verbose=0",
        *SMALL[name],
        *local_data.get(name, []),
    ]
    recipe = _load(name, *overrides)
    strategy = mirrored(2) if replicas == 2 else tf.distribute.get_strategy()
    metrics = tpukit.run(recipe, str(tmp_path), strategy=strategy)
    assert metrics["replicas"] == replicas
    assert metrics["step"] == 2
    assert np.isfinite(metrics["train"]["loss"])
    assert os.path.exists(tmp_path / "model.keras")
    if recipe.data.eval_split:
        assert np.isfinite(metrics["eval"]["loss"])
        # The accuracy the run reports is the exported model's, recounted here prediction by prediction.
        _check_recount(name, recipe, metrics, str(tmp_path / "model.keras"))


def _check_recount(name, recipe, metrics, model_path):
    """The eval metric the run reports (accuracy; a regression's mean squared error) equals the exported model's,
    recounted here example by example."""
    if recipe.model.name == "dcn_ranking":
        examples, squared_error = _recount_squared_error(recipe, model_path)
        assert examples == metrics["eval_examples"], name
        assert metrics["eval"]["mse"] * examples == pytest.approx(squared_error, rel=1e-4), name
        return
    examples, correct, total = _recount(recipe, model_path)
    assert examples == metrics["eval_examples"], name
    assert metrics["eval"]["accuracy"] * total == pytest.approx(correct, abs=1e-3), name


def _eval_examples(recipe):
    source = data.SOURCES[recipe.data.source]
    reserved = data.run_args(source, training=False, cache=False)
    return source(
        split=recipe.data.eval_split, input_context=None, **reserved, **recipe.data.options
    )


def _recount_squared_error(recipe, model_path) -> tuple[int, float]:
    """(examples, summed squared error) of the exported model over the eval split, read straight from the source."""
    model = tpukit.load_model(model_path)
    count, total = 0, 0.0
    for features, labels in _eval_examples(recipe).batch(256):
        predicted = np.asarray(model(features, training=False), np.float64)[:, 0]
        count += len(labels)
        total += float(np.sum((predicted - labels.numpy()) ** 2))
    return count, total


def _recount(recipe, model_path) -> tuple[int, int, int]:
    """(examples, correct predictions, predictions) of the exported model over the eval split, read straight from
    the source (no padding, no batching by tpukit): one prediction per example, or per position for sequence
    labels."""
    model = tpukit.load_model(model_path)
    count = correct = total = 0
    for features, labels in _eval_examples(recipe).batch(64):
        predicted = np.argmax(model(features, training=False), axis=-1)
        count += len(labels)
        correct += int(np.sum(predicted == labels.numpy()))
        total += labels.numpy().size
    return count, correct, total


@pytest.mark.integration
def test_language_model_recipes_evaluate(local_data, tmp_path):
    recipe = _load(
        "textfiles_char_lm",
        "train.epochs=1",
        "train.steps_per_epoch=1",
        "data.global_batch_size=4",
        "runtime.verbose=0",
        *SMALL["textfiles_char_lm"],
        *local_data["textfiles_char_lm"],
    )
    metrics = tpukit.run(recipe, str(tmp_path), strategy=tf.distribute.get_strategy())
    assert np.isfinite(metrics["eval"]["loss"])


@pytest.mark.slow
def test_digits_cnn_reaches_97_percent_with_the_default_command(tmp_path):
    metrics = tpukit.run(
        _load("digits_cnn", "runtime.verbose=0"),
        str(tmp_path),
        strategy=tf.distribute.get_strategy(),
    )
    assert metrics["eval_examples"] == 360
    assert metrics["eval"]["accuracy"] >= 0.97


def unigram_entropy_nats(labels: np.ndarray) -> float:
    """Entropy of the byte frequencies of `labels`: the loss of the best model that ignores context."""
    counts = np.bincount(labels.ravel(), minlength=text.VOCAB_SIZE).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


@pytest.mark.slow
def test_textfiles_char_lm_beats_the_unigram_baseline(tmp_path):
    """Default recipe (the stdlib corpus, 400 steps): held-out loss well below the training split's unigram entropy."""
    recipe = _load("textfiles_char_lm", "runtime.verbose=0")
    metrics = tpukit.run(recipe, str(tmp_path), strategy=tf.distribute.get_strategy())
    options = recipe.data.options
    train_labels = np.stack([y for _, y in data.text_files("train", **options).as_numpy_iterator()])
    baseline = unigram_entropy_nats(train_labels)
    model = keras.saving.load_model(tmp_path / "model.keras")
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    held_out = model.evaluate(
        data.text_files("test", **options).batch(64), verbose=0, return_dict=True
    )["loss"]
    print(
        f"textfiles_char_lm: held-out loss {held_out:.4f} nats, unigram entropy {baseline:.4f} nats"
    )
    assert 2.5 < baseline < 4.0  # source code: ~3.1 nats per byte
    assert held_out < baseline - 0.5, (held_out, baseline)
    # run()'s own evaluation (per-token weights, padding excluded) agrees with a plain Keras evaluation.
    assert abs(metrics["eval"]["loss"] - held_out) < 1e-3


@pytest.mark.slow
def test_every_recipe_trains_on_the_jax_engine_over_a_2x4_mesh(local_data, tmp_path):
    """Every shipped recipe, smoke-sized, on the jax engine with its model's default layout on 8 virtual CPU
    devices (one JAX process for all); the exported model.keras is read back here, on TensorFlow, and its
    accuracy recounted example by example."""
    runs = [
        {
            "name": name,
            "recipe": os.path.join(RECIPES, f"{name}.yaml"),
            "overrides": [
                "train.epochs=1",
                "train.steps_per_epoch=2",
                "data.global_batch_size=4",
                "runtime.steps_per_execution=1",
                "runtime.verbose=0",
                "runtime.mesh.data=2",
                "runtime.mesh.model=4",
                *SMALL[name],
                *local_data.get(name, []),
            ],
            "output_dir": str(tmp_path / name),
            "mock_tfds": True,
        }
        for name in RECIPE_NAMES
    ]
    code, results, output = run_jax({"runs": runs}, timeout=1800, all_results=True)
    assert code == 0 and len(results) == len(RECIPE_NAMES), output[-3000:]
    for result in results:
        name = result["name"]
        assert "error" not in result, (name, result.get("error"))
        metrics = result["metrics"]
        assert metrics["engine"] == "jax" and metrics["mesh"] == {"data": 2, "model": 4}, name
        assert metrics["step"] == 2 and np.isfinite(metrics["train"]["loss"]), name
        assert metrics["sharded"], (
            name
        )  # every built-in model splits some weights over the model axis
        recipe = _load(name, *runs[RECIPE_NAMES.index(name)]["overrides"])
        if recipe.data.eval_split:
            with tfds.testing.mock_data(num_examples=64):
                _check_recount(name, recipe, metrics, str(tmp_path / name / "model.keras"))
