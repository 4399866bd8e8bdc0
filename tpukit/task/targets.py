"""What each model output is trained to predict, from the model and the labels (or as the recipe states it).

tpukit trains any Keras model on any labels Keras itself takes, and picks the loss and the exact metrics from the
pair, as AutoKeras' heads and Ludwig's output features do from the data:

| labels (per example)                  | model output            | task (`train.task`)       | loss                    |
|---------------------------------------|-------------------------|---------------------------|-------------------------|
| integer class ids, shape `S`          | `S + (C,)`, C > 1       | classification (sparse)   | sparse cross-entropy    |
| one-hot or soft, shape `S + (C,)`     | `S + (C,)`, softmax/logits | classification (dense) | categorical cross-entropy |
| 0/1, shape `S` or `S + (1,)`          | one unit, sigmoid/logit | binary                    | binary cross-entropy    |
| 0/1 per class, shape `S + (C,)`       | C units, sigmoid/logits | multi_label               | binary cross-entropy    |
| real numbers, the output's shape      | linear                  | regression                | mean squared error      |

Softmax or sigmoid outputs give probabilities, any other logits. Labels pair with outputs as Keras pairs them; where
they leave the task open (0/1 labels of a linear output) the rule picks one and the log says which. A loss given
(`train.loss`, the model's compile) states the task instead (`loss_task`): a regression loss means real targets
whatever the activation, a cross-entropy its classification, a loss tpukit does not know no check (`custom`).

`decide` is pure (no TensorFlow): `OutputFacts` and `LabelFacts` in, a `Target` per output or a `TargetError` out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any


class TargetError(ValueError):
    """The model's outputs and the data's labels do not fit together (the message says how, and the fix)."""


@dataclasses.dataclass(frozen=True)
class OutputFacts:
    """One model output: its name, its shape per example and its final activation ("softmax", "sigmoid",
    "linear", ...; None when it cannot be read, e.g. a subclassed model)."""

    name: str
    shape: tuple
    activation: str | None = None


@dataclasses.dataclass(frozen=True)
class LabelFacts:
    """One label tensor of the data: its shape per example and dtype, and what a sample of its values shows."""

    shape: tuple
    dtype: str
    sampled: int = 0  # examples whose labels were read (0: values unknown)
    low: float | None = None
    high: float | None = None
    integral: bool = True  # every sampled value is a whole number
    binary: bool = False  # every sampled value is 0 or 1
    rows_sum_to_one: bool = (
        False  # the last axis sums to 1 in every sampled example (one-hot or soft labels)
    )

    @property
    def integer(self) -> bool:
        return self.dtype.startswith(("int", "uint")) or self.dtype == "bool"


@dataclasses.dataclass(frozen=True)
class Target:
    """What one output is trained on. `sparse`: integer class ids against `classes` logits or probabilities.
    `weight_rank`: the label dimensions (after the batch) that carry their own loss, hence their own eval weight
    (0: one weight per example; 1 for a language model's per-token labels)."""

    output: str
    task: str
    sparse: bool
    from_logits: bool
    classes: int
    weight_rank: int
    inferred: bool = True
    label: LabelFacts | None = None
    # Labels one axis short of the output's trailing 1 (shape [] for Dense(1)) get it.
    expand_label: bool = False
    activation: str | None = "linear"  # the output's last activation as read (None: unknown)
    stated_by: str | None = (
        None  # what stated the task when not train.task, e.g. "its compiled loss 'mse'"
    )

    def describe(self) -> str:
        if self.task == CUSTOM:
            return (
                f"output {self.output!r}: trained on {self.stated_by or 'its own loss'}, a loss tpukit does not "
                "know, so its labels are not checked (Keras reports what the loss cannot compute)"
            )
        kind = {
            ("classification", True): f"classification over {self.classes} classes, integer labels",
            (
                "classification",
                False,
            ): f"classification over {self.classes} classes, one-hot or soft labels",
        }.get((self.task, self.sparse), self.task)
        given = "from logits" if self.from_logits else "from probabilities"
        if self.task == "regression":
            given = ""
        elif self.activation is None:
            given = (
                "from logits, assumed: its last activation could not be read (a subclassed model or an op); if "
                "it outputs probabilities, set train.loss"
            )
        how = (
            "inferred from the model and the labels"
            if self.inferred
            else f"from {self.stated_by}"
            if self.stated_by
            else "train.task"
        )
        if self.task in ("classification", "binary", "multi_label") and self.stated_by:
            given = "from logits" if self.from_logits else "from probabilities"
        return f"output {self.output!r}: {kind}{' ' + given if given else ''} ({how})"


# The task of a model output trained on a loss tpukit does not know: no target check, no task metrics.
CUSTOM = "custom"

# Keras' loss names (functions, their aliases and classes in snake case) -> the task whose targets they take.
# "binary" stands for binary or multi_label (one unit or several, decided by the output).
_LOSS_TASKS = {
    **dict.fromkeys(
        (
            "mean_squared_error mse mean_absolute_error mae mean_absolute_percentage_error mape "
            "mean_squared_logarithmic_error msle huber huber_loss log_cosh logcosh poisson cosine_similarity"
        ).split(),
        "regression",
    ),
    **dict.fromkeys(
        (
            "sparse_categorical_crossentropy categorical_crossentropy categorical_focal_crossentropy "
            "sparse_categorical_crossentropy_with_label_smoothing"
        ).split(),
        "classification",
    ),
    **dict.fromkeys("binary_crossentropy binary_focal_crossentropy".split(), "binary"),
}


def loss_task(name: str | None) -> str | None:
    """The task a loss named `name` trains ("regression", "classification", "binary"), or None for a loss tpukit
    does not know. `name`: a Keras loss name or alias ("mse"), a function's or a class's name
    ("MeanSquaredError")."""
    if not name:
        return None
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip()).lower()
    return _LOSS_TASKS.get(snake) or _LOSS_TASKS.get(name.strip().lower())


