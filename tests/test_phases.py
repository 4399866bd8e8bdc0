"""Where a run's seconds go (issue 22): `tpukit.logs.Phases` and `metrics.json` "phases_seconds"."""

import time

import pytest

from tpukit import logs


def test_process_seconds_is_the_age_of_this_process():
    first = logs.process_seconds()
    time.sleep(0.05)
    second = logs.process_seconds()
    assert first is not None and first > 0  # pytest has been running a while
    # Seconds, to /proc's 10 ms ticks (the upper bound only allows for a loaded machine's late wake-up).
    assert 0.04 <= second - first <= 1.0


class _Clock:
    """`time.perf_counter` for `tpukit.logs`, moved by the test: the phases' arithmetic, not the sleeps' accuracy."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_phases_are_timed_split_and_reported_in_order(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(logs, "_timed_a_run", False)
    monkeypatch.setattr(logs.time, "perf_counter", clock)
    monkeypatch.setattr(logs, "process_seconds", lambda: 1.5)
    phases = logs.Phases()
    with phases.timed("training"):
        clock.now += 0.06
    with phases.timed("export"):
        clock.now += 0.02
    phases.split("training", first_step=0.02, validation=None, checkpoints=0.01)
    out = phases.to_json()
    assert list(out) == ["before_run", "first_step", "training", "checkpoints", "export", "total"]
    assert out == {
        "before_run": 1.5,
        "first_step": 0.02,
        "training": 0.03,
        "checkpoints": 0.01,
        "export": 0.02,
        "total": 1.58,
    }
    # A later run of the same process starts from its own call: no before_run, and a total of its own.
    later = logs.Phases()
    with later.timed("plan"):
        clock.now += 0.01
    clock.now += 0.005
    assert later.to_json() == {"plan": 0.01, "total": 0.015}


@pytest.mark.integration
def test_a_run_reports_its_phases(tmp_path):
    from test_run import recipe

    from tpukit.runner import run

    run(
        recipe(), str(tmp_path / "first")
    )  # the process's first run, if no other test ran one before
    metrics = run(recipe(), str(tmp_path / "second"))
    phases = metrics["phases_seconds"]
    assert "before_run" not in phases  # a later run of the process counts from its own call
    for name in ("plan", "build", "first_step", "training", "validation"):
        assert phases[name] > 0, phases
    for name in ("checkpoints", "evaluation", "export"):
        assert phases[name] > 0, (
            phases
        )  # the step-0 save and the last; the final pass; model.keras + SavedModel
    parts = sum(v for k, v in phases.items() if k != "total")
    # The phases cover the run, up to the small gaps between them.
    assert parts <= phases["total"] + 0.05 and phases["total"] - parts < 0.5


EXIT_SCRIPT = """
import gc, json, sys
sys.path.insert(0, {tests!r})


class Holder:  # a user's object in a reference cycle, holding a file it never closes
    def __init__(self, path):
        self.me = self
        self.file = open(path, "w")


before = Holder({before!r})  # made before the first run: frozen with the engine's imports
before.file.write("written before the run, never closed")
from helpers import digits_recipe
from tpukit.recipe import from_dict
from tpukit.runner import run
recipe = from_dict(digits_recipe(**{{"train.epochs": 1, "train.steps_per_epoch": 2, "runtime.verbose": 0}}),
                   "digits_cnn.yaml")
metrics = run(recipe, {output!r})
after = Holder({after!r})
after.file.write("written after the run, never closed")
# Both stay referenced until the interpreter clears this module at exit: then they are cyclic garbage, `before`
# frozen with the engine's imports. (A cycle already garbage before exit is not flushed by Python 3.11 either.)
print("STEP", metrics["step"], "FROZEN", gc.get_freeze_count(), flush=True)
"""


@pytest.mark.parametrize("setting", [None, "0"])
@pytest.mark.integration
def test_the_exit_collection_skips_the_imports_but_a_users_files_are_flushed(tmp_path, setting):
    """Python's last cyclic collection over TensorFlow's and Keras' import-time objects took ~1.1 s of every such
    process's exit; tpukit freezes what is alive once a CPU run's devices are known (`TPUKIT_GC_FREEZE=0`: not). A user's
    file left open in a reference cycle is flushed at exit whether it was made before the first run (frozen: tpukit
    flushes it) or after (collected as usual)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env.pop("TPUKIT_GC_FREEZE", None)
    if setting is not None:
        env["TPUKIT_GC_FREEZE"] = setting
    tests = os.path.dirname(os.path.abspath(__file__))
    before, after = tmp_path / "before.txt", tmp_path / "after.txt"
    script = EXIT_SCRIPT.format(
        tests=tests, output=str(tmp_path / "run"), before=str(before), after=str(after)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    frozen = int(done.stdout.split("FROZEN")[1].split()[0])
    assert (frozen == 0) if setting == "0" else (frozen > 100_000), frozen
    assert before.read_text() == "written before the run, never closed"
    assert after.read_text() == "written after the run, never closed"


def test_an_interactive_process_is_not_frozen(monkeypatch):
    """A notebook kernel lives on: a model built before its first fit would never be freed if frozen."""
    import gc
    import sys

    from tpukit.engines.keras import gc_freeze

    frozen = []
    monkeypatch.setattr(gc_freeze, "_done", None)
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    monkeypatch.setitem(sys.modules, "ipykernel", sys)  # any module object: a kernel is running
    skipped = gc_freeze.freeze_the_imports()
    assert frozen == [] and not skipped.frozen and "interactive" in skipped.reason
    monkeypatch.delitem(sys.modules, "ipykernel")
    monkeypatch.setattr(
        gc_freeze, "_interactive", lambda: False
    )  # pytest's own process may look interactive
    monkeypatch.setattr(
        gc_freeze, "atexit", type("A", (), {"register": staticmethod(lambda *a: None)})
    )
    assert gc_freeze.freeze_the_imports().frozen and frozen == [True]
