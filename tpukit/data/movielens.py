"""MovieLens ratings for recommenders: the real data from TFDS, and an offline synthetic stand-in.

Both sources give the same unbatched `(features, label)` examples, so a recipe switches between them by
`data.source` alone:

    features = {"user_id", "movie_id", "user_gender", "bucketized_user_age", "user_occupation_label"}  # int32
    label    = user_rating (scalar float32, 1.0..5.0)

Ids keep MovieLens' 1-based numbering, so an embedding table needs `VOCABULARY[variant][key]` rows (row 0 is never
used by real data); age is the index of MovieLens-1M's `AGE_BUCKETS`, gender is 1 for male, occupation is TFDS's
22-class label. TFDS has a single "train" split; both sources split it by a fixed function of each rating, the same
on every host, before sharding, so the hosts' shards of one split are disjoint and make the whole split.

    examples = movielens("train", None, variant="100k-ratings")     # downloads once (~5 MB)
    examples = movielens_synthetic("train", None)                     # no download, shaped like 100k-ratings"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
import tensorflow as tf

from tpukit.data import tfds as _tfds
from tpukit.data.pipeline import AUTOTUNE, shard

Variant = Literal["100k-ratings", "1m-ratings"]
VARIANTS = ("100k-ratings", "1m-ratings")
SPLITS = ("train", "test")
FEATURES = (
    "user_id",
    "movie_id",
    "user_gender",
    "bucketized_user_age",
    "user_occupation_label",
)
LABEL = "user_rating"

# Rows an embedding table needs per feature: the largest value + 1 (ids are 1-based, row 0 stays unused).
VOCABULARY = {
    "100k-ratings": {
        "user_id": 944,
        "movie_id": 1683,
        "user_gender": 2,
        "bucketized_user_age": 7,
        "user_occupation_label": 22,
    },
    "1m-ratings": {
        "user_id": 6041,
        "movie_id": 3953,
        "user_gender": 2,
        "bucketized_user_age": 7,
        "user_occupation_label": 22,
    },
}

# MovieLens-1M's age buckets (the lowest age of each range); TFDS gives 100k's ages in the same buckets.
AGE_BUCKETS = (1, 18, 25, 35, 45, 50, 56)
NUM_OCCUPATIONS = 22

# Ratings go to test when hash("user:movie") falls in the first `test_fraction` of these buckets.
_HASH_BUCKETS = 1_000_000
# The synthetic generator holds a few float32 and int arrays of num_users x num_movies (sampling without
# replacement over every pair): ~100 MB at 1m-ratings' size. Larger grids are refused before allocating them.
_MAX_SYNTHETIC_PAIRS = 50_000_000


def _check_common(source: str, split: str, test_fraction: float) -> None:
    if split not in SPLITS:
        raise ValueError(
            f"{source}: unknown split {split!r}; valid splits: {', '.join(SPLITS)}. MovieLens has one table of "
            "ratings, which this source splits itself. Fix: split: train or split: test (set the held-out share "
            "with test_fraction)."
        )
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)):
        raise ValueError(
            f"{source}: test_fraction must be a number in (0, 1); received {test_fraction!r} "
            f"({type(test_fraction).__name__}). Fix: e.g. test_fraction: 0.2."
        )
    if not 0 < test_fraction < 1:
        raise ValueError(
            f"{source}: test_fraction must be in (0, 1), the share of ratings held out for the test split; "
            f"received test_fraction={test_fraction!r}. Fix: e.g. test_fraction: 0.2."
        )


# ---- the real data: TFDS movielens/{variant} ---------------------------------------------------------------


def movielens(
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    variant: Variant = "100k-ratings",
    data_dir: str | None = None,
    try_gcs: bool = False,
    test_fraction: float = 0.2,
    download: bool = True,
) -> tf.data.Dataset:
    """MovieLens ratings with the users' side features, from TFDS `movielens/{variant}` (see the module docstring).

    TFDS has only a "train" split: it is read whole, in file order, and a rating is in `test` when the hash of
    its "user_id:movie_id" falls in the first `test_fraction` of the hash range, so the split is the same on every
    host and in every run without a pass to count. Ids that are not plain numbers (`tfds.testing.mock_data` makes
    random strings) or that exceed the variant's vocabulary are hashed into [1, vocabulary) so an embedding lookup
    stays in range.

    Args:
        split: 'train' or 'test'.
        input_context: this pipeline's place; each pipeline keeps every n-th rating of the split.
        variant: '100k-ratings' (100,000 ratings, 943 users, 1,682 movies) or '1m-ratings' (1,000,209 ratings,
            6,040 users, 3,952 movies); the others have no side features.
        data_dir: where prepared data lives (local or gs://); None: TFDS's default (~/tensorflow_datasets).
        try_gcs: read TFDS's public copy on GCS when it has one.
        test_fraction: the share of ratings in `test`, in (0, 1).
        download: download and prepare the data if `data_dir` does not have it (`tpukit show` sets false: TFDS
            then raises its "could not find data" AssertionError instead).

    Raises:
        ValueError: an unknown split or variant, or `test_fraction` outside (0, 1).
        RuntimeError: the data is not in `data_dir` and cannot be downloaded.
    """
    _check_common("movielens", split, test_fraction)
    if variant not in VARIANTS:
        raise ValueError(
            f"movielens: unknown variant {variant!r}; valid variants: {', '.join(VARIANTS)} (the MovieLens "
            "versions with user gender, age and occupation). Fix: e.g. variant: 100k-ratings."
        )
    import tensorflow_datasets as tfds

    builder = _movielens_builder(variant, data_dir, try_gcs, download)
    decoders = tfds.decode.PartialDecoding({key: True for key in (*FEATURES, LABEL)})
    # One file at a time and ordered maps: every pipeline must see the ratings in the same order for `shard`.
    read_config = tfds.ReadConfig(
        interleave_cycle_length=1, num_parallel_calls_for_interleave_files=1
    )
    dataset = builder.as_dataset(
        split="train", shuffle_files=False, decoders=decoders, read_config=read_config
    )
    vocabulary = VOCABULARY[variant]
    dataset = dataset.map(
        lambda example: _from_tfds(example, vocabulary),
        num_parallel_calls=AUTOTUNE,
        deterministic=True,  # a run's `deterministic: false` option must not reorder ratings before `shard`
    )
    threshold = _test_threshold(test_fraction)
    want_test = split == "test"
    dataset = dataset.filter(lambda features, _: _in_test(features, threshold) == want_test)
    return shard(dataset, input_context)


def _movielens_builder(variant: str, data_dir: str | None, try_gcs: bool, download: bool):
    """The TFDS builder, prepared unless `download` is false; a failed download names the offline source."""
    try:
        return _tfds._builder(f"movielens/{variant}", data_dir, try_gcs, download=download)
    except RuntimeError as error:
        cause = error.__cause__ or error
        gcs = "" if try_gcs else ", set try_gcs: true to read TFDS's public GCS copy"
        raise _tfds.DataUnavailableError(
            f"movielens: could not download and prepare movielens/{variant} into data_dir={data_dir!r}: "
            f"{type(cause).__name__}: {cause}. Fix: check the network{gcs}, or prepare it once elsewhere and copy "
            "it into data_dir (local or gs://); offline, the recipe movielens_dcn trains the same model on "
            "`movielens_synthetic` (the same features and shapes, no download)."
        ) from error


# The ratings of each variant as the TFDS catalogue publishes them: `tpukit show` plans with them where the data is
# not downloaded (and downloads nothing).
PUBLISHED_RATINGS = {"100k-ratings": 100_000, "1m-ratings": 1_000_209}


def published_split_size(
    split: str, variant: str = "100k-ratings", test_fraction: float = 0.2, **_
) -> int | None:
    """About how many ratings a split of `movielens` holds, from `PUBLISHED_RATINGS`: `test_fraction` of them in
    `test`, the rest in `train` (the exact counts follow the hash of each rating's user and movie, so they need the
    data); None for a variant, split or fraction `movielens` would refuse."""
    total = PUBLISHED_RATINGS.get(variant)
    number = isinstance(test_fraction, (int, float)) and not isinstance(test_fraction, bool)
    if total is None or split not in SPLITS or not (number and 0 < test_fraction < 1):
        return None
    test = int(round(test_fraction * total))
    return test if split == "test" else total - test


def _from_tfds(example: dict, vocabulary: dict) -> tuple[dict, tf.Tensor]:
    gender = tf.cast(example["user_gender"], tf.int32)  # TFDS: bool, True = male
    occupation = tf.cast(example["user_occupation_label"], tf.int32)
    features = {
        "user_id": _parse_id(example["user_id"], vocabulary["user_id"]),
        "movie_id": _parse_id(example["movie_id"], vocabulary["movie_id"]),
        "user_gender": tf.clip_by_value(gender, 0, 1),
        "bucketized_user_age": age_bucket(example["bucketized_user_age"]),
        "user_occupation_label": tf.clip_by_value(occupation, 0, NUM_OCCUPATIONS - 1),
    }
    # Whole stars 1..5 in real data; clipped so that an odd record (or mock data) cannot leave the range.
    rating = tf.clip_by_value(tf.cast(example[LABEL], tf.float32), 1.0, 5.0)
    return features, rating


def _parse_id(text: tf.Tensor, size: int) -> tf.Tensor:
    """A TFDS id string as an int32 in [0, size): its number when it is one below `size`, else a hash in
    [1, size). Up to 9 digits are parsed, so the number always fits int32."""
    is_number = tf.strings.regex_full_match(text, "[0-9]{1,9}")
    # to_number fails on a string that is not a number, even in the branch tf.where drops: parse "0" there.
    number = tf.strings.to_number(tf.where(is_number, text, "0"), out_type=tf.int32)
    hashed = tf.cast(tf.strings.to_hash_bucket_fast(text, size - 1), tf.int32) + 1
    return tf.where(is_number & (number < size), number, hashed)


def age_bucket(age: tf.Tensor) -> tf.Tensor:
    """TFDS's float `bucketized_user_age` (1, 18, 25, 35, 45, 50, 56) as its index 0..6; any other value gets the
    index of the nearest bucket below it (ages under 18 and unknown values: 0)."""
    edges = tf.constant(AGE_BUCKETS[1:], tf.float32)
    above = tf.cast(tf.cast(age, tf.float32)[..., None] >= edges, tf.int32)
    return tf.reduce_sum(above, axis=-1)


def _test_threshold(test_fraction: float) -> int:
    return int(round(test_fraction * _HASH_BUCKETS))


def _in_test(features: dict, threshold: int) -> tf.Tensor:
    """Whether a rating is held out: a fixed hash of "user:movie", so a (user, movie) pair is in one split only."""
    key = tf.strings.join(
        [tf.strings.as_string(features["user_id"]), tf.strings.as_string(features["movie_id"])],
        separator=":",
    )
    return tf.strings.to_hash_bucket_fast(key, _HASH_BUCKETS) < threshold


# ---- the offline stand-in ----------------------------------------------------------------------------------

# MovieLens-like frequencies: 71% of the 100k users are male; ages from MovieLens-1M's users per bucket; the
# 22 occupations roughly as in MovieLens-100k (students, educators, engineers and "other" most common).
_MALE_SHARE = 0.71
_AGE_COUNTS = (222, 1103, 2096, 1193, 550, 496, 380)
_OCCUPATION_COUNTS = (10, 3, 7, 1, 2, 2, 4, 0.5, 1, 1.5, 5, 11, 7, 2, 3, 3, 2, 20, 10, 1.5, 1, 5)
# The rating model, tuned so the ratings look like MovieLens-100k's (mean ~3.5, std ~1.1, mostly 3s and 4s)
# and a model has something to learn: biases alone cut the test RMSE by ~15% from predicting the mean, the
# latent factors and side features a little more, and the noise leaves a perfect model at ~0.85.
_GLOBAL_MEAN = 3.45
_USER_BIAS_STD = 0.5
_MOVIE_BIAS_STD = 0.5
_POPULARITY_BIAS = (
    0.2  # correlation of a movie's bias with its (log) popularity: popular films rate higher
)
_RANK = 8
_FACTOR_STD = 0.36
_SIDE_EFFECT = 0.25  # how far gender and age tilt a user's taste along one genre-like movie factor
_NOISE_STD = 0.9
_ACTIVITY_SIGMA = 0.9  # log-normal spread of how many ratings a user makes
_POPULARITY_OFFSET = 30.0  # movie weight ~ 1 / (rank + offset): Zipf-like, less extreme at the head


def movielens_synthetic(
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    num_users: int = 943,
    num_movies: int = 1682,
    num_ratings: int = 100_000,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> tf.data.Dataset:
    """Synthetic ratings with MovieLens-100k's features, dtypes and id ranges: a recommender recipe with no
    download. Not random labels: a hidden model makes them, so what a recommender learns shows on `test`.

    Each user gets a gender, age bucket and occupation (MovieLens-like frequencies), a bias and a rank-8 taste
    vector; each movie a bias, a rank-8 profile and a genre-like factor that gender and age tilt. A rating is
    mean + biases + taste . profile + side-feature effect + Gaussian noise, rounded and clipped to 1..5. Active users
    and popular (Zipf-like) movies get more ratings; a (user, movie) pair is rated at most once. One generation per
    argument tuple is kept in memory, so both splits come from it; `test` is a fixed-seed random
    `test_fraction` of the ratings.

    Args:
        split: 'train' or 'test'.
        input_context: this pipeline's place; each pipeline keeps every n-th rating of the split.
        num_users: user ids are 1..num_users (`VOCABULARY` size num_users + 1).
        num_movies: movie ids are 1..num_movies.
        num_ratings: ratings in both splits together, at most num_users x num_movies.
        test_fraction: the share of ratings in `test`, in (0, 1).
        seed: the generation's seed; the same seed gives the same ratings and split everywhere.

    Raises:
        ValueError: an unknown split, `test_fraction` outside (0, 1), or sizes that are not positive or do not fit.
    """
    _check_common("movielens_synthetic", split, test_fraction)
    _check_sizes(num_users, num_movies, num_ratings, seed)
    ratings = _synthetic_ratings(num_users, num_movies, num_ratings, seed)
    test = _synthetic_test_mask(num_ratings, test_fraction, seed)
    keep = test if split == "test" else ~test
    user = ratings["user_id"][keep]
    features = {
        "user_id": user,
        "movie_id": ratings["movie_id"][keep],
        # Side features belong to the user: looked up from the per-user tables (index 0 unused).
        "user_gender": ratings["gender_of_user"][user],
        "bucketized_user_age": ratings["age_of_user"][user],
        "user_occupation_label": ratings["occupation_of_user"][user],
    }
    dataset = tf.data.Dataset.from_tensor_slices((features, ratings["rating"][keep]))
    return shard(dataset, input_context)


def count_synthetic(
    split: str = "train",
    num_users: int = 943,
    num_movies: int = 1682,
    num_ratings: int = 100_000,
    test_fraction: float = 0.2,
    seed: int = 0,
    **_,
) -> int:
    """Examples in a split of `movielens_synthetic`, from its arguments alone (nothing generated)."""
    _check_common("movielens_synthetic", split, test_fraction)
    _check_sizes(num_users, num_movies, num_ratings, seed)
    num_test = _num_test(num_ratings, test_fraction)
    return num_test if split == "test" else num_ratings - num_test


def _check_sizes(num_users: int, num_movies: int, num_ratings: int, seed: int) -> None:
    examples = {"num_users": 943, "num_movies": 1682, "num_ratings": 100_000}
    low = {"num_users": 1, "num_movies": 1, "num_ratings": 2}
    for name, value in (
        ("num_users", num_users),
        ("num_movies", num_movies),
        ("num_ratings", num_ratings),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(
                f"movielens_synthetic: {name} must be an integer; received {value!r} ({type(value).__name__}). "
                f"Fix: e.g. {name}: {examples[name]}."
            )
        if value < low[name]:
            why = " (one rating for each split)" if name == "num_ratings" else ""
            raise ValueError(
                f"movielens_synthetic: {name} must be at least {low[name]}{why}; received {name}={value}. "
                f"Fix: e.g. {name}: {examples[name]}."
            )
    pairs = num_users * num_movies
    if num_ratings > pairs:
        raise ValueError(
            f"movielens_synthetic: num_ratings={num_ratings} is more than the {pairs} (user, movie) pairs of "
            f"num_users={num_users} x num_movies={num_movies}, and each pair is rated at most once. Fix: lower "
            "num_ratings or raise num_users/num_movies."
        )
    if pairs > _MAX_SYNTHETIC_PAIRS:
        raise ValueError(
            f"movielens_synthetic: num_users={num_users} x num_movies={num_movies} = {pairs:,} pairs; at most "
            f"{_MAX_SYNTHETIC_PAIRS:,} are supported (the generator samples over all pairs in memory). Fix: lower "
            "num_users or num_movies (1m-ratings' size, 6040 x 3952, fits)."
        )
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(
            f"movielens_synthetic: seed must be a non-negative integer; received seed={seed!r}. Fix: e.g. seed: 0."
        )


def _num_test(num_ratings: int, test_fraction: float) -> int:
    # Both splits keep at least one rating, so a small generation never gives an empty split.
    return min(max(int(round(test_fraction * num_ratings)), 1), num_ratings - 1)


@functools.lru_cache(maxsize=8)
def _synthetic_test_mask(num_ratings: int, test_fraction: float, seed: int) -> np.ndarray:
    """The held-out ratings: the first `test_fraction` of a fixed permutation, so test sets nest as it grows."""
    order = np.random.default_rng([seed, 1]).permutation(num_ratings)
    test = np.zeros(num_ratings, dtype=bool)
    test[order[: _num_test(num_ratings, test_fraction)]] = True
    test.setflags(write=False)
    return test


@functools.lru_cache(maxsize=4)
def _synthetic_ratings(num_users: int, num_movies: int, num_ratings: int, seed: int) -> dict:
    """One generation (see `movielens_synthetic`): per-rating ids and ratings, per-user side features. Cached, so
    the arrays are read-only."""
    rng = np.random.default_rng(seed)
    gender = (rng.random(num_users) < _MALE_SHARE).astype(np.int32)
    age = rng.choice(len(AGE_BUCKETS), size=num_users, p=_normalized(_AGE_COUNTS)).astype(np.int32)
    occupation = rng.choice(
        NUM_OCCUPATIONS, size=num_users, p=_normalized(_OCCUPATION_COUNTS)
    ).astype(np.int32)

    # Who rates what: weighted sampling without replacement over all (user, movie) pairs (Gumbel top-k), with
    # pair weight = user activity x movie popularity.
    activity = rng.lognormal(0.0, _ACTIVITY_SIGMA, num_users)
    popularity = (np.arange(num_movies) + _POPULARITY_OFFSET) ** -1.0
    popularity = popularity[rng.permutation(num_movies)]  # popular films anywhere in the id range
    log_weight = np.log(activity / activity.sum())[:, None] + np.log(popularity / popularity.sum())
    keys = log_weight.astype(np.float32) + rng.gumbel(size=log_weight.shape).astype(np.float32)
    chosen = np.argpartition(keys.ravel(), -num_ratings)[-num_ratings:]
    chosen = chosen[rng.permutation(num_ratings)]  # no order a small shuffle buffer could not break
    user, movie = np.divmod(chosen, num_movies)

    user_bias = rng.normal(0.0, _USER_BIAS_STD, num_users)
    log_popularity = np.log(popularity)
    log_popularity = (log_popularity - log_popularity.mean()) / max(log_popularity.std(), 1e-12)
    movie_bias = _MOVIE_BIAS_STD * (
        np.sqrt(1 - _POPULARITY_BIAS**2) * rng.normal(0.0, 1.0, num_movies)
        + _POPULARITY_BIAS * log_popularity
    )
    taste = rng.normal(0.0, _FACTOR_STD, (num_users, _RANK))
    profile = rng.normal(0.0, _FACTOR_STD, (num_movies, _RANK))
    genre = rng.normal(0.0, 1.0, num_movies)
    tilt = _SIDE_EFFECT * ((2 * gender - 1) * 0.5 + (age - 2.5) / 3.0)
    signal = (
        _GLOBAL_MEAN
        + user_bias[user]
        + movie_bias[movie]
        + np.einsum("ij,ij->i", taste[user], profile[movie])
        + tilt[user] * genre[movie]
    )
    noisy = signal + rng.normal(0.0, _NOISE_STD, num_ratings)
    result = {
        "user_id": (user + 1).astype(np.int32),
        "movie_id": (movie + 1).astype(np.int32),
        "rating": np.clip(np.rint(noisy), 1, 5).astype(np.float32),
        "signal": signal.astype(
            np.float32
        ),  # the noise-free rating, for measuring the best possible model
        # Per-user tables indexed by user id (row 0 unused: ids are 1-based).
        "gender_of_user": np.concatenate([[0], gender]).astype(np.int32),
        "age_of_user": np.concatenate([[0], age]).astype(np.int32),
        "occupation_of_user": np.concatenate([[0], occupation]).astype(np.int32),
    }
    for array in result.values():
        array.setflags(write=False)
    return result


def _normalized(counts) -> np.ndarray:
    weights = np.asarray(counts, dtype=np.float64)
    return weights / weights.sum()
