"""`steps_per_execution` > 1 under multi-replica MirroredStrategy, and choosing a `steps_per_execution` that fits.

Why Keras fails (Keras 3.15, TF 2.21; keras-team/keras#19246, open): `fit` with `steps_per_execution` > 1 under a
MirroredStrategy of 2+ replicas stops with "You must feed a value for placeholder tensor ...". Keras' multi-step
function calls `strategy.run` from a nested `tf.function` inside a `tf.cond` in a `tf.while_loop`
(`TensorFlowTrainer._make_function`), and MirroredStrategy's `merge_call` (the all-reduce and optimizer update) is
unsupported there (`_MirroredReplicaContext._merge_call`, tensorflow/python/distribute/mirrored_run.py). Both the
nested function and the `tf.cond` are needed to fail; single-replica strategies and stock `evaluate` work.

The fix: `use_multi_step_loop` gives the model train and test functions shaped like Orbit's loop
(`create_tf_while_loop_fn`): `strategy.run` directly in a `tf.while_loop` body, no nested `tf.function`, only the
iterator fetch conditional. Keras' bookkeeping (callbacks, `optimizer.iterations`, `StopIteration`) is unchanged.
Keras' epoch iterator asks for whole executions only, so `check_steps_per_execution` rejects an epoch that is not
a multiple of `steps_per_execution` before training."""

from __future__ import annotations

import logging
import types

from tpukit.engines.tensorflow import keras_private

logger = logging.getLogger("tpukit")


def _needs_loop(model) -> bool:
    """True when Keras' own train/test function fails (Keras 3.15, TF 2.21): a compiled graph-mode model with
    more than one Mirrored replica and `steps_per_execution` > 1, or any MultiWorkerMirroredStrategy (there Keras'
    reduction of the per-replica step outputs fails even at one step per call: "Invalid reduction dimension 0 for
    input with 0 dimensions"). TPUStrategy keeps Keras' own loop: it is the one Keras users run on TPUs, and this
    loop was never run on a TPU."""
    import tensorflow as tf

    if not getattr(model, "compiled", False) or model.run_eagerly:
        return False
    if getattr(model, "_tpukit_loop", "auto") != "auto":  # runtime.loop: keras | tpukit
        return model._tpukit_loop == "tpukit"
    strategy = model.distribute_strategy
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True
    return (
        isinstance(strategy, tf.distribute.MirroredStrategy)
        and strategy.num_replicas_in_sync > 1
        and int(model.steps_per_execution) > 1
    )


def _multi_step_function(model, step_function, stock_function):
    """Runs up to `steps_per_execution` steps of `step_function` per call; returns the model's metric results.

    Args:
        model: the compiled model (its strategy and `steps_per_execution` are read once, here).
        step_function: `model.train_step` or `model.test_step`, run per replica.
        stock_function: Keras' own function, used for inputs that are not iterators (`train_on_batch` passes a
            Python generator; Keras runs those step by step without a `tf.cond`, which works).
    """
    import tensorflow as tf

    strategy = model.distribute_strategy
    steps_per_execution = int(model.steps_per_execution)
    # Keras maps optional inputs (tf.experimental.Optional) to None before the step; keep that behaviour.
    replica_step = keras_private.autoconvert_optionals(model, step_function)

    # No jit_compile here: one XLA cluster cannot hold MirroredStrategy's cross-replica update (see
    # performance.choose_jit_compile), and TPUStrategy compiles `strategy.run` itself. No autograph either, as in
    # Keras (`do_not_convert`): the step runs as Python, the loop below is an explicit tf.while_loop.
    @tf.function(reduce_retracing=True, autograph=False)
    def multi_step(iterator):
        def cond(step, next_inputs):
            return tf.logical_and(step < steps_per_execution, next_inputs.has_value())

        def body(step, next_inputs):
            strategy.run(replica_step, args=(next_inputs.get_value(),))
            # Fetch only if another step follows, so no batch is taken from the iterator and dropped.
            following = tf.cond(
                step + 1 < steps_per_execution, iterator.get_next_as_optional, lambda: next_inputs
            )
            return step + 1, following

        steps, _ = tf.while_loop(cond, body, [tf.constant(0), iterator.get_next_as_optional()])
        # Cross-replica context: the metrics' SyncOnRead variables read as the sum over replicas, so these are the
        # global values (the ones the default train_step/test_step return). Extra keys that a custom step returns
        # are not carried out of the loop.
        return steps, model.get_metrics_result()

    def function(iterator):
        if not isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return stock_function(iterator)
        steps, logs = multi_step(iterator)
        if int(steps) == 0:
            raise StopIteration  # the data ran out before this execution; same contract as Keras' function
        return logs

    function.tpukit_multi_step = (
        True  # lets tests (and debugging) tell this function from Keras' own
    )
    return function


