"""Every registered source through the run's wiring: recipe keys validated, static batches, dtype from policy."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from test_data_tfrecord import _write

from tpukit import data
from tpukit.recipe import RecipeError, from_dict
from tpukit.task import count_examples, input_fns


@pytest.fixture(scope="module")
def source_options(tmp_path_factory):
    """Small local data for every source in data.SOURCES (a new source must be added here)."""
    root = tmp_path_factory.mktemp("sources")
    _write(root / "train-0", np.arange(8))
    _write(root / "test-0", np.arange(8, 12))
    (root / "a.txt").write_text("to be or not to be, that is the question. " * 20)
    return {
        "digits": {},
        "movielens": {},
        "movielens_synthetic": {"num_users": 20, "num_movies": 30, "num_ratings": 200},
        "synthetic": {"input_shape": [4, 4, 1], "num_examples": 16},
        "text_files": {
            "file_pattern": str(root / "*.txt"),
            "sequence_length": 16,
            "test_fraction": 0.3,
        },
        "tfds": {"name": "cifar10", "augment": "crop_flip"},
        "tfrecord_images": {"file_pattern": str(root / "{split}-*"), "image_size": [16, 16]},
    }


@pytest.fixture(scope="module")
def hub_preset(tmp_path_factory):
    """keras_hub_text's options: a tiny preset whose preprocessor tokenizes (made on first use, a few seconds)."""
    pytest.importorskip("keras_hub")
    from tpukit.models import hub

    return {
        "preset": hub.tiny_preset(str(tmp_path_factory.mktemp("preset"))),
        "sequence_length": 16,
    }


def _recipe(source, options, precision="float32"):
    return from_dict(
        {
            "model": {"name": "small_cnn"},
            "data": {"source": source, "global_batch_size": 4, "shuffle_buffer": 8, **options},
            "train": {"epochs": 1, "learning_rate": 0.01},
            "runtime": {"precision": precision},
        }
    )


def test_every_source_is_covered(source_options):
    # keras_hub_text needs a preset's tokenizer: the `hub_preset` fixture makes a tiny one where a test needs it.
    assert set(source_options) | {"keras_hub_text"} == set(data.SOURCES)


@pytest.mark.parametrize("source", sorted(data.SOURCES))
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.integration
def test_training_and_eval_batches_have_static_shapes(source, policy, source_options, request):
    keras.mixed_precision.set_global_policy(policy)
    if source == "keras_hub_text":
        options = request.getfixturevalue("hub_preset")
    else:
        options = source_options[source]
    recipe = _recipe(source, options)
    with tfds.testing.mock_data(num_examples=8):
        eval_examples = count_examples(recipe, "test")
        train_fn, eval_fn = input_fns(recipe, eval_examples)
        ctx = tf.distribute.InputContext(1, 0, 2)
        for dataset in (train_fn(ctx), eval_fn(ctx)):
            for spec in tf.nest.flatten(dataset.element_spec):
                assert spec.shape.is_fully_defined(), (source, dataset.element_spec)
                assert spec.shape[0] == 2  # per replica
            for features in tf.nest.flatten(dataset.element_spec[0]):  # a tensor, or a dict of them
                if features.dtype.is_floating:
                    assert features.dtype == tf.as_dtype(
                        keras.mixed_precision.global_policy().compute_dtype
                    )
        # The run's eval dataset is one finite pass of eval_steps batches.
        steps = data.eval_steps(eval_examples, recipe.data.global_batch_size)
        # Weights are shaped like the labels (one per token for language models): an example counts once.
        per_example = (tf.reshape(w, (w.shape[0], -1)) for _, _, w in eval_fn(None))
        weights = [float(tf.reduce_sum(tf.reduce_max(w, axis=1))) for w in per_example]
    assert len(weights) == steps and sum(weights) == eval_examples


def test_reserved_args_are_not_recipe_keys(source_options):
    with pytest.raises(RecipeError, match="unknown key data.training"):
        _recipe("tfrecord_images", {**source_options["tfrecord_images"], "training": True})
    recipe = _recipe(
        "tfrecord_images", {**source_options["tfrecord_images"], "split_sizes": {"test": 4}}
    )
    assert count_examples(recipe, "test") == 4 and count_examples(recipe, "train") == 8


def test_pipeline_knobs_reach_the_dataset(source_options):
    recipe = _recipe(
        "digits", {"private_threadpool_size": 2, "prefetch_batches": 3, "deterministic": True}
    )
    train_fn, _ = input_fns(recipe, 0)
    options = train_fn(None).options()
    assert options.threading.private_threadpool_size == 2 and options.deterministic is True