def _shape(shape) -> str:
    return str(list(shape))


def _probabilities(activation: str | None) -> bool:
    return activation in ("softmax", "sigmoid")


def pair(outputs: list[OutputFacts], labels: Any) -> list[tuple[OutputFacts, LabelFacts]]:
    """Pairs outputs with labels as Keras does: by output name for a mapping, in order for a sequence."""
    names = [o.name for o in outputs]
    if isinstance(labels, Mapping):
        missing = [n for n in names if n not in labels]
        extra = [k for k in labels if k not in names]
        if missing or extra:
            raise TargetError(
                f"the model's outputs are named {names} but the data's labels are {sorted(labels)}"
                + (f" (no label for {missing})" if missing else "")
                + (f" (no output for {extra})" if extra else "")
                + ". Fix: key the labels by the model's output names (the `name=` of each output layer)."
            )
        return [(o, labels[o.name]) for o in outputs]
    if isinstance(labels, (list, tuple)):
        if len(labels) != len(outputs):
            raise TargetError(
                f"the model has {len(outputs)} output(s) {names} but the data gives {len(labels)} labels. Fix: give "
                "one label per output, as a dict keyed by output name or a tuple in output order."
            )
        return list(zip(outputs, labels, strict=True))
    if len(outputs) != 1:
        raise TargetError(
            f"the model has {len(outputs)} outputs {names} but the data gives one label tensor. Fix: give one "
            f"label per output, e.g. a dict {{{', '.join(repr(n) + ': ...' for n in names)}}}."
        )
    return [(outputs[0], labels)]


def _fits(label: tuple, output: tuple) -> bool:
    """Labels of the output's shape, allowing a trailing axis of 1 on either side (Keras squeezes it)."""
    return label == output or label + (1,) == output or label == output + (1,)


def _sparse_fits(label: tuple, output: tuple) -> bool:
    return len(output) >= 1 and label in (output[:-1], output[:-1] + (1,))


def _auto(output: OutputFacts, label: LabelFacts) -> str | None:
    shape, classes = output.shape, (output.shape[-1] if output.shape else 1)
    if (
        classes is not None
        and classes > 1
        and _sparse_fits(label.shape, shape)
        and (label.integer or label.integral)
    ):
        return "classification"
    if not _fits(label.shape, shape):
        return None
    if output.activation == "softmax":
        return "classification"
    if output.activation == "sigmoid":
        return "binary" if classes == 1 else "multi_label"
    if label.integer or (label.sampled and label.binary):
        if classes == 1:
            return "binary"
        return "classification" if label.rows_sum_to_one else "multi_label"
    if classes and classes > 1 and label.sampled and label.rows_sum_to_one and label.low >= 0:
        return "classification"  # soft labels: probabilities over the classes
    return "regression"


def _mismatch(output: OutputFacts, label: LabelFacts, task: str | None) -> TargetError:
    shape = output.shape
    classes = shape[-1] if shape else 1
    wanted = {
        "classification": f"integer labels of shape {_shape(shape[:-1])} or one-hot labels of shape {_shape(shape)}",
        "binary": f"one 0/1 label per output unit (shape {_shape(shape)}), and one unit per label",
        "multi_label": f"0/1 labels of shape {_shape(shape)}",
        "regression": f"labels of shape {_shape(shape)}",
    }
    what = (
        f"train.task {task!r} takes {wanted[task]}"
        if task
        else (
            f"it takes integer class ids of shape {_shape(shape[:-1])}, or labels of its own shape "
            f"{_shape(shape)}"
        )
    )
    fix = (
        f"make the model's output layer {list(label.shape)[-1] if label.shape else 1} unit(s) wide, or reshape "
        "the labels"
    )
    if task == "binary" and classes and classes > 1:
        fix = "end the model with Dense(1) (a logit, or sigmoid)" + (
            ", or set train.task: multi_label" if _fits(label.shape, shape) else ""
        )
    return TargetError(
        f"model output {output.name!r} has shape {_shape(shape)} per example but the labels have shape "
        f"{_shape(label.shape)} ({label.dtype}); {what}. Fix: {fix}."
    )


