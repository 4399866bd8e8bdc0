"""The notebooks run as written on this CPU (install lines skipped), in a fresh process, from a temp directory."""

import glob
import json
import os
import subprocess
import sys

from helpers import REPO

NOTEBOOKS = sorted(glob.glob(os.path.join(REPO, "notebooks", "*.ipynb")))


def code_of(path: str) -> str:
    with open(path) as f:
        cells = json.load(f)["cells"]
    lines = []
    for cell in cells:
        if cell["cell_type"] == "code":
            lines += [line.rstrip("\n") for line in cell["source"] if not line.lstrip().startswith(("%", "!"))]
            lines.append("")
    return "\n".join(lines)


def test_there_is_a_notebook():
    assert NOTEBOOKS


def test_quickstart_runs_on_cpu(tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(code_of(os.path.join(REPO, "notebooks", "quickstart.ipynb")))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tpukit: using _DefaultDistributionStrategy" in result.stdout + result.stderr
    assert os.path.isfile(tmp_path / "runs" / "digits_cnn" / "metrics.json")
    accuracy = float(result.stdout.strip().splitlines()[-1])
    assert accuracy > 0.5
