"""The task: what to train, from a recipe. The model (built and compiled with its loss, optimizer and exact
metrics), the input pipelines, and the data's size. Engine-neutral: it never sees a strategy or a device; the
engine calls it inside its own distribution scope.

    train_fn, eval_fn = tpukit.task.input_fns(recipe, eval_examples)     # tf.data pipelines per InputContext
    with strategy.scope():
        model = tpukit.task.build_model(recipe, total_steps, jit_compile=False, steps_per_execution=1)
"""

from __future__ import annotations

import inspect
import logging

from tpukit.environment import backend as _backend

_backend.use_default()  # before this package's modules import Keras

import keras
import tensorflow as tf

from tpukit import data
from tpukit.data import EXAMPLE_COUNTS, SOURCES, run_args
from tpukit.data.pipeline import with_class_weights
from tpukit.models import MODELS
from tpukit.planner import DataFacts, eval_batch_size
from tpukit.recipe import Recipe, RecipeError
from tpukit.task import compiling, finetune
from tpukit.task.baseline import baseline as score_baseline  # noqa: F401 - for the engines
from tpukit.task.compiling import ModelSpec, compile_model, fit_to_data, label_facts
from tpukit.task.optim import build_optimizer
from tpukit.task.targets import CUSTOM

logger = logging.getLogger("tpukit")


def load_model(path: str, **kwargs):
    """`keras.saving.load_model(path)` with tpukit's serializable layers, losses and schedules registered, so a
    `model.keras` or `best.keras` that tpukit wrote loads in any program (`import tpukit` alone registers nothing:
    it imports no Keras). Importing `tpukit.task` registers them (its losses, optim and tpukit.models)."""
    return keras.saving.load_model(path, **kwargs)


def count_examples(recipe: Recipe, split: str) -> int:
    """Examples in a split of the recipe's source (its fast counter, else its cardinality, else one pass)."""
    skip = {"skip_corrupt": True} if recipe.data.skip_corrupt else {}
    counter = EXAMPLE_COUNTS.get(
        recipe.data.source
    )  # fast path: metadata or raw records, nothing decoded
    count = counter(split=split, **skip, **recipe.data.options) if counter else None
    if count is not None:
        return count
    source = SOURCES[recipe.data.source]
    skip = {
        k: v
        for k, v in run_args(source, False, False, recipe.data.skip_corrupt).items()
        if k == "skip_corrupt"
    }
    dataset = source(split=split, input_context=None, **skip, **recipe.data.options)
    if not isinstance(dataset, tf.data.Dataset):
        raise RecipeError(
            f"{recipe.path}: data.source={recipe.data.source!r} returned a {type(dataset).__name__} for split "
            f"{split!r}, not a tf.data.Dataset. Fix: return an unbatched tf.data.Dataset of (features, label) or "
            "(features, label, sample_weight), e.g. tf.data.Dataset.from_tensor_slices((x, y)) (tpukit batches it)."
        )
    count = int(dataset.cardinality())
    if count < 0:  # unknown or infinite: count once
        count = int(dataset.reduce(tf.constant(0, tf.int64), lambda n, *_: n + 1))
    return count


def _scan_corrupt(recipe: Recipe, evaluating: bool) -> dict:
    """With data.skip_corrupt: one pass per split that counts and names the records the pipeline will drop."""
    if not recipe.data.skip_corrupt:
        return {}
    reports = {}
    for split in filter(
        None, (recipe.data.train_split, recipe.data.eval_split if evaluating else None)
    ):
        report = data.scan_corrupt(recipe.data.source, split, recipe.data.options)
        if report is not None:
            (logger.warning if report.skipped else logger.info)("tpukit: %s", report.summary())
            reports[split] = report
    return reports


def count_data(recipe: Recipe, evaluating: bool) -> DataFacts:
    """What the planner needs to know of the data: examples per split and the corrupt records the pipeline will
    drop. A source's ValueError becomes a RecipeError."""
    try:
        train_examples = count_examples(recipe, recipe.data.train_split)
        eval_examples = count_examples(recipe, recipe.data.eval_split) if evaluating else 0
        corrupt = _scan_corrupt(recipe, evaluating)
    except RecipeError:
        raise
    except (
        ValueError
    ) as error:  # the source rejects a split or an argument, or a record is corrupt (named)
        raise RecipeError(f"{recipe.path}: data: {error}") from None
    try:
        labels = label_facts(recipe, evaluating)
    except tf.errors.OpError as error:  # a corrupt record among the labels read
        splits = [
            s
            for s in (recipe.data.train_split, recipe.data.eval_split if evaluating else None)
            if s
        ]
        explained = data.explain_data_error(error, recipe.data.source, splits, recipe.data.options)
        if explained is None:
            raise
        raise RecipeError(f"{recipe.path}: data: {explained}") from None
    except ValueError as error:
        # The source refuses its arguments when first read here (no file matches its pattern).
        raise RecipeError(f"{recipe.path}: data: {error}") from None
    return DataFacts(train_examples, eval_examples, corrupt, labels)


