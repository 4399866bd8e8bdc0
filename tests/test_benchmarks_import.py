"""The benchmark scripts' tpukit imports resolve: a module that moves must take its benchmarks along (they run only
by hand and in no test tier, so nothing else would notice)."""

import ast
import importlib
import pathlib

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
