"""The model against its data, and compiled for it: inputs matched by name, a loss and exact metrics per output.

    spec = fit_to_data(model, recipe, labels)      # RecipeError before anything is written
    compile_model(model, recipe, spec, optimizer, jit_compile, steps_per_execution)

The pairing follows Keras: a dict of features feeds the inputs of the same names (extra features are left out of
the pipeline, which Keras itself would refuse), a tuple feeds them in order. The targets (`tpukit.task.targets`)
come from the model's outputs and a sample of the labels, or from `train.task`.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tpukit import data
from tpukit.data import SOURCES
from tpukit.recipe import Recipe, RecipeError
from tpukit.task.losses import SparseCategoricalCrossentropyWithLabelSmoothing, WeightedLoss
from tpukit.task.targets import (
    CUSTOM,
    LabelFacts,
    OutputFacts,
    Target,
    TargetError,
    decide,
    loss_task,
)

logger = logging.getLogger("tpukit")

# Labels read per split to infer the task and check the label range before anything is written. Arrays given to
# `tpukit.fit` are read whole; a source's labels beyond this sample are checked by the first step that meets them.
LABEL_SAMPLE = 4096


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """How the data feeds a built model: the feature keys it takes (None: the features as they are), its targets,
    and the weight of each output's exact loss metric in the total (metric name -> weight)."""

    feature_keys: tuple[str, ...] | None
    targets: tuple[Target, ...]
    exact_loss: dict[str, float]
    custom_step: bool = False
    labels_keyed: bool = False  # the labels come as a dict by output name
    outputs_keyed: bool = False  # the model returns a dict
    # What the model is fed: `tf.TensorSpec`s with an open batch dimension (a subclassed model's serving signature).
    features: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def several(self) -> bool:
        """Several outputs: Keras names each output's metrics `<output>_<metric>` (one output keeps plain names,
        even keyed by name)."""
        return len(self.targets) > 1

    @property
    def expand_labels(self):
        """Per label (a dict or tuple like the labels; None if none is), whether it gets a trailing axis of 1 to
        take the output's shape: Keras' metric functions (unlike its losses) do not squeeze or expand."""
        if not any(t.expand_label for t in self.targets):
            return None
        if self.labels_keyed:
            return {t.output: t.expand_label for t in self.targets}
        flags = tuple(t.expand_label for t in self.targets)
        return flags if len(flags) > 1 else flags[0]

    @property
    def weight_ranks(self):
        """The eval weights' rank per label (a dict or tuple like the labels), for `data.eval_batches`."""
        if not self.targets:
            return None
        if self.labels_keyed:
            return {t.output: t.weight_rank for t in self.targets}
        ranks = tuple(t.weight_rank for t in self.targets)
        return ranks if len(ranks) > 1 else ranks[0]


# -- Facts ----------------------------------------------------------------------------------------------------------


def _source_examples(recipe: Recipe, split: str) -> tf.data.Dataset:
    source = SOURCES[recipe.data.source]
    reserved = data.run_args(source, False, False, recipe.data.skip_corrupt)
    return source(split=split, input_context=None, **reserved, **recipe.data.options)


def _label_values(recipe: Recipe, split: str):
    """The labels of up to LABEL_SAMPLE examples of a split (all of them for `tpukit.fit`'s arrays), as NumPy."""
    source = SOURCES[recipe.data.source]
    given = getattr(source, "tpukit_labels", None)
    if given is not None:
        return given(split)
    labels = _source_examples(recipe, split).map(lambda *example: example[1])
    batch = next(iter(labels.take(LABEL_SAMPLE).batch(LABEL_SAMPLE)), None)
    return None if batch is None else tf.nest.map_structure(lambda t: t.numpy(), batch)


def _facts(values: np.ndarray) -> LabelFacts:
    values = np.asarray(values)
    numbers = values.astype(np.float64)
    shape = tuple(values.shape[1:])
    if numbers.size == 0:
        return LabelFacts(shape, values.dtype.name)
    rows = numbers.sum(axis=-1) if numbers.ndim >= 2 else None
    return LabelFacts(
        shape=shape,
        dtype=values.dtype.name,
        sampled=len(values),
        low=float(numbers.min()),
        high=float(numbers.max()),
        integral=bool(np.all(numbers == np.round(numbers))),
        binary=bool(np.all((numbers == 0) | (numbers == 1))),
        rows_sum_to_one=rows is not None and bool(np.allclose(rows, 1.0, atol=1e-3)),
    )


