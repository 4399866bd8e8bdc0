"""Recommenders on keras-rs `DistributedEmbedding`: a DCN-v2 ranking model over categorical features.

Plain keyword arguments in, an uncompiled `keras.Model` out, like every builder here. The embedding tables live in
one `keras_rs.layers.DistributedEmbedding` layer (keras-rs 0.4), which places each table by its `placement`:

* on a TPU with SparseCore (or TensorFlow's TPU embedding API), built under `TPUStrategy` on the tensorflow engine
  or with `jax-tpu-embedding` installed on the jax engine, `auto` tables go to SparseCore, sharded over the chips,
  and train with their own keras-rs optimizer (Adam at keras-rs' default 0.001 here), not `train.optimizer`;
* everywhere else (CPU, GPU, TPUs without SparseCore, and `placement: default_device`) each table is a plain Keras
  embedding that `train.optimizer` trains with the dense layers, replicated, or split by rows over the jax engine's
  `model` mesh axis (the default layout in `tpukit.models.layouts`).

Only the second path runs on a machine without a TPU. `tpukit.check` says which tables a given TPU would place on
SparseCore, and why.

    model = dcn_ranking(tables={"user_id": {"vocabulary_size": 944, "embedding_dim": 32},
                                "movie_id": {"vocabulary_size": 1683, "embedding_dim": 32}})
    model({"user_id": ids, "movie_id": ids})   # (batch, 1) float32 scores: a rating, or a logit for a click

DCN-v2: Wang et al., "DCN V2: Improved Deep & Cross Network and Practical Lessons for Web-scale Learning to Rank
Systems" (WWW 2021), the stacked form (cross layers, then the deep layers), as keras-rs' DCN example builds it.
"""

from __future__ import annotations

import logging
import math
import reprlib
from collections.abc import Mapping
from typing import Any

import keras
import keras_rs  # also registers its layers, so a saved recommender loads wherever tpukit.models is imported
from keras import layers

logger = logging.getLogger("tpukit")

PLACEMENTS = ("auto", "sparsecore", "default_device")
# The keys a table takes; the two sizes are required.
TABLE_KEYS = ("vocabulary_size", "embedding_dim", "placement")


def check_tables(tables: Any, key: str = "tables") -> None:
    """Raises ValueError naming the table, the key, the value received and the fix, for any table the model cannot
    build. Pure: the recipe checks a recommender's tables with it before anything is built."""
    example = f"{key}: {{movie_id: {{vocabulary_size: 1683, embedding_dim: 32}}}}"
    if not isinstance(tables, Mapping) or not tables:
        raise ValueError(
            f"{key} must map each input feature's name to its table; received {reprlib.repr(tables)}. Fix: e.g. {example}."
        )
    for name, table in tables.items():
        where = f"{key}.{name}"
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(
                f"{key} has a table named {reprlib.repr(name)}: names are the model's input names, so they must be "
                "identifiers (letters, digits, _). Fix: name the table after its feature, e.g. movie_id."
            )
        if not isinstance(table, Mapping):
            raise ValueError(
                f"{where} must be a mapping with vocabulary_size and embedding_dim; received {reprlib.repr(table)}. "
                f"Fix: e.g. {name}: {{vocabulary_size: 1683, embedding_dim: 32}}."
            )
        unknown = sorted(set(table) - set(TABLE_KEYS))
        if unknown:
            raise ValueError(
                f"{where} has no key {reprlib.repr(unknown[0])}; a table takes {', '.join(TABLE_KEYS)}. Fix: remove it."
            )
        for size in ("vocabulary_size", "embedding_dim"):
            value = table.get(size)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"{where}.{size} must be a positive integer; received {reprlib.repr(value)}. Fix: e.g. "
                    f"{size}: {1683 if size == 'vocabulary_size' else 32} (vocabulary_size: the largest id + 1)."
                )
        placement = table.get("placement", "auto")
        if placement not in PLACEMENTS:
            raise ValueError(
                f"{where}.placement must be one of {', '.join(PLACEMENTS)}; received {reprlib.repr(placement)}. Fix: auto "
                "(SparseCore where the TPU has it)."
            )


def padded_vocabulary(vocabulary_size: int, multiple: int) -> int:
    """`vocabulary_size` rounded up to a multiple of `multiple` (rows a split over `multiple` devices needs)."""
    return math.ceil(vocabulary_size / multiple) * multiple


