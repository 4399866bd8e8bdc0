"""The recommender recipe (movielens_dcn) on the jax engine, each run in a JAX process of its own (child.py), on 8
virtual CPU devices: no split (1x1), data parallel (8x1) and the tables split by rows over the model axis (2x4) give
the same losses, the tables really are split and padded, a SIGKILLed run resumes to bit-identical weights (and on
another mesh with the padding it was trained with), and the default command beats the mean-rating baseline. The
fallback path of keras-rs (plain tables); nothing about SparseCore or a TPU.
"""

import json
import os

import numpy as np
import pytest
from helpers import DCN_RECIPE, DCN_SMALL, dcn_mean_rating_rmse, model_weights, run_cli, run_jax

RECIPE, SMALL = DCN_RECIPE, DCN_SMALL


def _jax_config(output_dir, data, model, **extra):
    return {
        "recipe": RECIPE,
        # Every epoch end saves (the SIGKILL test expects step 12's), however short a warm-cache epoch is.
        "overrides": [
            *SMALL,
            "runtime.checkpoint_max_overhead=null",
            f"runtime.mesh.data={data}",
            f"runtime.mesh.model={model}",
        ],
        "output_dir": str(output_dir),
        **extra,
    }


@pytest.fixture(scope="module")
def jax_runs(tmp_path_factory):
    """movielens_dcn, 24 steps, on the jax engine: one device (1x1), data parallel (8x1), tables split (2x4)."""
    meshes = ((1, 1), (8, 1), (2, 4))
    runs = [
        _jax_config(tmp_path_factory.mktemp(f"dcn_{d}x{m}"), d, m, name=f"{d}x{m}")
        for d, m in meshes
    ]
    code, results, output = run_jax({"runs": runs}, all_results=True)
    assert code == 0 and len(results) == 3, output[-3000:]
    for result in results:
        assert "error" not in result, result
    return {mesh: (run, result) for mesh, run, result in zip(meshes, runs, results, strict=True)}


@pytest.mark.integration
def test_jax_engine_gives_the_same_losses_unsplit_data_parallel_and_with_split_tables(jax_runs):
    _, one = jax_runs[(1, 1)]
    for mesh in ((8, 1), (2, 4)):
        _, other = jax_runs[mesh]
        assert len(other["losses"]) == len(one["losses"]) == 24
        np.testing.assert_allclose(other["losses"], one["losses"], rtol=0, atol=1e-5)
        assert other["metrics"]["eval"]["rmse"] == pytest.approx(
            one["metrics"]["eval"]["rmse"], abs=1e-5
        )
    assert jax_runs[(8, 1)][1]["metrics"]["strategy"] == "DataParallel"
    assert jax_runs[(2, 4)][1]["metrics"]["strategy"] == "ModelParallel"


@pytest.mark.integration
def test_the_tables_really_are_split_by_rows_and_padded_to_the_model_axis(jax_runs):
    shards = jax_runs[(2, 4)][1]["shards"]
    # movie_id: 1,683 ids padded to 1,684 rows, a quarter on each device of a model group.
    assert shards["embedding/movie_id/embeddings"]["shape"] == [1684, 32]
    assert shards["embedding/movie_id/embeddings"]["shard"] == [421, 32]
    assert shards["embedding/user_gender/embeddings"]["shard"] == [1, 4]  # 2 ids padded to 4 rows
    assert shards["deep0/kernel"]["shard"] == shards["deep0/kernel"]["shape"]  # dense layers whole
    unsplit = jax_runs[(1, 1)][1]["shards"]
    assert unsplit["embedding/movie_id/embeddings"]["shape"] == [1683, 32]  # no axis: no padding


@pytest.mark.integration
def test_jax_engine_resumes_a_sigkilled_run_with_split_tables_to_the_same_weights(
    jax_runs, tmp_path
):
    config = _jax_config(tmp_path / "killed", 2, 4)
    code, result, output = run_jax({**config, "kill_at_step": 13, "kill_after_commit": 12})
    assert code == -9 and result is None, output[-2000:]
    assert os.path.exists(tmp_path / "killed" / "checkpoints" / "ckpt_12")
    code, result, output = run_jax(config)
    assert code == 0, output[-3000:]
    assert result["metrics"]["resumed_from_step"] == 12 and result["metrics"]["step"] == 24
    reference, _ = jax_runs[(2, 4)]
    for resumed, uninterrupted in zip(
        model_weights(tmp_path / "killed" / "model.keras"),
        model_weights(os.path.join(reference["output_dir"], "model.keras")),
        strict=True,
    ):
        np.testing.assert_array_equal(resumed, uninterrupted)


@pytest.mark.slow  # two more JAX processes (~30 s)
def test_a_killed_jax_run_resumes_on_another_mesh_with_the_tables_it_was_trained_with(
    jax_runs, tmp_path
):
    """runtime is free to change on resume (a preempted job back on another slice shape): the tables keep the
    padding recorded in runs.jsonl (1,684 rows for mesh.model=4), not 1,683 for a 1x1 mesh."""
    killed = _jax_config(tmp_path / "run", 2, 4)
    code, _, output = run_jax({**killed, "kill_at_step": 13, "kill_after_commit": 12})
    assert code == -9, output[-2000:]
    code, result, output = run_jax(_jax_config(tmp_path / "run", 1, 1))
    assert code == 0, output[-3000:]
    assert result["metrics"]["resumed_from_step"] == 12 and result["metrics"]["step"] == 24
    assert "keep the padding this run was trained with (a multiple of 4 rows" in output
    assert result["shards"]["embedding/movie_id/embeddings"]["shape"] == [1684, 32]
    # The same training, on one device from step 12: the 2x4 run's losses to float32 round-off.
    _, reference = jax_runs[(2, 4)]
    np.testing.assert_allclose(result["losses"], reference["losses"][12:], rtol=0, atol=1e-4)


@pytest.mark.slow
def test_the_default_command_on_the_jax_engine_beats_predicting_the_mean_rating(tmp_path):
    out = tmp_path / "run"
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    done = run_cli(
        "movielens_dcn",
        "--output_dir",
        str(out),
        "--set",
        "runtime.engine=jax",
        "--set",
        "runtime.mesh.model=4",
        "--set",
        "runtime.verbose=0",
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "metrics.json") as f:
        metrics = json.load(f)
    assert metrics["engine"] == "jax" and metrics["mesh"] == {"data": 2, "model": 4}
    assert metrics["eval"]["rmse"] < 0.9 * dcn_mean_rating_rmse()
    assert os.path.isdir(out / "saved_model")  # exported by a TensorFlow-backend child
