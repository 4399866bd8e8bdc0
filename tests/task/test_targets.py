"""`tpukit.task.targets.decide`: the task of each output from the model and the labels, or as stated, and the
model/label pairs refused with a fix (pure: no TensorFlow)."""

import pytest

from tpukit.task.targets import LabelFacts, OutputFacts, TargetError, decide


def ints(shape=(), low=0, high=9, n=100):
    return LabelFacts(shape, "int64", n, low, high, True, high <= 1 and low >= 0)


def floats(shape=(), low=0.0, high=1.0, binary=False, rows=False, integral=False, n=100):
    return LabelFacts(shape, "float32", n, low, high, integral, binary, rows)


def out(shape, activation=None, name="output"):
    return OutputFacts(name, shape, activation)


@pytest.mark.parametrize(
    "output, label, task, sparse, from_logits, weight_rank",
    [
        (out((10,)), ints(), "classification", True, True, 0),  # class ids, logits
        (
            out((10,), "softmax"),
            ints((1,)),
            "classification",
            True,
            False,
            0,
        ),  # (B, 1) ids, probabilities
        (
            out((64, 256)),
            ints((64,), high=255),
            "classification",
            True,
            True,
            1,
        ),  # a language model, per token
        (
            out((10,), "softmax"),
            floats((10,), rows=True, binary=True),
            "classification",
            False,
            False,
            0,
        ),  # one-hot
        (
            out((10,)),
            floats((10,), rows=True),
            "classification",
            False,
            True,
            0,
        ),  # soft labels, logits
        (out((1,), "sigmoid"), ints(high=1), "binary", False, False, 0),  # the X-ray model
        (out((1,)), ints((1,), high=1), "binary", False, True, 0),  # one logit
        (out((1,)), floats(binary=True, integral=True), "binary", False, True, 0),  # 0.0/1.0 labels
        (out((5,), "sigmoid"), floats((5,), binary=True), "multi_label", False, False, 0),
        (out((5,)), ints((5,), high=1), "multi_label", False, True, 0),  # multi-hot, logits
        (out((1,)), floats(low=-3.0, high=4.5), "regression", False, False, 0),
        (out((3,)), floats((3,), low=-1.0, high=2.0), "regression", False, False, 0),
    ],
)
def test_the_task_is_inferred_from_the_output_and_the_labels(
    output, label, task, sparse, from_logits, weight_rank
):
    (target,) = decide([output], label)
    assert (target.task, target.sparse, target.from_logits, target.weight_rank) == (
        task,
        sparse,
        from_logits,
        weight_rank,
    )
    assert target.inferred


def test_a_dense_one_unit_output_with_scalar_labels_gets_a_trailing_axis():
    (target,) = decide([out((1,))], floats(low=-2.0, high=3.0))
    assert target.task == "regression" and target.expand_label
    (target,) = decide([out((1,))], floats((1,), low=-2.0, high=3.0))
    assert not target.expand_label


def test_a_stated_task_overrides_the_inference_and_is_checked():
    (target,) = decide([out((1,))], floats(binary=True, integral=True), "regression")
    assert target.task == "regression" and not target.inferred
    with pytest.raises(
        TargetError, match=r"end the model with Dense\(1\).*or set train.task: multi_label"
    ):
        decide([out((4,))], ints((4,), high=1), "binary")
    with pytest.raises(TargetError, match="classification needs one unit per class"):
        decide([out((1,))], ints(high=1), "classification")


def test_outputs_pair_with_labels_by_name_or_order():
    outputs = [out((1,), name="priority"), out((4,), name="department")]
    labels = {"priority": floats((1,), low=-1.0, high=1.0), "department": ints(high=3)}
    priority, department = decide(outputs, labels)
    assert (priority.task, department.task) == ("regression", "classification")
    ordered = decide(
        outputs, (labels["priority"], labels["department"]), {"priority": "regression"}
    )
    assert [t.task for t in ordered] == ["regression", "classification"]
    with pytest.raises(
        TargetError, match=r"outputs are named \['priority', 'department'\].*no label for"
    ):
        decide(outputs, {"priority": labels["priority"]})
    with pytest.raises(TargetError, match=r"2 outputs .* one label tensor.*'priority': \.\.\."):
        decide(outputs, labels["priority"])
    with pytest.raises(TargetError, match=r"train.task names output\(s\) \['dept'\]"):
        decide(outputs, labels, {"dept": "classification"})


def test_labels_beyond_the_classes_or_the_range_of_their_task_are_refused_with_a_fix():
    with pytest.raises(
        TargetError,
        match=r"has 10 classes \(ids 0..9\) but the labels seen in 100 examples range over \[0, 12\]",
    ):
        decide([out((10,))], ints(high=12))
    with pytest.raises(TargetError, match=r"set model.num_classes to at least 13"):
        decide(
            [out((10,))],
            ints(high=12),
            fix_classes=lambda target, n: f"set model.num_classes to at least {n}",
        )
    with pytest.raises(TargetError, match=r"ids 0..9\) but .* range over \[-1, 3\]"):
        decide([out((10,))], ints(low=-1, high=3))
    with pytest.raises(
        TargetError, match=r"trained as binary \(labels in \[0, 1\]\) .*range over \[0, 2\]"
    ):
        decide([out((1,), "sigmoid")], ints(high=2))
    with pytest.raises(TargetError, match="labels hold fractions"):
        decide([out((10,))], floats(high=3.5), "classification")


def test_shapes_that_fit_no_task_are_refused_with_the_width_that_would():
    with pytest.raises(
        TargetError,
        match=r"shape \[8\] per example but the labels have shape \[10\].*Fix: make the model's output layer 10",
    ):
        decide([out((8,))], floats((10,), rows=True, binary=True))


def test_outputs_whose_activation_contradicts_the_task_are_refused():
    with pytest.raises(
        TargetError, match=r"softmax over one unit, which is 1.0 whatever the input"
    ):
        decide([out((1,), "softmax")], ints(high=1), "binary")
    with pytest.raises(TargetError, match=r"sigmoid over 3 units but the labels are class ids"):
        decide([out((3,), "sigmoid")], ints(high=2))
    # The multi_label fix is offered only where the labels have the output's shape.
    with pytest.raises(TargetError) as scalar_labels:
        decide([out((4,))], ints(high=1), "binary")
    assert "multi_label" not in str(scalar_labels.value)


def test_an_unread_activation_is_said_to_be_assumed_logits():
    (target,) = decide([out((3,), None)], ints(high=2))
    assert target.from_logits and "assumed" in target.describe()
    (target,) = decide([out((3,), "linear")], ints(high=2))
    assert "assumed" not in target.describe()
