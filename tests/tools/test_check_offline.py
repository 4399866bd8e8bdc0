"""`tpukit check` with no network: it downloads nothing and answers at once from the catalogue, as `tpukit show`
does, and waits a bounded time for a remote path that does not answer (a failed TFDS download retries for over 12
minutes; TensorFlow's file system retries a blocked gs:// read for minutes)."""

import os
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from helpers import REPO

import tpukit
from tpukit.tools import check as check_lib
from tpukit.tools import offline

CHEAP = ("static_shapes", "batch", "input_ops", "input_paths")


def _rules(results):
    return {rule.name: rule for rule in results}


@pytest.fixture
def no_download(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("tpukit check tried to download")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", refuse)


@pytest.fixture
def remote_never_answers(monkeypatch):
    """tf.io.gfile.exists blocks (a network that drops packets): released after the test."""
    release = threading.Event()
    monkeypatch.setattr(check_lib, "DATA_WAIT_SECONDS", 0.5)
    monkeypatch.setattr(tf.io.gfile, "exists", lambda path: release.wait(60))
    yield
    release.set()


def test_tfds_data_not_here_is_checked_on_the_catalogue_and_nothing_is_downloaded(
    tmp_path, no_download
):
    recipe = tpukit.load_recipe("cifar10_resnet", [f"data.data_dir={tmp_path}"])
    results = _rules(check_lib.check(recipe, cores=8, tpu_type="v5e", rules=CHEAP))
    shapes = results["static_shapes"]
    assert shapes.status == "pass", shapes
    assert "train (128, 32, 32, 3)" in shapes.message  # one core's batch of the real feature spec
    assert (
        "'cifar10' is not downloaded here and `tpukit check` downloads nothing: checked on examples generated "
        "from its feature spec (tfds.testing.mock_data), counted with the split sizes its catalogue publishes "
        "(train 50,000, test 10,000)"
    ) in shapes.message
    assert results["batch"].status == "pass"
    # The generated stand-in is a from_generator: its ops say nothing about the real pipeline.
    assert results["input_ops"].status == "skip"
    assert os.listdir(tmp_path) == []


def test_tfds_data_not_here_without_published_sizes_checks_shapes_and_divisibility_only(
    tmp_path, no_download
):
    recipe = tpukit.load_recipe(
        "cifar10_resnet", [f"data.data_dir={tmp_path}", "data.name=cifar100"]
    )
    results = _rules(check_lib.check(recipe, cores=8, tpu_type="v5e", rules=CHEAP))
    assert results["static_shapes"].status == "pass", results["static_shapes"]
    assert "counted with no split size (unpublished)" in results["static_shapes"].message
    assert results["batch"].status == "pass"


def test_a_remote_path_that_does_not_answer_fails_after_a_bounded_wait_with_the_key(
    remote_never_answers,
):
    pattern = "gs://a-bucket/imagenet/{split}-*"
    recipe = tpukit.load_recipe("imagenet_resnet50", [f"data.file_pattern={pattern}"])
    start = time.monotonic()
    results = _rules(check_lib.check(recipe, cores=8, tpu_type="v5e", rules=CHEAP))
    assert time.monotonic() - start < 10
    shapes = results["static_shapes"]
    assert shapes.status == "fail"
    assert (
        f"data.file_pattern={pattern!r} did not answer within 0.5 s (no network" in shapes.message
    )
    assert "make data.* point at data this machine can read" in shapes.fix
    assert results["input_ops"].status == "skip"


def test_a_tfds_data_dir_that_does_not_answer_is_checked_on_the_catalogue(
    remote_never_answers, no_download
):
    recipe = tpukit.load_recipe("cifar10_resnet", ["data.data_dir=gs://a-bucket/tfds"])
    start = time.monotonic()
    results = _rules(check_lib.check(recipe, cores=8, tpu_type="v5e", rules=CHEAP))
    assert time.monotonic() - start < 20
    shapes = results["static_shapes"]
    assert shapes.status == "pass", shapes
    assert "'cifar10' did not answer and `tpukit check` downloads nothing" in shapes.message
    # The rules about the recipe itself still read its own data_dir.
    assert results["input_paths"].status == "pass"


def test_within_returns_the_result_raises_the_error_or_gives_up_in_time():
    assert offline.within(5, lambda: 3, "x") == 3
    with pytest.raises(KeyError):
        offline.within(5, lambda: {}["k"], "x")
    release = threading.Event()
    start = time.monotonic()
    with pytest.raises(offline.Unanswered, match="the bucket did not answer within 0.2 s"):
        offline.within(0.2, lambda: release.wait(60), "the bucket")
    assert time.monotonic() - start < 5
    release.set()


@pytest.mark.integration
def test_the_readme_check_of_cifar10_resnet_runs_every_rule_offline_and_downloads_nothing(tmp_path):
    """The README's `tpukit check cifar10_resnet --cores 8 --tpu-type v5e`, in a fresh process whose TFDS data
    directory is empty (TFDS_DATA_DIR): every rule answers from the catalogue and generated examples, and nothing
    is downloaded (the download it made before retried for over 12 minutes). Depth 8 keeps the compiled step short;
    the timeout only bounds a hang. How long the full command takes is measured, with the machine, in
    docs/guide/cli.md (no timed test)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TFDS_DATA_DIR=str(tmp_path))
    env.pop("KERAS_BACKEND", None)
    command = ["check", "cifar10_resnet", "--cores", "8", "--tpu-type", "v5e"]
    result = subprocess.run(
        [sys.executable, "-m", "tpukit", *command, "--set", "model.depth=8"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "is not downloaded here and `tpukit check` downloads nothing" in result.stdout
    assert "OK: no rule failed" in result.stdout
    assert "[PASS] xla_step" in result.stdout and "[PASS] precision_step" in result.stdout
    assert "Downloading" not in result.stderr + result.stdout
    assert os.listdir(tmp_path) == []


def test_a_half_downloaded_dataset_folder_is_not_prepared_and_tfds_says_nothing(tmp_path, caplog):
    """A download that never finished leaves `cifar10/3.0.2` without its dataset_info.json: TFDS warns about it
    through absl while tpukit only asks whether the data is prepared (`check --topology`, the rules' count)."""
    from tpukit.tools import tpu_check

    (tmp_path / "cifar10" / "3.0.2").mkdir(parents=True)
    recipe = tpukit.load_recipe("cifar10_resnet", [f"data.data_dir={tmp_path}"])
    with caplog.at_level("WARNING"):
        assert tpu_check._tfds_missing(recipe) == "cifar10"
    assert not [r for r in caplog.records if "Variant folder" in r.getMessage()]
