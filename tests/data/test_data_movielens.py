"""MovieLens sources: one contract for the real (TFDS) and the synthetic ratings, a deterministic split that every
host agrees on, shards that partition it, ids inside the embedding vocabulary, and synthetic ratings a model can
learn from (a bias-only model clearly beats predicting the mean on held-out ratings).

No network: the real source reads `tfds.testing.mock_data` (random strings as ids) or hand-made TFDS-shaped
examples with real-looking values.
"""

import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tpukit import data
from tpukit.data import DataUnavailableError
from tpukit.recipe import RecipeError, from_dict
from tpukit.task import count_examples, input_fns

# `tpukit.data.movielens` is the module; the sources are its functions of the same names.
ml = sys.modules["tpukit.data.movielens"]

SMALL = {"num_users": 40, "num_movies": 60, "num_ratings": 1000}
CONTRACT = (
    {
        "user_id": tf.TensorSpec((), tf.int32),
        "movie_id": tf.TensorSpec((), tf.int32),
        "user_gender": tf.TensorSpec((), tf.int32),
        "bucketized_user_age": tf.TensorSpec((), tf.int32),
        "user_occupation_label": tf.TensorSpec((), tf.int32),
    },
    tf.TensorSpec((), tf.float32),
)


def _arrays(dataset):
    """The whole dataset as NumPy arrays `(features, ratings)`, in order."""
    features, ratings = next(iter(dataset.batch(10_000_000)))
    return {k: v.numpy() for k, v in features.items()}, ratings.numpy()


def _rows(dataset):
    """Every example as one tuple (ids, side features, rating): a multiset to compare splits and shards by."""
    features, ratings = _arrays(dataset)
    keys = sorted(features)
    return sorted(zip(*(features[k].tolist() for k in keys), ratings.tolist(), strict=True))


def _pairs(rows):
    """(movie_id, user_id) of `_rows` (features sort by name: age, movie, gender, user, occupation)."""
    return {(row[1], row[3]) for row in rows}


def _id_pairs(features):
    return list(zip(features["user_id"].tolist(), features["movie_id"].tolist(), strict=True))


def _rmse(ratings, predicted):
    return float(np.sqrt(np.mean((ratings - predicted) ** 2)))


def _context(pipeline_id, pipelines=2):
    return tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=pipelines
    )


def _tfds_like(examples):
    """An `as_dataset_fn` for mock_data: TFDS movielens examples with the given (real-looking) values."""

    def as_dataset(self, *args, **kwargs):
        columns = {k: [e[k] for e in examples] for k in examples[0]}
        return tf.data.Dataset.from_tensor_slices(
            {
                "user_id": tf.constant(columns["user_id"], tf.string),
                "movie_id": tf.constant(columns["movie_id"], tf.string),
                "user_gender": tf.constant(columns["user_gender"], tf.bool),
                "bucketized_user_age": tf.constant(columns["bucketized_user_age"], tf.float32),
                "user_occupation_label": tf.constant(columns["user_occupation_label"], tf.int64),
                "user_rating": tf.constant(columns["user_rating"], tf.float32),
            }
        )

    return as_dataset


# ---- one contract for both sources -------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ml.VARIANTS)
def test_both_sources_have_exactly_the_contract_element_spec(variant):
    synthetic = ml.movielens_synthetic("train", **SMALL).element_spec
    with tfds.testing.mock_data(num_examples=8):
        real = ml.movielens("test", variant=variant).element_spec
    assert synthetic == CONTRACT
    assert real == CONTRACT


def test_sources_are_registered_with_a_fast_count_for_the_synthetic_one():
    assert data.SOURCES["movielens"] is ml.movielens
    assert data.SOURCES["movielens_synthetic"] is ml.movielens_synthetic
    assert data.EXAMPLE_COUNTS["movielens_synthetic"] is ml.count_synthetic
    assert (
        "movielens" not in data.EXAMPLE_COUNTS
    )  # the hash split is known only by reading: tpukit counts once
    assert data.movielens is ml  # the package attribute stays the module (VOCABULARY)