def _merged(a: LabelFacts, b: LabelFacts) -> LabelFacts:
    if not b.sampled:
        return a
    if not a.sampled:
        return dataclasses.replace(b, shape=a.shape, dtype=a.dtype)
    return dataclasses.replace(
        a,
        sampled=a.sampled + b.sampled,
        low=min(a.low, b.low),
        high=max(a.high, b.high),
        integral=a.integral and b.integral,
        binary=a.binary and b.binary,
        rows_sum_to_one=a.rows_sum_to_one and b.rows_sum_to_one,
    )


def label_facts(recipe: Recipe, evaluating: bool):
    """`LabelFacts` for the recipe's labels (a dict or tuple of them for several), from the train split and, when
    `evaluating`, the eval split: shapes and dtypes from the data's spec, values from a sample."""
    spec = _source_examples(recipe, recipe.data.train_split).element_spec
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise RecipeError(
            f"{recipe.path}: data.source={recipe.data.source!r} gives elements of {spec}; tpukit trains on "
            "(features, labels) or (features, labels, sample_weights) tuples, as keras.Model.fit takes a dataset. "
            "Fix: make the source return a dataset of such tuples."
        )
    splits = [recipe.data.train_split] + ([recipe.data.eval_split] if evaluating else [])
    merged = None
    for split in splits:
        values = _label_values(recipe, split)
        if values is None:
            continue
        facts = tf.nest.map_structure(_facts, values)
        merged = facts if merged is None else tf.nest.map_structure(_merged, merged, facts)
    if merged is None:
        merged = tf.nest.map_structure(lambda s: LabelFacts(tuple(s.shape), s.dtype.name), spec[1])
    return merged


def _activation(layer) -> str | None:
    """ "softmax", "sigmoid", "linear", ... of the layer or operation that made an output; None if unknown."""
    if layer is None:
        return None
    if isinstance(layer, keras.layers.Softmax) or type(layer).__name__ in ("Softmax", "LogSoftmax"):
        return "softmax" if type(layer).__name__ != "LogSoftmax" else "log_softmax"
    if type(layer).__name__ == "Sigmoid":  # keras.ops.sigmoid in a functional model
        return "sigmoid"
    function = getattr(layer, "activation", None)
    return getattr(function, "__name__", None) if function is not None else None


def _output_layers(model) -> dict[int, Any]:
    """Output index -> the layer or operation (`keras.ops.softmax` in a functional model) that produced it
    (functional and Sequential models; {} for subclassed ones)."""
    outputs = getattr(model, "outputs", None) or []
    found = {}
    for layer in getattr(model, "operations", None) or getattr(model, "layers", []):
        try:
            produced = layer.output
        except (AttributeError, ValueError):  # a layer used more than once, or never called
            continue
        for index, tensor in enumerate(outputs):
            if produced is tensor:
                found[index] = layer
    return found


def _symbolic(spec) -> Any:
    return keras.KerasTensor((None, *spec.shape[1:]), dtype=spec.dtype.name)


def output_facts(model, features_spec) -> tuple[list[OutputFacts], bool]:
    """The model's outputs (names, shapes, activations) and whether they come as a dict, from a symbolic call on
    the features' spec (which also builds a subclassed model's weights, no device work)."""
    outputs = model(tf.nest.map_structure(_symbolic, features_spec), training=False)
    keyed = isinstance(outputs, Mapping)
    if keyed:
        names, tensors = list(outputs), list(outputs.values())
    else:
        tensors = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        declared = list(getattr(model, "output_names", None) or [])
        names = (
            declared
            if len(declared) == len(tensors)
            else (["output"] if len(tensors) == 1 else [f"output_{i}" for i in range(len(tensors))])
        )
    layers = _output_layers(model)
    declared_order = list(getattr(model, "output_names", None) or [])
    facts = []
    for index, (name, tensor) in enumerate(zip(names, tensors, strict=True)):
        # Keras orders a dict-output model's `outputs` as its `output_names`.
        where = declared_order.index(name) if keyed and name in declared_order else index
        facts.append(OutputFacts(name, tuple(tensor.shape[1:]), _activation(layers.get(where))))
    return facts, keyed


# -- Inputs ---------------------------------------------------------------------------------------------------------


def _shape_fits(data_shape: tuple, model_shape: tuple) -> bool:
    return len(data_shape) == len(model_shape) and all(
        m is None or d is None or m == d for d, m in zip(data_shape, model_shape, strict=True)
    )


