"""A KerasHub model built from a config (no weight download) trains through `tpukit.fit` (issue 18): keras-hub
0.32 installs beside tpukit's pinned Keras and TensorFlow (the `hub` extra)."""

import numpy as np
import pytest
from conftest import mirrored

import tpukit

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub is not installed: pip install -e '.[hub]' (.ci/run installs it)"
)

VOCABULARY, LENGTH = 100, 16


def classifier():
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=LENGTH,
    )
    return keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2, preprocessor=None)


def tokens(n, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCABULARY, (n, LENGTH)).astype("int32")
    lengths = rng.integers(4, LENGTH + 1, n)
    mask = (np.arange(LENGTH)[None, :] < lengths[:, None]).astype("int32")
    labels = (ids[:, 0] < VOCABULARY // 2).astype("int32")  # the first token decides the class
    features = {"token_ids": ids * mask, "segment_ids": np.zeros_like(ids), "padding_mask": mask}
    return features, labels


@pytest.mark.slow  # 13 s; .ci/run installs the hub extra and runs it
def test_a_keras_hub_classifier_from_a_config_trains_on_two_replicas_with_exact_eval(tmp_path):
    x, y = tokens(256, 0)
    vx, vy = tokens(
        101, 1
    )  # 101 examples: the last eval batch is completed with zero-weight examples
    metrics = tpukit.fit(
        classifier,
        x,
        y,
        validation_data=(vx, vy),
        epochs=6,
        batch_size=32,
        learning_rate=3e-3,
        output_dir=str(tmp_path / "bert"),
        strategy=mirrored(2),
        verbose=0,
    )
    assert metrics["status"] == "done" and metrics["eval_examples"] == 101
    # KerasHub's own compile (its loss) is kept, its metrics are compiled weighted: the accuracy reported is the
    # exported model's over exactly the 101 examples.
    model = tpukit.load_model(metrics["exported"]["keras"])
    logits = model.predict(vx, verbose=0)
    assert metrics["eval"]["sparse_categorical_accuracy"] == pytest.approx(
        np.mean(logits.argmax(-1) == vy), abs=1e-6
    )
    assert metrics["eval"]["sparse_categorical_accuracy"] > 0.7