def test_vocabulary_covers_every_feature_and_the_synthetic_default_matches_100k():
    for sizes in ml.VOCABULARY.values():
        assert set(sizes) == set(CONTRACT[0])
    assert ml.VOCABULARY["100k-ratings"]["user_id"] == 944
    assert ml.VOCABULARY["100k-ratings"]["movie_id"] == 1683
    assert ml.VOCABULARY["1m-ratings"]["user_id"] == 6041
    assert ml.VOCABULARY["1m-ratings"]["movie_id"] == 3953
    features, ratings = _arrays(ml.movielens_synthetic("train"))
    for key, size in ml.VOCABULARY["100k-ratings"].items():
        assert 0 <= features[key].min() and features[key].max() < size, key
    assert features["user_id"].max() == 943 and features["movie_id"].max() == 1682


# ---- the split: deterministic, disjoint, complete ----------------------------------------------------------


def test_synthetic_train_and_test_partition_the_ratings_deterministically():
    train = _rows(ml.movielens_synthetic("train", **SMALL, test_fraction=0.25))
    test = _rows(ml.movielens_synthetic("test", **SMALL, test_fraction=0.25))
    assert len(test) == 250 and len(train) == 750
    # Each (user, movie) pair is rated once, in one split only.
    assert len(_pairs(train) | _pairs(test)) == 1000
    assert not _pairs(train) & _pairs(test)
    ml._synthetic_ratings.cache_clear()  # a fresh generation gives the same ratings
    ml._synthetic_test_mask.cache_clear()
    assert _rows(ml.movielens_synthetic("test", **SMALL, test_fraction=0.25)) == test
    other_seed = _rows(ml.movielens_synthetic("test", **SMALL, test_fraction=0.25, seed=1))
    assert other_seed != test


def test_synthetic_test_fraction_is_exact_and_test_sets_nest():
    small = _rows(ml.movielens_synthetic("test", **SMALL, test_fraction=0.1))
    large = _rows(ml.movielens_synthetic("test", **SMALL, test_fraction=0.3))
    assert len(small) == 100 and len(large) == 300
    # The same generation: a larger test_fraction only moves more ratings to test.
    assert set(small) <= set(large)


def test_real_train_and_test_partition_the_ratings_deterministically():
    with tfds.testing.mock_data(num_examples=400):
        everything = _rows(
            ml.movielens("train", test_fraction=0.5).concatenate(
                ml.movielens("test", test_fraction=0.5)
            )
        )
        test = _rows(ml.movielens("test"))
        train = _rows(ml.movielens("train"))
        again = _rows(ml.movielens("test"))
    assert len(everything) == 400 and len(train) + len(test) == 400
    assert sorted(train + test) == everything
    assert not set(train) & set(test)
    assert again == test
    assert 0.12 < len(test) / 400 < 0.28  # hash split: ~test_fraction=0.2 (binomial sd 0.02)


def test_real_split_holds_each_user_movie_pair_in_one_split_only():
    # The same (user, movie) twice with different ratings: both copies land in the same split.
    examples = [
        dict(
            user_id=str(1 + i % 30),
            movie_id=str(1 + i % 70),
            user_gender=bool(i % 2),
            bucketized_user_age=25.0,
            user_occupation_label=3,
            user_rating=float(1 + i % 5),
        )
        for i in range(420)  # lcm(30, 70) = 210: every pair appears exactly twice
    ]
    with tfds.testing.mock_data(as_dataset_fn=_tfds_like(examples)):
        train, _ = _arrays(ml.movielens("train"))
        test, _ = _arrays(ml.movielens("test"))
    train, test = _id_pairs(train), _id_pairs(test)
    assert len(train) + len(test) == 420
    assert not set(train) & set(test)
    assert len(set(test)) * 2 == len(test)


# ---- sharding -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("split", ["train", "test"])
def test_synthetic_shards_are_disjoint_and_make_the_split(split):
    whole = _rows(ml.movielens_synthetic(split, **SMALL))
    parts = [_rows(ml.movielens_synthetic(split, _context(i), **SMALL)) for i in (0, 1)]
    assert abs(len(parts[0]) - len(parts[1])) <= 1
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == whole


@pytest.mark.parametrize("split", ["train", "test"])
@pytest.mark.integration
def test_real_shards_are_disjoint_and_make_the_split(split):
    with tfds.testing.mock_data(num_examples=300):
        whole = _rows(ml.movielens(split, variant="1m-ratings"))
        parts = [_rows(ml.movielens(split, _context(i), variant="1m-ratings")) for i in (0, 1)]
    assert len(whole) > 20
    assert abs(len(parts[0]) - len(parts[1])) <= 1
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == whole