def _check_inputs(recipe: Recipe, model, features_spec) -> tuple[str, ...] | None:
    """Feature keys the model takes (a dict of features, by input name as Keras matches them); raises a
    RecipeError where the features and the model's declared inputs differ in number, name or shape."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None  # a subclassed model declares no inputs; the symbolic call below checks what it can
    where = f"{recipe.path}: model {recipe.model.name!r}"
    source = f"data.source={recipe.data.source!r}"
    keys = None
    if isinstance(features_spec, Mapping):
        names = [t.name for t in inputs]
        missing = [n for n in names if n not in features_spec]
        if missing:
            raise RecipeError(
                f"{where} takes inputs named {names} but {source} gives features {sorted(features_spec)} (none "
                f"named {missing}). Fix: name each keras.Input(name=...) after a feature, or rename the features."
            )
        keys = tuple(names)
        pairs = [(n, features_spec[n], t) for n, t in zip(names, inputs, strict=True)]
    else:
        specs = tf.nest.flatten(features_spec)
        if len(specs) != len(inputs):
            raise RecipeError(
                f"{where} takes {len(inputs)} input(s) but {source} gives {len(specs)} feature tensor(s). Fix: make "
                "them match (a dict of features keyed by input name, or a tuple in input order)."
            )
        pairs = [(t.name, s, t) for s, t in zip(specs, inputs, strict=True)]
    for name, spec, tensor in pairs:
        data_shape, model_shape = tuple(spec.shape[1:]), tuple(tensor.shape[1:])
        if not _shape_fits(data_shape, model_shape):
            label = f"input {name!r}" if len(pairs) > 1 else "the model"
            raise RecipeError(
                f"{where}: {label} takes examples of shape {list(model_shape)} but {source} gives "
                f"{list(data_shape)}. Fix: set the model's input shape to the data's (e.g. --set "
                f"model.input_shape={list(data_shape)}) or change the data options."
            )
    return keys


def class_count_fix(recipe: Recipe, output: str, has: int, needs: int) -> str:
    """The fix for labels beyond an output's `has` classes: the builder argument whose value is the class count
    (`model.num_classes`, `model.vocab_size`, ...), else the output layer's width."""
    from tpukit.models import MODELS

    try:
        params = inspect.signature(MODELS[recipe.model.name]).parameters
    except (TypeError, ValueError, KeyError):
        params = {}
    for name, p in params.items():
        value = recipe.model.kwargs.get(name, p.default)
        if isinstance(value, int) and not isinstance(value, bool) and value == has:
            return f"set model.{name} to at least {needs} (e.g. --set model.{name}={needs})"
    return f"make output {output!r} {needs} classes wide (its last layer's units)"


def _class_fix(recipe: Recipe):
    return lambda target, needs: class_count_fix(recipe, target.output, target.classes, needs)


def custom_step(model) -> bool:
    cls = type(model)
    return (
        cls.train_step is not keras.Model.train_step or cls.test_step is not keras.Model.test_step
    )


def _id_tables(model) -> dict[str, tuple[int, str]]:
    """{input name: (rows, table name)} for each named input of a functional model that an embedding table looks up
    directly: a Keras `Embedding` on the input, or a keras-rs `DistributedEmbedding` fed the input under the same
    key."""
    inputs = getattr(model, "_inputs_struct", None)
    if not isinstance(inputs, Mapping):
        return {}
    found = {}
    for layer in model.layers:
        try:
            consumed = layer.input
        except (AttributeError, ValueError):  # a layer used more than once, or never called
            continue
        configs = getattr(layer, "_feature_configs", None)
        if type(layer).__name__ == "DistributedEmbedding" and isinstance(configs, Mapping):
            # Its inputs have its feature configs' structure (keras-rs requires it); Keras keeps them flattened.
            flat = keras.tree.flatten(consumed)
            if len(flat) != len(keras.tree.flatten(configs)):
                continue
            fed = keras.tree.pack_sequence_as(configs, flat)
            for name, config in configs.items():
                table = getattr(config, "table", None)
                if table is not None and name in inputs and fed[name] is inputs[name]:
                    found[name] = (int(table.vocabulary_size), table.name)
        elif isinstance(layer, keras.layers.Embedding):
            for name, tensor in inputs.items():
                if consumed is tensor:
                    found[name] = (int(layer.input_dim), layer.name)
    return found


def _check_ids(recipe: Recipe, model) -> None:
    """Refuses ids outside their table, from a sample of each split: past the last row, a lookup fails on
    TensorFlow's CPU kernels but silently reads another row (JAX clamps) or zeros (TPU) elsewhere. Switching a
    recipe to a larger dataset (MovieLens 100K -> 1M) without growing the tables does exactly that."""
    tables = _id_tables(model)
    if not tables:
        return
    splits = [s for s in (recipe.data.train_split, recipe.data.eval_split) if s]
    for split in splits:
        examples = _source_examples(recipe, split)
        if not isinstance(examples.element_spec[0], Mapping):
            return
        ids = examples.map(lambda features, *_: {k: features[k] for k in tables if k in features})
        batch = next(iter(ids.take(LABEL_SAMPLE).batch(LABEL_SAMPLE)), None)
        for name, values in (batch or {}).items():
            rows, table = tables[name]
            low, high = int(tf.reduce_min(values)), int(tf.reduce_max(values))
            if low < 0 or high >= rows:
                bad = high if high >= rows else low
                raise RecipeError(
                    f"{recipe.path}: feature {name!r} of split {split!r} has id {bad} (ids {low}..{high} in the "
                    f"first {int(tf.size(values))} examples), but its embedding table {table!r} has {rows} rows "
                    f"(ids 0..{rows - 1}): past the table a lookup fails here and reads a wrong row or zeros on a "
                    f"TPU or JAX. Fix: a table of at least {max(high + 1, rows)} rows (e.g. --set "
                    f"model.tables.{name}.vocabulary_size={max(high + 1, rows)}), or ids below {rows}."
                )


