"""Private Keras (and TensorFlow) internals that both engines' shared trainer, callbacks and export touch, in one
module: each through one small named function that says what it works around, the upstream issue where there is one,
and the versions it was tested with. Bumping Keras is a review of this file and of the engines' own private modules
(`tpukit.engines.tensorflow.keras_private`, `tpukit.engines.jax.compat`); `tests/engines/tensorflow/
test_keras_private.py` keeps `keras.src` and `tensorflow.python` imports out of every other module. Importing this
module imports neither Keras nor TensorFlow (each function imports what it needs).

Tested: Keras 3.15.x (`tpukit.environment.versions.KERAS_TESTED`) with TensorFlow 2.19-2.21 and JAX 0.10-0.12; the
Keras line numbers below are from keras 3.15.1 (`keras/src/...`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator


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


@contextlib.contextmanager
def fresh_names() -> Iterator[None]:
    """Inside the block, Keras names new layers, variables, optimizers and seed generators as in a new process
    (`dense`, `dense_1`, ...); afterwards the caller's own counters are back, raised past every name the block
    used, so the caller's later objects still get names of their own.

    The engines build the model in it: the jax engine's checkpoints match variables by path
    (`dense_1/kernel`, `adam/dense_1_kernel_momentum`), layout keys and output names are names too, and a second
    `tpukit.fit` in a notebook would otherwise build `dense_2`, `dense_3` and not resume. In a new process (the
    CLI) the counters are empty when the model is built, so its names are unchanged. Keras has no public way to
    read or set its per-prefix counters (`keras.backend.get_uid` only counts up; `clear_session` drops the
    user's whole session): they are the thread's global attribute `object_name_uids`, a `defaultdict(int)`
    (keras/src/utils/naming.py `uniquify` and `get_uid`, keras/src/backend/common/global_state.py). No upstream
    issue. Tested: Keras 3.15.x on TensorFlow 2.19-2.21 and JAX 0.10-0.12.
    """
    import collections

    from keras.src.backend.common import global_state

    key = "object_name_uids"
    callers = global_state.get_global_attribute(key)
    global_state.set_global_attribute(key, collections.defaultdict(int))
    try:
        yield
    finally:
        # Read again: a builder calling `keras.backend.clear_session()` replaced the whole global state.
        used = global_state.get_global_attribute(key) or {}
        merged = callers if callers is not None else collections.defaultdict(int)
        for prefix, count in used.items():
            merged[prefix] = max(merged[prefix], count)
        global_state.set_global_attribute(key, merged)


# What Keras raises for a variable made from a value (not an initializer) inside `variables_left_unmade`
# (keras/src/backend/common/variables.py, `KerasVariable.__init__`).
STATELESS_VARIABLE = "create a variable while in a stateless scope"


@contextlib.contextmanager
def variables_left_unmade() -> Iterator[None]:
    """Variables created inside hold no values (no memory, on no device) and are never made later: a model
    rebuilt inside from its config costs its Python objects only. Keras defers a variable made in a
    `keras.StatelessScope` (public) to `keras/src/backend/common/variables.py` `register_uninitialized_variable`, a
    global list that the next outermost scope's exit initializes: it is put back as it was. No upstream issue.
    Tested: Keras 3.15.x."""
    import keras
    from keras.src.backend.common import global_state

    name = "uninitialized_variables"
    before = list(global_state.get_global_attribute(name) or [])
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        global_state.set_global_attribute(name, before)


def jax_variable_class():
    """Keras' JAX variable class (`keras.src.backend.jax.core.JaxVariable`), which the jax engine's
    `compat.sharded_assign` patches while a model loads (keras-team/keras#21634). Keras 3.15."""
    from keras.src.backend.jax.core import JaxVariable

    return JaxVariable


def in_stateless_scope() -> bool:
    """Whether Keras is inside a `StatelessScope` (assignments are recorded, not applied). Keras 3.15."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope as inside

    return inside()
