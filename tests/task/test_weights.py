"""Sample and class weights in the input pipeline, the task a compiled loss states, and `train.class_weight`'s
validation (issue 40): fast, no training."""

import numpy as np
import pytest
import tensorflow as tf

from tpukit.data.pipeline import eval_batches, mean_weights, training_batches, with_class_weights
from tpukit.recipe import RecipeError, from_dict
from tpukit.task.targets import CUSTOM, LabelFacts, OutputFacts, decide, loss_task


def _examples(n=5, weights=True):
    x = np.arange(n * 2, dtype="float32").reshape(n, 2)
    y = np.arange(n, dtype="int32") % 3
    w = np.linspace(0.5, 2.5, n).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y, w) if weights else (x, y)), x, y, w


def test_eval_weights_are_the_sample_weights_then_zero_padding():
    examples, x, y, w = _examples(5)
    batches = list(eval_batches(examples, 5, 4, weight_ranks=0))
    assert len(batches) == 2
    weights = np.concatenate([b[2].numpy() for b in batches])
    np.testing.assert_array_equal(weights, np.concatenate([w, [0, 0, 0]]))
    np.testing.assert_array_equal(np.concatenate([b[1].numpy() for b in batches])[:5], y)
    assert all(b[2].shape == (4,) for b in batches)  # static shapes, the padding batch's too


def test_per_token_sample_weights_multiply_the_per_token_padding():
    # A language model's (x, y, padding mask): [B, T] labels, the loss per token (weight rank 1).
    x = np.ones((3, 4), "int32")
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], "float32")
    examples = tf.data.Dataset.from_tensor_slices((x, x, mask))
    (first, second) = list(eval_batches(examples, 3, 2, weight_ranks=1))
    np.testing.assert_array_equal(first[2], mask[:2])
    np.testing.assert_array_equal(second[2], np.stack([mask[2], np.zeros(4)]))
    # One weight per example against per-token labels: broadcast over the tokens, as Keras broadcasts it.
    per_example = tf.data.Dataset.from_tensor_slices((x, x, np.array([2.0, 3.0, 4.0], "float32")))
    (first, second) = list(eval_batches(per_example, 3, 2, weight_ranks=1))
    np.testing.assert_array_equal(first[2], [[2.0] * 4, [3.0] * 4])
    np.testing.assert_array_equal(second[2], [[4.0] * 4, [0.0] * 4])


def test_one_sample_weight_weighs_every_output_or_one_per_output():
    x = np.zeros((2, 1), "float32")
    labels = {"a": np.zeros((2,), "int32"), "b": np.zeros((2, 1), "float32")}
    shared = tf.data.Dataset.from_tensor_slices((x, labels, np.array([2.0, 5.0], "float32")))
    (batch,) = list(eval_batches(shared, 2, 3, weight_ranks={"a": 0, "b": 0}))
    np.testing.assert_array_equal(batch[2]["a"], [2, 5, 0])
    np.testing.assert_array_equal(batch[2]["b"], [2, 5, 0])
    own = {"a": np.array([1.0, 2.0], "float32"), "b": np.array([3.0, 4.0], "float32")}
    separate = tf.data.Dataset.from_tensor_slices((x, labels, own))
    (batch,) = list(eval_batches(separate, 2, 3, weight_ranks={"a": 0, "b": 0}))
    np.testing.assert_array_equal(batch[2]["a"], [1, 2, 0])
    np.testing.assert_array_equal(batch[2]["b"], [3, 4, 0])


def test_mean_weights_per_loss_value_scale_a_weighted_mean_to_keras_sum_over_batch_size():
    x = np.ones((3, 4), "int32")
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], "float32")
    assert mean_weights(tf.data.Dataset.from_tensor_slices((x, x, mask)), 1, batch=2) == 0.5
    per_example = tf.data.Dataset.from_tensor_slices((x, x, np.array([1.0, 2.0, 6.0], "float32")))
    assert mean_weights(per_example, 1) == 3.0  # broadcast over the 4 tokens: (4 + 8 + 24) / 12


def test_training_batches_pass_the_sample_weights_to_keras_as_they_are():
    examples, _, _, w = _examples(8)
    batch = next(iter(training_batches(examples, 4, shuffle_buffer=1, cache=False)))
    assert len(batch) == 3
    np.testing.assert_array_equal(batch[2], w[:4])


def test_class_weights_become_per_example_weights_times_the_sample_weights():
    examples, _, y, w = _examples(6, weights=False)
    weighted = list(with_class_weights(examples, {0: 2.0, 2: 0.5}).as_numpy_iterator())
    assert [e[2] for e in weighted] == [2.0, 1.0, 0.5, 2.0, 1.0, 0.5]  # class 1 unnamed: 1
    examples, _, y, w = _examples(6)
    weighted = list(with_class_weights(examples, {0: 2.0, 2: 0.5}).as_numpy_iterator())
    np.testing.assert_allclose([e[2] for e in weighted], w * [2.0, 1.0, 0.5, 2.0, 1.0, 0.5])
    one_hot = tf.data.Dataset.from_tensor_slices(
        (np.zeros((2, 1)), np.eye(3, dtype="float32")[[2, 0]])
    )
    assert [
        e[2] for e in with_class_weights(one_hot, {2: 4.0}, one_hot=True).as_numpy_iterator()
    ] == [4.0, 1.0]
    # Per-token sample weights (a padding mask) times one class weight per example, and per-token class ids.
    tokens = tf.data.Dataset.from_tensor_slices(
        (np.zeros((2, 1)), np.array([1, 0], "int32"), np.array([[1, 1, 0], [1, 0, 0]], "float32"))
    )
    weighted = [e[2].tolist() for e in with_class_weights(tokens, {1: 3.0}).as_numpy_iterator()]
    assert weighted == [[3.0, 3.0, 0.0], [1.0, 0.0, 0.0]]
    per_token = tf.data.Dataset.from_tensor_slices(
        (np.zeros((1, 1)), np.array([[1, 0, 1]], "int32"), np.array([2.0], "float32"))
    )
    weighted = [e[2].tolist() for e in with_class_weights(per_token, {1: 3.0}).as_numpy_iterator()]
    assert weighted == [[6.0, 2.0, 6.0]]
    # Keras rounds binary labels (a [1]-shaped 0/1 label) to the class id.
    binary = tf.data.Dataset.from_tensor_slices(
        (np.zeros((2, 1)), np.array([[1.0], [0.0]], "float32"))
    )
    assert [e[2] for e in with_class_weights(binary, {0: 1.0, 1: 3.0}).as_numpy_iterator()] == [
        3.0,
        1.0,
    ]


