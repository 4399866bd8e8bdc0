"""Fine-tuning a built model: start from weights, freeze layers by name, LoRA.

`prepare` applies a recipe's `model.init_weights`, `model.freeze` and `model.lora_rank` to the built model, before
`compile` and inside the engine's distribution scope, in this order:

1. checks, each a `RecipeError` naming the key, the value and a fix, before any weight is read;
2. freeze: `layer.trainable = False` for each layer (or weight path) a pattern matches (`re.search`);
3. init_weights (a new run only; a resume restores its checkpoint): `model.load_weights`, matched by structure.
   A head at the model's output end that does not fit the file keeps its initialization, with a warning (a new
   number of classes); a mismatch anywhere else is an error;
4. LoRA: on a KerasHub backbone (the model, a task's `.backbone`, or one inside a model), the backbone's own
   `enable_lora(rank)`: its `default_lora_layer_names()` (query and value) adapted, the rest of the backbone frozen,
   as KerasHub's fine-tuning guides do; elsewhere `layer.enable_lora(rank)` on every trainable Dense and
   EinsumDense. It comes after loading because `Dense.load_own_variables` zeroes both LoRA matrices
   (keras/src/layers/core/dense.py, Keras 3.15)."""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
import zipfile

import keras
import tensorflow as tf

from tpukit.recipe import RecipeError

logger = logging.getLogger("tpukit")

# What a tpukit output directory holds (tpukit.engines.keras.export.KERAS_FILENAME and the plan's checkpoint
# directory; repeated here because the task layer sits below the engines).
KERAS_FILENAME = "model.keras"
CHECKPOINT_DIRNAME = "checkpoints"
LORA_LAYERS = (keras.layers.Dense, keras.layers.EinsumDense)
# Keras' repr of a layer (keras/src/layers/layer.py `__repr__`), as listed in its "could not be loaded" error.
_KERAS_LAYER_REPR = re.compile(r"<\w+ name=([^,>\s]+), built=")


def prepare(model, config, resuming: bool, path: str = "<dict>"):
    """Applies `config.init_weights` (not when `resuming`), `config.freeze` and `config.lora_rank` to `model`.

    Args:
        model: the built, uncompiled `keras.Model` from the recipe's builder (in the engine's strategy scope).
        config: the recipe's `ModelConfig` (read with `getattr`, so older configs work).
        resuming: a checkpoint will be restored into the model, so `init_weights` is not loaded.
        path: the recipe's file, for error messages.

    Returns:
        The same model, changed in place.

    Raises:
        RecipeError: the weights cannot be found or read or do not fit the model, a freeze pattern matches
            nothing, LoRA finds no layer to adapt (or, on a KerasHub backbone, one it would adapt is frozen or
            adapted already), or nothing is left to train.
    """
    init_weights = getattr(config, "init_weights", None)
    patterns = tuple(getattr(config, "freeze", None) or ())
    rank = getattr(config, "lora_rank", None)
    if not (init_weights or patterns or rank):
        return model
    if not model.built:
        raise RecipeError(
            f"{path}: model.{_first_key(init_weights, patterns, rank)} needs the model's weights, but the builder "
            f"returned an unbuilt {type(model).__name__}. Fix: build it in the builder (a functional model on "
            "keras.Input, or call model.build(input_shape))."
        )
    source = _resolve(init_weights, path) if init_weights and not resuming else None
    layers = list(
        model._flatten_layers(include_self=False)
    )  # every sublayer, as keras-hub's enable_lora walks
    frozen = _freeze(model, layers, patterns, path) if patterns else []
    backbones = _keras_hub_backbones(model, layers) if rank else []
    if backbones:
        targets = _backbone_lora_targets(
            backbones, patterns, rank, path, getattr(config, "lora_targets", None)
        )
    else:
        targets = _lora_targets(layers, patterns, rank, path) if rank else []
        names = set(getattr(config, "lora_targets", None) or ())
        if names:
            unknown = sorted(names - {layer.name for layer in targets})
            if unknown:
                raise RecipeError(
                    f"{path}: model.lora_targets names {unknown}, which is no trainable Dense or EinsumDense "
                    f"layer of the model (those are {sorted(layer.name for layer in targets)[:12]}). Fix: names "
                    "from that list."
                )
            targets = [layer for layer in targets if layer.name in names]
    if not model.trainable_weights and not targets:
        raise RecipeError(
            f"{path}: model.freeze={list(patterns)} freezes every layer of the model: nothing is left to train. "
            "Fix: narrow the patterns (e.g. freeze: ['^backbone'] keeps the head trainable), or set "
            "model.lora_rank to train low-rank adapters."
        )
    if source:
        _load(model, layers, source, init_weights, patterns, path)
    elif init_weights:
        logger.info(
            "tpukit: model.init_weights=%s not loaded: resuming, the checkpoint's weights are restored instead",
            init_weights,
        )
    if frozen:
        kept = sum(_size(w) for w in model.trainable_weights)
        logger.info(
            "tpukit: model.freeze=%s froze %s; %s trainable parameters left",
            list(patterns),
            ", ".join(frozen),
            f"{kept:,}",
        )
    if targets:
        _enable_lora(model, backbones, targets, rank, getattr(config, "lora_targets", None))
    return model