def input_fns(
    recipe: Recipe,
    eval_examples: int,
    steps_per_epoch: int | None = None,
    spec: ModelSpec | None = None,
):
    """`(train_fn(input_context, skip_steps), eval_fn(input_context))`: the recipe's tf.data pipelines. With the
    model's `spec` (`spec_of(model)`), a dict of features is cut to the model's inputs and the eval weights take
    the shape of each output's loss."""
    source = data.SOURCES[recipe.data.source]
    keys = spec.feature_keys if spec is not None else None
    weight_ranks = spec.weight_ranks if spec is not None else None
    expand = spec.expand_labels if spec is not None else None
    one_hot = _class_weight_reading(spec)
    config = recipe.data
    # Float features travel in the compute dtype (bfloat16 under mixed_bfloat16: half the infeed bytes).
    feature_dtype = (
        keras.mixed_precision.global_policy().compute_dtype
        if config.cast_to_compute_dtype
        else None
    )
    pipeline_knobs = dict(
        feature_dtype=feature_dtype,
        prefetch_batches=config.prefetch_batches,
        private_threadpool_size=config.private_threadpool_size,
    )

    def examples_and_cache(split, input_context, training):
        # Sources that augment at random cache before augmenting, so they take `cache` themselves.
        reserved = data.run_args(
            source, training=training, cache=config.cache, skip_corrupt=config.skip_corrupt
        )
        examples = source(split=split, input_context=input_context, **reserved, **config.options)
        if keys is not None and set(examples.element_spec[0]) != set(keys):
            # Keras flattens a dict of features in key order, so a feature the model does not take would shift
            # the others: only the model's inputs travel (a sample weight, if any, travels too).
            examples = examples.map(lambda features, *rest: ({k: features[k] for k in keys}, *rest))
        if expand is not None:
            examples = examples.map(
                lambda features, label, *rest: (
                    features,
                    tf.nest.map_structure(lambda t, e: t[..., None] if e else t, label, expand),
                    *rest,
                )
            )
        if training and recipe.train.class_weight:  # as Keras: the training data only
            examples = with_class_weights(examples, recipe.train.class_weight, one_hot)
        return examples, config.cache and "cache" not in reserved

    def train_fn(input_context, skip_steps=0):
        """Training batches positioned after `skip_steps` steps of data, each epoch in its own seeded order."""
        examples, cache = examples_and_cache(config.train_split, input_context, training=True)
        return data.training_batches(
            examples,
            config.global_batch_size,
            input_context,
            shuffle_buffer=config.shuffle_buffer,
            seed=recipe.train.seed,
            cache=cache,
            deterministic=config.deterministic,
            skip_steps=skip_steps,
            steps_per_epoch=steps_per_epoch,
            **pipeline_knobs,
        )

    def eval_fn(input_context):
        """One finite pass; the last batch is completed with zero-weight examples (static shapes)."""
        examples, cache = examples_and_cache(config.eval_split, input_context, training=False)
        return data.eval_batches(
            examples,
            eval_examples,
            eval_batch_size(recipe),
            input_context,
            cache=cache,
            weight_ranks=weight_ranks,
            **pipeline_knobs,
        )

    return train_fn, eval_fn


def _class_weight_reading(spec: ModelSpec | None) -> bool | None:
    """How `train.class_weight` reads the one output's labels (`fit_to_data` checked there is one): one-hot by
    argmax for classification on one-hot labels, as Keras reads them (None) for a loss tpukit does not know, else
    class ids."""
    if spec is None or not spec.targets:
        return False
    target = spec.targets[0]
    if target.task == CUSTOM:
        return None
    return target.task == "classification" and not target.sparse


def spec_of(model) -> ModelSpec | None:
    """How the data feeds a model `build_model` made (None for any other model)."""
    return getattr(model, "_tpukit_spec", None)


def _optimizer(model, recipe: Recipe, total_steps: int):
    """tpukit's optimizer from `train`, or the one the builder compiled the model with (`train.learning_rate:
    null`), or Adam at Keras' default rate for an uncompiled model with no learning rate."""
    train = recipe.train
    if train.learning_rate is not None:
        return build_optimizer(train, total_steps, global_batch_size=recipe.data.global_batch_size)
    own = (
        model.optimizer if model.compiled else None
    )  # the schema refused optimizer settings with null
    if own is not None:
        logger.info("tpukit: training with the model's own optimizer (%s)", type(own).__name__)
        return own
    logger.info(
        "tpukit: train.learning_rate is null and the model brought no optimizer: Adam at 0.001"
    )
    return keras.optimizers.Adam()


