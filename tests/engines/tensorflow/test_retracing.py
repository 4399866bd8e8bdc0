"""The train and test functions are traced once per run: not again per epoch, per validation, per checkpoint, for the
final evaluation, or per `fit` segment of a resumed run (a partial epoch, then whole epochs).

A retrace costs a trace (and with XLA a compile) that `time_to_first_step` pays once; one per epoch would make every
epoch pay it. Two independent counts, both through the public `callbacks=` seam of `tpukit.run`:

* Python executions of `train_step` / `test_step` (one per replica per trace: MirroredStrategy runs the step
  function in each replica's thread while tracing). Keras builds its step functions from the bound methods
  (`make_train_function` in keras/src/backend/tensorflow/trainer.py), so wrapping them in `set_model` (which runs
  before `fit` builds its function) counts every trace of every function built from them, and every rebuild.
* `experimental_get_tracing_count()` of every `tf.function` reachable from `model.train_function` /
  `model.test_function` (the closure Keras or `tpukit.loop` returns): catches an outer function that retraces while
  reusing an inner one's cached graph, which the first count would miss.
"""

import types

import faults
import keras
import pytest
import tensorflow as tf
from conftest import mirrored
from helpers import digits_recipe

from tpukit.recipe import from_dict
from tpukit.runner import run


class TraceCounter(keras.callbacks.Callback):
    """Counts traces of the model's train and test steps and the `fit` calls (segments) of one run."""

    def __init__(self):
        super().__init__()
        self.traces = {"train_step": 0, "test_step": 0}
        self.fits = 0
        self.train_functions = set()
        self.test_functions = set()
        self._wrapped = None

    def set_model(self, model):
        super().set_model(model)
        if self._wrapped is model:
            return
        assert self._wrapped is None, "one TraceCounter per run: it counts one model"
        self._wrapped = model
        for name in self.traces:
            step = getattr(model, name)

            def counted(data, _step=step, _name=name):
                self.traces[_name] += (
                    1  # Python runs only while tracing: a traced graph runs without it
                )
                return _step(data)

            setattr(model, name, counted)

    def on_train_begin(self, logs=None):
        self.fits += 1
        self.train_functions.add(id(self.model.train_function))

    def on_test_begin(self, logs=None):
        self.test_functions.add(id(self.model.test_function))

    def traced_at_most_once(self, function) -> bool:
        """Every tf.function behind `function` was traced at most once, and at least one was traced. (tpukit's
        multi-replica loop keeps Keras' own function as a fallback for non-iterator inputs: it is never traced.)"""
        counts = [f.experimental_get_tracing_count() for f in _tf_functions(function)]
        return max(counts, default=0) == 1


def _tf_functions(function, seen=None) -> list:
    """Every `tf.function` in `function`'s closure, recursively (Keras and tpukit wrap them in plain closures)."""
    seen = set() if seen is None else seen
    if id(function) in seen:
        return []
    seen.add(id(function))
    found = []
    if hasattr(function, "experimental_get_tracing_count"):
        found.append(function)
        function = getattr(function, "python_function", None)
    target = getattr(function, "__wrapped__", None)
    if target is not None:
        found += _tf_functions(target, seen)
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(value) and isinstance(
            value, (types.FunctionType, tf.types.experimental.PolymorphicFunction)
        ):
            found += _tf_functions(value, seen)
    return found


def recipe(steps_per_execution: int, **overrides):
    base = {
        "train.epochs": 3,
        "data.global_batch_size": 32,  # 44 steps per epoch; 360 eval examples: 12 eval steps
        "train.warmup_steps": 5,
        "runtime.verbose": 0,
        "runtime.steps_per_execution": steps_per_execution,
        "runtime.checkpoint_every_steps": 8,
        "train.eval_every_epochs": 1,
    }
    return from_dict(digits_recipe(**{**base, **overrides}), "digits_cnn.yaml")


def check_traced_once(counter: TraceCounter, metrics: dict, replicas: int) -> None:
    assert counter.traces == {"train_step": replicas, "test_step": replicas}, counter.traces
    assert len(counter.train_functions) == 1 and len(counter.test_functions) == 1
    model = counter.model
    train_functions = _tf_functions(model.train_function)
    assert train_functions, (
        "no tf.function found in model.train_function: the counting below would prove nothing"
    )
    assert counter.traced_at_most_once(model.train_function)
    assert counter.traced_at_most_once(model.test_function)
    assert metrics["status"] == "done" and metrics["eval"]["accuracy"] > 0.5


@pytest.mark.parametrize("replicas", [1, pytest.param(2, marks=pytest.mark.slow)])
@pytest.mark.integration
def test_one_trace_per_run_across_epochs_validation_checkpoints_and_a_resumed_run(
    tmp_path, replicas
):
    # 2 replicas at steps_per_execution 4 run tpukit's own loop (tpukit.loop, keras-team/keras#19246).
    strategy = mirrored(2) if replicas == 2 else None
    first = TraceCounter()
    with faults.signals_at_step(50):  # a real SIGTERM in epoch 2, after checkpoints at 8, 16..
        preempted = run(recipe(4), str(tmp_path), strategy=strategy, callbacks=[first])
    assert preempted["status"] == "preempted" and preempted["step"] == 52
    # epoch 1, its validation, 6 checkpoints, the start of epoch 2: one trace (run once per replica)
    assert first.traces == {"train_step": replicas, "test_step": replicas}, first.traces
    assert first.traced_at_most_once(first.model.train_function)

    resumed = TraceCounter()
    metrics = run(recipe(4), str(tmp_path), strategy=strategy, callbacks=[resumed])
    assert metrics["resumed_from_step"] == 52 and metrics["step"] == 3 * 44
    assert resumed.fits == 2  # the rest of epoch 2, then epoch 3: two fit segments with one trace
    check_traced_once(resumed, metrics, replicas)


@pytest.mark.integration
def test_the_counter_sees_a_retrace(tmp_path):
    """The check is not vacuous: recompiling the model between fits (which rebuilds its functions) is counted."""
    counter = TraceCounter()

    class Recompile(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.model.make_train_function(force=True)

    run(
        recipe(1, **{"train.epochs": 2, "runtime.checkpoint_every_steps": None}),
        str(tmp_path),
        callbacks=[counter, Recompile()],
    )
    assert counter.traces["train_step"] == 2
