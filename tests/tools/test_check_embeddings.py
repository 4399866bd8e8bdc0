"""`python -m tpukit.check`'s `embeddings` rule: where keras-rs 0.4.0's DistributedEmbedding puts each table.

What this proves: for every TPU type and engine the rule places `auto`, `sparsecore` and `default_device` tables as
the table in `tpukit/tools/check.py` says (TensorFlow: by the embedding feature the generation reports; JAX: only
v5p and v6e), fails with a fix where keras-rs would raise at build, warns where a run needs something (jax-tpu-
embedding) or a table is large for HBM, names every table with its size, and is not reported for a model without
tables. What it does not prove: the per-generation table itself, which is taken from public sources (cited in
check.py) and not run on a TPU; and that keras-rs behaves so at build (that needs TPUs).
"""

import json
import math
import types

import pytest
import yaml
from helpers import digits_recipe

import tpukit
from tpukit.recipe import RecipeError, from_dict
from tpukit.tools import check as check_lib

TPU_TYPES = list(check_lib.HBM_BYTES_PER_CHIP)
TABLES = {
    "user_id": {"vocabulary_size": 944, "embedding_dim": 32},
    "movie_id": {"vocabulary_size": 1683, "embedding_dim": 32, "placement": "auto"},
}
# Where an `auto` table goes, per engine and TPU type (None: it stays in HBM). Written out here, not read from
# check.py's tables, so that a changed row there fails this test.
TF_AUTO = {
    "v2": "the TPU embedding API via tf.tpu.experimental.embedding.TPUEmbedding",
    "v3": "the TPU embedding API via tf.tpu.experimental.embedding.TPUEmbedding",
    "v4": "SparseCore via tf.tpu.experimental.embedding.TPUEmbedding",
    "v5e": None,
    "v5p": "SparseCore via tf.tpu.experimental.embedding.TPUEmbeddingV2",
    "v6e": "SparseCore via tf.tpu.experimental.embedding.TPUEmbeddingV2",
}
TF_FEATURE = {"v2": "V1", "v3": "V1", "v4": "V1", "v5e": "UNSUPPORTED", "v5p": "V2", "v6e": "V2"}
# tpukit's jax engine keeps every table in HBM (keras-rs' SparseCore path under JAX needs a preprocess step outside
# the compiled step, which the engine does not run), even where keras-rs 0.4.0 would use SparseCore (v5p, v6e).
JAX_AUTO = dict.fromkeys(TPU_TYPES)


def _recipe(tables, engine="tensorflow", mesh_model=1, optimizer="adamw"):
    """The fields `embeddings_rule` (and `target_for`) read, without a model builder that takes `tables`."""
    return types.SimpleNamespace(
        model=types.SimpleNamespace(name="dcn_ranking", kwargs={"tables": tables}),
        runtime=types.SimpleNamespace(
            engine=engine, mesh={"data": "auto", "model": mesh_model}, tpu=None
        ),
        train=types.SimpleNamespace(optimizer=optimizer),
        path="embeddings_test.yaml",
    )


def _rule(tables, tpu_type, engine="tensorflow", cores=8, **kwargs):
    recipe = _recipe(tables, engine, **kwargs)
    return check_lib.embeddings_rule(recipe, check_lib.target_for(recipe, cores, tpu_type))


def _shown(name, rows, dim):
    """The table as the message names it, its float32 size recomputed here."""
    kib = rows * dim * 4 / 2**10
    return f"{name} ({rows:,} x {dim}, {kib:.1f} KiB)"


# ---- the per-generation table --------------------------------------------------------------------------------


def test_every_tpu_type_has_a_row_for_both_engines():
    assert set(check_lib.TF_EMBEDDING_FEATURE) == set(TPU_TYPES)
    assert set(check_lib.JAX_DEVICE_KIND) == set(TPU_TYPES)
    assert check_lib.TF_EMBEDDING_FEATURE["tpu7x"] is None  # TensorFlow does not run on TPU7x