def fit_to_data(model, recipe: Recipe, labels, own: dict | None = None) -> ModelSpec:
    """Checks the model against the data (inputs by name and shape, outputs against labels and their range) and
    returns how to feed and compile it. Raises RecipeError with the fix; nothing is written."""
    features_spec = _source_examples(recipe, recipe.data.train_split).element_spec[0]
    batched = tf.nest.map_structure(
        lambda s: tf.TensorSpec((None, *s.shape), s.dtype), features_spec
    )
    keys = _check_inputs(recipe, model, batched)
    _check_ids(recipe, model)
    fed = {k: batched[k] for k in keys} if keys is not None else batched
    try:
        outputs, keyed = output_facts(model, fed)
    except (ValueError, TypeError) as error:
        raise RecipeError(
            f"{recipe.path}: model {recipe.model.name!r} cannot take data.source={recipe.data.source!r}'s "
            f"features {tf.nest.map_structure(lambda s: list(s.shape[1:]), fed)}: "
            f"{str(error).strip().splitlines()[0][:300]} Fix: make the model's inputs take the features."
        ) from None
    custom = custom_step(model)
    own = compiled_config(model) if own is None else own
    own_loss = own.get("loss") is not None
    if custom and recipe.train.task == "auto" and not recipe.train.loss and not own_loss:
        try:
            targets = decide(outputs, labels, "auto", _class_fix(recipe))
        except TargetError:
            targets = []  # its own train_step may take any labels: Keras reports what it cannot
    else:
        stated, by = _stated_tasks(recipe, outputs, own)
        try:
            targets = decide(outputs, labels, stated, _class_fix(recipe))
        except TargetError as error:
            raise RecipeError(f"{recipe.path}: {error}") from None
        targets = [_with_loss(target, by.get(target.output)) for target in targets]
    _check_class_weight(recipe, targets)
    for target in targets:
        unread = target.activation is None and target.task not in ("regression", CUSTOM)
        (logger.warning if unread else logger.info)("tpukit: %s", target.describe())
    spec = ModelSpec(
        feature_keys=keys,
        targets=tuple(targets),
        exact_loss={},
        custom_step=custom,
        labels_keyed=isinstance(labels, Mapping),
        outputs_keyed=keyed,
        features=fed,
    )
    weights = _loss_weights(recipe, spec.targets, own.get("loss_weights"))
    exact = _exact_loss_weights(spec, recipe, own_loss, weights)
    return dataclasses.replace(spec, exact_loss=_per_loss_value(exact, spec, recipe, own))


def _loss_name(loss) -> str | None:
    """The name Keras knows a loss by: the name given, a wrapped function's, a loss class's or a function's."""
    if isinstance(loss, str):
        return OBJECTS.get(loss) and _loss_name(OBJECTS[loss]) or loss
    if type(loss).__name__ == "LossFunctionWrapper":  # keras.losses.Loss around a function
        return getattr(getattr(loss, "fn", None), "__name__", None)
    if isinstance(loss, keras.losses.Loss):
        return type(loss).__name__
    return getattr(loss, "__name__", None)


def _stated_tasks(recipe: Recipe, outputs: list[OutputFacts], own: dict) -> tuple[Any, dict]:
    """`(stated, by)`: the task of each output for `decide`, and {output: (what stated it, the loss)} for the
    outputs whose loss stated it. `train.task` where set; else the task each output's loss implies (`train.loss`,
    else the model's compiled loss): a loss tpukit does not know states `custom` (no target check); "auto"
    (inference from the labels) only where no loss was given."""
    if recipe.train.task != "auto":
        return recipe.train.task, {}
    given, where = (
        (recipe.train.loss, "train.loss")
        if recipe.train.loss
        else (own.get("loss"), "its compiled loss")
    )
    if given is None:
        return "auto", {}
    stated, by = {}, {}
    for index, output in enumerate(outputs):
        loss = _loss_for(given, index, output)
        if loss is None:
            continue
        name = _loss_name(loss)
        task = loss_task(name) or CUSTOM
        if task == "binary" and output.shape and output.shape[-1] != 1:
            task = "multi_label"
        stated[output.name] = task
        found = OBJECTS.get(loss, loss) if isinstance(loss, str) else loss
        by[output.name] = (f"{where} {name or type(loss).__name__!r}", found)
    return stated or "auto", by


