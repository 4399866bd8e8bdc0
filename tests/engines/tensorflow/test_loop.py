"""tpukit.engines.tensorflow.loop: steps_per_execution > 1 on 2 and 4 virtual-CPU replicas matches one device step for step."""

from helpers import REPO  # noqa: I001
import os
import subprocess
import sys
import textwrap
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored

from tpukit.engines.tensorflow.loop import use_multi_step_loop
from tpukit.planner.steps import auto_steps_per_execution, check_steps_per_execution

GLOBAL_BATCH, STEPS, EVAL_STEPS = (
    16,
    8,
    6,
)  # 6 eval batches: the last execution of 4 steps is partial
_rng = np.random.RandomState(0)
X = _rng.randn(GLOBAL_BATCH * STEPS, 6).astype("float32")
Y = (X @ _rng.randn(6, 1) + 0.1).astype("float32")


def _train_batches():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(GLOBAL_BATCH)


def _eval_batches():
    n = GLOBAL_BATCH * EVAL_STEPS
    return tf.data.Dataset.from_tensor_slices((X[:n], Y[:n])).batch(GLOBAL_BATCH)


class BatchLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.train, self.test = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.train.append(batch)

    def on_test_batch_end(self, batch, logs=None):
        self.test.append(batch)


def _model(strategy, steps_per_execution):
    """A functional Dense model whose every train step writes its global loss into `model.step_losses`."""
    with strategy.scope():
        keras.utils.set_random_seed(42)
        inputs = keras.Input((6,))
        outputs = keras.layers.Dense(1)(keras.layers.Dense(16, activation="tanh")(inputs))
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss="mse",
            metrics=["mae"],
            steps_per_execution=steps_per_execution,
        )
        # Each replica writes its loss (already divided by the replica count); reading sums the replicas.
        step_losses = tf.Variable(
            tf.zeros([4 * STEPS]),  # room for the longer runs below
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = type(self).compute_loss(self, x, y, y_pred, sample_weight, training=training)
        if training:
            step = tf.cast(tf.convert_to_tensor(self.optimizer.iterations.value), tf.int32)
            step_losses.assign(
                tf.tensor_scatter_nd_update(step_losses, [[step]], [tf.cast(loss, tf.float32)])
            )
        return loss

    model.compute_loss = types.MethodType(compute_loss, model)
    model.step_losses = step_losses
    return model


def _train_and_evaluate(strategy, steps_per_execution, fix):
    model = _model(strategy, steps_per_execution)
    used = use_multi_step_loop(model) if fix else None
    batches = BatchLogs()
    history = model.fit(_train_batches(), epochs=1, verbose=0, callbacks=[batches], shuffle=False)
    evaluation = model.evaluate(_eval_batches(), verbose=0, return_dict=True, callbacks=[batches])
    return dict(
        used=used,
        model=model,
        step_losses=model.step_losses.numpy(),
        weights=model.get_weights(),
        history=history.history,
        evaluation=evaluation,
        train_batches=batches.train,
        test_batches=batches.test,
        iterations=int(model.optimizer.iterations.numpy()),
    )


def _python(code: str) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter with tests/ (conftest sets up the virtual CPUs) and this file's folder
    importable."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])),
    )
    tests = os.path.join(REPO, "tests")
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tests,
        timeout=300,
    )


def assert_matches_one_device(replicas):
    one_device = _train_and_evaluate(tf.distribute.get_strategy(), steps_per_execution=1, fix=False)
    run = _train_and_evaluate(mirrored(replicas), steps_per_execution=4, fix=True)

    assert run["used"] is True
    assert run["model"].train_function.tpukit_multi_step
    np.testing.assert_allclose(run["step_losses"], one_device["step_losses"], atol=1e-5)
    assert not np.any(one_device["step_losses"][STEPS:])
    assert np.all(
        one_device["step_losses"][:STEPS] > 0
    )  # every one of the 8 steps ran and wrote its loss
    for got, want in zip(run["weights"], one_device["weights"], strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    for key in ("loss", "mae"):
        np.testing.assert_allclose(run["history"][key], one_device["history"][key], atol=1e-5)
        np.testing.assert_allclose(run["evaluation"][key], one_device["evaluation"][key], atol=1e-5)
    assert run["iterations"] == one_device["iterations"] == STEPS
    # Callbacks see Keras' own bookkeeping: the last step index of each execution (one device: every step).
    assert one_device["train_batches"] == list(range(STEPS))
    assert run["train_batches"] == [3, 7]
    assert run["test_batches"] == [
        3,
        7,
    ]  # 6 eval batches: the second execution ran 2 steps and stopped cleanly


@pytest.mark.integration
def test_two_replicas_with_steps_per_execution_match_one_device():
    assert_matches_one_device(2)


@pytest.mark.slow
def test_four_replicas_with_steps_per_execution_match_one_device():
    # In a subprocess: every MirroredStrategy numbers its collective groups from 1, so a 4-replica strategy in this
    # process breaks the shared 2-replica one ("joining a group with size 4, but that group has size 2").
    result = _python("import test_loop; test_loop.assert_matches_one_device(4); print('MATCHED')")
    assert result.returncode == 0 and "MATCHED" in result.stdout, (
        result.stdout + result.stderr[-3000:]
    )


def test_recompile_keeps_the_loop_and_steps_count_with_a_distributed_repeated_dataset():
    """The run.py shape: `distribute_datasets_from_function`, repeated data, `steps_per_epoch`, compile twice."""
    strategy = mirrored(2)
    model = _model(strategy, steps_per_execution=4)
    assert use_multi_step_loop(model)

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(GLOBAL_BATCH)
        return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(batch, drop_remainder=True)

    def fit(epochs):
        batches = BatchLogs()
        model.fit(
            strategy.distribute_datasets_from_function(dataset_fn),
            epochs=epochs,
            steps_per_epoch=STEPS,
            verbose=0,
            callbacks=[batches],
            shuffle=False,
        )
        return batches.train

    assert fit(epochs=2) == [3, 7, 3, 7]
    assert int(model.optimizer.iterations.numpy()) == 2 * STEPS

    with (
        strategy.scope()
    ):  # compile() resets train_function; the bound method must build the loop again
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=2)
    assert fit(epochs=1) == [1, 3, 5, 7]
    assert model.train_function.tpukit_multi_step
    assert int(model.optimizer.iterations.numpy()) == STEPS

    with strategy.scope():  # steps_per_execution 1: Keras' own function again
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=1)
    assert fit(epochs=1) == list(range(STEPS))
    assert not hasattr(model.train_function, "tpukit_multi_step")


