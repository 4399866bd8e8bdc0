"""Corrupt inputs through the whole run (issue 13): by default the CLI exits 2 naming the file and record and keeps
the earlier checkpoints; with data.skip_corrupt the records are skipped, counted in the log and in metrics.json,
and the eval stays exact over the examples that remain."""

import json

import pytest
import yaml
from helpers import run_cli
from test_data_corrupt import _write


def _recipe(tmp_path, skip_corrupt):
    root = tmp_path / "data"
    root.mkdir()
    _write(root / "train-0", range(32))
    _write(root / "train-1", range(32, 64), garbage=(40, 41))
    _write(root / "test-0", range(16), garbage=(3,))
    recipe = {
        "model": {
            "name": "small_cnn",
            "input_shape": [8, 8, 3],
            "num_classes": 64,
            "filters": [4],
            "dense_units": 8,
        },
        "data": {
            "source": "tfrecord_images",
            "file_pattern": str(root / "{split}-*"),
            "image_size": [8, 8],
            "normalize": "unit",
            "augment": "none",
            "global_batch_size": 8,
            "eval_split": "test",
            "skip_corrupt": skip_corrupt,
        },
        "train": {"epochs": 1, "learning_rate": 0.01},
        "runtime": {"verbose": 0},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


@pytest.mark.integration
def test_a_corrupt_image_stops_the_run_with_its_file_and_record(tmp_path):
    result = run_cli(_recipe(tmp_path, False), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert (
        "train-1" in result.stderr
        and "record 8" in result.stderr
        and "skip_corrupt" in result.stderr
    )


@pytest.mark.slow  # the default tier keeps the corrupt-image stop below
def test_skip_corrupt_skips_counts_and_reports(tmp_path):
    result = run_cli(_recipe(tmp_path, True), "--output_dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["skipped_corrupt"]["train"]["skipped"] == 2
    assert metrics["skipped_corrupt"]["test"]["skipped"] == 1
    assert metrics["eval_examples"] == 15  # 16 test records, one skipped
    assert "skipping 2 corrupt" in result.stderr