def _with_loss(target: Target, by) -> Target:
    """The target as its loss states it: named after that loss, and from logits as the loss reads its outputs (a
    Keras cross-entropy given by name takes probabilities)."""
    if by is None:
        return target
    stated_by, loss = by
    logits = getattr(loss, "from_logits", None)
    if logits is None and target.task in ("classification", "binary", "multi_label"):
        logits = False  # Keras' cross-entropies given by name default to probabilities
    return dataclasses.replace(
        target,
        stated_by=stated_by,
        from_logits=target.from_logits if logits is None else bool(logits),
    )


def _check_class_weight(recipe: Recipe, targets) -> None:
    """`train.class_weight` weighs the examples of one output by class, as Keras' does: a classification or binary
    output (whose class count bounds the keys), or one trained on a loss tpukit does not know (class ids read as
    Keras reads them)."""
    if not recipe.train.class_weight:
        return
    given = dict(recipe.train.class_weight)
    tasks = [t.task for t in targets]
    if len(targets) != 1 or tasks[0] not in ("classification", "binary", CUSTOM):
        raise RecipeError(
            f"{recipe.path}: train.class_weight={given} weighs examples by class, which needs one classification, "
            f"binary or custom-loss output; the model's outputs are trained as {tasks}. Fix: remove "
            "train.class_weight, or give per-example sample weights (a third element of each example, or "
            "tpukit.fit(sample_weight=...))."
        )
    (target,) = targets
    if target.task == CUSTOM:
        return
    classes = 2 if target.task == "binary" else target.classes
    beyond = sorted(k for k in given if k >= classes)
    if beyond:
        raise RecipeError(
            f"{recipe.path}: train.class_weight names class {beyond[0]}, but output {target.output!r} has "
            f"{classes} classes (ids 0 to {classes - 1}). Fix: key train.class_weight by class ids below {classes}."
        )


# -- Losses and metrics ---------------------------------------------------------------------------------------------


def _loss_weights(recipe: Recipe, targets, own=None) -> dict[str, float]:
    """Each output's loss weight: `train.loss_weights`, else those the builder compiled with (`own`), else 1."""
    weights = recipe.train.loss_weights if recipe.train.loss_weights is not None else own
    if weights is None:
        return {t.output: 1.0 for t in targets}
    if isinstance(weights, Mapping):
        unknown = [k for k in weights if k not in [t.output for t in targets]]
        if unknown:
            raise RecipeError(
                f"{recipe.path}: train.loss_weights names {unknown}, but the model's outputs are "
                f"{[t.output for t in targets]}. Fix: key train.loss_weights by output name."
            )
        return {t.output: float(weights.get(t.output, 1.0)) for t in targets}
    if len(weights) != len(targets):
        raise RecipeError(
            f"{recipe.path}: train.loss_weights has {len(weights)} values for {len(targets)} output(s) "
            f"{[t.output for t in targets]}. Fix: give one weight per output, or a mapping by output name."
        )
    return {t.output: float(w) for t, w in zip(targets, weights, strict=True)}


def _exact_loss_weights(
    spec: ModelSpec, recipe: Recipe, own_loss: bool, weights: dict[str, float]
) -> dict[str, float]:
    """The logged metric that is each output's exact loss, and its weight in the total loss."""
    result = {}
    for target in spec.targets:
        name = _exact_loss_metric(target, recipe, own_loss)
        result[f"{target.output}_{name}" if spec.several else name] = weights[target.output]
    return result


def _exact_loss_metric(target: Target, recipe: Recipe, own_loss: bool) -> str:
    plain = target.task == "classification" and target.sparse and target.from_logits
    if plain and not recipe.train.label_smoothing and not recipe.train.loss and not own_loss:
        return (
            "cross_entropy"  # the loss itself: a second metric would cost another softmax per step
        )
    return "weighted_loss"


def _reduction(recipe: Recipe, own: dict, index: int, target: Target) -> str:
    """How an output's loss reduces a batch: tpukit's own loss averages by the weights; a Keras loss object says;
    a loss given by name or as a function is wrapped by Keras' compile with its default, `sum_over_batch_size`."""
    if recipe.train.loss:
        loss = _loss_for(recipe.train.loss, index, target)
        loss = OBJECTS.get(loss, loss) if isinstance(loss, str) else loss
    elif own.get("loss") is not None:
        loss = _loss_for(own["loss"], index, target)
    else:
        return "mean_with_sample_weight"
    return getattr(loss, "reduction", None) or "sum_over_batch_size"


