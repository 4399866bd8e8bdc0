"""The benchmark workloads shared by `vs_keras.py`, `mfu.py` and `compile_times.py`: one model, data and optimizer
each, as a tpukit recipe and as the arrays and Keras objects a plain Keras script would use.

Rows (sizes chosen to run on a 2-core CPU; `quick` shrinks the steps, never the model):

* `mlp`: the seed-style workload: Flatten -> Dense(128, relu) -> Dropout(0.2) -> Dense(10) (TensorFlow's
  beginner quickstart model) on random 28x28 inputs, global batch 1024, Adam.
* `cnn`: `small_cnn` on scikit-learn's digits (the `digits_cnn` recipe's model and data, batch 64), Adam.
* `resnet`: `resnet_cifar` depth 8 on random 32x32x3 images, batch 128, SGD with momentum.
* `transformer`: `causal_lm` (2 layers, width 128, 4 heads, 128 tokens, vocabulary 256), batch 32, Adam.
* `mnist_convnet`: keras-io's examples/vision/mnist_convnet.py as written (Conv2D 32 -> MaxPooling -> Conv2D 64 ->
  MaxPooling -> Flatten -> Dropout(0.5) -> Dense(10, softmax); `categorical_crossentropy` on one-hot labels, Adam,
  batch 128, `validation_split=0.1`, then `evaluate` on the test set) on MNIST-shaped synthetic images in [0, 1]
  whose class adds a fixed pattern of bright pixels to noise, so accuracy means something. keras-io trains 15
  epochs of 60,000 and tests 10,000; here 2 epochs of 12,800 (11,520 trained, 1,280 validated) and 1,280 tested,
  quick 6,400 and 640.
* `text_transformer`: keras-io's examples/nlp/text_classification_with_transformer.py as written (vocabulary
  20,000, 200 tokens, its `TokenAndPositionEmbedding` and `TransformerBlock`: embed 32, 2 heads, feed-forward 32;
  GlobalAveragePooling1D -> Dropout -> Dense(20, relu) -> Dropout -> Dense(2, softmax);
  `sparse_categorical_crossentropy`, Adam, batch 32, `validation_data`) on synthetic token ids in [1, 20,000) with
  8 words of the review's class (ids 1-99 or 100-198) at random places. keras-io trains 2 epochs of 25,000 IMDB
  reviews and validates on 25,000; here 2 epochs of 2,560 and 640 validated, quick 1,280 and 320.

`mlp`, `mnist_convnet` and `text_transformer` are users' own models: `vs_keras.py` hands them to `tpukit.fit` as a
builder function and arrays (`through="fit"`); the others are tpukit recipes. Every row also has a recipe
(`Workload.recipe`, used by `mfu.py`). Only public seams of tpukit are used: `tpukit.register_model`,
`tpukit.register_source`, `tpukit.data.*`, `tpukit.models.MODELS` and `tpukit.recipe.from_dict`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable

import keras
import numpy as np

import tpukit
from tpukit import data
from tpukit.models import MODELS

ROWS = ("mlp", "cnn", "resnet", "transformer", "mnist_convnet", "text_transformer")


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


def mnist_convnet() -> keras.Model:
    """keras-io examples/vision/mnist_convnet.py's model, as written (softmax out)."""
    return keras.Sequential(
        [
            keras.Input(shape=(28, 28, 1)),
            keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
            keras.layers.MaxPooling2D(pool_size=(2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dropout(0.5),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


# keras-io examples/nlp/text_classification_with_transformer.py's two layers, as written: no `get_config` and no
# `register_keras_serializable`, as a user's own layers often are.
class TransformerBlock(keras.layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1):
        super().__init__()
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [
                keras.layers.Dense(ff_dim, activation="relu"),
                keras.layers.Dense(embed_dim),
            ]
        )
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)


class TokenAndPositionEmbedding(keras.layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
        super().__init__()
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = keras.ops.shape(x)[-1]
        positions = keras.ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions


def text_transformer() -> keras.Model:
    """keras-io examples/nlp/text_classification_with_transformer.py's model, as written (softmax out)."""
    vocab_size, maxlen, embed_dim, num_heads, ff_dim = 20000, 200, 32, 2, 32
    inputs = keras.layers.Input(shape=(maxlen,))
    embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
    x = transformer_block(x)
    x = keras.layers.GlobalAveragePooling1D()(x)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Dense(20, activation="relu")(x)
    x = keras.layers.Dropout(0.1)(x)
    outputs = keras.layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


# The rows' own model builders (a user's functions), by model name; registered with tpukit by `register`.
BUILDERS = {
    "bench_mlp": mlp,
    "bench_mnist_convnet": mnist_convnet,
    "bench_text_transformer": text_transformer,
}


def mnist_like(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` MNIST-shaped examples as keras-io's script prepares them: float32 (count, 28, 28, 1) images in
    [0, 1] and one-hot float labels (count, 10). Each class adds its own fixed pattern of bright pixels (the same
    in every split) to uniform noise, so a convnet learns it."""
    patterns = np.random.default_rng(0).random((10, 28, 28, 1)) < 0.2
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)
    images = 0.5 * rng.random((count, 28, 28, 1), dtype=np.float32)
    images += np.float32(0.5) * patterns[labels]
    return images, keras.utils.to_categorical(labels, 10)


def imdb_like(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` IMDB-shaped examples as keras-io's script prepares them: int32 (count, 200) token ids (what
    `pad_sequences` returns) below 20,000 and integer labels 0 or 1. Each sequence carries 8 words of its class
    (ids 1-99 or 100-198) at random places among uniform ids, so the model learns it."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, count)
    tokens = rng.integers(1, 20000, (count, 200))
    words = rng.integers(1, 100, (count, 8)) + 99 * labels[:, None]
    np.put_along_axis(tokens, rng.integers(0, 200, (count, 8)), words, axis=1)
    return tokens.astype(np.int32), labels


# The keras-io rows' synthetic data, by row name: `maker(count, seed)`.
KERAS_IO_DATA = {"mnist_convnet": mnist_like, "text_transformer": imdb_like}


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
    # "fit": (c) is `tpukit.fit` with the row's builder and arrays (a user's own model); "run": the row's recipe.
    through: str = "run"
    # The loss as the row's script names it (softmax outputs); None: class ids on logits, that is
    # SparseCategoricalCrossentropy(from_logits=True) in plain Keras and the loss tpukit infers in (c).
    loss: str | None = None
    # The part of the training examples plain Keras' `fit(validation_split=...)` validates on (its last ones);
    # (b) and (c) get the same split as arrays (`fit_arrays`), and `eval_examples` are then a separate test set.
    validation_split: float = 0.0

    @property
    def source_name(self) -> str:
        return f"bench_{self.name}_quick" if self.quick else f"bench_{self.name}"

    @property
    def fitted_examples(self) -> int:
        """The examples trained on each epoch (the training examples less `validation_split`'s)."""
        return self.train_examples - round(self.train_examples * self.validation_split)

    @property
    def steps_per_epoch(self) -> int:
        return self.fitted_examples // self.global_batch_size

    @property
    def builder(self) -> Callable[[], keras.Model]:
        """The function building the row's model (a user's own for `through="fit"` rows)."""
        if self.model_name in BUILDERS:
            return BUILDERS[self.model_name]
        return lambda: MODELS[self.model_name](**self.model_kwargs)

    def build_model(self) -> keras.Model:
        return self.builder()

    def keras_loss(self):
        """The loss plain Keras compiles with: the script's name, or class ids on logits."""
        if self.loss is not None:
            return self.loss
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def keras_optimizer(self) -> keras.optimizers.Optimizer:
        if self.optimizer == "sgd":
            return keras.optimizers.SGD(self.learning_rate, momentum=0.9)
        return keras.optimizers.Adam(self.learning_rate)

    def arrays(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """The split as NumPy arrays (what a plain Keras script passes to `fit`; "train" holds every training
        example, `validation_split`'s included)."""
        count = self.train_examples if split == "train" else self.eval_examples
        seed = 1 if split == "train" else 2
        if self.name in KERAS_IO_DATA:
            return KERAS_IO_DATA[self.name](count, seed)
        x, y = self.source(split=split).batch(1 << 30).get_single_element()
        return x.numpy(), y.numpy()

    def fit_arrays(self) -> tuple[tuple[np.ndarray, np.ndarray], tuple | None]:
        """`(x, y)` to train on and the validation arrays (None without), as a user hands them to `tpukit.fit`:
        with `validation_split`, the training arrays' last examples, as plain Keras splits them."""
        x, y = self.arrays("train")
        if self.validation_split:
            kept = self.fitted_examples
            return (x[:kept], y[:kept]), (x[kept:], y[kept:])
        return (x, y), (self.arrays("test") if self.eval_examples else None)

    def source(self, split: str = "train", input_context=None):
        if self.name == "cnn":
            return data.digits(split=split, input_context=input_context)
        if self.name in KERAS_IO_DATA:
            # The arrays `tpukit.fit` gets: "train" trains, any other split validates.
            train, validation = self.fit_arrays()
            return data.arrays(*(train if split == "train" else validation), input_context)
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
                **({"loss": self.loss, "metrics": ["accuracy"]} if self.loss else {}),
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
            through="fit",
        )
    if name == "mnist_convnet":
        examples = 6400 if quick else 12_800  # 10% validated: 45 or 90 steps of 128 per epoch
        return Workload(
            "mnist_convnet",
            "bench_mnist_convnet",
            {},
            128,
            examples,
            examples // 10,
            2,
            "adam",
            1e-3,
            {},
            quick=quick,
            through="fit",
            loss="categorical_crossentropy",
            validation_split=0.1,
        )
    if name == "text_transformer":
        examples = 1280 if quick else 2560  # 40 or 80 steps of 32 per epoch
        return Workload(
            "text_transformer",
            "bench_text_transformer",
            {},
            32,
            examples,
            examples // 4,
            2,
            "adam",
            1e-3,
            {},
            quick=quick,
            through="fit",
            loss="sparse_categorical_crossentropy",
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
    """Registers the rows' own models (`BUILDERS`) and one data source per row and size (`bench_<row>`,
    `bench_<row>_quick`)."""
    for model_name, builder in BUILDERS.items():
        tpukit.register_model(model_name, builder)
    for name in ROWS:
        for quick in (False, True):
            row = workload(name, quick)

            def source(split: str = "train", input_context=None, _row=row):
                return _row.source(split=split, input_context=input_context)

            tpukit.register_source(row.source_name, source)


GATE_ENV = "VS_KERAS_GATE"  # a file descriptor: where a child of `vs_keras.py`'s interleaved rounds reports


class Gate:
    """What a child of an interleaved round (`vs_keras.run_round`) tells its parent, one byte each: `b"s"` when a
    steady-state window begins (the parent may then stop and continue the process in short slices, SIGSTOP and
    SIGCONT, alternating with the round's other variants), `b"e"` when it ends (the process then runs on alone to
    its exit). Writing never blocks the child; the parent learns the window's times from the child's results."""

    def __init__(self, write_fd: int):
        self.write_fd = write_fd

    @classmethod
    def from_env(cls) -> Gate | None:
        value = os.environ.get(GATE_ENV)
        return cls(int(value)) if value else None

    def tell(self, what: bytes) -> None:
        os.write(self.write_fd, what)


STOPPED_ENV = "VS_KERAS_STOPPED"  # a file of one float64: the seconds the parent has kept this process stopped


def count_only_running_time() -> None:
    """In a child of an interleaved round: `time.perf_counter()` leaves out the seconds the parent kept the process
    stopped (the parent adds each stop to the `STOPPED_ENV` file before it continues the process). tpukit's own
    clock-driven choices, chiefly `checkpoint_max_overhead`'s (a save is due once the time since the last one is
    50 times the save's), then see the clock they would see alone; with the real clock, which runs about three
    times faster than the process while three take turns, (c) saved at most epoch ends (CNN row: 0.88 of (b)'s
    rate, against 1.12 when run alone). `time.monotonic()` stays the machine's clock, for the parent."""
    path = os.environ.get(STOPPED_ENV)
    if not path:
        return
    import mmap
    import struct

    with open(path, "rb") as f:
        stopped = mmap.mmap(f.fileno(), 8, access=mmap.ACCESS_READ)
    real = time.perf_counter
    last = [real()]

    def perf_counter() -> float:
        # Never backwards: the parent's record of a stop starts a moment before the process stops.
        now = max(last[0], real() - struct.unpack("d", stopped[:8])[0])
        last[0] = now
        return now

    time.perf_counter = perf_counter


class SteadyRate(keras.callbacks.Callback):
    """Steady-state examples/s, measured the same way for every variant: optimizer steps after the first execution
    of each `fit` call (which includes tracing and compilation), over wall time minus validation time. Also the time
    from `on_train_begin` of the first `fit` to the end of its first execution (time to first step).

    The windows and the validations inside them are also kept as times of `time.monotonic()` (one clock for every
    process of a Linux machine), so that an interleaved round's parent, which knows when it stopped the process,
    can count only the seconds the process ran (`vs_keras.active_seconds`)."""

    def __init__(self, global_batch_size: int):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.steps = 0
        self.seconds = 0.0
        self.time_to_first_step = None
        self.windows: list[
            list[float]
        ] = []  # [start, end] of each fit's steady state (time.monotonic)
        self.validations: list[list[float]] = []  # [start, end] of each validation inside them
        self._first = None
        self._begin = None
        self._testing_since = None
        self._test_seconds = 0.0
        self._gate = Gate.from_env()

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
            self.windows.append([time.monotonic(), None])
            if self._gate is not None:
                self._gate.tell(b"s")

    def on_test_begin(self, logs=None):
        self._testing_since = time.perf_counter()
        if self._first is not None:
            self.validations.append([time.monotonic(), None])

    def on_test_end(self, logs=None):
        if self._testing_since is not None:
            self._test_seconds += time.perf_counter() - self._testing_since
            self._testing_since = None
            if self._first is not None:
                self.validations[-1][1] = time.monotonic()

    def on_train_end(self, logs=None):
        if self._first is not None:
            self.steps += self._iterations() - self._first[1]
            self.seconds += time.perf_counter() - self._first[0] - self._test_seconds
            self.windows[-1][1] = time.monotonic()
            if self._gate is not None:
                self._gate.tell(b"e")

    @property
    def examples_per_second(self) -> float | None:
        return (
            self.steps * self.global_batch_size / self.seconds
            if self.steps and self.seconds > 0
            else None
        )

    def result(self) -> dict:
        """What each variant of `vs_keras.py` reports of its steady state."""
        return {
            "examples_per_second": self.examples_per_second,
            "time_to_first_step": self.time_to_first_step,
            "steps_timed": self.steps,
            "windows": self.windows,
            "validations": self.validations,
        }


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
