"""tpukit's models and data in plain Keras code: no recipe, no tpukit trainer.

One hand-written `compile`/`fit` script, and one custom training loop with `strategy.run` on 2 replicas
(GradientTape, `optimizer.apply_gradients`, the per-example loss averaged over the GLOBAL batch).
"""

import keras
import numpy as np
import tensorflow as tf
from conftest import mirrored

import tpukit

GLOBAL_BATCH = 64
STEPS_PER_EPOCH = 1437 // GLOBAL_BATCH  # digits' train split


def _test_accuracy(model) -> float:
    images, labels = next(iter(tpukit.data.digits("test").batch(360)))
    predictions = np.argmax(model(images, training=False), axis=-1)
    return float(np.mean(predictions == labels.numpy()))


def test_model_and_data_in_a_plain_keras_script():
    keras.utils.set_random_seed(0)
    model = tpukit.models.small_cnn(input_shape=(8, 8, 1), num_classes=10)
    model.compile(
        optimizer=keras.optimizers.Adam(0.002),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    batches = tpukit.data.training_batches(tpukit.data.digits("train"), GLOBAL_BATCH)
    history = model.fit(batches, epochs=3, steps_per_epoch=STEPS_PER_EPOCH, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]
    assert _test_accuracy(model) > 0.8  # chance: 0.1


def test_model_and_data_in_a_custom_loop_on_two_replicas():
    keras.utils.set_random_seed(0)
    strategy = mirrored(2)
    with strategy.scope():
        model = tpukit.models.small_cnn(input_shape=(8, 8, 1), num_classes=10)
        optimizer = keras.optimizers.Adam(0.002)
        # Built here, not lazily at the first apply_gradients: inside strategy.run in a tf.function, Keras would
        # create its slot variables in a tf.cond, which fails with "You must feed a value for placeholder".
        optimizer.build(model.trainable_variables)
        per_example_loss = keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=None
        )
    batches = strategy.distribute_datasets_from_function(
        lambda ctx: tpukit.data.training_batches(
            tpukit.data.digits("train", ctx), GLOBAL_BATCH, ctx
        )
    )

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            losses = per_example_loss(labels, model(images, training=True))
            # Each replica sees GLOBAL_BATCH / 2 examples; the all-reduce sums the replicas' gradients.
            loss = tf.nn.compute_average_loss(losses, global_batch_size=GLOBAL_BATCH)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def train_step(iterator):
        images, labels = next(iterator)
        per_replica = strategy.run(replica_step, args=(images, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    iterator = iter(batches)
    losses = [float(train_step(iterator)) for _ in range(3 * STEPS_PER_EPOCH)]
    assert int(optimizer.iterations.numpy()) == 3 * STEPS_PER_EPOCH
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    assert _test_accuracy(model) > 0.8


def test_tpukit_log_lines_follow_the_current_stderr(capsys):
    """A handler bound to the stderr of its first use would write to a closed stream once a notebook kernel or
    redirect_stderr replaced it."""
    import contextlib
    import io
    import logging

    from tpukit.logs import enable_logging

    first = io.StringIO()
    with contextlib.redirect_stderr(first):
        enable_logging()
        logging.getLogger("tpukit").info("tpukit: one")
    first.close()
    second = io.StringIO()
    with contextlib.redirect_stderr(second):
        logging.getLogger("tpukit").info("tpukit: two")
    assert second.getvalue() == "tpukit: two\n"
