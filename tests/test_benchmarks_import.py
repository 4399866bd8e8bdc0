"""The benchmark scripts' tpukit imports resolve: a module that moves must take its benchmarks along (they run only
by hand and in no test tier, so nothing else would notice). And every row of `benchmarks/workloads.py` resolves,
its keras-io rows being keras-io's models and data shapes."""

import ast
import importlib
import json
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


# A stand-in for one variant of vs_keras.py's interleaved rounds: busy for BUSY seconds of its own running time
# in its steady state, recording when it was busy, then the result file the parent reads.
_FAKE_VARIANT = r"""
import json, os, struct, sys, time
report = int(os.environ["VS_KERAS_GATE"])  # workloads.Gate's protocol, without importing Keras
busy_seconds = float(sys.argv[2])
start = time.monotonic()
os.write(report, b"s")
ticks, ran, last = [start], 0.0, time.monotonic()
while ran < busy_seconds:
    now = time.monotonic()
    if now - last < 0.005:  # a longer gap: it was stopped
        ran += now - last
        if now - ticks[-1] >= 0.001:
            ticks.append(now)
    last = now
end = time.monotonic()
os.write(report, b"e")
with open(os.environ["VS_KERAS_STOPPED"], "rb") as f:  # what workloads.count_only_running_time reads
    stopped_seen = (time.monotonic(), struct.unpack("d", f.read(8))[0])
json.dump({"examples_per_second": 1.0, "steps_timed": 100, "time_to_first_step": 0.0,
           "windows": [[start, end]], "validations": [], "ticks": ticks,
           "stopped_seen": stopped_seen}, open(sys.argv[1], "w"))
"""


@pytest.mark.integration
def test_interleaved_round_runs_one_variant_at_a_time_and_counts_only_its_running_time(
    tmp_path, monkeypatch
):
    import sys

    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    vs_keras = importlib.import_module("vs_keras")  # the parent's side imports no Keras
    script = tmp_path / "fake_variant.py"
    script.write_text(_FAKE_VARIANT)
    busy = {"c": 0.6, "a": 0.9, "b": 0.3}
    monkeypatch.setattr(
        vs_keras,
        "_child_command",
        lambda row, variant, quick, path, engine: [
            sys.executable,
            str(script),
            path,
            str(busy[variant]),
        ],
    )
    monkeypatch.setattr(vs_keras, "_global_batch_size", lambda row, quick: 1)
    monkeypatch.setattr(vs_keras, "SETTLE_SECONDS", 0.0)
    results = vs_keras.run_round("mlp", True, str(tmp_path), 0, "tensorflow")
    assert set(results) == set("cab")
    ticks = {}
    for variant, result in results.items():
        ran = result["ran"]
        assert result["slices"] == len(ran) > 3, ran  # stopped and continued in slices
        assert result["wall_seconds"] == pytest.approx(sum(end - start for start, end in ran))
        ticks[variant] = json.loads((tmp_path / f"mlp-{variant}-0.json").read_text())["ticks"]
        # Busy only while the parent let it run (SIGSTOP took effect within 10 ms)...
        outside = [t for t in ticks[variant] if not any(s <= t <= e + 0.01 for s, e in ran)]
        assert not outside, (variant, len(outside), len(ticks[variant]))
        # ...and its rate counts the seconds it ran in its steady state: its own busy time, not the others'.
        active = 100 / result["examples_per_second"]
        # (Above its busy time only by what other processes took from it on a loaded machine; the others' busy
        # time would add at least 0.9 s.)
        assert busy[variant] <= active <= 1.5 * busy[variant] + 0.1, (variant, active)
        # Its clock was told every stop before it ran again: the seconds since its start that it did not run.
        seen_at, stopped = json.loads((tmp_path / f"mlp-{variant}-0.json").read_text())[
            "stopped_seen"
        ]
        running = sum(min(e, seen_at) - s for s, e in ran if s < seen_at)
        assert stopped == pytest.approx(seen_at - ran[0][0] - running, abs=0.005), variant
        assert stopped > 0.1
    # The three ran in turn, never two at once: the parent's intervals do not overlap.
    intervals = sorted((s, e, v) for v, r in results.items() for s, e in r["ran"])
    for (_, end, v1), (start, _, v2) in zip(intervals, intervals[1:], strict=False):
        assert start >= end - 1e-6, (v1, v2)
    # Their steady states were interleaved, not run one after another.
    for variant, own in ticks.items():
        assert any(own[0] < t < own[-1] for v, ts in ticks.items() if v != variant for t in ts), (
            variant
        )


def test_a_childs_clock_leaves_out_the_seconds_it_was_stopped(workloads, tmp_path, monkeypatch):
    import struct
    import time

    path = tmp_path / "stopped"
    path.write_bytes(struct.pack("d", 0.0))
    monkeypatch.setenv(workloads.STOPPED_ENV, str(path))
    machine = [100.0]  # the machine's clock, as the child's real perf_counter reads it
    monkeypatch.setattr(time, "perf_counter", lambda: machine[0])
    workloads.count_only_running_time()
    assert time.perf_counter() == 100.0
    machine[0] = 110.0
    path.write_bytes(struct.pack("d", 5.0))  # of those 10 s, the parent kept it stopped 5
    assert time.perf_counter() == 105.0
    path.write_bytes(struct.pack("d", 5.5))  # a stop recorded from a moment before it took effect
    assert time.perf_counter() == 105.0  # never backwards
    machine[0] = 120.0
    assert time.perf_counter() == 114.5


def test_an_interleaved_rounds_children_die_with_their_parent(tmp_path):
    """A parent killed by a signal (SIGKILL: no cleanup of its own runs) takes its children, stopped or running, with
    it: they had stayed stopped, holding their memory, after a killed run."""
    import subprocess
    import sys
    import time

    script = tmp_path / "fake_variant.py"
    script.write_text(_FAKE_VARIANT)
    parent = tmp_path / "parent.py"
    parent.write_text(
        "import sys\n"
        f"sys.path.insert(0, {os.path.join(REPO, 'benchmarks')!r})\n"
        "import vs_keras\n"
        "vs_keras._child_command = lambda row, variant, quick, path, engine: "
        f"[sys.executable, {str(script)!r}, path, '60']\n"
        "vs_keras.run_round('mlp', True, sys.argv[1], 0, 'tensorflow')\n"
    )
    process = subprocess.Popen([sys.executable, str(parent), str(tmp_path)])
    children: list[int] = []
    deadline = time.monotonic() + 30
    # All three started (the last one runs, two are stopped).
    while len(children) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
        with open(f"/proc/{process.pid}/task/{process.pid}/children") as f:
            children = [int(pid) for pid in f.read().split()]
    assert len(children) == 3, children
    process.kill()
    process.wait()
    deadline = time.monotonic() + 10
    alive = children
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in children if _running(pid)]
    assert not alive, alive


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