def _per_loss_value(exact: dict, spec: ModelSpec, recipe: Recipe, own: dict) -> dict[str, float]:
    """`exact` (metric -> weight in the reported loss) with each `sum_over_batch_size` loss's term scaled from the
    weighted mean its `WeightedLoss` logs to Keras' value, the weighted sum over the number of loss values: times
    the eval split's mean weight per loss value (one pass over its sample weights; 1 without them). Then the
    reported eval loss equals plain Keras `evaluate` over the whole split in one batch."""
    if not exact or not recipe.data.eval_split or not spec.targets:
        return exact
    scaled = [
        (index, target)
        for index, target in enumerate(spec.targets)
        if _exact_loss_metric(target, recipe, own.get("loss") is not None) == "weighted_loss"
        and _reduction(recipe, own, index, target) == "sum_over_batch_size"
    ]
    examples = _source_examples(recipe, recipe.data.eval_split)
    if not scaled or len(examples.element_spec) != 3:
        return exact
    means = data.pipeline.mean_weights(examples, spec.weight_ranks)
    flat = [means[t.output] for t in spec.targets] if spec.labels_keyed else tf.nest.flatten(means)
    result = dict(exact)
    for index, target in scaled:
        name = f"{target.output}_weighted_loss" if spec.several else "weighted_loss"
        result[name] = exact[name] * flat[index]
    return result


# Loss and metric objects given to `tpukit.fit` (registered under a name for the duration of the call).
OBJECTS: dict[str, Any] = {}


def _fresh(metric):
    """A new instance of a metric object (its variables are made in the caller's scope, once per model)."""
    if isinstance(metric, keras.metrics.Metric):
        return type(metric).from_config(metric.get_config())
    return metric


def _named(kind: str, name: str, recipe: Recipe):
    """A loss or metric named in the recipe: a Keras name, or an importable 'module.path:function'."""
    from tpukit.recipe import registry

    if name in OBJECTS:
        return _fresh(OBJECTS[name])
    getter = keras.losses.get if kind == "loss" else keras.metrics.get
    if ":" in name:
        try:
            found = registry.lookup({}, name, f"train.{kind}")
        except registry.RegistryError as error:
            raise RecipeError(f"{recipe.path}: {error}") from None
        return found() if isinstance(found, type) else _fresh(found)
    try:
        found = getter(name)
        # A metric name stays a name: Keras resolves "accuracy" and "crossentropy" by the labels' and the output's
        # shapes (sparse, categorical or binary), which `keras.metrics.get` alone cannot.
        return name if kind == "metric" else found
    except ValueError:
        raise RecipeError(
            f"{recipe.path}: train.{kind} {name!r} is not a Keras {kind} name. Fix: use a Keras name (e.g. "
            f"{'huber, mse, binary_crossentropy' if kind == 'loss' else 'mae, auc, precision'}) or an importable "
            "'module.path:function'."
        ) from None


def _check_names(recipe: Recipe, key: str, value, targets) -> None:
    """A per-output mapping or list given for `key` (loss, metrics) names the model's outputs, or has one entry
    per output."""
    names = [t.output for t in targets]
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise RecipeError(
                f"{recipe.path}: train.{key} names output(s) {unknown}, but the model's outputs are {names}. Fix: "
                f"key train.{key} by output name."
            )
    elif (
        isinstance(value, (list, tuple))
        and (key == "loss" or len(targets) > 1)
        and len(value) != len(targets)
    ):
        one = "one loss for all" if key == "loss" else "a mapping of output name to its metrics"
        raise RecipeError(
            f"{recipe.path}: train.{key} has {len(value)} entries for the {len(targets)} outputs {names}. Fix: give "
            f"one entry per output, in output order (as Keras reads it), or {one}."
        )


def _loss_for(value, index: int, target):
    """An output's loss: from a mapping by name, a list in output order, or the one loss given for all.
    `target`: a `Target` or an `OutputFacts`."""
    if isinstance(value, Mapping):
        return value.get(getattr(target, "output", None) or target.name)
    if isinstance(value, (list, tuple)):
        return value[index]
    return value


