"""The private Keras and TensorFlow internals only the TensorFlow engine touches, in one module (those the
engines share are in `tpukit.engines.keras.keras_private`).

Keras' and TensorFlow's private names (`keras.src.*`, `tensorflow.python.*`, underscore attributes and methods of
their objects) can change in any release. tpukit touches them only here and in the shared module, each through one
small named function that says what it works around, the upstream issue where there is one, and the versions it was
tested with; `tests/engines/tensorflow/test_keras_private.py` keeps `keras.src` and `tensorflow.python` imports out
of every other module. Importing this module imports neither Keras nor TensorFlow (each function imports what it needs), so the doctor still runs where they are broken.

Tested ranges (the suite on each; `.ci/tf_matrix.sh`):
- Keras 3.15.x: `compat.KERAS_TESTED` (3.15.1 tested); outside it tpukit refuses to run unless
  $TPUKIT_ALLOW_UNTESTED_KERAS=1.
- TensorFlow 2.19-2.21: `tpukit.environment.versions.MIN_TF` .. `MAX_TF_EXCLUSIVE` (2.19.1, 2.20.0, 2.21.0
  tested on the CPU wheel; tensorflow-tpu 2.19.1 for `tpu_kernels_registered`).

The Keras line numbers below are from keras 3.15.1 (`keras/src/...`).
"""

from __future__ import annotations

import types

# -- Keras' TensorFlow trainer (keras/src/backend/tensorflow/trainer.py) ----------------------------------------------


def autoconvert_optionals(model, step_function):
    """`step_function` wrapped as Keras wraps it before `strategy.run`: `tf.experimental.Optional` inputs become
    None (`TensorFlowTrainer._autoconvert_optionals`, keras/src/backend/tensorflow/trainer.py line 115); the
    function itself where this Keras has no such method. Used by `loop._multi_step_function`, which replaces
    Keras' train function (keras-team/keras#19246). Tested: Keras 3.15.x with TensorFlow 2.19-2.21.
    """
    if hasattr(model, "_autoconvert_optionals"):
        return model._autoconvert_optionals(step_function)
    return step_function


def _local_replica_symbolic_build(self, iterator=None, data_batch=None):
    """Keras' `_maybe_symbolic_build`, but shaped from one local replica's batch.

    Keras 3.15 (keras/src/backend/tensorflow/trainer.py line 713, `_maybe_symbolic_build`) averages the first
    distributed batch with an eager `strategy.reduce("MEAN", ...)` only to learn its shapes; across
    MultiWorkerMirroredStrategy workers that reduce fails ("Attempt to convert a value (PerReplica...) to a
    Tensor"). One replica's batch has the same shape. Reads `_distribute_strategy` and calls `_symbolic_build`
    (keras/src/trainers/trainer.py line 1125) as Keras' method does.
    """
    import tensorflow as tf
    from keras.src import tree

    if self._distribute_strategy is None:
        return
    if iterator is not None:
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tree.map_structure(
                lambda v: (
                    self.distribute_strategy.experimental_local_results(v)[0]
                    if isinstance(v, tf.distribute.DistributedValues)
                    else v
                ),
                batch,
            )
            break
    with self.distribute_strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def build_from_one_replica_batch(model) -> None:
    """Makes `model` learn its input shapes from one local replica's batch (`_local_replica_symbolic_build`)
    instead of Keras' cross-worker mean, by binding it over the instance's `_maybe_symbolic_build`; a Keras
    without that method is left alone. No upstream issue (the failure is MultiWorkerMirroredStrategy's; see
    `loop._needs_loop`). Tested: Keras 3.15.x with TensorFlow 2.19-2.21 (multi-worker on CPU).
    """
    if hasattr(model, "_maybe_symbolic_build"):
        model._maybe_symbolic_build = types.MethodType(_local_replica_symbolic_build, model)


def profiled_float_ops(graph, op_type_regexes: list[str]) -> int:
    """FLOPs TensorFlow's profiler counts in `graph` for the ops whose type matches one of `op_type_regexes`.

    `tensorflow.python.profiler.model_analyzer.profile` is what `tf.compat.v1.profiler.profile` exports (the same
    function); `tensorflow.python.util.deprecation.silence` has no public name and quiets the TF1 shape helper
    the flops registry calls, which warns on every call. No upstream issue.
    Tested: TensorFlow 2.19-2.21.
    """
    from tensorflow.python.profiler import model_analyzer, option_builder
    from tensorflow.python.util import deprecation

    options = option_builder.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    options["account_type_regexes"] = list(op_type_regexes)
    with deprecation.silence():
        profile = model_analyzer.profile(graph=graph, options=options)
    return int(profile.total_float_ops)


def tpu_kernels_registered() -> bool | None:
    """Whether this TensorFlow registered the `TPUExecute` kernel (a TPU build does, the CPU/GPU wheel does not);
    None when the private kernel registry cannot say.

    `tensorflow.python.framework.kernels.get_registered_kernels_for_op` has no public equivalent. No upstream
    issue. Tested: tensorflow 2.19.1-2.21 (False: the CPU wheel) and tensorflow-tpu 2.19.1 (True, even with no
    TPU attached).
    """
    try:
        from tensorflow.python.framework import kernels

        return bool(kernels.get_registered_kernels_for_op("TPUExecute").kernel)
    except Exception:  # noqa: BLE001 - a private API: whatever a moved or changed one raises means "cannot tell"
        return None


def initialized_tpu_systems() -> dict:
    """TensorFlow's own record of the TPU systems this process initialized (keyed like the resolver's `tpu`), or
    {} where this build lacks it.

    `tensorflow.python.tpu.tpu_strategy_util.get_initialized_tpu_systems` has no public equivalent; a second
    `tf.tpu.experimental.initialize_tpu_system` would wipe every variable on the TPU. No upstream issue.
    Tested: TensorFlow 2.19-2.21 (the CPU wheel imports it and returns {}; the TPU path is mocked in
    tests/engines/tensorflow/test_strategy.py).
    """
    try:
        from tensorflow.python.tpu import tpu_strategy_util

        return tpu_strategy_util.get_initialized_tpu_systems()
    except (ImportError, AttributeError):
        return {}


def serialized_dataset_graph(dataset):
    """The GraphDef (a serialized tensor) tf.data ships to other processes for `dataset`, its functions included.

    `tf.data.Dataset._as_serialized_graph`: no public API returns a dataset's graph (tested on TensorFlow
    2.19-2.21); `python -m tpukit.check` reads the op types in it. No upstream issue.
    """
    import tensorflow as tf

    return dataset._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN
    )
