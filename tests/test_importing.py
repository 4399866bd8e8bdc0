"""tpukit's models and data in plain Keras code: no recipe, no tpukit trainer.

One hand-written `compile`/`fit` script, and one custom training loop with `strategy.run` on 2 replicas
(GradientTape, `optimizer.apply_gradients`, the per-example loss averaged over the GLOBAL batch).
"""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored
from helpers import REPO

import tpukit

GLOBAL_BATCH = 64
STEPS_PER_EPOCH = 1437 // GLOBAL_BATCH  # digits' train split


def _test_accuracy(model) -> float:
    images, labels = next(iter(tpukit.data.digits("test").batch(360)))
    predictions = np.argmax(model(images, training=False), axis=-1)
    return float(np.mean(predictions == labels.numpy()))


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.parametrize(
    "module",
    [
        # One module per package that sets the default (each package's __init__ runs first), plus the paths
        # where TensorFlow, not Keras, is imported first (it fixes Keras' backend through keras.src.backend.config).
        "tpukit.task.losses",
        "tpukit.engines.tensorflow.checkpoint",
        *(
            pytest.param(
                m, marks=pytest.mark.slow
            )  # ~5 s each (a TensorFlow import): the slow tier
            for m in (
                "tpukit.runner",
                "tpukit.engines.keras.trainer",
                "tpukit.notebook.helpers",
                "tpukit.tools.doctor",
            )
        ),
    ],
)
@pytest.mark.integration
def test_every_module_that_imports_keras_loads_it_on_tensorflow_whatever_keras_json_says(
    tmp_path, module
):
    # Keras reads ~/.keras/keras.json when KERAS_BACKEND is unset; tpukit sets its default before Keras loads,
    # so a user's keras.json naming jax (here, where jax is not installed: importing it would fail) changes nothing.
    (tmp_path / "keras.json").write_text('{"backend": "jax"}')
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    env.update(KERAS_HOME=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    code = f"import {module}, keras; print(keras.config.backend())"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "tensorflow"


def test_the_engine_refuses_a_keras_already_loaded_on_another_backend(monkeypatch):
    from tpukit.environment import backend

    class Config:
        @staticmethod
        def backend():
            return "jax"

    monkeypatch.setitem(sys.modules, "keras", type("keras", (), {"config": Config}))
    with pytest.raises(
        ImportError,
        match=r"received keras.config.backend\(\)='jax'. Fix: call tpukit.use_engine\('tensorflow'\)",
    ):
        backend.require("tensorflow", "TensorFlow")
