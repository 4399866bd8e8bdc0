"""A KerasHub GemmaCausalLM fine-tuned through `tpukit.fit` on its preprocessor's `(x, y, sample_weight)` trains
as KerasHub's own `fit` does (issue 40: 5.111 instead of 3.616 when the padding mask was dropped). A tiny Gemma from
a config and a SentencePiece vocabulary trained here on a few sentences: no download."""

import io

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import tiny_gemma_backbone

import tpukit

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub is not installed: pip install -e '.[hub]' (.ci/run installs it)"
)
sentencepiece = pytest.importorskip("sentencepiece")

TEXTS = [
    f"the {a} cat sat on the {b} mat"
    for a in ("red", "big", "old", "shy")
    for b in ("blue", "flat", "new", "dry", "wet")
] * 2
LENGTH, BATCH, EPOCHS, SEED = 12, 8, 2, 3


def tokenizer():
    """A GemmaTokenizer over a word-level SentencePiece model of TEXTS (Gemma's special pieces included)."""
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS),
        model_writer=proto,
        vocab_size=22,
        model_type="WORD",
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        minloglevel=2,
    )
    return keras_hub.models.GemmaTokenizer(proto=proto.getvalue())


@pytest.fixture(scope="module")
def preprocessed():
    """The preprocessor's `(x, y, sample_weight)` for TEXTS: y the next tokens, the weight the padding mask."""
    preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer(), sequence_length=LENGTH)
    x, y, weight = keras.tree.map_structure(np.asarray, preprocessor(tf.constant(TEXTS)))
    assert (
        weight.shape == (len(TEXTS), LENGTH) and 0 < weight.mean() < 1
    )  # some positions are padding
    return x, y, weight


def gemma(vocabulary=22):
    keras.utils.set_random_seed(SEED)
    backbone = tiny_gemma_backbone(vocabulary)
    model = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        weighted_metrics=[keras.metrics.SparseCategoricalAccuracy()],
    )
    return model


class EpochLosses(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_epoch_end(self, epoch, logs=None):
        self.losses.append(float(logs["loss"]))

    def on_train_end(self, logs=None):
        self.trained = self.model  # the model as trained (tpukit evaluates it after training)


@pytest.mark.integration  # about 30 s: KerasHub's import and two small trainings
def test_gemma_fine_tuned_on_the_preprocessors_sample_weights_matches_keras_hub_fit(
    tmp_path, preprocessed
):
    plain = EpochLosses()
    gemma().fit(
        tf.data.Dataset.from_tensor_slices(preprocessed).batch(BATCH),
        epochs=EPOCHS,
        verbose=0,
        callbacks=[plain],
    )

    def dataset_fn(split):
        return tf.data.Dataset.from_tensor_slices(preprocessed)

    mine = EpochLosses()
    metrics = tpukit.fit(
        gemma,
        dataset_fn=dataset_fn,
        validation_data=True,
        epochs=EPOCHS,
        batch_size=BATCH,
        output_dir=str(tmp_path / "gemma"),
        shuffle_buffer=1,
        deterministic=True,
        verbose=0,
        callbacks=[mine],
    )
    assert metrics["status"] == "done"
    np.testing.assert_allclose(mine.losses, plain.losses, rtol=1e-5)
    # Trained on the padding too (the weights dropped), the loss is another: the 5.111 against 3.616.
    x, y, _ = preprocessed
    padded = EpochLosses()
    gemma().fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH),
        epochs=EPOCHS,
        verbose=0,
        callbacks=[padded],
    )
    assert abs(padded.losses[0] - plain.losses[0]) > 0.05
    # Evaluation counts only the real tokens: the weighted accuracy is the trained model's over them.
    x, y, weight = preprocessed
    logits = mine.trained.predict(x, verbose=0)
    accuracy = float(np.sum((logits.argmax(-1) == y) * weight) / np.sum(weight))
    assert metrics["eval"]["sparse_categorical_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    # And the loss is KerasHub's (`sum_over_batch_size`: the weighted sum over every position) in one batch.
    per_token = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    assert metrics["eval"]["loss"] == pytest.approx(
        float(np.sum(per_token * weight) / y.size), rel=1e-5
    )