# ---- values: ids in the vocabulary, side features and ratings in range ----------------------------------------


def test_real_values_are_parsed_from_tfds_strings_floats_and_bools():
    examples = [
        dict(user_id="1", movie_id="1682", user_gender=True, bucketized_user_age=1.0,
             user_occupation_label=0, user_rating=5.0),
        dict(user_id="943", movie_id="50", user_gender=False, bucketized_user_age=18.0,
             user_occupation_label=21, user_rating=1.0),
        dict(user_id="7", movie_id="3", user_gender=True, bucketized_user_age=56.0,
             user_occupation_label=17, user_rating=3.0),
        dict(user_id="8", movie_id="4", user_gender=False, bucketized_user_age=20.0,
             user_occupation_label=5, user_rating=4.0),
        dict(user_id="9", movie_id="5", user_gender=False, bucketized_user_age=70.0,
             user_occupation_label=5, user_rating=2.0),
    ]  # fmt: skip
    with tfds.testing.mock_data(as_dataset_fn=_tfds_like(examples)):
        parts = [_arrays(ml.movielens(split, test_fraction=0.5)) for split in ("train", "test")]
    rows = {}
    for features, ratings in parts:
        for i, user in enumerate(features["user_id"].tolist()):
            rows[user] = tuple(int(features[k][i]) for k in sorted(CONTRACT[0]) if k != "user_id")
            rows[user] += (float(ratings[i]),)
    # (bucketized_user_age, movie_id, user_gender, user_occupation_label, rating) by user_id
    assert rows == {
        1: (0, 1682, 1, 0, 5.0),
        943: (1, 50, 0, 21, 1.0),
        7: (6, 3, 1, 17, 3.0),
        8: (1, 4, 0, 5, 4.0),  # 20 -> the bucket below it, 18
        9: (6, 5, 0, 5, 2.0),  # above the last bucket -> 56
    }


def test_ids_that_are_not_numbers_or_too_large_are_hashed_into_the_vocabulary():
    texts = tf.constant(["12", "1683", "99999999999", "abc", "", "0"])
    ids = ml._parse_id(texts, 1683).numpy().tolist()
    assert ids[0] == 12 and ids[5] == 0
    assert all(1 <= i < 1683 for i in ids[1:5])
    ages = tf.constant([0.5, 1.0, 17.9, 18.0, 34.0, 35.0, 49.0, 50.0, 56.0, 99.0])
    assert ml.age_bucket(ages).numpy().tolist() == [0, 0, 0, 1, 2, 3, 4, 5, 6, 6]


@pytest.mark.parametrize("variant", ml.VARIANTS)
def test_real_values_are_in_range_even_from_random_mock_data(variant):
    with tfds.testing.mock_data(
        num_examples=200
    ):  # ids are random strings, ratings and ages random floats
        features, ratings = _arrays(ml.movielens("train", variant=variant))
    for key, size in ml.VOCABULARY[variant].items():
        assert features[key].min() >= 0 and features[key].max() < size, key
    assert (
        features["user_id"].min() >= 1 and features["movie_id"].min() >= 1
    )  # hashed ids avoid row 0
    assert ratings.min() >= 1.0 and ratings.max() <= 5.0


def test_synthetic_values_are_in_range_and_side_features_belong_to_the_user():
    sizes = {"num_users": 200, "num_movies": 300, "num_ratings": 20_000}
    features, ratings = _arrays(ml.movielens_synthetic("train", **sizes))
    assert features["user_id"].min() == 1 and features["user_id"].max() == 200
    assert features["movie_id"].min() == 1 and features["movie_id"].max() == 300
    assert set(np.unique(features["user_gender"])) == {0, 1}
    assert set(np.unique(features["bucketized_user_age"])) == set(range(7))
    assert (
        0 <= features["user_occupation_label"].min()
        and features["user_occupation_label"].max() <= 21
    )
    assert set(np.unique(ratings)) == {1.0, 2.0, 3.0, 4.0, 5.0}  # whole stars, like 100k-ratings
    for key in ("user_gender", "bucketized_user_age", "user_occupation_label"):
        per_user = {}
        for user, value in zip(features["user_id"].tolist(), features[key].tolist(), strict=True):
            assert per_user.setdefault(user, value) == value, key