def _metrics_for(value, index: int, target: Target, count: int) -> list | None:
    """An output's metrics, as Keras reads `metrics`: a mapping by output name, or with several outputs a list of
    one entry (a metric or a list of them) per output. None: not given."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        chosen = value.get(target.output)
    elif count > 1 and isinstance(value, (list, tuple)):
        chosen = value[index]  # one entry per output (`_check_names` checked the count)
    else:
        chosen = value
    if chosen is None:
        return []
    return list(chosen) if isinstance(chosen, (list, tuple)) else [chosen]


def task_loss(target: Target, label_smoothing: float, reduction="mean_with_sample_weight"):
    """The loss for a target: cross-entropy (sparse, categorical or binary, smoothed if asked) or squared error.
    The default reduction averages over the real examples only: eval batches carry zero-weight padding."""
    logits = target.from_logits
    if target.task == "classification" and target.sparse:
        if label_smoothing:
            return SparseCategoricalCrossentropyWithLabelSmoothing(
                label_smoothing, from_logits=logits, reduction=reduction
            )
        return keras.losses.SparseCategoricalCrossentropy(from_logits=logits, reduction=reduction)
    if target.task == "classification":
        return keras.losses.CategoricalCrossentropy(
            from_logits=logits, label_smoothing=label_smoothing, reduction=reduction
        )
    if target.task in ("binary", "multi_label"):
        return keras.losses.BinaryCrossentropy(
            from_logits=logits, label_smoothing=label_smoothing, reduction=reduction
        )
    return keras.losses.MeanSquaredError(reduction=reduction)


def task_metrics(target: Target) -> list:
    """Accuracy and cross-entropy (classification, binary, multi-label; AUC for the last two), or squared and
    absolute error and RMSE (regression): each weighted by the sample weights, so exact over padded eval batches.
    None for an output trained on a loss tpukit does not know (its exact loss is logged)."""
    logits = target.from_logits
    if target.task == CUSTOM:
        return []
    if target.task == "classification" and target.sparse:
        return [
            keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            keras.metrics.SparseCategoricalCrossentropy(from_logits=logits, name="cross_entropy"),
        ]
    if target.task == "classification":
        return [
            keras.metrics.CategoricalAccuracy(name="accuracy"),
            keras.metrics.CategoricalCrossentropy(from_logits=logits, name="cross_entropy"),
        ]
    if target.task in ("binary", "multi_label"):
        return [
            keras.metrics.BinaryAccuracy(name="accuracy", threshold=0.0 if logits else 0.5),
            keras.metrics.BinaryCrossentropy(from_logits=logits, name="cross_entropy"),
            keras.metrics.AUC(
                name="auc",
                from_logits=logits,
                multi_label=target.task == "multi_label",
                num_labels=target.classes if target.task == "multi_label" else None,
            ),
        ]
    return [
        keras.metrics.MeanSquaredError(name="mse"),
        # What rating predictions are judged by (MovieLens, Netflix prize): sqrt of the summed squares / weights.
        keras.metrics.RootMeanSquaredError(name="rmse"),
        keras.metrics.MeanAbsoluteError(name="mae"),
    ]


def compiled_config(model) -> dict:
    """The loss, loss weights and metrics the builder compiled the model with ({} if it did not compile it)."""
    if not model.compiled:
        return {}
    try:
        config = model.get_compile_config() or {}
    except Exception:  # noqa: BLE001 - see below
        # Inside jax.eval_shape (`tpukit check --topology`) the optimizer's learning rate is a tracer, which
        # `get_compile_config` cannot serialize; the optimizer is not read from here, so serialize the rest alone
        # (Keras 3.15 keeps the compile arguments in `model._compile_config.config`).
        raw = getattr(getattr(model, "_compile_config", None), "config", None) or {}
        config = {
            key: keras.saving.serialize_keras_object(raw.get(key))
            for key in ("loss_weights", "metrics", "weighted_metrics")
        }

    def restore(value):
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, Mapping) and "class_name" in value:
            return keras.saving.deserialize_keras_object(value)
        if isinstance(value, Mapping):
            return {k: restore(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [restore(v) for v in value]
        return value

    result = {"loss": model.loss, "loss_weights": config.get("loss_weights")}
    metrics = [config.get("metrics"), config.get("weighted_metrics")]
    try:
        restored = [restore(m) for m in metrics]
    except (TypeError, ValueError) as error:
        raise RecipeError(
            f"the model was compiled with metrics tpukit cannot rebuild ({error}). Fix: pass them to "
            "tpukit.fit(metrics=[...]) or train.metrics, or register them with "
            "@keras.saving.register_keras_serializable()."
        ) from None
    # Keras weighs `metrics` by nothing; tpukit compiles them as weighted (`_say_unweighted_metrics_weigh`).
    result["unweighted_metrics"] = _metric_names(restored[0])
    restored = [m for m in restored if m]
    if len(restored) == 2 and isinstance(restored[0], list) and isinstance(restored[1], list):
        restored = [restored[0] + restored[1]]
    result["metrics"] = restored[0] if restored else None
    return result


def _metric_names(metrics) -> list[str]:
    """The names of a compile's metrics (a list, or a list or dict of lists per output), as the logs show them."""
    if not metrics:
        return []
    if isinstance(metrics, Mapping):
        return [name for per_output in metrics.values() for name in _metric_names(per_output)]
    if not isinstance(metrics, (list, tuple)):
        metrics = [metrics]
    names = []
    for metric in metrics:
        if isinstance(metric, (list, tuple, Mapping)):
            names += _metric_names(metric)
        elif metric is not None:
            names.append(
                metric
                if isinstance(metric, str)
                else getattr(metric, "name", type(metric).__name__)
            )
    return names


