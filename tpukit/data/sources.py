"""Data sources: each function returns an unbatched `tf.data.Dataset` of `(features, label)` for one split (or
`(features, label, sample_weight)`, as Keras takes them: a KerasHub preprocessor's padding mask, for one).

A source gets `split` and the pipeline's `input_context` (to read only this host's shard) and nothing of tpukit;
its other keyword arguments are the keys a recipe's `data` section may set for it.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from tpukit.data.pipeline import shard


def _split_error(split: str, valid: tuple[str, ...], source: str) -> ValueError:
    return ValueError(f"{source}: unknown split {split!r}; valid splits: {', '.join(valid)}.")


def digits(
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    test_fraction: float = 0.2,
) -> tf.data.Dataset:
    """scikit-learn's bundled 8x8 handwritten digits (1,797 images, 10 classes): real data with no download.

    Images are scaled to [0, 1] with shape (8, 8, 1); the train/test split is stratified and fixed (seed 0).
    """
    if split not in ("train", "test"):
        raise _split_error(split, ("train", "test"), "digits")
    x, y = _digits_split(split, test_fraction)
    return shard(tf.data.Dataset.from_tensor_slices((x, y)), input_context)


@functools.lru_cache(maxsize=4)
def _digits_split(split: str, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Read-only arrays, made once per process: a run reads a split several times (counting, labels, pipelines),
    and each read costs a scikit-learn load."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    images = (bunch.images / 16.0).astype(np.float32)[..., None]
    labels = bunch.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=test_fraction, random_state=0, stratify=labels
    )
    x, y = (x_train, y_train) if split == "train" else (x_test, y_test)
    x.flags.writeable = y.flags.writeable = False
    return x, y


def arrays(
    x,
    y,
    input_context: tf.distribute.InputContext | None = None,
    sample_weight=None,
) -> tf.data.Dataset:
    """In-memory arrays (NumPy or anything `np.asarray` takes), Keras-style `(x, y)`, as examples; with
    `sample_weight`, `(x, y, sample_weight)`. For several inputs or outputs, `x` and `y` may be dicts (by name) or
    tuples of arrays, and `sample_weight` one array for every output or one per output, as in `keras.Model.fit`."""

    def arrays_of(value):
        if isinstance(value, dict):
            return {k: np.asarray(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return tuple(np.asarray(v) for v in value)
        return np.asarray(value)

    x, y = arrays_of(x), arrays_of(y)
    example = (x, y) if sample_weight is None else (x, y, arrays_of(sample_weight))
    lengths = {len(a) for a in tf.nest.flatten(example)}
    if len(lengths) != 1:
        raise ValueError(
            f"arrays: x, y (and sample_weight) must have the same length; received "
            f"{[len(tf.nest.flatten(part)[0]) for part in example]}."
        )
    return shard(tf.data.Dataset.from_tensor_slices(example), input_context)


def synthetic(
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    input_shape: tuple[int, ...] = (8, 8, 1),
    num_classes: int = 10,
    num_examples: int = 1024,
    label_shape: tuple[int, ...] = (),
    integer_inputs: bool = False,
) -> tf.data.Dataset:
    """Random examples of a recipe's shapes, to measure the model without I/O (labels are random: no learning).

    `integer_inputs` gives token ids in [0, num_classes) instead of floats (for language models).
    """
    x, y = _synthetic_arrays(
        split, tuple(input_shape), num_classes, num_examples, tuple(label_shape), integer_inputs
    )
    return shard(tf.data.Dataset.from_tensor_slices((x, y)), input_context)


@functools.lru_cache(maxsize=2)
def _synthetic_arrays(
    split: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    num_examples: int,
    label_shape: tuple[int, ...],
    integer_inputs: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Read-only arrays, made once per process: a run reads a split several times (counting, labels, pipelines),
    and each read would draw every example again. The last two splits made stay (a recipe's train and eval
    split)."""
    rng = np.random.default_rng(0 if split == "train" else 1)
    if integer_inputs:
        x = rng.integers(0, num_classes, size=(num_examples, *input_shape), dtype=np.int32)
    else:
        x = rng.standard_normal((num_examples, *input_shape), dtype=np.float32)
    y = rng.integers(0, num_classes, size=(num_examples, *label_shape), dtype=np.int32)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y