@pytest.mark.parametrize("tpu_type", sorted(TF_AUTO))
def test_tensorflow_places_auto_tables_by_the_embedding_feature(tpu_type):
    rule = _rule(TABLES, tpu_type)
    where = TF_AUTO[tpu_type]
    # Off HBM is a path no tpukit test has run (no TPU): a warning, with the fix that trains as tested.
    assert rule.name == "embeddings" and rule.status == ("pass" if where is None else "warn"), rule
    if where is not None:
        assert "Not run by tpukit: its tests have no TPU" in rule.message
        assert rule.fix.startswith(
            "to train as tested, keep the tables in HBM: --set model.tables."
        )
    feature = TF_FEATURE[tpu_type]
    verb = "reports" if tpu_type in ("v5p", "v6e") else "is expected to report"
    subject = "v5e has no SparseCore and" if tpu_type == "v5e" else tpu_type
    assert f"{subject} {verb} embedding feature {feature}" in rule.message
    for name, table in TABLES.items():
        shown = _shown(name, table["vocabulary_size"], table["embedding_dim"])
        if where is None:
            assert (
                f"{shown}: stays in HBM with the dense model, replicated on every core"
                in rule.message
            )
        else:
            assert f"{shown}: {where.partition(' via ')[0]} (placement auto)" in rule.message
    if where is None:
        assert "has no SparseCore" in rule.message and "SparseCore (placement" not in rule.message
    else:
        assert f"put a table on {where}" in rule.message
    # Only v5p and v6e are documented for keras-rs on TensorFlow; the other rows say they are inferred.
    assert ("not verified on a TPU" in rule.message) == (tpu_type not in ("v5p", "v6e"))


@pytest.mark.parametrize("tpu_type", TPU_TYPES)
def test_the_jax_engine_keeps_every_table_in_hbm(tpu_type):
    rule = _rule(TABLES, tpu_type, engine="jax")
    shown = _shown("movie_id", 1683, 32)
    assert rule.status == "pass", rule
    assert f"{shown}: stays in HBM with the dense model" in rule.message
    assert "SparseCore (placement" not in rule.message
    if tpu_type in ("v5p", "v6e"):  # says why: keras-rs would, tpukit's jax engine does not feed it
        assert "DistributedEmbedding.preprocess outside the compiled step" in rule.message
    if tpu_type in (
        "v4",
        "tpu7x",
    ):  # they have SparseCores that keras-rs 0.4.0 does not use under JAX
        assert (
            f"{tpu_type} has SparseCores, but keras-rs 0.4.0 does not enable SparseCore"
            in rule.message
        )
    if tpu_type == "tpu7x":
        assert "keras-team/keras-rs#183" in rule.message


def test_tensorflow_on_tpu7x_fails_with_the_engine_fix():
    rule = _rule(TABLES, "tpu7x")
    assert rule.status == "fail"
    assert "TensorFlow does not run on tpu7x" in rule.message
    assert _shown("user_id", 944, 32) in rule.message
    assert rule.fix.startswith("--set runtime.engine=jax")


# ---- placements that cannot work -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "engine, raised, types_fix",
    [
        (
            "tensorflow",
            "ValueError('Placement to sparsecore was requested, however, this TPU does not support it.')",
            "--tpu-type v2 or v3 or v4 or v5p or v6e",
        ),
        (
            "jax",
            "tpukit's jax engine refuses placement: sparsecore before building",
            "(--set runtime.engine=tensorflow) on --tpu-type v2 or v3 or v4 or v5p or v6e",
        ),
    ],
)
def test_sparsecore_placement_on_v5e_fails_with_a_fix(engine, raised, types_fix):
    tables = {**TABLES, "movie_id": {**TABLES["movie_id"], "placement": "sparsecore"}}
    rule = _rule(tables, "v5e", engine=engine)
    assert rule.status == "fail", rule
    assert f"{_shown('movie_id', 1683, 32)}: fails at build (placement sparsecore)" in rule.message
    assert raised in rule.message
    # The other table is fine: it stays in HBM.
    assert f"{_shown('user_id', 944, 32)}: stays in HBM" in rule.message
    assert "--set model.tables.movie_id.placement=auto" in rule.fix
    assert "user_id" not in rule.fix
    assert rule.fix.endswith(types_fix)


def test_sparsecore_placement_is_fine_where_keras_rs_uses_sparsecore():
    tables = {"movie_id": {"vocabulary_size": 1683, "embedding_dim": 32, "placement": "sparsecore"}}
    assert _rule(tables, "v5p").status == "warn"  # possible, but untried by tpukit
    assert _rule(tables, "v4").status == "warn"
    assert _rule(tables, "v4", engine="jax").status == "fail"  # never on the jax engine