def _enable_lora(model, backbones: list, targets: list, rank: int, names_asked=None) -> None:
    """LoRA on `targets`: through each KerasHub backbone's own `enable_lora` where there are `backbones` (so the
    result is KerasHub's exactly, `save_lora_weights` included), else layer by layer; logs what it adapted."""
    before = sum(_size(w) for w in model.trainable_weights)
    asked = sorted({layer.name for layer in targets}) if names_asked else None
    for backbone in backbones:
        backbone.enable_lora(rank, target_layer_names=asked)
    adapted = targets
    if backbones:
        # Read back: the log states what KerasHub adapted, even where a release picks other layers than it names.
        layers = model._flatten_layers(include_self=False)
        adapted = [layer for layer in layers if getattr(layer, "lora_enabled", False)]
    else:
        for layer in targets:
            layer.enable_lora(rank)
    after = sum(_size(w) for w in model.trainable_weights)
    how = (
        "KerasHub's "
        + ", ".join(f"{type(b).__name__}.enable_lora({rank})" for b in backbones)
        + " (the rest of the backbone frozen)"
        if backbones
        else "their kernels frozen"
    )
    logger.info(
        "tpukit: model.lora_rank=%d: LoRA on %d layer(s) (%s), %s; %s trainable parameters now (%+d)",
        rank,
        len(adapted),
        # paths where KerasHub repeats names (every block's `query`), names as before elsewhere
        ", ".join(_layer_path(layer) if backbones else layer.name for layer in adapted),
        how,
        f"{after:,}",
        after - before,
    )


def _first_key(init_weights, patterns, rank) -> str:
    if init_weights:
        return f"init_weights={init_weights!r}"
    return f"freeze={list(patterns)}" if patterns else f"lora_rank={rank}"


def _size(variable) -> int:
    size = 1
    for dim in variable.shape:
        size *= int(dim)
    return size


# ---- init_weights ------------------------------------------------------------------------------------------------


def _resolve(value: str, path: str) -> tuple[str, str]:
    """`("keras", file)` for a `.keras` / `.weights.h5` file (or a directory's model.keras), `("checkpoint",
    prefix)` for a directory that holds only tpukit checkpoints (a run stopped before its export)."""
    key = f"model.init_weights={value!r}"
    if tf.io.gfile.isdir(value):
        keras_file = os.path.join(value, KERAS_FILENAME)
        if tf.io.gfile.exists(keras_file):
            return "keras", keras_file
        prefix = _newest_checkpoint(os.path.join(value, CHECKPOINT_DIRNAME))
        if prefix:
            return "checkpoint", prefix
        raise RecipeError(
            f"{path}: {key} is a directory without {KERAS_FILENAME} or {CHECKPOINT_DIRNAME}/ckpt-N, so it is not "
            "a tpukit output directory. Fix: name the output directory of a tpukit run, or a .keras or "
            ".weights.h5 file."
        )
    if not tf.io.gfile.exists(value):
        raise RecipeError(
            f"{path}: {key} does not exist (looked for {os.path.abspath(value)}; relative paths are from the "
            "working directory). Fix: give the path of a .keras or .weights.h5 file or of a tpukit output "
            "directory."
        )
    if value.endswith(".keras") or value.endswith(".weights.h5"):
        return "keras", value
    raise RecipeError(
        f"{path}: {key} is neither a .keras nor a .weights.h5 file (legacy .h5 files and SavedModels are not "
        "read). Fix: save the weights with Keras 3 (model.save('x.keras') or model.save_weights('x.weights.h5')) "
        "and name that file."
    )


