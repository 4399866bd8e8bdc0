"""`train.baseline`: the trivial prediction's scores on the eval split, recomputed here from the data, and the
outputs that get none (said, not crashed on)."""

import json

import numpy as np
import pytest
from helpers import digits_recipe, train_in_process

import tpukit
from tpukit.data.sources import _digits_split


def _run(tmp_path, recipe=None, *overrides):
    out = tmp_path / "run"
    args = ["train.baseline=true", "train.epochs=1", "train.steps_per_epoch=2", *overrides]
    sets = [a for override in args for a in ("--set", override)]
    done = train_in_process(recipe or _digits(tmp_path), *sets, "--output_dir", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "metrics.json") as f:
        return json.load(f), done


def _digits(tmp_path):
    import yaml

    path = tmp_path / "digits.yaml"
    path.write_text(yaml.safe_dump(digits_recipe()))
    return str(path)


def test_a_classifier_is_compared_with_always_predicting_the_most_frequent_class(tmp_path):
    metrics, done = _run(tmp_path)
    _, train = _digits_split("train", 0.2)
    _, test = _digits_split("test", 0.2)
    majority = np.bincount(train).argmax()
    assert metrics["baseline"]["predicts"].startswith(
        f"the most frequent training class, {majority}"
    )
    assert metrics["baseline"]["examples"] == len(test) == 360
    assert metrics["baseline"]["accuracy"] == pytest.approx(np.mean(test == majority))
    assert "; baseline (the most frequent training class) accuracy" in done.stdout


def test_a_regression_is_compared_with_the_training_mean(tmp_path):
    x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    y = (x @ [1.0, -2.0, 0.5] + 3).astype("float32")
    metrics = tpukit.fit(
        _linear, x[:48], y[:48], validation_data=(x[48:], y[48:]), epochs=1, batch_size=8,
        output_dir=str(tmp_path / "fit"), baseline=True,
    )  # fmt: skip
    error = y[48:] - y[:48].mean()
    assert metrics["baseline"]["mse"] == pytest.approx(float(np.mean(error**2)), rel=1e-6)
    assert metrics["baseline"]["rmse"] == pytest.approx(float(np.sqrt(np.mean(error**2))), rel=1e-6)
    assert metrics["baseline"]["mae"] == pytest.approx(float(np.mean(np.abs(error))), rel=1e-6)
    assert metrics["baseline"]["examples"] == 16


def _linear():
    import keras

    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


@pytest.mark.integration
def test_an_output_with_no_trivial_baseline_says_why_and_the_run_still_ends_well(tmp_path):
    # Per-token labels (a language model): no baseline here; the run says so instead of failing at its last line.
    metrics, done = _run(
        tmp_path, "textfiles_char_lm", "data.max_bytes=50000", "model.sequence_length=16",
        "data.sequence_length=16", "model.num_layers=1", "model.hidden_dim=32", "model.num_heads=2",
        "model.mlp_dim=64", "data.global_batch_size=8",
    )  # fmt: skip
    assert "skipped" in metrics["baseline"] and "predicts" not in metrics["baseline"]
    assert "; no baseline: " in done.stdout
