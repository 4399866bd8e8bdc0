"""The tests' fault injection (tests/faults.py) lives in test code only, and reaches a subprocess."""

import os
import pathlib
import subprocess
import sys

import faults

import tpukit
from tpukit.engines.keras import trainer
from tpukit.engines.tensorflow import waiting


def test_production_code_has_no_test_hooks():
    package = pathlib.Path(tpukit.__file__).parent
    hooks = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "TPUKIT_TEST_" in path.read_text() or "TPUKIT_FAULT_" in path.read_text()
    ]
    assert hooks == []


def test_the_faults_reach_a_subprocess_when_it_imports_the_module():
    code = (
        "import sys; from tpukit.engines.tensorflow import waiting; "
        "print(waiting.LOG_INTERVAL_SECONDS, 'tpukit.engines.keras.trainer' in sys.modules)"
    )
    env = dict(os.environ, **faults.env(wait_log_seconds=1.5, signals_at_step=3))
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # patched on import; the trainer (Keras, TensorFlow) is not imported by the injection itself
    assert result.stdout.split() == ["1.5", "False"]
    plain = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert plain.stdout.split() == ["30.0", "False"]


def test_the_in_process_faults_are_undone_on_exit():
    before = trainer.TrainingGuard.on_train_batch_end
    with faults.signals_at_step(3, "SIGINT"), faults.wait_log_seconds(0.5):
        assert trainer.TrainingGuard.on_train_batch_end is not before
        assert waiting.LOG_INTERVAL_SECONDS == 0.5
    assert trainer.TrainingGuard.on_train_batch_end is before
    assert waiting.LOG_INTERVAL_SECONDS == 30.0