def _newest_checkpoint(directory: str) -> str | None:
    """The newest `ckpt-N` prefix in `directory` (tpukit numbers checkpoints by step), None when there is none."""
    numbered = []
    for index in glob.glob(os.path.join(glob.escape(directory), "ckpt-*.index")):
        match = re.search(r"ckpt-(\d+)\.index$", index)
        if match:
            numbered.append((int(match.group(1)), index[: -len(".index")]))
    return max(numbered)[1] if numbered else None


def _head_names(model, layers: list) -> set[str]:
    """Names of the layers a fine-tuning run may replace: the last top-level layer with weights, the layers that
    produce the model's outputs, and their sublayers."""
    top = [layer for layer in model.layers if layer.weights]
    heads = top[-1:]
    try:
        outputs = list(model.outputs or [])  # a functional model's output KerasTensors
    except AttributeError:  # a subclassed model has none
        outputs = []
    for output in outputs:
        history = getattr(output, "_keras_history", None)
        operation = history[0] if history else None
        if isinstance(operation, keras.layers.Layer) and operation.weights:
            heads.append(operation)
    names = set()
    for head in heads:
        names.add(head.name)
        names.update(sub.name for sub in head._flatten_layers(include_self=False))
    return names


def _load(
    model, layers: list, source: tuple[str, str], value: str, patterns: tuple, path: str
) -> None:
    kind, file = source
    key = f"model.init_weights={value!r}"
    if kind == "checkpoint":
        _load_checkpoint(model, file, key, path)
        return
    try:
        # Keras (keras/src/saving/saving_lib.py `load_weights_only`, 3.15) loads every layer it can and only then
        # raises one ValueError listing the layers that failed, so after the error the others hold the file's
        # weights; the listed ones are untouched (their shapes or counts differ).
        model.load_weights(file)
        failed, keras_error = [], ""
    except ValueError as error:
        keras_error = str(error)
        listed = keras_error.rpartition("List of objects that could not be loaded:")[2]
        failed = list(dict.fromkeys(_KERAS_LAYER_REPR.findall(listed)))
        if (
            not failed
        ):  # not the per-layer report: the file is not a Keras weights file for any model
            raise RecipeError(
                f"{path}: {key}: Keras could not read {file} ({_first_line(keras_error)}). Fix: name a .keras or "
                ".weights.h5 file written by Keras 3 for this model."
            ) from None
    except (
        OSError,
        KeyError,
        EOFError,
        zipfile.BadZipFile,
    ) as error:  # not a zip or HDF5 file, or no weights in it
        raise RecipeError(
            f"{path}: {key}: {file} is not a Keras weights file ({type(error).__name__}: "
            f"{_first_line(str(error))}). Fix: name a .keras or .weights.h5 file written by Keras 3."
        ) from None
    with_weights = [layer for layer in model.layers if layer.weights]
    if failed:
        heads = _head_names(model, layers)
        body = [name for name in failed if name not in heads]
        if body or len(set(failed)) >= len(with_weights):
            raise RecipeError(
                f"{path}: {key}: the weights in {file} do not fit this model: layer(s) {', '.join(body or failed)} "
                f"differ ({_keras_example(keras_error)}). Weights are matched by the model's structure (layer "
                "classes in order), and only the head may differ. Fix: build the model with the architecture and "
                "arguments of the run that wrote the file (only its output layer may change, e.g. num_classes)."
            )
        frozen_heads = [name for name in failed if any(re.search(p, name) for p in patterns)]
        if frozen_heads:
            raise RecipeError(
                f"{path}: {key}: layer(s) {', '.join(frozen_heads)} are not in {file} (or differ in shape) and "
                f"model.freeze={list(patterns)} freezes them, so they would stay at their random initialization. "
                "Fix: leave the new head out of model.freeze, or load a file whose head fits."
            )
        logger.warning(
            "tpukit: model.init_weights: new head layer(s) %s do not fit %s and keep their initialization "
            "(Keras: %s)",
            ", ".join(failed),
            file,
            _keras_example(keras_error),
        )
    logger.info(
        "tpukit: model.init_weights: loaded %d of %d layer(s) with weights from %s%s",
        len(with_weights) - len({n for n in failed if n in {layer.name for layer in with_weights}}),
        len(with_weights),
        file,
        f" (new: {', '.join(failed)})" if failed else "",
    )


