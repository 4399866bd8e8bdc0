"""The benchmarks that have a quick size run at it: a benchmark is run by hand, so one that no longer runs (a recipe
key it relied on changed meaning) would otherwise be found only when someone needs its numbers."""

import os
import re
import subprocess
import sys

import pytest
from helpers import REPO


@pytest.mark.integration
def test_input_pipeline_benchmark_runs_every_case_at_its_quick_size():
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        KERAS_BACKEND="tensorflow",
    )
    result = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "input_pipeline.py"), "--quick"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| \w", line)][1:]
    # Each case measured: both rates and their ratio, none skipped.
    assert len(rows) == 5, result.stdout
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        pipeline, step = (float(c.replace(",", "")) for c in cells[1:3])
        assert pipeline > 0 and step > 0 and cells[3].endswith("x"), row
