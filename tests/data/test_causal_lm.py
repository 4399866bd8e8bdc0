"""keras_hub_text: text for a KerasHub causal LM, tokenized by a tiny preset's own preprocessor (made here: no
download). Plain text is exactly KerasHub's preprocessing; prompt/response weighs the response and end token only."""

import json

import numpy as np
import pytest
import tensorflow as tf

import tpukit
from tpukit.data import causal_lm

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub is not installed: pip install -e '.[hub]'"
)
pytest.importorskip("sentencepiece")
LENGTH = 16


@pytest.fixture(scope="module")
def preset(tmp_path_factory):
    from tpukit.models.hub import tiny_preset

    return tiny_preset(str(tmp_path_factory.mktemp("presets") / "gemma"), "gemma")


@pytest.fixture(scope="module")
def preprocessor(preset):
    return keras_hub.models.CausalLMPreprocessor.from_preset(preset, sequence_length=LENGTH)


def test_plain_text_is_exactly_keras_hubs_preprocessing(preprocessor):
    texts = ["what is 3 plus 4 ?", "7"]
    mine = list(causal_lm.dataset(preprocessor, texts=texts).batch(2))[0]
    theirs = preprocessor(tf.constant(texts))
    for a, b in zip(tf.nest.flatten(mine), tf.nest.flatten(theirs), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_prompt_response_pair_weighs_only_the_response_and_the_end_token(preprocessor):
    tokenizer = preprocessor.tokenizer
    x, y, weight = next(
        iter(causal_lm.dataset(preprocessor, prompts=["what is 3 plus 4 ?"], responses=["7"]))
    )
    prompt = list(np.asarray(tokenizer("what is 3 plus 4 ?")))
    response = list(np.asarray(tokenizer("7")))
    tokens = [tokenizer.start_token_id, *prompt, *response, tokenizer.end_token_id]
    assert list(np.asarray(x["token_ids"])[: len(tokens)]) == tokens
    assert list(np.asarray(y)[: len(tokens) - 1]) == tokens[1:]
    expected = [0] * (len(prompt)) + [1] * (
        len(response) + 1
    )  # y: prompt after start, response, end
    assert list(np.asarray(weight).astype(int)) == expected + [0] * (LENGTH - len(expected))
    assert int(np.asarray(x["padding_mask"]).sum()) == len(
        tokens
    )  # as KerasHub: the end token is real in x
    assert x["token_ids"].shape == (LENGTH,) and y.shape == (LENGTH,)


def test_the_recipe_takes_the_models_preset_and_sequence_length(preset):
    recipe = tpukit.load_recipe("gemma_lora", [f"model.preset={preset}"])
    assert recipe.data.options["preset"] == preset and recipe.data.options["sequence_length"] == 64
    train = causal_lm.keras_hub_text("train", **recipe.data.options)
    test = causal_lm.keras_hub_text("test", **recipe.data.options)
    assert (len(list(train)), len(list(test))) == (
        124,
        31,
    )  # every 5th of the 155 built-in examples is test


def test_jsonl_files_and_a_line_without_the_keys(preset, tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text(
        "\n".join(
            json.dumps({"prompt": f"what is {n} plus 1 ?", "response": str(n + 1)})
            for n in range(10)
        )
    )
    examples = causal_lm.keras_hub_text(
        "test", preset=preset, sequence_length=LENGTH, format="jsonl", files=str(good)
    )
    assert len(list(examples)) == 2
    bad = tmp_path / "b.jsonl"
    bad.write_text(json.dumps({"question": "what is 1 plus 1 ?", "answer": "2"}) + "\n")
    with pytest.raises(
        ValueError, match=r"b.jsonl line 1 has keys \['answer', 'question'\].*prompt_key"
    ):
        causal_lm.keras_hub_text(
            "train", preset=preset, sequence_length=LENGTH, format="jsonl", files=str(bad)
        )
    with pytest.raises(ValueError, match="matched no file"):
        causal_lm.keras_hub_text(
            "train",
            preset=preset,
            sequence_length=LENGTH,
            format="jsonl",
            files=str(tmp_path / "none*.jsonl"),
        )


def test_a_preset_that_is_not_there_is_named_with_the_fix(tmp_path):
    """The data source reads the preset first (before the model is built): a missing one is the recipe's key and the
    fix (tests/environment/test_presets.py: no network, no credentials), exit 2 with no traceback."""
    from tpukit.recipe import RecipeError
    from tpukit.task import count_data

    missing = str(tmp_path / "no_such_preset")
    recipe = tpukit.load_recipe("gemma_lora", [f"model.preset={missing}"])
    with pytest.raises(RecipeError) as raised:
        count_data(recipe, evaluating=True)
    assert (
        f"data: model.preset (or data.preset): {missing!r} is not a KerasHub preset directory"
        in str(raised.value)
    )