def _load_checkpoint(model, prefix: str, key: str, path: str) -> None:
    """The model's variables from a tpukit checkpoint (`tf.train.Checkpoint(model=...)`; the optimizer, RNG and run
    state in it are ignored). The architecture must match exactly; a new head needs the run's model.keras."""
    fix = (
        "Fix: build the model exactly as the run that wrote it did, or name its model.keras (there a new head may "
        "differ)."
    )
    try:
        saved = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError) as error:
        raise RecipeError(
            f"{path}: {key}: checkpoint {prefix} cannot be read ({_first_line(str(error))}). Fix: name a complete "
            "checkpoint's output directory, or a .keras file."
        ) from None
    if any("lora_kernel" in name for name in saved):
        raise RecipeError(
            f"{path}: {key}: checkpoint {prefix} was trained with LoRA; its kernels hold the base weights without "
            "the adapters. Fix: name that run's model.keras (the merged weights), or resume the run itself."
        )
    try:
        status = tf.train.Checkpoint(model=model).read(prefix)
        status.expect_partial()  # the optimizer and run state are not wanted
        status.assert_existing_objects_matched()
    except (AssertionError, ValueError, tf.errors.OpError) as error:
        raise RecipeError(
            f"{path}: {key}: checkpoint {prefix} does not fit this model ({type(error).__name__}: "
            f"{_first_line(str(error))[:300]}). {fix}"
        ) from None
    logger.info(
        "tpukit: model.init_weights: loaded %d variable(s) from checkpoint %s",
        len(model.weights),
        prefix,
    )


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no message"


def _keras_example(keras_error: str) -> str:
    """Keras' example error from its loading report (the first failing layer's shapes), on one line."""
    match = re.search(
        r"Example error message for object <[^>]*>:\s*(.+?)\s*(?:Target variable:|List of objects)",
        keras_error,
        re.S,
    )
    return " ".join((match.group(1) if match else _first_line(keras_error)).split())[:300]


# ---- freeze and LoRA ---------------------------------------------------------------------------------------------


def _freeze(model, layers: list, patterns: tuple, path: str) -> list[str]:
    """Freezes the layers (and weights) each pattern matches; returns what it froze, for the log."""
    frozen = []
    for pattern in patterns:
        matched = [layer for layer in layers if re.search(pattern, layer.name)]
        weights = [w for w in model.weights if re.search(pattern, w.path)] if not matched else []
        if not matched and not weights:
            names = [layer.name for layer in layers if layer.weights]
            shown = ", ".join(names[:20]) + (
                f" and {len(names) - 20} more" if len(names) > 20 else ""
            )
            raise RecipeError(
                f"{path}: model.freeze holds {pattern!r}, which matches no layer name or weight path of this model "
                f"(re.search). Layers with weights: {shown}. Fix: use one of those names, e.g. freeze: "
                f"['^{names[0] if names else 'dense'}']."
            )
        for layer in matched:
            layer.trainable = False  # Keras also freezes its sublayers
            frozen.append(layer.name)
        for weight in weights:
            weight.trainable = False
            frozen.append(weight.path)
    return list(dict.fromkeys(frozen))


def _lora_targets(layers: list, patterns: tuple, rank: int, path: str) -> list:
    """The Dense and EinsumDense layers to adapt: trainable, kernel trainable, LoRA not enabled yet."""
    candidates = [layer for layer in layers if isinstance(layer, LORA_LAYERS)]
    if not candidates:
        raise RecipeError(
            f"{path}: model.lora_rank={rank}, but the model has no Dense or EinsumDense layer (Keras' LoRA adapts "
            "only those). Fix: set model.lora_rank: null, or train the model fully."
        )
    targets = [
        layer
        for layer in candidates
        if layer.trainable and layer._kernel.trainable and not layer.lora_enabled
    ]
    if not targets:
        raise RecipeError(
            f"{path}: model.lora_rank={rank}, but model.freeze={list(patterns)} freezes every Dense and EinsumDense "
            f"layer ({', '.join(layer.name for layer in candidates[:10])}), and LoRA adapts only trainable ones. "
            "Fix: leave the layers to adapt out of model.freeze."
        )
    for layer in targets:
        if layer.kernel_constraint is not None:
            raise RecipeError(
                f"{path}: model.lora_rank={rank}: layer {layer.name!r} has a kernel_constraint, which Keras' LoRA "
                f"does not support. Fix: add '^{layer.name}$' to model.freeze, or remove the constraint."
            )
    return targets