def test_models_that_keras_handles_are_left_untouched():
    single = _model(tf.distribute.get_strategy(), steps_per_execution=4)
    one_step = _model(mirrored(2), steps_per_execution=1)
    eager = _model(mirrored(2), steps_per_execution=4)
    eager.run_eagerly = True
    for model in (single, one_step, eager):
        assert use_multi_step_loop(model) is False
        assert "make_train_function" not in vars(model) and "make_test_function" not in vars(model)
    with mirrored(2).scope():
        uncompiled = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
    assert use_multi_step_loop(uncompiled) is False


@pytest.mark.integration
def test_stock_keras_fails_on_two_replicas_so_these_tests_exercise_the_bug():
    """keras-team/keras#19246. In a subprocess: the failed collective step must not poison this process's strategy."""
    script = textwrap.dedent(
        """
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import keras, numpy as np
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse", steps_per_execution=4)
        x = np.ones((128, 6), "float32")
        try:
            model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0)
            print("NO ERROR")
        except tf.errors.InvalidArgumentError as error:
            print("ERROR:", " ".join(str(error).split()))
        """
    )
    result = _python(script)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "You must feed a value for placeholder tensor" in result.stdout, (
        result.stdout + result.stderr[-2000:]
    )


def test_keras_trains_whole_executions_past_the_end_of_an_epoch():
    """Why check_steps_per_execution exists: 8 steps per epoch at 3 steps per execution trains 9 steps."""
    model = _model(tf.distribute.get_strategy(), steps_per_execution=3)
    repeated = tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(GLOBAL_BATCH)
    model.fit(repeated, epochs=1, steps_per_epoch=STEPS, verbose=0, shuffle=False)
    assert int(model.optimizer.iterations.numpy()) == 9


def test_check_steps_per_execution():
    for divisor in (1, 2, 4, 8):
        check_steps_per_execution(divisor, 8)
    with pytest.raises(ValueError) as error:
        check_steps_per_execution(3, 8)
    assert str(error.value) == (
        "steps_per_execution=3 does not divide steps_per_epoch=8: Keras runs whole executions only, so each epoch "
        "would train 9 steps instead of 8. Fix: use a divisor of 8: 1, 2, 4, 8."
    )
    with pytest.raises(ValueError, match="divisor of 36: 1, 2, 3, 4, 6, 9, 12, 18, 36"):
        check_steps_per_execution(48, 36)
    with pytest.raises(ValueError, match=r"Received: steps_per_execution=0"):
        check_steps_per_execution(0, 8)
    with pytest.raises(ValueError, match=r"Received: steps_per_epoch=2.5"):
        check_steps_per_execution(1, 2.5)


@pytest.mark.parametrize(
    "seconds, steps_per_epoch, kwargs, expected",
    [
        (0.01, 100, {}, 50),  # 0.5 s / 0.01 s = 50 steps, and 50 divides 100
        (0.01, 96, {}, 48),  # at most 50 steps; the largest divisor of 96 below that
        (0.1, 10, {}, 5),  # exactly 0.5 s is within the target
        (1.0, 8, {}, 1),  # one step is over the target already: still 1
        (0.001, 97, {}, 97),  # prime: the whole epoch fits in 0.097 s
        (0.001, 97, {"target_seconds": 0.05}, 1),  # ... or only 1 divides
        (1e-6, 5000, {}, 1000),  # capped by `maximum`
        (1e-6, 5000, {"maximum": 300}, 250),
        (0.02, 1251, {"target_seconds": 2.0}, 9),  # 1251 = 3^2 * 139
    ],
)
def test_auto_steps_per_execution(seconds, steps_per_epoch, kwargs, expected):
    chosen = auto_steps_per_execution(seconds, steps_per_epoch, **kwargs)
    assert chosen == expected
    check_steps_per_execution(chosen, steps_per_epoch)


def test_auto_steps_per_execution_rejects_bad_inputs():
    with pytest.raises(ValueError, match=r"Received: time_one_step_seconds=0"):
        auto_steps_per_execution(0, 8)
    with pytest.raises(ValueError, match=r"Received: time_one_step_seconds=nan"):
        auto_steps_per_execution(float("nan"), 8)
    with pytest.raises(ValueError, match=r"Received: target_seconds=-1"):
        auto_steps_per_execution(0.1, 8, target_seconds=-1)
    with pytest.raises(ValueError, match=r"Received: maximum=0"):
        auto_steps_per_execution(0.1, 8, maximum=0)