def _check_dcn_arguments(
    tables: Any,
    cross_layers: Any,
    projection_dim: Any,
    deep_units: Any,
    dropout: Any,
    vocabulary_multiple: Any,
) -> None:
    """Raises ValueError naming the argument, the value received and the fix, before any layer is built."""
    check_tables(tables)
    for name, value, low in (
        ("cross_layers", cross_layers, 0),
        ("vocabulary_multiple", vocabulary_multiple, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(
                f"dcn_ranking: {name} must be an integer >= {low}; received {name}={value!r}. Fix: e.g. {name}=2."
            )
    if projection_dim is not None and projection_dim < 1:
        raise ValueError(
            f"dcn_ranking: projection_dim must be positive or None (full rank); received {projection_dim!r}."
        )
    if any(units < 1 for units in deep_units):
        raise ValueError(f"dcn_ranking: deep_units must be positive; received {list(deep_units)}.")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dcn_ranking: dropout must be in [0, 1); received dropout={dropout!r}.")


def _feature_config(name: str, table: Mapping[str, Any], vocabulary_multiple: int):
    """The keras-rs FeatureConfig of one table, its rows padded to `vocabulary_multiple`."""
    rows = padded_vocabulary(table["vocabulary_size"], vocabulary_multiple)
    if rows != table["vocabulary_size"]:
        logger.info(
            "tpukit: table %s padded from %d to %d rows to split over %d devices (the extra rows are never "
            "looked up)",
            name,
            table["vocabulary_size"],
            rows,
            vocabulary_multiple,
        )
    config = keras_rs.layers.TableConfig(
        name=name,
        vocabulary_size=rows,
        embedding_dim=table["embedding_dim"],
        # A fresh initializer, drawn from Keras' seed (keras.utils.set_random_seed): keras-rs' default is
        # one instance made at import, whose seed ignores set_random_seed.
        initializer=keras.initializers.VarianceScaling(
            mode="fan_out", distribution="truncated_normal"
        ),
        placement=table.get("placement", "auto"),
    )
    return keras_rs.layers.FeatureConfig(
        name=name,
        table=config,
        input_shape=(None,),
        output_shape=(None, table["embedding_dim"]),
    )


def _distributed_embedding(features: dict[str, Any], tables: dict[str, Any]):
    """The `DistributedEmbedding` layer over `features`; a table asked onto SparseCore where none can take it is a
    ValueError that names it and the fix (keras-rs' own error otherwise)."""
    try:
        return keras_rs.layers.DistributedEmbedding(features, name="embedding")
    except (ValueError, NotImplementedError, ImportError) as error:
        asked = [n for n in sorted(tables) if tables[n].get("placement") == "sparsecore"]
        if not asked:
            raise
        raise ValueError(
            f"tables.{asked[0]}.placement=sparsecore, but no SparseCore can take it here (keras-rs: {error}). "
            f"Fix: --set model.tables.{asked[0]}.placement=auto (SparseCore where the TPU has it, else HBM), or "
            "train on a TPU with SparseCore under the tensorflow engine (tpukit.check --tpu-type says which)."
        ) from None


def dcn_ranking(
    tables: dict[str, Any],
    cross_layers: int = 2,
    projection_dim: int | None = None,
    deep_units: tuple[int, ...] = (256, 128),
    dropout: float = 0.0,
    vocabulary_multiple: int = 1,
) -> keras.Model:
    """A DCN-v2 ranking model: one embedding per categorical input, `cross_layers` feature crosses, `deep_units`
    ReLU layers and one float32 score.

    Args:
        tables: {input name: {vocabulary_size, embedding_dim, placement}}; each input is a scalar int32 id in
            [0, vocabulary_size). `placement`: auto (SparseCore where present), sparsecore, default_device.
        cross_layers: DCN-v2 cross layers x_{l+1} = x_0 * (W x_l + b) + x_l over the concatenated embeddings.
        projection_dim: low-rank cross layers (W = U V with this inner size); None: full rank.
        deep_units: widths of the ReLU layers after the crosses.
        vocabulary_multiple: pad every table's rows to a multiple of this, so a split over that many devices
            divides; padded rows are never looked up. tpukit sets it to the jax engine's `runtime.mesh.model`.
    """
    _check_dcn_arguments(
        tables, cross_layers, projection_dim, deep_units, dropout, vocabulary_multiple
    )
    names = sorted(tables)

    # === Layers ===
    features = {name: _feature_config(name, tables[name], vocabulary_multiple) for name in names}
    inputs = {name: keras.Input(shape=(), dtype="int32", name=name) for name in names}
    embedding = _distributed_embedding(features, tables)

    # === Functional model ===
    embedded = embedding(inputs)
    x0 = layers.Concatenate(name="embeddings")([embedded[name] for name in names])
    x = x0
    for i in range(cross_layers):
        x = keras_rs.layers.FeatureCross(projection_dim=projection_dim, name=f"cross{i}")(x0, x)
    for i, units in enumerate(deep_units):
        x = layers.Dense(units, activation="relu", name=f"deep{i}")(x)
        if dropout:
            x = layers.Dropout(dropout, name=f"dropout{i}")(x)
    score = layers.Dense(1, dtype="float32", name="score")(x)
    # === Config ===
    # A plain functional model: its config is the graph above (layer names and arguments), so a `.keras` file
    # loads with `keras.saving.load_model` and no custom class.
    return keras.Model(inputs, score, name="dcn_ranking")


# The recipe checks these arguments before anything is built (tpukit.recipe.schema reads `check_arguments`).
dcn_ranking.check_arguments = lambda kwargs: (
    check_tables(kwargs["tables"]) if "tables" in kwargs else None
)