# ---- the synthetic data is learnable -------------------------------------------------------------------------


def _bias_model(users, movies, ratings, num_users, num_movies, reg=5.0, sweeps=10):
    """Global mean + user bias + movie bias, fitted by alternating regularised least squares."""
    mean = ratings.mean()
    user_bias, movie_bias = np.zeros(num_users + 1), np.zeros(num_movies + 1)
    for _ in range(sweeps):
        residual = ratings - mean - movie_bias[movies]
        user_bias = np.bincount(users, residual, num_users + 1) / (
            np.bincount(users, minlength=num_users + 1) + reg
        )
        residual = ratings - mean - user_bias[users]
        movie_bias = np.bincount(movies, residual, num_movies + 1) / (
            np.bincount(movies, minlength=num_movies + 1) + reg
        )
    return lambda u, m: mean + user_bias[u] + movie_bias[m]


def test_synthetic_ratings_look_like_movielens_and_a_bias_model_beats_the_mean():
    ml._synthetic_ratings.cache_clear()
    start = time.perf_counter()
    train_features, train_ratings = _arrays(ml.movielens_synthetic("train"))
    seconds = time.perf_counter() - start
    test_features, test_ratings = _arrays(ml.movielens_synthetic("test"))
    everything = np.concatenate([train_ratings, test_ratings])
    assert 3.3 < everything.mean() < 3.7 and 1.0 <= everything.std() <= 1.15
    assert seconds < 10  # ~0.1 s to generate; generous for a loaded 2-core CI machine

    mean_rmse = _rmse(test_ratings, train_ratings.mean())
    predict = _bias_model(
        train_features["user_id"], train_features["movie_id"], train_ratings, 943, 1682
    )
    bias_rmse = _rmse(test_ratings, predict(test_features["user_id"], test_features["movie_id"]))
    assert 1.0 <= mean_rmse <= 1.15
    assert bias_rmse < 0.92 * mean_rmse, (bias_rmse, mean_rmse)  # measured: 0.941 vs 1.124 (-16%)

    # More than biases to learn: the noise-free ratings (what factors + side features can reach) do better still.
    generated = ml._synthetic_ratings(943, 1682, 100_000, 0)
    test = ml._synthetic_test_mask(100_000, 0.2, 0)
    best_rmse = _rmse(test_ratings, np.clip(generated["signal"][test], 1, 5))
    assert best_rmse < 0.95 * bias_rmse and 0.8 <= best_rmse <= 0.9, (best_rmse, bias_rmse)


# ---- counts --------------------------------------------------------------------------------------------------


TINY = {"num_users": 3, "num_movies": 2, "num_ratings": 6, "test_fraction": 0.01}


@pytest.mark.parametrize("options", [{}, {**SMALL, "test_fraction": 0.37, "seed": 4}, TINY])
def test_synthetic_count_agrees_with_the_dataset(options):
    for split in ("train", "test"):
        counted = ml.count_synthetic(
            split, **options, skip_corrupt=True
        )  # as count_examples calls it
        assert counted == int(ml.movielens_synthetic(split, **options).cardinality())
        assert counted == len(_rows(ml.movielens_synthetic(split, **options)))
    assert ml.count_synthetic("test", **options) >= 1  # never an empty split


def _recipe(source, **options):
    return from_dict(
        {
            "model": {"name": "small_cnn"},
            "data": {"source": source, "global_batch_size": 256, **options},
            "train": {"epochs": 1, "learning_rate": 0.01},
        }
    )


def test_recipes_accept_the_sources_and_count_their_splits():
    recipe = _recipe("movielens_synthetic", **SMALL, test_fraction=0.25, seed=2)
    assert recipe.data.options == {**SMALL, "test_fraction": 0.25, "seed": 2}
    assert count_examples(recipe, "test") == 250 and count_examples(recipe, "train") == 750
    real = _recipe("movielens", variant="1m-ratings", test_fraction=0.3, data_dir="/tmp/unused")
    assert real.data.options["variant"] == "1m-ratings"
    with tfds.testing.mock_data(num_examples=100):
        counted = count_examples(real, "train") + count_examples(real, "test")
    assert counted == 100