def build_model(
    recipe: Recipe,
    total_steps: int,
    jit_compile: bool,
    steps_per_execution: int,
    resuming: bool = False,
    labels=None,
):
    """The recipe's model, built and compiled in the caller's distribution scope and dtype policy (the engine's).

    The model is checked against the data (`compiling.fit_to_data`: inputs by name and shape, outputs against the
    labels, the label range) and compiled for its targets; `spec_of(model)` tells the pipelines how to feed it.
    `resuming`: a checkpoint will be restored into it, so `model.init_weights` is not loaded. `labels`: the
    `LabelFacts` of `label_facts` (read here when not given).
    """
    model = MODELS[recipe.model.name](**builder_kwargs(recipe))
    if not isinstance(model, keras.Model):
        raise RecipeError(
            f"{recipe.path}: model.name={recipe.model.name!r} returned a {type(model).__name__}, not a "
            "keras.Model. Fix: make the builder return the model (tpukit compiles it)."
        )
    if labels is None:
        labels = label_facts(recipe, evaluating=recipe.data.eval_split is not None)
    own = compiling.compiled_config(model)
    optimizer = _optimizer(model, recipe, total_steps)
    model = _plain(model)
    spec = fit_to_data(model, recipe, labels, own)
    finetune.prepare(model, recipe.model, resuming, recipe.path)
    compile_model(model, recipe, spec, optimizer, jit_compile, steps_per_execution, own)
    model._tpukit_spec = spec
    return model


def builder_kwargs(recipe: Recipe) -> dict:
    """The builder's arguments: the recipe's `model` keys, plus `vocabulary_multiple` (a builder that pads its
    tables takes it) set to the jax engine's `runtime.mesh.model` unless the recipe sets it: a table's rows then
    split evenly over the model axis (`tpukit.models.layouts` splits tables by rows)."""
    kwargs = dict(recipe.model.kwargs)
    builder = MODELS[recipe.model.name]
    if recipe.runtime.engine != "jax":
        return kwargs
    if (
        "vocabulary_multiple" not in kwargs
        and "vocabulary_multiple" in inspect.signature(builder).parameters
    ):
        kwargs["vocabulary_multiple"] = recipe.runtime.mesh["model"]
    tables = kwargs.get("tables")
    if isinstance(tables, dict) and recipe.model.name == "dcn_ranking":
        # keras-rs' SparseCore path under JAX needs DistributedEmbedding.preprocess on the host, outside the
        # compiled step (it raises under jit); the jax engine does not run it, so its tables stay on the default
        # device, split by rows over the model axis. (`auto` only differs on a TPU with SparseCore.)
        refused = [name for name, t in tables.items() if t.get("placement") == "sparsecore"]
        if refused:
            raise RecipeError(
                f"{recipe.path}: model.tables.{refused[0]}.placement=sparsecore, but the jax engine does not feed "
                "SparseCore yet (keras-rs needs its inputs preprocessed outside the compiled step). Fix: --set "
                f"model.tables.{refused[0]}.placement=auto (the table stays in HBM, split by rows over "
                "runtime.mesh.model), or --set runtime.engine=tensorflow on a TPU with SparseCore."
            )
        kwargs["tables"] = {
            name: {**table, "placement": "default_device"} for name, table in tables.items()
        }
    return kwargs


class _Original:
    """The model a plain one was made from (`_plain`), held outside Keras' tracking: a layer set as an attribute of
    a model would become one of its sublayers (its variables twice in checkpoints)."""

    def __init__(self, model):
        self.model = model


def _plain(model):
    """A functional model whose class overrides `fit` or `compile` (a KerasHub task: its `fit` does not take a
    distributed dataset, its `compile` adds unweighted metrics back) as a plain `keras.Model` over the same layers
    and weights; any other model as it is. The plain model keeps the original as `_tpukit_original`: the export
    saves that (`tpukit.engines.keras.export.exported_model`), so `model.keras` loads as the task it was."""
    cls = type(model)
    overrides = [
        name for name in ("fit", "compile") if getattr(cls, name) is not getattr(keras.Model, name)
    ]
    if not overrides or not getattr(model, "inputs", None) or compiling.custom_step(model):
        return model  # a model with its own train_step/test_step keeps them (and its fit/compile)
    logger.info(
        "tpukit: %s overrides %s: trained as a plain keras.Model over its layers (the same weights)",
        cls.__name__,
        " and ".join(overrides),
    )
    plain = keras.Model(model.input, model.output, name=model.name)
    plain._tpukit_original = _Original(model)
    return plain
