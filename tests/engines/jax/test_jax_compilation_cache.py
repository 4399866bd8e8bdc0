"""The jax engine's persistent compilation cache (`tpukit.engines.jax.compilation_cache`): a second process of the
same recipe loads what the first compiled, the user's own cache directory and `TPUKIT_JAX_COMPILATION_CACHE=0` are
respected, and a run from the cache trains the same weights. Each run is a JAX process of its own (`child.py`);
nothing here measures speed (benchmarks/vs_keras.py does)."""

import os

import pytest
from helpers import run_jax

RUN = {
    "recipe": "digits_cnn",
    "overrides": ["train.epochs=1", "train.steps_per_epoch=4", "runtime.verbose=0"],
}


def _run(tmp_path, name, cache_home, **env):
    environment = dict(os.environ, XDG_CACHE_HOME=str(cache_home), **env)
    for variable in ("JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        environment.pop(variable, None)
    environment.update(env)
    config = {**RUN, "output_dir": str(tmp_path / name)}
    code, result, output = run_jax(config, devices=1, env=environment)
    assert code == 0 and result and "error" not in result, output[-3000:]
    return result, output


def _entries(path):
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("cache")
    first = _run(tmp_path, "first", tmp_path / "home")
    second = _run(tmp_path, "second", tmp_path / "home")
    return tmp_path, first, second


@pytest.mark.integration
def test_a_second_process_loads_what_the_first_compiled(two_runs):
    tmp_path, (first, _), (second, _) = two_runs
    cache = tmp_path / "home" / "tpukit" / "jax_compilation_cache"
    assert first["cache_hits"] == 0 and len(_entries(cache)) >= 5
    # The initializers, the train and test steps and the rest: every computation the first run compiled.
    assert second["cache_hits"] >= len([c for c in first["compiles"] if c[0] == "train_step"]) + 4


@pytest.mark.integration
def test_a_run_from_the_cache_trains_the_same_weights(two_runs):
    _, (first, _), (second, _) = two_runs
    assert second["losses"] == first["losses"]
    assert second["metrics"]["eval"] == first["metrics"]["eval"]


@pytest.mark.slow
def test_the_users_own_cache_and_the_off_switch_are_respected(tmp_path):
    mine = tmp_path / "mine"
    # A user's own cache keeps all of JAX's own settings, JAX's 1 s minimum compile time too: on a fast machine
    # no compile of this small CNN takes that long (CI's did not), so the user here also asks for every compile.
    _run(
        tmp_path,
        "users",
        tmp_path / "home",
        JAX_COMPILATION_CACHE_DIR=str(mine),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    )
    assert _entries(mine) and not _entries(tmp_path / "home" / "tpukit" / "jax_compilation_cache")
    off, _ = _run(tmp_path, "off", tmp_path / "home", TPUKIT_JAX_COMPILATION_CACHE="0")
    assert off["cache_hits"] == 0
    assert not _entries(tmp_path / "home" / "tpukit" / "jax_compilation_cache")