def test_recipes_reject_bad_movielens_keys_by_name():
    with pytest.raises(RecipeError, match="num_user"):
        _recipe("movielens_synthetic", num_user=10)
    with pytest.raises(RecipeError, match="25m-ratings"):
        _recipe("movielens", variant="25m-ratings")


def test_run_pipeline_batches_the_feature_dict_with_static_shapes():
    recipe = _recipe("movielens_synthetic", **SMALL, shuffle_buffer=64)
    eval_examples = count_examples(recipe, "test")
    train_fn, eval_fn = input_fns(recipe, eval_examples)
    for dataset in (train_fn(_context(0)), eval_fn(_context(0))):
        for spec in tf.nest.flatten(dataset.element_spec):
            assert spec.shape.is_fully_defined() and spec.shape[0] == 128  # per replica of 2
    features, ratings, weights = next(iter(eval_fn(None)))
    assert features["user_id"].dtype == tf.int32 and ratings.dtype == tf.float32
    total = sum(float(tf.reduce_sum(w)) for _, _, w in eval_fn(None))
    assert total == eval_examples == 200


# ---- bad arguments fail fast, naming the argument and the fix ------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ml.movielens_synthetic("validation"), "unknown split 'validation'; valid splits: train, test"),
        (lambda: ml.movielens("train[:80%]"), r"unknown split 'train\[:80%\]'; valid splits: train, test"),
        (lambda: ml.movielens(variant="25m-ratings"), "valid variants: 100k-ratings, 1m-ratings"),
        (lambda: ml.movielens(test_fraction=0.0), r"test_fraction must be in \(0, 1\).*received test_fraction=0.0"),
        (lambda: ml.movielens_synthetic(test_fraction=1), "received test_fraction=1"),
        (lambda: ml.movielens_synthetic(test_fraction=-0.5), "received test_fraction=-0.5"),
        (lambda: ml.movielens_synthetic(test_fraction="0.2"), "test_fraction must be a number"),
        (lambda: ml.movielens_synthetic(num_users=0), "num_users must be at least 1; received num_users=0"),
        (lambda: ml.movielens_synthetic(num_movies=-3), "num_movies must be at least 1; received num_movies=-3"),
        (lambda: ml.movielens_synthetic(num_ratings=0), "num_ratings must be at least 2"),
        (lambda: ml.movielens_synthetic(num_users=2.5), "num_users must be an integer; received 2.5"),
        (lambda: ml.movielens_synthetic(num_users=3, num_movies=4, num_ratings=13), "more than the 12"),
        (lambda: ml.movielens_synthetic(num_users=100_000, num_movies=100_000), "at most 50,000,000"),
        (lambda: ml.movielens_synthetic(seed=-1), "seed must be a non-negative integer"),
        (lambda: ml.count_synthetic("dev"), "valid splits: train, test"),
    ],
)  # fmt: skip
def test_bad_arguments_raise_value_errors_that_name_them_and_the_fix(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "Fix:" in str(info.value)


def test_a_failed_download_points_at_the_offline_source(tmp_path, monkeypatch):
    def no_network(self, *args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_network)
    with pytest.raises(DataUnavailableError) as info:
        ml.movielens(data_dir=str(tmp_path))
    message = str(info.value)
    assert "movielens/100k-ratings" in message and "OSError: network unreachable" in message
    assert "the recipe movielens_dcn" in message and "movielens_synthetic" in message
    assert "set try_gcs: true" in message and "data_dir" in message
    with pytest.raises(DataUnavailableError) as info:
        ml.movielens(data_dir=str(tmp_path), try_gcs=True)
    assert "try_gcs" not in str(info.value).split("Fix:")[1]  # already set: not suggested again


def test_the_cli_reports_a_failed_download_without_a_traceback(tmp_path, monkeypatch):
    from helpers import train_in_process

    def no_network(self, *args, **kwargs):
        raise OSError("network unreachable")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_network)
    out = tmp_path / "run"
    done = train_in_process(
        "movielens_100k_dcn", "--set", "data.try_gcs=false", "--set", f"data.data_dir={tmp_path}",
        "--output_dir", str(out),
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert (
        "\ntpukit: error: movielens: could not download and prepare movielens/100k-ratings"
        in done.stderr
    )
    assert "Traceback" not in done.stderr and "the recipe movielens_dcn" in done.stderr
    assert not out.exists()