def _check_values(target: Target, label: LabelFacts, fix_classes) -> None:
    if not label.sampled:
        return
    seen = f"labels seen in {label.sampled} examples range over [{label.low:g}, {label.high:g}]"
    if target.task == "classification" and target.sparse:
        if not label.integral:
            raise TargetError(
                f"output {target.output!r} is trained on class ids, but the labels hold fractions ({seen}). Fix: "
                "give integer class ids, one-hot labels of the output's shape, or set train.task: regression."
            )
        if label.low < 0 or label.high >= target.classes:
            raise TargetError(
                f"output {target.output!r} has {target.classes} classes (ids 0..{target.classes - 1}) but the "
                f"{seen}. Fix: {fix_classes(target, int(label.high) + 1)}, or check the labels."
            )
    elif target.task in ("binary", "multi_label") and (label.low < 0 or label.high > 1):
        raise TargetError(
            f"output {target.output!r} is trained as {target.task} (labels in [0, 1]) but the {seen}. Fix: give 0/1 "
            "labels (or probabilities), or set train.task: regression (or classification for class ids)."
        )
    elif target.task == "classification" and label.low < 0:
        raise TargetError(
            f"output {target.output!r} is trained on one-hot or soft labels, which cannot be negative, but the "
            f"{seen}. Fix: give probabilities per class, or set train.task: regression."
        )


def _default_fix(target: Target, classes: int) -> str:
    return f"make output {target.output!r} {classes} classes wide (its last layer's units)"


def _unchecked(output: OutputFacts, label: LabelFacts) -> Target:
    """The target of an output trained on a loss tpukit does not know: shapes as read, nothing checked."""
    classes = output.shape[-1] if output.shape else 1
    sparse = _sparse_fits(label.shape, output.shape) and classes not in (None, 1)
    return Target(
        output=output.name,
        task=CUSTOM,
        sparse=sparse,
        from_logits=not _probabilities(output.activation),
        classes=int(classes or 1),
        weight_rank=max(len(output.shape) - 1, 0),
        inferred=False,
        label=label,
        expand_label=not sparse and label.shape + (1,) == output.shape,
        activation=output.activation,
    )


def decide(
    outputs: list[OutputFacts],
    labels: Any,
    stated: str | Mapping[str, str] = "auto",
    fix_classes=_default_fix,
) -> list[Target]:
    """A `Target` per output, in output order. `labels`: `LabelFacts`, or a dict/list/tuple of them.

    `stated` is `train.task`: "auto", one task for every output, or a mapping of output name to task (where a
    compiled loss states it: `custom` for a loss tpukit does not know, whose output is not checked).
    `fix_classes(target, classes)` words the fix for labels beyond the output's classes.

    Raises:
        TargetError: the outputs and labels do not fit, a stated task does not fit them, or a label is out of range.
    """
    if isinstance(stated, Mapping):
        unknown = [name for name in stated if name not in [o.name for o in outputs]]
        if unknown:
            raise TargetError(
                f"train.task names output(s) {unknown}, but the model's outputs are {[o.name for o in outputs]}. "
                "Fix: key train.task by output name."
            )
    targets = []
    for output, label in pair(outputs, labels):
        task = stated.get(output.name, "auto") if isinstance(stated, Mapping) else stated
        if task == CUSTOM:
            targets.append(_unchecked(output, label))
            continue
        inferred = task == "auto"
        if inferred:
            task = _auto(output, label)
            if task is None:
                raise _mismatch(output, label, None)
        classes = output.shape[-1] if output.shape else 1
        sparse = (
            task == "classification" and _sparse_fits(label.shape, output.shape) and classes != 1
        )
        fits = sparse or _fits(label.shape, output.shape)
        if task == "classification" and (classes is None or classes < 2):
            raise TargetError(
                f"output {output.name!r} has shape {_shape(output.shape)}: classification needs one unit per class "
                "(2 or more). Fix: for two classes with one unit set train.task: binary, or widen the output layer."
            )
        if task == "binary" and classes != 1:
            fits = False
        if not fits:
            raise _mismatch(output, label, task)
        if output.activation == "softmax" and classes == 1:
            raise TargetError(
                f"output {output.name!r} is a softmax over one unit, which is 1.0 whatever the input. Fix: end the "
                "model with Dense(1, activation='sigmoid') or Dense(1) (a logit) for a binary task, or one unit per "
                "class with softmax."
            )
        if output.activation == "sigmoid" and sparse:
            raise TargetError(
                f"output {output.name!r} has a sigmoid over {classes} units but the labels are class ids. Fix: use "
                "softmax or no activation (logits) for one class per example, or give 0/1 labels per class "
                "(multi_label)."
            )
        if task == "regression":
            from_logits = False
        elif task == "classification":
            from_logits = output.activation != "softmax"
        else:
            from_logits = not _probabilities(output.activation)
        target = Target(
            output=output.name,
            task=task,
            sparse=sparse,
            from_logits=from_logits,
            classes=int(classes or 1),
            weight_rank=max(len(output.shape) - 1, 0),
            inferred=inferred,
            label=label,
            expand_label=not sparse and label.shape + (1,) == output.shape,
            activation=output.activation,
        )
        _check_values(target, label, fix_classes)
        targets.append(target)
    return targets
