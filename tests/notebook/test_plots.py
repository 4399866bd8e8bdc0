"""tpukit.notebook.plots: scalars read back from real TensorBoard event files, the figures drawn from them, the prediction
grid and the throughput line (matplotlib's Agg backend; what a notebook shows inline is checked by
tests/notebook/test_notebooks.py)."""

import contextlib
import json
import os

import matplotlib
import numpy as np
import pytest
import tensorflow as tf

import tpukit
from tpukit.notebook import plots

matplotlib.use("Agg")


def write_scalars(log_dir, split, points, tag="epoch_loss"):
    writer = tf.summary.create_file_writer(os.path.join(log_dir, split))
    with writer.as_default():
        for step, value in points:
            tf.summary.scalar(tag, value, step=step)
    writer.close()


def test_read_scalars_sorted_newest_file_wins_and_a_cut_record_ends_the_file(tmp_path):
    logs = str(tmp_path / "logs")
    write_scalars(logs, "train", [(10, 3.0), (20, 2.0), (30, 1.5)])
    # A resumed run writes a newer file (names start with the time) that repeats step 30.
    write_scalars(logs, "train", [(30, 1.4), (40, 1.0)])
    write_scalars(logs, "validation", [(20, 2.5)])
    with tf.summary.create_file_writer(os.path.join(logs, "train")).as_default():
        tf.summary.text("note", "not a scalar", step=5)
    files = sorted(tf.io.gfile.glob(os.path.join(logs, "train", "events*")))
    assert len(files) == 3
    with open(files[-1], "ab") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00partial")  # a record still being written
    scalars = plots.read_scalars(logs)
    assert scalars["train"]["epoch_loss"] == [
        (10, 3.0),
        (20, 2.0),
        (30, pytest.approx(1.4)),
        (40, 1.0),
    ]
    assert scalars["validation"] == {"epoch_loss": [(20, 2.5)]}
    assert "note" not in scalars["train"]
    assert plots.read_scalars(str(tmp_path / "missing")) == {}


def test_learning_curves_plot_exactly_the_logged_points(tmp_path):
    run = str(tmp_path / "run")
    write_scalars(run + "/logs", "train", [(22, 2.0), (44, 1.0)])
    write_scalars(run + "/logs", "validation", [(22, 2.5), (44, 1.5)])
    write_scalars(run + "/logs", "train", [(22, 0.4), (44, 0.8)], tag="epoch_accuracy")
    figure = plots.learning_curves(run, save_as=str(tmp_path / "curves.png"))
    loss, accuracy = figure.axes
    assert loss.get_title() == "loss" and accuracy.get_title() == "accuracy"
    lines = {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in loss.get_lines()
    }
    assert lines == {"train": ([22, 44], [2.0, 1.0]), "validation": ([22, 44], [2.5, 1.5])}
    assert [line.get_label() for line in accuracy.get_lines()] == ["train"]
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(
        ValueError, match=r"\['perplexity'\] were not logged.*logged: \['accuracy', 'loss'\]"
    ):
        plots.learning_curves(run, metrics=("perplexity",))
    with pytest.raises(
        FileNotFoundError, match="no TensorBoard scalars under .*empty/logs. Fix: train first"
    ):
        plots.learning_curves(str(tmp_path / "empty"))


def test_predictions_titles_prediction_and_label_red_when_wrong():
    import keras

    # Logits = the image's pixels: the predicted class is the brightest pixel's index.
    model = keras.Sequential([keras.Input((2, 2)), keras.layers.Flatten()])
    images = np.zeros((5, 2, 2), np.float32)
    for i, bright in enumerate([0, 1, 2, 3, 0]):
        images[i].flat[bright] = 1.0
    labels = np.array([0, 1, 2, 0, 0])
    figure = plots.predictions(model, images, labels, class_names=["a", "b", "c", "d"], columns=3)
    shown = [(ax.get_title(), ax.title.get_color()) for ax in figure.axes if ax.get_title()]
    assert shown == [
        ("a (a)", "black"),
        ("b (b)", "black"),
        ("c (c)", "black"),
        ("d (a)", "red"),
        ("a (a)", "black"),
    ]
    assert figure.texts[0].get_text() == "prediction (label): 4/5 right"
    assert len(figure.axes) == 6  # 2 rows x 3 columns, the last one empty
    with pytest.raises(ValueError, match=r"received images \(5, 2, 2\) and labels \(4,\)"):
        plots.predictions(model, images, labels[:4])


def test_eval_examples_are_the_recipe_sources_first_examples():
    recipe = tpukit.load_recipe("digits_cnn")
    images, labels = plots.eval_examples(recipe, 16)
    expected = list(tpukit.data.digits("test").take(16).as_numpy_iterator())
    assert images.shape == (16, 8, 8, 1) and labels.shape == (16,)
    np.testing.assert_array_equal(labels, [y for _, y in expected])
    np.testing.assert_array_equal(images, np.stack([x for x, _ in expected]))


METRICS = {
    "examples_per_second": 123456.7,
    "steps_per_second": 120.56,
    "replicas": 8,
    "strategy": "TPUStrategy",
    "precision": "mixed_bfloat16",
    "global_batch_size": 1024,
    "steps_per_execution": 58,
    "mfu": 0.4213,
    "peak_flops": 8 * 197e12,
    "peak_flops_dtype": "bfloat16",
    "peak_flops_source": "TPU v5e per-chip peak",
    "time_to_first_step_seconds": 31.25,
}


def test_throughput_line_from_a_dict_or_metrics_json(tmp_path):
    expected = (
        "throughput: 123,457 examples/s, 120.6 steps/s on 8 replica(s) (TPUStrategy, mixed_bfloat16, global batch "
        "1024, steps_per_execution 58); MFU 42.1% of 1.6 PFLOP/s bfloat16 peak (TPU v5e per-chip peak); 31.2 s to "
        "the first step (compilation)"
    )
    assert plots.throughput_line(METRICS) == expected
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps(METRICS))
    assert plots.throughput_line(str(path)) == expected
    assert "MFU: unknown" in plots.throughput_line({**METRICS, "mfu": None})
    assert plots.throughput_line({**METRICS, "examples_per_second": None}).startswith(
        "throughput: not measured"
    )


def test_eval_examples_of_a_source_with_sample_weights_leave_the_weights_out():
    recipe = tpukit.load_recipe("digits_cnn")

    def weighted(split="train", input_context=None, **options):
        base = tpukit.data.digits(split, input_context)
        return base.map(lambda x, y: (x, y, tf.cast(y, tf.float32)))

    with _registered_source("weighted_digits_for_plots", weighted):
        recipe.data.source = "weighted_digits_for_plots"
        images, labels = plots.eval_examples(recipe, 4)
    expected = list(tpukit.data.digits("test").take(4).as_numpy_iterator())
    np.testing.assert_array_equal(labels, [y for _, y in expected])
    np.testing.assert_array_equal(images, np.stack([x for x, _ in expected]))


@contextlib.contextmanager
def _registered_source(name, fn):
    tpukit.data.SOURCES[name] = fn
    try:
        yield
    finally:
        del tpukit.data.SOURCES[name]
