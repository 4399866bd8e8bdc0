"""Pictures and one-line summaries of a run, read from what the run itself wrote (for notebooks and reports).

    tpukit.notebook.plots.learning_curves(output_dir)                 # from output_dir/logs (TensorBoard event files)
    images, labels = tpukit.notebook.plots.eval_examples(recipe, 16)  # from the recipe's own eval split
    tpukit.notebook.plots.predictions(model, images, labels)
    print(tpukit.notebook.plots.throughput_line(metrics))             # from metrics.json

Figures are made with pyplot, so a notebook shows them inline (as PNG) at the end of the cell; each function
returns its `matplotlib.figure.Figure`. matplotlib is the `notebooks` extra, imported only when a figure is made.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

# Keras' TensorBoard callback writes epoch metrics as `epoch_<name>` under logs/train and logs/validation;
# tpukit's TensorBoardScalars writes them at the optimizer step (tpukit/engines/keras/callbacks.py).
SPLITS = ("train", "validation")


def read_scalars(log_dir: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """Every scalar in the TensorBoard event files under `log_dir/<split>/`: {split: {tag: [(step, value)]}}.

    Steps are sorted; when a resumed run wrote a step again, the newest file's value is kept. Local and `gs://`
    paths both work (tf.io.gfile). A record cut short by a run that is still writing ends that file's reading.
    """
    import tensorflow as tf

    scalars: dict[str, dict[str, dict[int, float]]] = {}
    for split in tf.io.gfile.listdir(log_dir) if tf.io.gfile.isdir(log_dir) else []:
        split = split.rstrip("/")
        # Event file names start with their creation time, so sorted order is the order they were written.
        for path in sorted(tf.io.gfile.glob(os.path.join(log_dir, split, "events.out.tfevents.*"))):
            try:
                for record in tf.data.TFRecordDataset(path):
                    event = tf.compat.v1.Event.FromString(record.numpy())
                    for value in event.summary.value:
                        number = _scalar(value)
                        if number is not None:
                            tags = scalars.setdefault(split, {}).setdefault(value.tag, {})
                            tags[int(event.step)] = number
            except tf.errors.DataLossError:
                continue
    return {
        split: {tag: sorted(points.items()) for tag, points in tags.items()}
        for split, tags in scalars.items()
    }


def _scalar(value) -> float | None:
    import tensorflow as tf

    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars":
        array = tf.make_ndarray(value.tensor)
        if array.shape == () and np.issubdtype(array.dtype, np.number):
            return float(array)
    return None


def learning_curves(
    output_dir: str, metrics: tuple[str, ...] | None = None, save_as: str | None = None
):
    """One panel per metric (default: loss and accuracy when logged), train and validation against the step.

    Args:
        output_dir: a run's output directory (its `logs/` holds the TensorBoard event files).
        metrics: metric names as logged without the `epoch_` prefix, e.g. ("loss", "accuracy").
        save_as: also write the figure there as PNG (local or gs://), e.g. next to the run's outputs.

    Raises:
        FileNotFoundError: no scalars under `output_dir/logs` (nothing trained yet, or TensorBoard was off: a
            remote TPU with a local output_dir).
    """
    log_dir = output_dir.rstrip("/") + "/logs"
    scalars = read_scalars(log_dir)
    if not scalars:
        raise FileNotFoundError(
            f"no TensorBoard scalars under {log_dir}. Fix: train first (tpukit.run / tpukit.fit write them), and "
            "on a remote TPU give a gs:// output_dir (local TensorBoard logs are off there)."
        )
    logged = {
        tag[len("epoch_") :]
        for tags in scalars.values()
        for tag in tags
        if tag.startswith("epoch_")
    }
    if metrics is None:
        metrics = tuple(m for m in ("loss", "accuracy") if m in logged) or tuple(sorted(logged))[:2]
    missing = [m for m in metrics if m not in logged]
    if missing:
        raise ValueError(
            f"metric(s) {missing} were not logged under {log_dir}; logged: {sorted(logged)}."
        )
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 3.5), squeeze=False)
    for axis, metric in zip(axes[0], metrics, strict=True):
        for split in SPLITS:
            points = scalars.get(split, {}).get(f"epoch_{metric}")
            if points:
                steps, values = zip(*points, strict=True)
                axis.plot(steps, values, marker="o", markersize=3, label=split)
        axis.set_xlabel("optimizer step")
        axis.set_title(metric)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(os.path.basename(output_dir.rstrip("/")))
    figure.tight_layout()
    if save_as:
        save_png(figure, save_as)
    return figure


def save_png(figure, path: str) -> None:
    """Writes `figure` as PNG to `path`, local or gs://."""
    import tensorflow as tf

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(buffer.getvalue())


def eval_examples(
    recipe, count: int = 16, split: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The first `count` (features, labels) of the recipe's eval split (default), as read by its own source (a
    source's sample weights are left out)."""
    from tpukit import data

    split = split or recipe.data.eval_split or recipe.data.train_split
    source = data.SOURCES[recipe.data.source]
    reserved = data.run_args(source, training=False, cache=False)
    dataset = source(split=split, input_context=None, **reserved, **recipe.data.options).take(count)
    features, labels = [], []
    for (
        example
    ) in dataset.as_numpy_iterator():  # (features, label) or (features, label, sample_weight)
        features.append(example[0])
        labels.append(example[1])
    if not features:
        raise ValueError(f"the {split!r} split of {recipe.path} has no examples.")
    return np.stack(features), np.stack(labels)


def predictions(model, images, labels, class_names=None, columns: int = 8):
    """A grid of `images` titled with the model's prediction and the label (red when they differ).

    Args:
        model: a Keras classifier returning logits or probabilities (e.g. `keras.saving.load_model(
            metrics["exported"]["keras"])`), or a path to a `.keras` file.
        images: `(N, H, W)` or `(N, H, W, C)` with C in (1, 3); each is shown min-max scaled.
        labels: `(N,)` integer labels.
        class_names: names indexed by label (default: the label numbers).
    """
    import matplotlib.pyplot as plt

    if isinstance(model, str):
        import keras

        model = keras.saving.load_model(model, compile=False)
    images, labels = np.asarray(images), np.asarray(labels)
    if images.ndim not in (3, 4) or len(images) != len(labels):
        raise ValueError(
            f"predictions: images must be (N, H, W[, C]) with one label each; received images "
            f"{images.shape} and labels {labels.shape}."
        )
    predicted = np.argmax(np.asarray(model.predict(images, verbose=0)), axis=-1)
    name = (lambda i: str(class_names[i])) if class_names is not None else str
    rows = -(-len(images) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(1.4 * columns, 1.6 * rows), squeeze=False)
    for index, axis in enumerate(axes.flat):
        axis.axis("off")
        if index >= len(images):
            continue
        image = images[index].astype(np.float32)
        if image.ndim == 3 and image.shape[-1] == 1:
            image = image[..., 0]
        low, high = float(image.min()), float(image.max())
        image = (image - low) / (high - low) if high > low else np.zeros_like(image)
        axis.imshow(image, cmap="gray" if image.ndim == 2 else None)
        right = int(predicted[index]) == int(labels[index])
        axis.set_title(
            f"{name(int(predicted[index]))} ({name(int(labels[index]))})",
            color="black" if right else "red",
            fontsize=9,
        )
    figure.suptitle(f"prediction (label): {int(np.sum(predicted == labels))}/{len(labels)} right")
    figure.tight_layout()
    return figure


def throughput_line(metrics: dict | str) -> str:
    """One line: examples/s, steps/s, replicas and strategy, precision, MFU against the named peak, compile time.

    Args:
        metrics: the dict `tpukit.run` / `tpukit.fit` return, or the path of a run's `metrics.json`.
    """
    if isinstance(metrics, str):
        import tensorflow as tf

        with tf.io.gfile.GFile(metrics) as f:
            metrics = json.load(f)
    examples = metrics.get("examples_per_second")
    if not examples:
        return "throughput: not measured (nothing was trained in this call)"
    line = (
        f"throughput: {examples:,.0f} examples/s, {metrics.get('steps_per_second') or 0:,.1f} steps/s on "
        f"{metrics.get('replicas')} replica(s) ({metrics.get('strategy')}, {metrics.get('precision')}, "
        f"global batch {metrics.get('global_batch_size')}, steps_per_execution "
        f"{metrics.get('steps_per_execution')})"
    )
    mfu, peak = metrics.get("mfu"), metrics.get("peak_flops")
    if mfu is not None and peak:
        line += (
            f"; MFU {100 * mfu:.1f}% of {_flops(peak)} {metrics.get('peak_flops_dtype')} peak "
            f"({metrics.get('peak_flops_source')})"
        )
    else:
        line += "; MFU: unknown (no FLOP count or no peak for this device)"
    first = metrics.get("time_to_first_step_seconds")
    if first is not None:
        line += f"; {first:.1f} s to the first step (compilation)"
    return line


def _flops(value: float) -> str:
    for unit, scale in (("PFLOP/s", 1e15), ("TFLOP/s", 1e12), ("GFLOP/s", 1e9)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value:,.0f} FLOP/s"
