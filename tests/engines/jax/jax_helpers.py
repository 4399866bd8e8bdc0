"""Runs of the jax engine, each in a process of its own (`child.py`): the test process's Keras is on TensorFlow.
(Not a conftest.py: tests import the top-level `conftest` by name, which a second one would shadow.)"""

import json
import os
import subprocess
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))


def run_jax(config: dict, devices: int = 8, timeout: int = 600, env: dict | None = None):
    """(returncode, the RESULT dict or None, the output) of `child.py` with `devices` virtual CPU devices."""
    environment = dict(
        env or os.environ,
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        KERAS_BACKEND="jax",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
    )
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "child.py"), json.dumps(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    result = next(
        (
            json.loads(line[len("RESULT ") :])
            for line in done.stdout.splitlines()
            if line.startswith("RESULT ")
        ),
        None,
    )
    return done.returncode, result, output