def test_class_weights_read_labels_as_keras_for_a_loss_tpukit_does_not_know():
    # one_hot=None (a custom loss): argmax when the last axis is longer than 1, else rounded ids, as Keras.
    labels = [
        np.eye(3, dtype="float32")[[2, 0]],
        np.array([[2.2], [0.4]], "float32"),
        np.array([1.6, 0.0]),
    ]
    for label in labels:
        examples = tf.data.Dataset.from_tensor_slices((np.zeros((2, 1)), label))
        found = [
            e[2] for e in with_class_weights(examples, {2: 4.0}, one_hot=None).as_numpy_iterator()
        ]
        assert found == [4.0, 1.0], label
    # A last axis of unknown length is read when the data comes.
    unknown = tf.data.Dataset.from_generator(
        lambda: iter([(0.0, np.eye(3, dtype="float32")[2]), (0.0, np.array([2.0], "float32"))]),
        output_signature=(tf.TensorSpec([]), tf.TensorSpec([None])),
    )
    assert [
        e[2] for e in with_class_weights(unknown, {2: 4.0}, one_hot=None).as_numpy_iterator()
    ] == [4.0, 4.0]


def test_a_huge_class_id_is_looked_up_without_a_table_as_long_as_the_id():
    # {1_000_000_000: 1} once built a list of a billion weights; the lookup now grows with the number of keys.
    examples = tf.data.Dataset.from_tensor_slices(
        (np.zeros((4, 1)), np.array([0, 7, 2147483647, -1]))
    )
    weights = {0: 2.0, 2147483647: 5.0, 1_000_000_000: 9.0}
    found = [e[2] for e in with_class_weights(examples, weights).as_numpy_iterator()]
    assert found == [2.0, 1.0, 5.0, 1.0]


@pytest.mark.parametrize(
    "name, task",
    [
        ("mse", "regression"),
        ("MeanSquaredError", "regression"),
        ("mean_absolute_error", "regression"),
        ("Huber", "regression"),
        ("sparse_categorical_crossentropy", "classification"),
        ("CategoricalCrossentropy", "classification"),
        ("binary_crossentropy", "binary"),
        ("KLDivergence", None),
        ("my_module:my_loss", None),
    ],
)
def test_a_loss_states_its_task(name, task):
    assert loss_task(name) == task


def test_a_regression_loss_takes_real_targets_on_a_softmax_output_and_a_custom_loss_is_unchecked():
    # The Keras distribution-API guide: mse on a softmax output, targets from a normal distribution.
    output = OutputFacts("out", (4,), "softmax")
    label = LabelFacts((4,), "float32", sampled=8, low=-2.1, high=2.4, integral=False)
    with pytest.raises(ValueError, match="cannot be negative"):
        decide([output], label)  # inferred: soft labels
    (target,) = decide([output], label, {"out": "regression"})
    assert target.task == "regression"
    (target,) = decide([output], label, {"out": CUSTOM})
    assert target.task == CUSTOM and "not checked" in target.describe()
    # Class ids beyond the output's classes pass unchecked under a loss tpukit does not know.
    ids = LabelFacts((), "int32", sampled=8, low=0, high=9)
    (target,) = decide([output], ids, {"out": CUSTOM})
    assert target.sparse and target.weight_rank == 0


RECIPE = {
    "model": {"name": "small_cnn"},
    "data": {"source": "synthetic", "global_batch_size": 8},
    "train": {"epochs": 1, "learning_rate": 0.001},
}


def _with_class_weight(value):
    return from_dict({**RECIPE, "train": {**RECIPE["train"], "class_weight": value}}, "r.yaml")


def test_train_class_weight_is_a_mapping_of_class_ids_to_non_negative_numbers():
    assert _with_class_weight({0: 1, 1: 3.5}).train.class_weight == {0: 1.0, 1: 3.5}
    assert _with_class_weight(None).train.class_weight is None
    cases = [
        (
            [1.0, 3.0],
            "train.class_weight must be a mapping of class id to weight; received [1.0, 3.0]",
        ),
        ({}, "must be a mapping of class id to weight; received {}"),
        ({"cat": 1.0}, "keys must be class ids (integers >= 0); received key 'cat' (str)"),
        ({-1: 1.0}, "received key -1 (int)"),
        ({True: 1.0}, "received key True (bool)"),
        ({0: -0.5}, "train.class_weight[0] must be a finite number >= 0; received -0.5"),
        ({0: "high"}, "train.class_weight[0] must be a finite number >= 0; received 'high'"),
        ({0: float("nan")}, "train.class_weight[0] must be a finite number >= 0"),
    ]
    for value, message in cases:
        with pytest.raises(RecipeError) as error:
            _with_class_weight(value)
        assert message in str(error.value) and "Fix: " in str(error.value), str(error.value)
