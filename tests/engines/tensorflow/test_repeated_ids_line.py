"""The tensorflow engine says when summing repeated ids' gradients makes a model train differently from plain
Keras-TF, and `train.combine_repeated_ids: false` reproduces plain Keras-TF (issue 40, item 5;
tensorflow/tensorflow#28090)."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored
from helpers import digits_recipe

import tpukit
from tpukit.engines.tensorflow import sparse
from tpukit.planner.settings import run_settings
from tpukit.recipe import RecipeError, from_dict

VOCAB, DIM, LR = 8, 4, 1e-2
# Id 1 in every example (twice in the first): the per-lookup updates of plain Keras-TF show at the first step.
IDS = np.array([[1, 1, 2], [1, 3, 4], [1, 2, 5], [1, 3, 7]], "int32")
LABELS = np.array([0, 1, 0, 1], "int32")
STEPS = 3
LINE = "tpukit plan: repeated ids summed before the optimizer"


def embedding_model(compiled: bool = True):
    model = keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(
                VOCAB,
                DIM,
                embeddings_initializer=keras.initializers.RandomNormal(seed=1),
                name="tokens",
            ),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(
                2, kernel_initializer=keras.initializers.RandomNormal(stddev=1.0, seed=2)
            ),
        ],
        name="net",
    )
    if compiled:  # the builder compiles as plain Keras does: tpukit keeps its optimizer and loss
        model.compile(
            optimizer=keras.optimizers.Adam(LR),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model


class Tied(keras.layers.Layer):
    """A table read by a lookup and by the output matmul (KerasHub's ReversibleEmbedding with tied weights): its
    gradient is dense, so summing changes nothing."""

    def build(self, input_shape):
        self.table = self.add_weight(shape=(VOCAB, DIM), name="table")

    def call(self, ids):
        pooled = keras.ops.mean(keras.ops.take(self.table, ids, axis=0), axis=1)
        return keras.ops.matmul(pooled, keras.ops.transpose(self.table))


def tied_model():
    return keras.Sequential([keras.Input((3,), dtype="int32"), Tied(name="tied")])


def dense_model():
    return keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, name="hidden"), keras.layers.Dense(2)]
    )


def _gradients(model, ids):
    with tf.GradientTape() as tape:
        logits = model(ids, training=True)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(LABELS, logits)
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize(
    "make, inputs, expected",
    [
        (lambda: embedding_model(compiled=False), IDS, ["net/tokens/embeddings"]),
        (tied_model, IDS, []),
        (dense_model, IDS.astype("float32"), []),
    ],
    ids=["embedding", "tied_table", "dense_only"],
)
def test_sparse_variables_are_those_whose_gradient_is_indexed_slices(make, inputs, expected):
    model = make()
    grads = _gradients(model, inputs)
    assert sparse.sparse_variables(grads, model.trainable_variables) == expected
    assert sparse.sparse_variables(grads) == [
        f"#{i}" for i, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)
    ]


def test_the_watch_calls_back_where_the_step_is_traced_and_is_idempotent():
    model = embedding_model(compiled=False)
    optimizer = keras.optimizers.Adam(LR)
    optimizer.build(model.trainable_variables)
    seen = []
    assert sparse.watch_sparse_gradients(optimizer, seen.append) is optimizer
    sparse.watch_sparse_gradients(optimizer, seen.append)  # not wrapped twice

    @tf.function
    def step(ids):
        optimizer.apply(_gradients(model, ids), model.trainable_variables)

    for _ in range(3):
        step(IDS)
    assert seen == [["net/tokens/embeddings"]]  # one trace, whatever the steps


def _fit(tmp_path, name, make=embedding_model, x=IDS, **settings):
    output_dir = tmp_path / name
    metrics = tpukit.fit(
        make,
        np.tile(x, (STEPS, 1)),
        np.tile(LABELS, STEPS),
        epochs=1,
        batch_size=len(x),
        output_dir=str(output_dir),
        verbose=0,
        deterministic=True,
        shuffle_buffer=1,
        engine="tensorflow",
        **settings,
    )
    assert metrics["step"] == STEPS
    return [w.numpy() for w in keras.saving.load_model(output_dir / "model.keras").weights]


def _plain_keras():
    keras.utils.set_random_seed(0)
    model = embedding_model()
    model.fit(
        np.tile(IDS, (STEPS, 1)),
        np.tile(LABELS, STEPS),
        batch_size=len(IDS),
        epochs=1,
        shuffle=False,
        verbose=0,
    )
    return [w.numpy() for w in model.weights]


def test_switched_off_an_embedding_model_trains_as_plain_keras_tf_and_no_line_is_said(
    tmp_path, caplog
):
    plain = _plain_keras()
    with caplog.at_level(logging.INFO, logger="tpukit"):
        off = _fit(tmp_path, "off", combine_repeated_ids=False)
    assert LINE not in caplog.text
    for mine, theirs in zip(off, plain, strict=True):
        np.testing.assert_array_equal(mine, theirs)  # bit for bit


def test_by_default_an_embedding_model_differs_from_plain_keras_tf_and_the_plan_says_so(
    tmp_path, caplog
):
    plain = _plain_keras()
    with caplog.at_level(logging.INFO, logger="tpukit"):
        summed = _fit(tmp_path, "on")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(LINE)]
    assert len(lines) == 1, lines
    assert "1 variable(s) with sparse gradients (net/tokens/embeddings)" in lines[0]
    assert "train.combine_repeated_ids=false" in lines[0]
    # id 1, looked up twice in the first example and in every example, moves less than Keras-TF moves it
    assert np.abs(summed[0] - plain[0]).max() > 0.1 * LR


def test_a_model_without_sparse_gradients_says_no_such_line(tmp_path, caplog):
    def compiled_dense():
        model = dense_model()
        model.compile(
            optimizer=keras.optimizers.Adam(LR),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        return model

    with caplog.at_level(logging.INFO, logger="tpukit"):
        _fit(tmp_path, "dense", make=compiled_dense, x=IDS.astype("float32"))
    assert "tpukit plan:" in caplog.text  # the plan was logged here ...
    assert LINE not in caplog.text  # ... without the line


def test_two_replicas_say_the_line_once(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="tpukit"):
        _fit(tmp_path, "two", strategy=mirrored(2))
    assert sum(r.getMessage().startswith(LINE) for r in caplog.records) == 1


def test_the_key_takes_only_true_or_false():
    recipe = digits_recipe(**{"train.combine_repeated_ids": "no"})
    with pytest.raises(
        RecipeError, match=r"train.combine_repeated_ids must be true/false; received 'no'"
    ):
        from_dict(recipe, "r.yaml")
    off = from_dict(digits_recipe(**{"train.combine_repeated_ids": False}), "r.yaml")
    assert run_settings(off).combine_repeated_ids is False
    assert run_settings(from_dict(digits_recipe(), "r.yaml")).combine_repeated_ids is True
