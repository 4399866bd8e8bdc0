"""Every use of private Keras and TensorFlow internals in tpukit, in one module.

Keras' and TensorFlow's private names (`keras.src.*`, `tensorflow.python.*`, underscore attributes and methods of
their objects) can change in any release. tpukit touches them only here, each through one small named function
or class that says what it works around, the upstream issue where there is one, and the versions it was tested
with. Bumping Keras or TensorFlow is a review of this file; `tests/engines/tensorflow/test_keras_private.py`
keeps `keras.src` and `tensorflow.python` imports out of every other module. Importing this module imports
neither Keras nor TensorFlow (each function imports what it needs), so the doctor still runs where they are broken.

Tested ranges (the suite on each; `.ci/tf_matrix.sh`):
- Keras 3.15.x: `compat.KERAS_TESTED` (3.15.1 measured); outside it tpukit refuses to run unless
  $TPUKIT_ALLOW_UNTESTED_KERAS=1.
- TensorFlow 2.19-2.21: `tpukit.environment.versions.MIN_TF` .. `MAX_TF_EXCLUSIVE` (2.19.1, 2.20.0, 2.21.0
  measured on the CPU wheel; tensorflow-tpu 2.19.1 for `tpu_kernels_registered`).

The Keras line numbers below are from keras 3.15.1 (`keras/src/...`).
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator

# -- Keras trainer (keras/src/trainers/trainer.py, keras/src/backend/tensorflow/trainer.py) -------------------------


@contextlib.contextmanager
def validation_only_while(model, allowed: Callable[[], bool]) -> Iterator[None]:
    """Inside the block, `fit` runs an epoch's validation only while `allowed()` is True (and Keras' own
    `validation_freq` rule says so); back to Keras' rule afterwards.

    Keras has no public hook for skipping a validation: `fit` asks `Trainer._should_eval(epoch, validation_freq)`
    (keras/src/trainers/trainer.py line 1022), which this shadows on the instance. No upstream issue.
    Tested: Keras 3.15.x with TensorFlow 2.19-2.21.
    """
    keras_should_eval = type(model)._should_eval
    model._should_eval = lambda epoch, freq: allowed() and keras_should_eval(model, epoch, freq)
    try:
        yield
    finally:
        del model._should_eval  # back to Keras' method


def reset_eval_epoch_iterator(model) -> None:
    """Resets the eval `EpochIterator` that `fit` caches between validations, if there is one.

    Keras 3.15's `fit` keeps it in `model._eval_epoch_iterator` (keras/src/backend/tensorflow/trainer.py lines
    412-415) and can reuse an exhausted one (see `trainer.FreshValidationPass`). No upstream issue.
    Tested: Keras 3.15.x with TensorFlow 2.19-2.21.
    """
    iterator = getattr(model, "_eval_epoch_iterator", None)
    if iterator is not None:
        iterator.reset()


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


# -- Keras callbacks (keras/src/callbacks/tensorboard.py) -----------------------------------------------------------


@functools.cache
def tensorboard_without_scalars() -> type:
    """A `keras.callbacks.TensorBoard` subclass that writes no epoch scalars and no graph (tpukit writes the scalars
    off the step loop, `callbacks.TensorBoardScalars`): what is left is its profiler (`profile_batch`). A function
    so that importing this module imports no Keras (the doctor imports `strategy`, which imports this module).

    Keras 3.15 has no switch for its epoch scalars: `TensorBoard._log_epoch_metrics(epoch, logs)`
    (keras/src/callbacks/tensorboard.py line 548) writes every `epoch_*` scalar; the class overrides it. No
    upstream issue. Tested: Keras 3.15.x with TensorFlow 2.19-2.21.
    """
    import keras

    class TensorBoardWithoutScalars(keras.callbacks.TensorBoard):
        def __init__(self, log_dir, profile_batch):
            super().__init__(log_dir, write_graph=False, profile_batch=profile_batch)

        def _log_epoch_metrics(self, epoch, logs):
            pass

    return TensorBoardWithoutScalars


# -- TensorFlow (tensorflow/python/...) -----------------------------------------------------------------------------


def saved_model_root():
    """An empty `AutoTrackable`, the root object Keras' `ExportArchive` saves (keras/src/export/
    saved_model_export_archive.py line 35): any attribute set on it is tracked and saved, `variables` included
    (a `tf.Module` computes `variables` itself and refuses the assignment). `tf.__internal__` has no stability
    promise. No upstream issue. Tested: TensorFlow 2.19-2.21.
    """
    import tensorflow as tf

    return tf.__internal__.tracking.AutoTrackable()


def record_steps_per_execution(model, steps_per_execution: int) -> None:
    """Sets `steps_per_execution` in the compile config a saved `.keras` file keeps, as if `compile` had been given
    it: tpukit compiles with 1 and decides `auto` once the model is built. Keras 3.15 keeps that config in
    `model._compile_config.config` (keras/src/trainers/trainer.py, `compile`). No upstream issue. Tested: Keras
    3.15.x.
    """
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if isinstance(config, dict) and "steps_per_execution" in config:
        config["steps_per_execution"] = steps_per_execution


def record_jit_compile(model, jit_compile: bool) -> None:
    """Sets `jit_compile` in the compile config a saved `.keras` file keeps, as `record_steps_per_execution` does:
    on a CPU tpukit compiles without XLA and decides once the model is built (`Trainer.jit_compile`'s setter is
    public; the config is not). Tested: Keras 3.15.x."""
    config = getattr(getattr(model, "_compile_config", None), "config", None)
    if isinstance(config, dict) and "jit_compile" in config:
        config["jit_compile"] = jit_compile


def layer_classes(model) -> set[type]:
    """The classes of every layer in `model`, nested ones included (a layer kept as another layer's attribute,
    which `model.layers` does not list). Keras 3 has no public recursive listing: `Layer._flatten_layers`
    (keras/src/layers/layer.py) is what `Layer.summary` and weight tracking walk. No upstream issue. Tested: Keras
    3.15.x."""
    return {type(layer) for layer in model._flatten_layers(include_self=True, recursive=True)}


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


# -- Keras optimizers (keras/src/optimizers/base_optimizer.py) ---------------------------------------------------------


def batch_step(optimizer) -> int:
    """Batches the optimizer has taken: `optimizer._iterations`, which with `gradient_accumulation_steps=k`
    counts every batch while the public `iterations` counts updates (`_iterations // k`, base_optimizer.py
    `iterations` property). tpukit's steps (checkpoints, epochs, the data position) are batches. No upstream
    issue. A `LossScaleOptimizer` (mixed_float16) counts with the optimizer it wraps (its `iterations` property,
    loss_scale_optimizer.py line 312; its own `_iterations` never moves), so the innermost optimizer is read.
    Tested: Keras 3.15.x with TensorFlow 2.19-2.21.
    """
    while getattr(optimizer, "inner_optimizer", None) is not None:
        optimizer = optimizer.inner_optimizer
    counter = getattr(optimizer, "_iterations", None)
    return int((optimizer.iterations if counter is None else counter).numpy())


@contextlib.contextmanager
def averages_kept_apart(optimizer) -> Iterator[None]:
    """Inside the block, `fit` leaves the weights as trained when it returns: with `use_ema`, Keras' `fit` ends
    by copying the moving averages into the model (`finalize_variable_values`, base_optimizer.py), so a
    checkpoint saved after one `fit` (a segment between resumes) would resume from the averages instead of the
    trained weights. Shadows the method on the instance; the engine calls Keras' own after the last checkpoint.
    No upstream issue. Tested: Keras 3.15.x with TensorFlow 2.19-2.21.
    """
    if not getattr(optimizer, "use_ema", False):
        yield
        return
    optimizer.finalize_variable_values = lambda variables: None
    try:
        yield
    finally:
        del optimizer.finalize_variable_values  # back to Keras' method