def _make_train_function(self, force=False):
    if self.train_function is not None and not force:
        return self.train_function
    type(self).make_train_function(
        self, force=True
    )  # Keras' function: the fallback, and all we need at 1 replica
    if _needs_loop(self):
        self.train_function = _multi_step_function(self, self.train_step, self.train_function)
    return self.train_function


def _make_test_function(self, force=False):
    if self.test_function is not None and not force:
        return self.test_function
    type(self).make_test_function(self, force=True)
    if _needs_loop(self):
        self.test_function = _multi_step_function(self, self.test_step, self.test_function)
    return self.test_function


def keras_loop_fails(strategy, steps_per_execution: int) -> str | None:
    """Why Keras 3.15's own train function fails on this strategy and `steps_per_execution`, or None."""
    import tensorflow as tf

    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "Keras' fit fails on any MultiWorkerMirroredStrategy (its symbolic build and output reduction)"
    if (
        isinstance(strategy, tf.distribute.MirroredStrategy)
        and strategy.num_replicas_in_sync > 1
        and steps_per_execution > 1
    ):
        return "Keras' fit fails with steps_per_execution > 1 on 2+ MirroredStrategy replicas (keras-team/keras#19246)"
    return None


def use_multi_step_loop(model, loop: str = "auto") -> bool:
    """Makes `fit`/`evaluate` work where Keras 3.15's own functions fail: `steps_per_execution` > 1 on a
    multi-replica MirroredStrategy, and any MultiWorkerMirroredStrategy (where the symbolic build is replaced too).

    Binds replacement `make_train_function`/`make_test_function` onto this model instance (tpukit's models are
    functional `keras.Model`s, not subclasses). They decide on every build, so a later `compile()` with other
    settings keeps working: with `steps_per_execution` 1, `run_eagerly` or one replica they return Keras' own
    function. `predict` keeps Keras' function, which works (it has no `tf.cond` around `strategy.run`).

    Call it after `model.compile(...)`; calling it twice is harmless.

    Args:
        model: a compiled Keras 3 model (TensorFlow backend).
        loop: "auto" (tpukit's loop only where Keras' fails), "tpukit" (always, e.g. on a TPUStrategy whose Keras
            loop fails on the device: the escape hatch `runtime.loop: tpukit`), or "keras" (never).

    Returns:
        True if the model now uses the loop; False if the model was left untouched.
    """
    if loop not in ("auto", "keras", "tpukit"):
        raise ValueError(f"loop must be 'auto', 'keras' or 'tpukit'. Received: loop={loop!r}")
    model._tpukit_loop = loop
    if not _needs_loop(model):
        return False
    if getattr(model.make_train_function, "__func__", None) is not _make_train_function:
        model.make_train_function = types.MethodType(_make_train_function, model)
        model.make_test_function = types.MethodType(_make_test_function, model)
        keras_private.build_from_one_replica_batch(model)
    # Functions Keras may have built already would bypass the new methods.
    model.train_function = None
    model.test_function = None
    logger.info(
        "tpukit: steps_per_execution=%d over %d replica(s) runs in tpukit's while-loop (keras-team/keras#19246)",
        int(model.steps_per_execution),
        model.distribute_strategy.num_replicas_in_sync,
    )
    return True
