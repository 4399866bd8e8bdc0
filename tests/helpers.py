"""Shared test helpers: running the CLI in a subprocess and building small recipes."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(REPO, "recipes")


def run_cli(*args: str, cwd: str | None = None, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(env or os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    return subprocess.run(
        [sys.executable, "-m", "tpukit.train", *args],
        capture_output=True,
        text=True,
        cwd=cwd or REPO,
        env=env,
        timeout=timeout,
    )


def digits_recipe(**overrides):
    """The digits_cnn recipe as a dict with `section.key` overrides applied (small and fast)."""
    import yaml

    with open(os.path.join(RECIPES, "digits_cnn.yaml")) as f:
        raw = yaml.safe_load(f)
    for dotted, value in overrides.items():
        section, key = dotted.split("__") if "__" in dotted else dotted.split(".")
        raw[section][key] = value
    return raw
