"""tpukit.notebook.sampling: the window it feeds the model, greedy and temperature draws, and text from a trained causal_lm."""

import math

import keras
import numpy as np
import pytest

from tpukit import models
from tpukit.notebook import sampling


class NextOfLast:
    """A fake LM whose logits at position t say "token[t] + 1 (mod vocab)", recording every window it sees."""

    def __init__(self, length=4, vocab=5):
        self.length, self.vocab, self.windows = length, vocab, []

    def __call__(self, ids):
        ids = np.asarray(ids)
        self.windows.append(ids[0].tolist())
        logits = np.zeros((1, self.length, self.vocab), np.float32)
        logits[0, np.arange(self.length), (ids[0] + 1) % self.vocab] = 10.0
        return logits


def test_greedy_reads_the_last_real_position_of_a_right_padded_then_sliding_window():
    model = NextOfLast()
    tokens = sampling.sample(model, [1], num_tokens=6, sequence_length=4, pad_id=0)
    assert tokens.tolist() == [2, 3, 4, 0, 1, 2]
    assert model.windows == [
        [1, 0, 0, 0],
        [1, 2, 0, 0],
        [1, 2, 3, 0],
        [1, 2, 3, 4],  # full: from here on the window slides over the last 4 tokens
        [2, 3, 4, 0],
        [3, 4, 0, 1],
    ]


def test_a_prompt_longer_than_the_window_keeps_its_end():
    model = NextOfLast()
    assert sampling.sample(model, [1, 2, 3, 4, 1, 2], 1, sequence_length=4).tolist() == [3]
    assert model.windows == [[3, 4, 1, 2]]


def constant(logits):
    logits = np.asarray(logits, np.float32)
    return lambda ids: np.broadcast_to(logits, (1, np.asarray(ids).shape[1], len(logits)))


@pytest.mark.parametrize("temperature", [1.0, 2.0, 0.5])
def test_temperature_draws_follow_softmax_of_logits_over_temperature(temperature):
    logits = [0.0, math.log(2.0), math.log(4.0)]
    draws = sampling.sample(
        constant(logits), [0], 6000, temperature=temperature, seed=1, sequence_length=3
    )
    expected = np.exp(np.asarray(logits) / temperature)
    expected /= expected.sum()
    observed = np.bincount(draws, minlength=3) / len(draws)
    np.testing.assert_allclose(observed, expected, atol=0.02)


def test_same_seed_same_draws_and_greedy_is_the_argmax():
    model = constant([0.1, 0.3, 0.2, 0.25])
    first = sampling.sample(model, [0], 50, temperature=1.0, seed=7, sequence_length=2)
    assert (
        first.tolist()
        == sampling.sample(model, [0], 50, temperature=1.0, seed=7, sequence_length=2).tolist()
    )
    assert (
        first.tolist()
        != sampling.sample(model, [0], 50, temperature=1.0, seed=8, sequence_length=2).tolist()
    )
    assert sampling.sample(model, [0], 5, sequence_length=2).tolist() == [1] * 5


def test_bad_arguments_name_the_value():
    model = constant([0.0, 1.0])
    with pytest.raises(ValueError, match="at least one token"):
        sampling.sample(model, [], 3, sequence_length=2)
    with pytest.raises(ValueError, match="received num_tokens=-1"):
        sampling.sample(model, [0], -1, sequence_length=2)
    for bad in (-0.5, float("nan")):
        with pytest.raises(ValueError, match="temperature must be a finite number >= 0"):
            sampling.sample(model, [0], 3, temperature=bad, sequence_length=2)
    with pytest.raises(ValueError, match="no static sequence length"):
        sampling.sample(model, [0], 3)
    with pytest.raises(ValueError, match=r"expected logits of shape \(1, 3, vocab\)"):
        sampling.sample(lambda ids: np.zeros((1, 2, 4)), [0], 1, sequence_length=3)
    classifier = models.small_cnn(input_shape=(8, 8, 1), num_classes=10)
    with pytest.raises(ValueError, match="predicts 10 tokens, not the 256 bytes"):
        sampling.generate_text(classifier, "x")


def test_right_padding_is_invisible_to_the_read_position_of_causal_lm():
    model = models.causal_lm(
        vocab_size=256, sequence_length=12, num_layers=1, hidden_dim=32, num_heads=2, mlp_dim=64
    )
    rng = np.random.default_rng(0)
    real = rng.integers(1, 256, size=5)
    padded = np.zeros((1, 12), np.int32)
    padded[0, :5] = real
    noisy = rng.integers(0, 256, size=(1, 12)).astype(np.int32)
    noisy[0, :5] = real
    a, b = model.predict_on_batch(padded), model.predict_on_batch(noisy)
    np.testing.assert_allclose(a[0, :5], b[0, :5], atol=1e-5)
    assert sampling.sample(model, real, 1).tolist() == [int(np.argmax(a[0, 4]))]


@pytest.mark.integration
def test_a_causal_lm_trained_on_a_repeating_text_continues_it_after_a_save_and_load(tmp_path):
    text = b"abcdefgh" * 64
    ids = np.frombuffer(text, np.uint8).astype(np.int32)
    length = 16
    starts = np.arange(0, len(ids) - length - 1)
    x = np.stack([ids[s : s + length] for s in starts])
    y = np.stack([ids[s + 1 : s + length + 1] for s in starts])
    keras.utils.set_random_seed(0)
    model = models.causal_lm(
        vocab_size=256, sequence_length=length, num_layers=1, hidden_dim=32, num_heads=2, mlp_dim=64
    )
    model.compile(
        keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    model.fit(x, y, batch_size=32, epochs=8, verbose=0)
    path = str(tmp_path / "lm.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    # 20 new bytes: past the 16-byte window, so the sliding path is exercised too.
    assert (
        sampling.generate_text(loaded, "cde", num_tokens=20) == "cde" + "fghabcdefghabcdefgha"[:20]
    )
    sampled = sampling.generate_text(loaded, "cde", num_tokens=20, temperature=0.3, seed=0)
    assert sampled.startswith("cde") and len(sampled) == 23
