"""tpukit.notebook.helpers: the SMALL default, the output folder (Drive mounted / Colab authenticated for gs://, resume
step reported) and the recipe fallback when data cannot be read. Colab is a fake here: the calls are checked, not a
real Drive mount."""

import os
import re

import pytest
import tensorflow as tf

import tpukit
from tpukit.notebook import helpers as notebook
from tpukit.recipe import resolve_path


def test_choose_small_is_small_exactly_without_a_tpu_or_gpu(capsys):
    strategy = tf.distribute.get_strategy()  # the default strategy on this CPU-only machine
    assert notebook.choose_small(None, strategy) is True
    assert "SMALL = True (no TPU or GPU found" in capsys.readouterr().out
    assert notebook.choose_small(False, strategy) is False
    assert notebook.choose_small(True, strategy) is True
    with pytest.raises(ValueError, match="received SMALL='yes'"):
        notebook.choose_small("yes", strategy)


class FakeColab:
    def __init__(self):
        self.calls = []
        self.drive = self
        self.auth = self

    def mount(self, path):
        self.calls.append(("mount", path))

    def authenticate_user(self):
        self.calls.append(("authenticate_user",))


def test_output_dir_on_this_disk_reports_the_resume_step(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert notebook.output_dir("", "digits_cnn") == os.path.join("runs", "digits_cnn")
    assert "outputs: runs/digits_cnn (this runtime's disk)" in capsys.readouterr().out
    root = str(tmp_path / "persist")
    os.makedirs(os.path.join(root, "digits_cnn", "checkpoints"))
    for step in (22, 44):
        open(os.path.join(root, "digits_cnn", "checkpoints", f"ckpt-{step}.index"), "w").close()
    assert notebook.output_dir(root + "/", "digits_cnn") == root + "/digits_cnn"
    assert "resumes from step 44" in capsys.readouterr().out


def test_output_dir_mounts_drive_and_authenticates_for_buckets(monkeypatch, capsys):
    monkeypatch.setattr(
        notebook, "newest_checkpoint_step", lambda path: 0
    )  # no GCS access from here
    colab = FakeColab()
    path = notebook.output_dir("/content/drive/MyDrive/tpukit", "mnist_cnn", colab=colab)
    assert path == "/content/drive/MyDrive/tpukit/mnist_cnn"
    assert colab.calls == [("mount", "/content/drive")]
    assert "(persistent)" in capsys.readouterr().out
    colab.calls.clear()
    assert (
        notebook.output_dir("gs://bucket/runs", "mnist_cnn", colab=colab)
        == "gs://bucket/runs/mnist_cnn"
    )
    assert colab.calls == [("authenticate_user",)]
    with pytest.raises(ValueError, match="received OUTPUT_ROOT=None. Fix"):
        notebook.output_dir(None, "x")


def test_first_available_falls_back_only_when_data_cannot_be_read(tmp_path, capsys):
    @tpukit.register_source("test_notebook_offline")
    def offline(split="train", input_context=None):
        raise OSError("could not reach the dataset server")

    recipe = tmp_path / "offline.yaml"
    with open(resolve_path("digits_cnn"), encoding="utf-8") as f:
        text = f.read()
    recipe.write_text(text.replace("source: digits", "source: test_notebook_offline"))
    strategy = tf.distribute.get_strategy()
    name, chosen = notebook.first_available(
        {str(recipe): [], "digits_cnn": ["train.epochs=2"]}, strategy
    )
    out = capsys.readouterr().out
    assert name == "digits_cnn" and chosen.train.epochs == 2
    assert (
        "offline.yaml cannot read its data here (OSError: could not reach the dataset server)"
        in out
    )
    assert "recipe: digits_cnn train.epochs=2" in out
    with pytest.raises(
        tpukit.RecipeError, match="train.epoch"
    ):  # a typo is an error, not a fallback
        notebook.first_available({"digits_cnn": ["train.epoch=2"]}, strategy)
    with pytest.raises(
        RuntimeError, match="none of the recipes can read its data here: .*offline.yaml: OSError"
    ):
        notebook.first_available({str(recipe): []}, strategy)


def test_an_unprepared_tfds_dataset_is_passed_over_in_seconds_when_the_network_does_not_answer(
    tmp_path, monkeypatch, capsys
):
    """Without this, TFDS's own retries took 3-4 minutes per notebook in CI before the offline recipe was tried."""
    import http.server
    import threading
    import time

    from tpukit.recipe import load_recipe

    mnist = load_recipe("mnist_cnn", [f"data.data_dir={tmp_path}"])  # nothing prepared there
    monkeypatch.setattr(notebook, "TFDS_HOST", "http://127.0.0.1:9")  # the discard port: refused
    start = time.perf_counter()
    reason = notebook.cannot_download(mnist)
    assert time.perf_counter() - start < notebook.NETWORK_TIMEOUT_S
    assert "TFDS would download 'mnist', and http://127.0.0.1:9 did not answer" in reason
    assert notebook.cannot_download(load_recipe("digits_cnn", [])) is None  # not TFDS

    name, _ = notebook.first_available(
        {"mnist_cnn": [f"data.data_dir={tmp_path}"], "digits_cnn": []}, tf.distribute.get_strategy()
    )
    assert name == "digits_cnn"
    assert (
        "mnist_cnn cannot read its data here (TFDS would download 'mnist'"
        in capsys.readouterr().out
    )

    # A host that answers at all, even with an error status, is a network: TFDS is left to try.
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setattr(notebook, "TFDS_HOST", f"http://127.0.0.1:{server.server_port}")
        assert notebook.cannot_download(mnist) is None
    finally:
        server.shutdown()


def test_output_dir_reads_the_resume_step_from_the_engines_own_checkpoints(tmp_path, capsys):
    """One engine cannot resume the other's checkpoints: each reports only steps of its own format."""
    checkpoints = tmp_path / "lm" / "checkpoints"
    os.makedirs(checkpoints)
    # The jax engine's format before issue 39, still resumed.
    (checkpoints / "ckpt-30.npz").write_bytes(b"")
    (checkpoints / "ckpt-10.index").write_bytes(b"")
    root = str(tmp_path) + "/"
    assert notebook.output_dir(root, "lm", engine="jax") == root + "lm"
    assert "resumes from step 30" in capsys.readouterr().out
    (checkpoints / "ckpt_40").mkdir()  # an Orbax step; its temporary is not a step
    (checkpoints / "ckpt_50.orbax-checkpoint-tmp-1234").mkdir()
    notebook.output_dir(root, "lm", engine="jax")
    assert "resumes from step 40" in capsys.readouterr().out
    notebook.output_dir(root, "lm")
    assert "resumes from step 10" in capsys.readouterr().out


def test_first_available_adds_the_engine_override(capsys):
    strategy = tf.distribute.get_strategy()
    name, chosen = notebook.first_available(
        {"digits_cnn": ["train.epochs=2"]}, strategy, "tensorflow"
    )
    assert chosen.runtime.engine == "tensorflow" and chosen.train.epochs == 2
    assert "recipe: digits_cnn train.epochs=2 runtime.engine=tensorflow" in capsys.readouterr().out


def test_connect_scope_and_has_accelerator_per_engine(capsys):
    assert notebook.connect("jax") is None  # the jax engine finds its devices when it plans
    assert re.match(r"jax engine: \d+ CPU device\(s\)", capsys.readouterr().out)
    strategy = notebook.connect("tensorflow")
    assert isinstance(strategy, tf.distribute.Strategy)
    with notebook.scope(strategy):
        assert tf.distribute.get_strategy() is strategy
    with notebook.scope(None):  # the jax engine: nothing to enter
        pass
    assert notebook.has_accelerator(None) is False  # JAX's default backend on this CPU
    with pytest.raises(ValueError, match="received engine='torch'"):
        notebook.connect("torch")
