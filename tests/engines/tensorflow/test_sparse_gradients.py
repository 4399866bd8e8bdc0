"""An embedding row looked up several times in a batch is trained by the optimizer's definition on the TensorFlow
engine: one update from the summed gradient, as with a dense gradient and on JAX (issue 18, item 6;
tensorflow/tensorflow#28090)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored

import tpukit
from tpukit.engines.tensorflow import sparse
from tpukit.task.optim import LARS, SGDWithL2

VOCAB, DIM, LR = 8, 4, 1e-3
# Id 1 in every example (five times: twice in the first), ids 2 and 3 twice, ids 4, 5 and 7 once, ids 0 and 6
# never. However tpukit shuffles the examples onto two replicas, id 1 is looked up on both.
IDS = np.array([[1, 1, 2], [1, 3, 4], [1, 2, 5], [1, 3, 7]], "int32")
# One class: with two classes each example's gradient on a row is a positive multiple of one vector
# (W[:, 1] - W[:, 0]), so repeated lookups never cancel and per-occurrence second moments always show.
LABELS = np.zeros(4, "int32")


def build():
    # Average pooling: the two lookups of id 1 in the first example get the same gradient (the worst case for
    # per-occurrence second moments). stddev 1 keeps |gradient| well above Adam's epsilon.
    return keras.Sequential(
        [
            keras.Input((3,), dtype="int32"),
            keras.layers.Embedding(
                VOCAB, DIM, embeddings_initializer=keras.initializers.RandomNormal(seed=1)
            ),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(
                2, kernel_initializer=keras.initializers.RandomNormal(stddev=1.0, seed=2)
            ),
        ]
    )


def _densified(optimizer, dense=False):
    """The reference: `optimizer` fed dense gradients (what JAX computes), by the same two methods (`dense`: the
    engine's argument, which this replacement does not need)."""
    for each in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if each is None:
            continue
        apply, update_step = each.apply, each.update_step
        each.apply = lambda grads, *args, apply=apply, **kwargs: apply(
            [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads],
            *args,
            **kwargs,
        )
        each.update_step = lambda g, v, lr, update_step=update_step: update_step(
            tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g, v, lr
        )
    return optimizer


def _fit_embeddings(tmp_path, name, steps=1, **settings):
    """The embedding table after `tpukit.fit` trains `build()` for `steps` steps of the batch (IDS, LABELS)."""
    output_dir = tmp_path / name
    metrics = tpukit.fit(
        build,
        np.tile(IDS, (steps, 1)),
        np.tile(LABELS, steps),
        epochs=1,
        batch_size=len(IDS),
        learning_rate=LR,
        output_dir=str(output_dir),
        verbose=0,
        deterministic=True,
        **settings,
    )
    assert metrics["step"] == steps
    model = keras.saving.load_model(output_dir / "model.keras", compile=False)
    return model.layers[0].embeddings.numpy()


@pytest.mark.parametrize(
    "replicas, jit_compile",
    [(1, False), (2, False), pytest.param(1, True, id="1-xla", marks=pytest.mark.slow)],
)
def test_one_adam_step_moves_every_looked_up_row_by_the_learning_rate(
    tmp_path, replicas, jit_compile
):
    strategy = mirrored(2) if replicas == 2 else None
    initial = build().layers[0].embeddings.numpy()
    trained = _fit_embeddings(
        tmp_path, "run", optimizer="adam", strategy=strategy, jit_compile=jit_compile
    )
    moved = np.abs(trained - initial) / LR
    # Adam's first step is lr * g / (|g| + epsilon) per component: lr for each looked-up row however many times it
    # was looked up (per-occurrence second moments give sum(g) / sqrt(sum(g^2)) * lr: up to sqrt(5) for id 1).
    looked_up = [1, 2, 3, 4, 5, 7]
    np.testing.assert_allclose(moved[looked_up], 1.0, rtol=1e-3)
    assert not moved[[0, 6]].any()


@pytest.mark.integration
def test_steps_per_execution_on_two_replicas_match_dense_gradients(tmp_path, monkeypatch):
    # Two replicas with steps_per_execution > 1 run tpukit's own loop (loop.py), which calls the optimizer itself.
    combined = _fit_embeddings(
        tmp_path, "combined", steps=2, strategy=mirrored(2), steps_per_execution=2
    )
    monkeypatch.setattr(sparse, "combine_repeated_ids", _densified)
    dense = _fit_embeddings(tmp_path, "dense", steps=2, strategy=mirrored(2), steps_per_execution=2)
    np.testing.assert_allclose(combined, dense, rtol=0, atol=1e-7)


# -- the optimizers themselves --------------------------------------------------------------------------------------

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(LR),
    "adamw": lambda: keras.optimizers.AdamW(LR, weight_decay=0.1),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "sgd_plain": lambda: keras.optimizers.SGD(0.1),
    "lamb": lambda: keras.optimizers.Lamb(LR, weight_decay=0.01),
    "sgd_with_l2": lambda: SGDWithL2(0.1, momentum=0.9, weight_decay=5e-4),
    "lars": lambda: LARS(0.1, momentum=0.9, weight_decay=0.0),
    "lars_l2": lambda: LARS(0.1, momentum=0.9, weight_decay=1e-4),
    "adam_clipnorm": lambda: keras.optimizers.Adam(LR, clipnorm=1e-3),
    "adam_global_clipnorm": lambda: keras.optimizers.Adam(LR, global_clipnorm=1e-3),
    "loss_scale_adam": lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(LR)),
}


