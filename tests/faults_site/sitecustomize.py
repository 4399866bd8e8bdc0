"""Loaded by every Python process started with `tests/faults.py`'s `env(...)` (this directory first on PYTHONPATH):
installs the faults the environment asks for. Test code only."""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "tpukit_test_faults", os.path.join(os.path.dirname(os.path.dirname(__file__)), "faults.py")
)
_faults = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_faults)
_faults.install_from_env()