# Every engine and TPU type but TensorFlow on TPU7x, which TensorFlow does not run on (its own test above).
@pytest.mark.parametrize(
    "engine, tpu_type",
    [(e, t) for e in ("tensorflow", "jax") for t in TPU_TYPES if (e, t) != ("tensorflow", "tpu7x")],
)
def test_default_device_stays_in_hbm_everywhere(engine, tpu_type):
    tables = {name: {**table, "placement": "default_device"} for name, table in TABLES.items()}
    rule = _rule(tables, tpu_type, engine=engine)
    assert rule.status == "pass", (
        rule
    )  # nothing on SparseCore, so nothing to install, and small tables
    for name, table in tables.items():
        shown = _shown(name, table["vocabulary_size"], table["embedding_dim"])
        assert (
            f"{shown}: stays in HBM with the dense model, replicated on every core (placement default_device)"
            in rule.message
        )
    assert (
        "TableConfig optimizer" not in rule.message
    )  # no table trains with keras-rs' own optimizer


# ---- what the message says once -----------------------------------------------------------------------------


def test_the_message_names_every_table_with_its_size():
    tables = {
        **TABLES,
        "user_gender": {"vocabulary_size": 2, "embedding_dim": 4},
        "big": {"vocabulary_size": 3_000_000, "embedding_dim": 64},
    }
    message = _rule(tables, "v5p").message
    assert "user_id (944 x 32, 118.0 KiB)" in message
    assert "movie_id (1,683 x 32, 210.4 KiB)" in message
    assert "user_gender (2 x 4, 32 B)" in message
    assert "big (3,000,000 x 64, 732.4 MiB)" in message  # 3e6 * 64 * 4 bytes


def test_sparsecore_tables_note_their_own_optimizer_once():
    rule = _rule(TABLES, "v6e", optimizer="lamb")
    assert rule.message.count("TableConfig optimizer") == 1
    assert "only SGD, Adagrad, Adam, Ftrl are supported there" in rule.message
    assert "not train.optimizer='lamb'" in rule.message
    assert (
        "an upper bound" in rule.message
    )  # the memory rule counts SparseCore tables as replicated weights


def test_sparsecore_placement_on_the_jax_engine_fails_with_the_fix():
    tables = {"movie_id": {"vocabulary_size": 1683, "embedding_dim": 32, "placement": "sparsecore"}}
    rule = _rule(tables, "v6e", engine="jax")
    assert rule.status == "fail"
    assert "tpukit's jax engine refuses placement: sparsecore" in rule.message
    assert "--set model.tables.movie_id.placement=auto" in rule.fix


def test_a_huge_hbm_table_warns_and_a_split_one_does_not():
    target = check_lib.target_for(_recipe({}), 8, "v5e")
    quarter = target.hbm_bytes_per_core / 4
    dim = 128
    over = {"big": {"vocabulary_size": math.ceil(quarter / (dim * 4)) + 1, "embedding_dim": dim}}
    under = {"big": {"vocabulary_size": math.floor(quarter / (dim * 4)) - 1, "embedding_dim": dim}}
    rule = _rule(over, "v5e")
    assert rule.status == "warn", rule
    assert "Large for HBM, over 1/4 of one v5e core's" in rule.message and "big (" in rule.message
    assert "placement auto on --tpu-type" in rule.fix
    assert _rule(under, "v5e").status == "pass"
    # On jax, the default layout splits a recommender's tables by rows over runtime.mesh.model.
    split = _rule(over, "v5e", engine="jax", mesh_model=2)
    assert split.status == "pass", split
    assert "split by rows over runtime.mesh.model=2" in split.message
    assert _rule(over, "v5e", engine="jax").status == "warn"
    # Where the table goes to SparseCore, its size does not matter to HBM (only the untried path warns).
    assert "Large for HBM" not in _rule(over, "v5p").message


def test_a_table_without_sizes_is_skipped_not_guessed():
    rule = _rule({"movie_id": {"embedding_dim": 32}}, "v5p")
    assert rule.status == "skip" and "model.tables.movie_id" in rule.message


# ---- through check() and the CLI ------------------------------------------------------------------------------


def test_no_tables_no_embeddings_rule():
    digits = from_dict(digits_recipe(), path="digits_test.yaml")
    assert check_lib.embeddings_rule(digits, check_lib.target_for(digits)) is None
    # (the mesh rule is reported for a recipe the jax engine trains: auto on a TPU where no TensorFlow TPU build is)
    assert [r.name for r in check_lib.check(digits, rules=["embeddings"])] in ([], ["mesh"])