def _train(optimizer, ids, labels, steps=3, strategy=None, jit_compile=False):
    """`build()`'s weights after `steps` steps of `optimizer` on the batch (ids, labels), with the loss summed over
    examples (so that two replicas' all-reduced gradient is the one-device gradient)."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model = build()
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
        optimizer = optimizer(model)
        optimizer.build(
            model.trainable_variables
        )  # as Keras' compile/fit does, before the first step

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(
            zip(
                tape.gradient(loss, model.trainable_variables),
                model.trainable_variables,
                strict=True,
            )
        )

    # As Keras' train function: strategy.run inside the tf.function (one replica: the default strategy's run).
    distributed_step = tf.function(
        lambda x, y: strategy.run(step, args=(x, y)), jit_compile=jit_compile
    )
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.from_tensors((ids, labels)).repeat(steps)
    )
    for x, y in dataset:
        distributed_step(x, y)
    return [v.numpy() for v in model.weights]


def _assert_same(actual, expected, atol=1e-7):
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=0, atol=atol)


def _combined(make):
    return lambda model: sparse.combine_repeated_ids(make())


def _dense(make):
    return lambda model: _densified(make())


@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.integration
def test_each_optimizer_updates_as_with_dense_gradients(name):
    make = OPTIMIZERS[name]
    _assert_same(_train(_combined(make), IDS, LABELS), _train(_dense(make), IDS, LABELS))


def test_two_replicas_combine_the_ids_the_all_reduce_concatenates(strategy_2):
    # Each replica's slices are combined before the all-reduce; ids on both replicas repeat again after it.
    make = OPTIMIZERS["adam"]
    _assert_same(
        _train(_combined(make), IDS, LABELS, strategy=strategy_2),
        _train(_dense(make), IDS, LABELS),
        atol=2e-7,
    )


def test_combining_compiles_under_xla():
    make = OPTIMIZERS["adam"]
    _assert_same(
        _train(_combined(make), IDS, LABELS, jit_compile=True),
        _train(_dense(make), IDS, LABELS),
    )


@pytest.mark.parametrize("name", ["adam", "sgd_plain", "loss_scale_adam"])
def test_dense_combining_under_xla_updates_as_with_dense_gradients(name):
    # What the engine does where the step is compiled with XLA (tf.unique's padded slices were 9x slower there).
    make = OPTIMIZERS[name]
    _assert_same(
        _train(
            lambda model: sparse.combine_repeated_ids(make(), dense=True),
            IDS,
            LABELS,
            jit_compile=True,
        ),
        _train(_dense(make), IDS, LABELS),
    )


def test_the_engine_combines_densely_exactly_where_it_compiles_with_xla(tmp_path, monkeypatch):
    seen = []
    original = sparse.combine_repeated_ids

    def spy(optimizer, dense=False):
        seen.append(dense)
        return original(optimizer, dense=dense)

    monkeypatch.setattr(sparse, "combine_repeated_ids", spy)
    _fit_embeddings(tmp_path, "xla", optimizer="adam", jit_compile=True)
    _fit_embeddings(tmp_path, "eager", optimizer="adam", jit_compile=False)
    assert seen == [True, False]


def test_keras_still_applies_repeated_ids_once_per_occurrence():
    # Why this module exists: when this fails, Keras combines repeated ids itself and the wrapper can go.
    make = OPTIMIZERS["adam"]
    uncombined = _train(lambda model: make(), IDS, LABELS, steps=1)
    dense = _train(_dense(make), IDS, LABELS, steps=1)
    assert np.abs(uncombined[0] - dense[0]).max() > 0.3 * LR


def test_combine_repeated_ids_is_idempotent_and_leaves_config_and_checkpoints_alone(tmp_path):
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(LR))
    config = keras.optimizers.serialize(optimizer)
    assert sparse.combine_repeated_ids(optimizer) is optimizer
    inner = optimizer.inner_optimizer
    wrapped = optimizer.apply, inner.apply, inner.update_step
    assert all(hasattr(method, "__wrapped__") for method in wrapped)  # the inner optimizer's too
    sparse.combine_repeated_ids(optimizer)
    assert (optimizer.apply, inner.apply, inner.update_step) == wrapped  # not wrapped twice
    assert keras.optimizers.serialize(optimizer) == config

    weights = _train(lambda model: optimizer, IDS, LABELS, steps=1)
    assert weights  # it trained
    path = tf.train.Checkpoint(optimizer=optimizer).write(str(tmp_path / "ckpt"))
    restored = sparse.combine_repeated_ids(
        keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(LR))
    )
    restored.build(build().trainable_variables)
    tf.train.Checkpoint(optimizer=restored).read(path).assert_consumed()
    _assert_same([v.numpy() for v in restored.variables], [v.numpy() for v in optimizer.variables])


def test_combined_slices_sums_each_id_and_passes_dense_gradients_through():
    slices = tf.IndexedSlices(
        tf.constant([[1.0], [2.0], [4.0]]), tf.constant([3, 1, 3]), tf.constant([5, 1])
    )
    combined = sparse.combined_slices(slices)
    assert sorted(combined.indices.numpy().tolist()) == [1, 3]
    np.testing.assert_array_equal(
        tf.convert_to_tensor(combined).numpy(), tf.convert_to_tensor(slices).numpy()
    )
    summed = sparse.combined_slices(slices, dense=True)
    assert not isinstance(summed, tf.IndexedSlices)
    np.testing.assert_array_equal(summed.numpy(), [[0.0], [2.0], [0.0], [5.0], [0.0]])
    dense = tf.ones([2, 2])
    assert sparse.combined_slices(dense) is dense and sparse.combined_slices(None) is None
    assert sparse.combined_slices(dense, dense=True) is dense