def _layer_path(layer) -> str:
    return getattr(layer, "path", None) or layer.name


def _keras_hub_backbones(model, layers: list) -> list:
    """The outermost KerasHub `Backbone`s in `model` (the model itself, a task's `.backbone`, or one inside a user's
    model); [] when KerasHub is not imported (then no model can hold one)."""
    keras_hub = sys.modules.get("keras_hub")
    if keras_hub is None:
        return []
    backbone_class = keras_hub.models.Backbone
    if isinstance(model, backbone_class):
        return [model]
    found = [layer for layer in layers if isinstance(layer, backbone_class)]
    inner = {
        id(sub) for layer in found for sub in layer._flatten_layers(include_self=False)
    }  # a backbone inside another is adapted by the outer one's enable_lora
    return [layer for layer in found if id(layer) not in inner]


def _backbone_lora_targets(
    backbones: list, patterns: tuple, rank: int, path: str, names_asked=None
) -> list:
    """The layers each backbone's `enable_lora(rank, target_layer_names)` adapts (Keras-Hub 0.32
    `Backbone.enable_lora`: every sublayer with weights named in `names_asked`, by default its
    `default_lora_layer_names()`, that has `enable_lora`), checked before anything changes."""
    targets = []
    for backbone in backbones:
        names = set(names_asked or backbone.default_lora_layer_names())
        if names_asked:
            present = {
                layer.name
                for layer in backbone._flatten_layers(include_self=False)
                if layer.weights
            }
            unknown = sorted(names - present)
            if unknown:
                able = sorted(
                    {
                        layer.name
                        for layer in backbone._flatten_layers(include_self=False)
                        if layer.weights and hasattr(layer, "enable_lora")
                    }
                )
                shown = ", ".join(able[:24]) + (
                    f", ... ({len(able)} in all)" if len(able) > 24 else ""
                )
                raise RecipeError(
                    f"{path}: model.lora_targets names {unknown}, which {type(backbone).__name__} has no layer "
                    f"with weights called; the names of its layers that take LoRA: {shown}. Fix: names from that "
                    f"list (KerasHub's default: {sorted(backbone.default_lora_layer_names())})."
                )
        mine = [
            layer
            for layer in backbone._flatten_layers(include_self=False)
            if layer.weights and layer.name in names and hasattr(layer, "enable_lora")
        ]
        if not mine:
            raise RecipeError(
                f"{path}: model.lora_rank={rank}, but KerasHub's {type(backbone).__name__} has no layer named "
                f"{sorted(names)} (its default_lora_layer_names()) to adapt. Fix: set model.lora_rank: null and "
                "call backbone.enable_lora(rank, target_layer_names=[...]) in the builder."
            )
        targets += mine
    shown = ", ".join(_layer_path(layer) for layer in targets[:6])
    if any(layer.lora_enabled for layer in targets):
        raise RecipeError(
            f"{path}: model.lora_rank={rank}, but LoRA is already enabled on the backbone ({shown}): the builder "
            "called enable_lora. Fix: set model.lora_rank: null, or remove enable_lora from the builder."
        )
    frozen = [
        layer
        for layer in targets
        if not (layer.trainable and all(weight.trainable for weight in layer.weights))
    ]
    if frozen:
        raise RecipeError(
            f"{path}: model.lora_rank={rank}: model.freeze={list(patterns)} freezes "
            f"{', '.join(_layer_path(layer) for layer in frozen[:6])}, which KerasHub's enable_lora adapts (it "
            "freezes the rest of the backbone itself). Fix: leave the backbone's query/value layers out of "
            "model.freeze (patterns outside the backbone, such as a head, still apply)."
        )
    for layer in targets:
        if getattr(layer, "kernel_constraint", None) is not None:
            raise RecipeError(
                f"{path}: model.lora_rank={rank}: layer {_layer_path(layer)!r} has a kernel_constraint, which "
                "Keras' LoRA does not support. Fix: set model.lora_rank: null, or remove the constraint."
            )
    return targets