def _say_unweighted_metrics_weigh(recipe: Recipe, own: dict) -> None:
    """One line when the model compiled (unweighted) `metrics` and the data carries weights: tpukit weighs them.

    Keras weighs only `weighted_metrics` by sample and class weights; tpukit compiles every metric as weighted,
    because its exact evaluation completes the last batch with zero-weight examples that an unweighted metric
    would count. With weights, those metrics then differ from plain Keras' (in training and evaluation)."""
    names = own.get("unweighted_metrics")
    if not names or recipe.train.metrics is not None:
        return
    weighted = bool(recipe.train.class_weight) or any(
        len(_source_examples(recipe, split).element_spec) == 3
        for split in (recipe.data.train_split, recipe.data.eval_split)
        if split
    )
    if weighted:
        logger.info(
            "tpukit: the model compiled metrics=%s, which Keras leaves unweighted; tpukit weighs them by the "
            "sample and class weights (its exact evaluation pads the last batch with zero-weight examples, which "
            "an unweighted metric would count), so they differ from plain Keras'. Fix, to compare: compile them "
            "as weighted_metrics in plain Keras too.",
            names,
        )


def compile_model(
    model,
    recipe: Recipe,
    spec: ModelSpec,
    optimizer,
    jit_compile: bool,
    steps_per_execution: int,
    own: dict | None = None,
):
    """Compiles `model` for its targets: the task's loss (or `train.loss`, or the one the builder compiled), the
    exact weighted loss, and the task's metrics (or `train.metrics`, or the builder's), all as weighted metrics.
    `own`: the builder's compile (`compiled_config`), read from the model when not given."""
    train = recipe.train
    own = compiled_config(model) if own is None else own
    _say_unweighted_metrics_weigh(recipe, own)
    targets, several = spec.targets, spec.several
    own_loss = own.get("loss") is not None
    for key, value in (("loss", train.loss), ("metrics", train.metrics), ("loss", own.get("loss"))):
        _check_names(recipe, key, value, targets)
    losses, metrics = {}, {}
    for index, target in enumerate(targets):
        named = _loss_for(train.loss, index, target) if train.loss else None
        if named:
            loss = _named("loss", named, recipe)
        elif own_loss:
            loss = _loss_for(own["loss"], index, target)
        else:
            loss = task_loss(target, train.label_smoothing)
        losses[target.output] = loss
        wanted = _metrics_for(train.metrics, index, target, len(targets))
        own_metrics = _metrics_for(own.get("metrics"), index, target, len(targets))
        if wanted is not None:
            chosen = [_named("metric", name, recipe) for name in wanted]
        elif own_metrics is not None:
            chosen = own_metrics
        else:
            chosen = task_metrics(target)
        if _exact_loss_metric(target, recipe, own_loss) == "weighted_loss":
            exact = loss if loss is not None else task_loss(target, train.label_smoothing)
            if isinstance(exact, str):
                exact = keras.losses.get(exact)
            chosen = [*chosen, WeightedLoss(exact)]
        elif not any(getattr(m, "name", None) == "cross_entropy" for m in chosen):
            chosen = [*chosen, *task_metrics(target)[1:2]]
        metrics[target.output] = chosen
    if not targets:  # a model with its own train_step and labels tpukit does not read
        compile_args = dict(loss=own.get("loss"), weighted_metrics=own.get("metrics"))
    elif several or spec.labels_keyed or spec.outputs_keyed:
        weights = _loss_weights(recipe, targets, own.get("loss_weights"))
        compile_args = dict(loss=losses, loss_weights=weights, weighted_metrics=metrics)
        if not (spec.labels_keyed or spec.outputs_keyed):
            order = [t.output for t in targets]
            compile_args = dict(
                loss=[losses[n] for n in order],
                loss_weights=[weights[n] for n in order]
                if isinstance(weights, Mapping)
                else weights,
                weighted_metrics=[metrics[n] for n in order],
            )
    else:
        (name,) = losses
        compile_args = dict(loss=losses[name], weighted_metrics=metrics[name])
    model.compile(
        optimizer=optimizer,
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
        **compile_args,
    )
    return model