def _dcn_recipe(engine="tensorflow", placement="auto"):
    """A recipe whose model has `tables` (data: the digits section, which the embeddings rule never reads)."""
    from tpukit.models import MODELS

    if "dcn_ranking" not in MODELS:
        pytest.skip("the dcn_ranking model is not registered")
    raw = digits_recipe()
    raw["model"] = {
        "name": "dcn_ranking",
        "tables": {
            "user_id": {"vocabulary_size": 944, "embedding_dim": 32},
            "movie_id": {"vocabulary_size": 1683, "embedding_dim": 32, "placement": placement},
        },
    }
    raw.setdefault("runtime", {})["engine"] = engine
    return raw


def test_check_reports_embeddings_after_mesh_and_before_the_others():
    recipe = from_dict(_dcn_recipe(engine="jax"), path="dcn_test.yaml")
    names = [r.name for r in check_lib.check(recipe, tpu_type="v5p", rules=["embeddings"])]
    assert names == ["mesh", "embeddings"]
    recipe = from_dict(_dcn_recipe(), path="dcn_test.yaml")
    results = check_lib.check(recipe, tpu_type="v5p", rules=["input_paths", "embeddings"])
    assert [r.name for r in results] == ["embeddings", "input_paths"]
    assert "embeddings" in check_lib.RECIPE_RULES and "embeddings" not in check_lib.RULES


def test_cli_selects_the_rule_and_prints_it_in_json(capsys, tmp_path):
    path = tmp_path / "dcn.yaml"
    path.write_text(yaml.safe_dump(_dcn_recipe(placement="sparsecore")))
    argv = [str(path), "--rule", "embeddings", "--json"]
    assert check_lib.main([*argv, "--tpu-type", "v6e"]) == 0  # a warning exits 0
    report = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in report["rules"]] == ["embeddings"]
    assert report["rules"][0]["status"] == "warn"
    assert (
        "SparseCore via tf.tpu.experimental.embedding.TPUEmbeddingV2"
        in report["rules"][0]["message"]
    )
    assert check_lib.main([*argv, "--tpu-type", "v5e"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["rules"][0]["status"] == "fail"
    assert "--set model.tables.movie_id.placement=auto" in report["rules"][0]["fix"]


def test_unknown_rule_lists_embeddings():
    with pytest.raises(RecipeError, match=r"the rules are .*memory, embeddings\."):
        check_lib.check(from_dict(digits_recipe(), path="d.yaml"), rules=["embedding"])


@pytest.mark.integration
def test_every_rule_runs_on_the_recommender_recipe_with_named_inputs():
    """The other rules on a model of several named int32 inputs (they once assumed one tensor input)."""
    recipe = tpukit.load_recipe(
        "movielens_dcn", ["data.num_ratings=4000", "runtime.engine=tensorflow"]
    )
    results = {r.name: r for r in check_lib.check(recipe, tpu_type="v5e")}
    assert list(results) == ["embeddings", *check_lib.RULES]
    assert {r.status for r in results.values()} == {"pass"}, results
    assert "'movie_id': (128,)" in results["xla_step"].message
    assert "inputs in int32" in results["precision_step"].message
    assert "train movie_id (128,)" in results["static_shapes"].message


def test_a_table_padded_to_a_multiple_that_does_not_split_over_the_model_axis_fails():
    recipe = _recipe(TABLES, engine="jax", mesh_model=4)
    recipe.model.kwargs["vocabulary_multiple"] = 1
    rule = check_lib.embeddings_rule(recipe, check_lib.target_for(recipe, 8, "v5e"))
    assert rule.status == "fail", rule
    assert (
        "1,683 rows (model.vocabulary_multiple=1) do not split over runtime.mesh.model=4"
        in rule.message
    )
    assert "user_id" not in rule.message.split("do not split")[0].split(";")[-1]  # 944 divides by 4
    assert rule.fix.startswith("remove model.vocabulary_multiple")
    recipe.model.kwargs.pop("vocabulary_multiple")  # tpukit pads to the axis itself
    assert (
        check_lib.embeddings_rule(recipe, check_lib.target_for(recipe, 8, "v5e")).status == "pass"
    )
