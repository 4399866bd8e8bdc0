"""The benchmark scripts' tpukit imports resolve: a module that moves must take its benchmarks along (they run only
by hand and in no test tier, so nothing else would notice). And every row of `benchmarks/workloads.py` resolves,
its keras-io rows being keras-io's models and data shapes."""

import ast
import importlib
import os
import pathlib

import numpy as np
import pytest
from helpers import REPO

SCRIPTS = sorted(pathlib.Path(REPO, "benchmarks").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_every_tpukit_name_a_benchmark_imports_exists(script):
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tpukit":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"
                ), f"{script.name}: from {node.module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tpukit":
                    importlib.import_module(alias.name)


@pytest.fixture
def workloads(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    return importlib.import_module("workloads")


def test_every_benchmark_row_resolves_at_both_sizes(workloads):
    for name in workloads.ROWS:
        full, quick = workloads.workload(name), workloads.workload(name, quick=True)
        assert (full.name, quick.name) == (name, name)
        assert full.through in ("fit", "run")
        assert 2 <= quick.steps_per_epoch * quick.epochs <= full.steps_per_epoch * full.epochs
    with pytest.raises(ValueError, match="valid: mlp, cnn, resnet, transformer, mnist_convnet"):
        workloads.workload("mnist")


def test_mnist_convnet_row_is_keras_ios_model_on_mnist_shaped_one_hot_data(workloads):
    row = workloads.workload("mnist_convnet", quick=True)
    model = row.build_model()
    assert model.count_params() == 34_826  # keras-io's model.summary()
    assert model.layers[-1].get_config()["activation"] == "softmax"
    (x, y), (x_val, y_val) = row.fit_arrays()
    assert (x.shape, x.dtype, y.shape) == ((5760, 28, 28, 1), np.float32, (5760, 10))
    assert 0.0 <= x.min() and x.max() <= 1.0
    np.testing.assert_array_equal(y.sum(axis=1), 1.0)  # one-hot, as keras.utils.to_categorical
    np.testing.assert_array_equal(
        x_val, row.arrays("train")[0][5760:]
    )  # validation_split=0.1: the last 10%
    assert (len(x_val), len(row.arrays("test")[0]), row.steps_per_epoch) == (640, 640, 45)
    assert (row.loss, row.validation_split, row.global_batch_size) == (
        "categorical_crossentropy",
        0.1,
        128,
    )


def test_text_transformer_row_is_keras_ios_model_on_imdb_shaped_token_ids(workloads):
    row = workloads.workload("text_transformer", quick=True)
    model = row.build_model()
    assert model.count_params() == 657_758
    assert model.layers[-1].get_config()["activation"] == "softmax"
    (x, y), (x_val, y_val) = row.fit_arrays()
    assert (x.shape, x.dtype, y.shape, x_val.shape) == ((1280, 200), np.int32, (1280,), (320, 200))
    assert 1 <= x.min() and x.max() < 20_000
    assert set(np.unique(y)) == {0, 1}
    assert (row.loss, row.global_batch_size, row.steps_per_epoch) == (
        "sparse_categorical_crossentropy",
        32,
        40,
    )
