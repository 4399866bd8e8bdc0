"""Small models and data for the sample- and class-weight tests: trained by plain Keras and by `tpukit.fit` on
the same data, seed and batch order (imported by tests/test_fit_weights.py and by its jax-engine child)."""

import keras
import numpy as np

N, EVAL_N, BATCH, EPOCHS, SEED = 96, 37, 16, 2, 7


def arrays(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype("float32")
    y = (np.abs(x[:, 0]) * 2).astype("int32").clip(0, 2)
    weight = rng.uniform(0.0, 3.0, n).astype("float32")
    return x, y, weight


def classifier(compiled=True):
    """A 3-class classifier, compiled as a Keras user compiles it (or not, for tpukit's own loss)."""
    keras.utils.set_random_seed(SEED)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    if compiled:
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            weighted_metrics=["sparse_categorical_accuracy"],
        )
    return model


def guide_model():
    """keras-io's distribution-API guide: `loss="mse"` on a softmax output, real-valued (some negative) targets."""
    keras.utils.set_random_seed(SEED)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def guide_arrays(n, seed):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype("float32"), rng.normal(size=(n, 4)).astype("float32")


class Losses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))


def plain(case):
    """Plain Keras `fit` (batches in order, no shuffling): (the training loss of each epoch, `evaluate`'s loss over
    the whole eval set in one batch)."""
    recorder = Losses()
    if case == "guide":
        (x, y), (vx, vy) = guide_arrays(N, 0), guide_arrays(EVAL_N, 1)
        model, kwargs, vw = guide_model(), {}, None
    else:
        (x, y, w), (vx, vy, vw) = arrays(N, 0), arrays(EVAL_N, 1)
        model = classifier()
        kwargs = {"sample_weight": w} if case == "sample_weight" else {"class_weight": CLASS_WEIGHT}
    model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=EPOCHS,
        shuffle=False,
        verbose=0,
        callbacks=[recorder],
        **kwargs,
    )
    evaluated = model.evaluate(
        vx, vy, sample_weight=vw, batch_size=EVAL_N, verbose=0, return_dict=True
    )
    return recorder.losses, float(evaluated["loss"])


CLASS_WEIGHT = {0: 1.0, 1: 3.0, 2: 0.5}


def with_tpukit(case, output_dir, **settings):
    """`tpukit.fit` of the same model and data, validated on weighted examples (but the guide's): (the training loss
    of each epoch, the metrics it returned)."""
    import tpukit

    recorder = Losses()
    common = dict(
        epochs=EPOCHS,
        batch_size=BATCH,
        output_dir=str(output_dir),
        seed=SEED,
        shuffle_buffer=1,
        deterministic=True,
        verbose=0,
        callbacks=[recorder],
    )
    if case == "guide":
        x, y = guide_arrays(N, 0)
        metrics = tpukit.fit(
            guide_model, x, y, validation_data=guide_arrays(EVAL_N, 1), **common, **settings
        )
        return recorder.losses, metrics
    x, y, w = arrays(N, 0)
    kwargs = {"sample_weight": w} if case == "sample_weight" else {"class_weight": CLASS_WEIGHT}
    kwargs.update(settings)  # e.g. sample_weight=None: the same run without the weights
    metrics = tpukit.fit(classifier, x, y, validation_data=arrays(EVAL_N, 1), **common, **kwargs)
    return recorder.losses, metrics
