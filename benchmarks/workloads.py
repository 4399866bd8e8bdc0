"""The benchmark workloads shared by `vs_keras.py`, `mfu.py` and `compile_times.py`: one model, data and optimizer
each, as a tpukit recipe and as the arrays and Keras objects a plain Keras script would use.

Rows (sizes chosen to run on a 2-core CPU; `quick` shrinks the steps, never the model):

* `mlp`: the seed-style workload: Flatten -> Dense(128, relu) -> Dropout(0.2) -> Dense(10) (TensorFlow's
  beginner quickstart model) on random 28x28 inputs, global batch 1024, Adam.
* `cnn`: `small_cnn` on scikit-learn's digits (the `digits_cnn` recipe's model and data, batch 64), Adam.
* `resnet`: `resnet_cifar` depth 8 on random 32x32x3 images, batch 128, SGD with momentum.
* `transformer`: `causal_lm` (2 layers, width 128, 4 heads, 128 tokens, vocabulary 256), batch 32, Adam.

Only public seams of tpukit are used: `tpukit.register_model`, `tpukit.register_source`, `tpukit.data.*`,
`tpukit.models.MODELS` and `tpukit.recipe.from_dict`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import keras
import numpy as np

import tpukit
from tpukit import data
from tpukit.models import MODELS

ROWS = ("mlp", "cnn", "resnet", "transformer")


def mlp() -> keras.Model:
    """TensorFlow's quickstart MLP (tensorflow.org/tutorials/quickstart/beginner), logits out."""
    return keras.Sequential(
        [
            keras.Input((28, 28), name="image"),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(10, dtype="float32"),
        ],
        name="mlp",
    )


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark row: what tpukit's recipe says, and the same thing for a plain Keras script."""

    name: str
    model_name: str  # in tpukit.models.MODELS (or registered here)
    model_kwargs: dict
    global_batch_size: int
    train_examples: int
    eval_examples: int  # 0: no evaluation
    epochs: int
    optimizer: str  # adam or sgd (tpukit's names; the same Keras class in plain Keras)
    learning_rate: float
    source_kwargs: dict  # for tpukit.data.synthetic; None: the row's own source
    shuffle_buffer: int = 10_000
    quick: bool = False

    @property
    def source_name(self) -> str:
        return f"bench_{self.name}_quick" if self.quick else f"bench_{self.name}"

    @property
    def steps_per_epoch(self) -> int:
        return self.train_examples // self.global_batch_size

    def build_model(self) -> keras.Model:
        return (
            mlp()
            if self.model_name == "bench_mlp"
            else MODELS[self.model_name](**self.model_kwargs)
        )

    def keras_optimizer(self) -> keras.optimizers.Optimizer:
        if self.optimizer == "sgd":
            return keras.optimizers.SGD(self.learning_rate, momentum=0.9)
        return keras.optimizers.Adam(self.learning_rate)

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The split as NumPy arrays (what a plain Keras script passes to `fit`)."""
        x, y = self.source(split=split).batch(1 << 30).get_single_element()
        return x.numpy(), y.numpy()

    def source(self, split: str = "train", input_context=None):
        if self.name == "cnn":
            return data.digits(split=split, input_context=input_context)
        count = self.train_examples if split == "train" else self.eval_examples
        return data.synthetic(
            split=split, input_context=input_context, num_examples=count, **self.source_kwargs
        )

    def recipe(self, **runtime) -> tpukit.Recipe:
        """The tpukit recipe of this row (`runtime` overrides the runtime section, e.g. steps_per_execution)."""
        from tpukit.recipe import from_dict

        register()
        raw = {
            "model": {"name": self.model_name, **self.model_kwargs},
            "data": {
                "source": self.source_name,
                "global_batch_size": self.global_batch_size,
                "eval_split": "test" if self.eval_examples else None,
                "shuffle_buffer": self.shuffle_buffer,
            },
            "train": {
                "epochs": self.epochs,
                "optimizer": self.optimizer,
                "learning_rate": self.learning_rate,
                **({"momentum": 0.9} if self.optimizer == "sgd" else {}),
            },
            "runtime": {"steps_per_execution": "auto", **runtime},
        }
        return from_dict(raw, f"benchmarks/workloads.py:{self.name}")


def workload(name: str, quick: bool = False) -> Workload:
    """The row `name`; `quick` trains fewer steps of the same model."""
    if name == "mlp":
        return Workload(
            "mlp",
            "bench_mlp",
            {},
            1024,
            1024 * (20 if quick else 30),
            1024 * 8,
            2 if quick else 3,
            "adam",
            1e-3,
            {"input_shape": (28, 28), "num_classes": 10},
            quick=quick,
        )
    if name == "cnn":
        # digits: 1,437 train / 360 test images, 22 steps of 64 per epoch.
        return Workload(
            "cnn",
            "small_cnn",
            {"input_shape": (8, 8, 1), "num_classes": 10},
            64,
            1437,
            360,
            4 if quick else 8,
            "adam",
            2e-3,
            {},
            shuffle_buffer=2048,
            quick=quick,
        )
    if name == "resnet":
        return Workload(
            "resnet",
            "resnet_cifar",
            {"depth": 8, "width": 16, "num_classes": 10, "input_shape": (32, 32, 3)},
            128,
            128 * (10 if quick else 20),
            0,
            2,
            "sgd",
            0.05,
            {"input_shape": (32, 32, 3), "num_classes": 10},
            shuffle_buffer=1,
            quick=quick,
        )
    if name == "transformer":
        return Workload(
            "transformer",
            "causal_lm",
            {
                "vocab_size": 256,
                "sequence_length": 128,
                "num_layers": 2,
                "hidden_dim": 128,
                "num_heads": 4,
                "mlp_dim": 512,
            },
            32,
            32 * (10 if quick else 20),
            0,
            2,
            "adam",
            3e-4,
            {
                "input_shape": (128,),
                "label_shape": (128,),
                "integer_inputs": True,
                "num_classes": 256,
            },
            shuffle_buffer=1,
            quick=quick,
        )
    raise ValueError(f"unknown workload {name!r}; valid: {', '.join(ROWS)}")


def register() -> None:
    """Registers the MLP model and one data source per row and size (`bench_<row>`, `bench_<row>_quick`)."""
    tpukit.register_model("bench_mlp", mlp)
    for name in ROWS:
        for quick in (False, True):
            row = workload(name, quick)

            def source(split: str = "train", input_context=None, _row=row):
                return _row.source(split=split, input_context=input_context)

            tpukit.register_source(row.source_name, source)


class SteadyRate(keras.callbacks.Callback):
    """Steady-state examples/s, measured the same way for every variant: optimizer steps after the first execution
    of each `fit` call (which includes tracing and compilation), over wall time minus validation time. Also the time
    from `on_train_begin` of the first `fit` to the end of its first execution (time to first step)."""

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.steps = 0
        self.seconds = 0.0
        self.time_to_first_step = None
        self._first = None
        self._begin = None
        self._testing_since = None
        self._test_seconds = 0.0

    def _iterations(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def on_train_begin(self, logs=None):
        self._begin, self._first, self._test_seconds = time.perf_counter(), None, 0.0

    def on_train_batch_end(self, batch, logs=None):
        if self._first is None:
            now = time.perf_counter()
            if self.time_to_first_step is None:
                self.time_to_first_step = now - self._begin
            self._first = (now, self._iterations())

    def on_test_begin(self, logs=None):
        self._testing_since = time.perf_counter()

    def on_test_end(self, logs=None):
        if self._testing_since is not None:
            self._test_seconds += time.perf_counter() - self._testing_since
            self._testing_since = None

    def on_train_end(self, logs=None):
        if self._first is not None:
            self.steps += self._iterations() - self._first[1]
            self.seconds += time.perf_counter() - self._first[0] - self._test_seconds

    @property
    def examples_per_second(self) -> float | None:
        return (
            self.steps * self.global_batch_size / self.seconds
            if self.steps and self.seconds > 0
            else None
        )


def median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def timed(fn: Callable) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start
