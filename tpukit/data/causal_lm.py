"""Text for a KerasHub causal LM, tokenized in tf.data by the preset's own preprocessor.

    keras_hub_text("train", preset="gemma_2b_en", sequence_length=256)            # the built-in examples
    keras_hub_text("train", preset=..., format="jsonl", files="data/*.jsonl")    # {"prompt", "response"} per line
    dataset(preprocessor, prompts=[...], responses=[...])                        # lists from Python

Each example is `(x, y, sample_weight)` as KerasHub's `CausalLMPreprocessor` gives them: `x = {"token_ids",
"padding_mask"}` of `sequence_length` tokens, `y` the next tokens, `sample_weight` the padding mask of `y`. Plain
text goes through the preprocessor itself. A prompt/response pair is packed as the preprocessor packs a text (start
token, prompt, response, end token, padded or truncated to `sequence_length + 1`, shifted), and its weight is 1 only
where `y` is a response token or the end token: the loss is the response's (KerasHub 0.32's generic preprocessor has
no prompts and responses; Gemma 3's masks the same way). Examples are padded or truncated (the end cut), never packed
together.

The built-in examples (`builtin_examples`) are prompt/response pairs of small sums and differences ("what is 3 plus
4 ?" -> "7"), made here: the offline default of the LoRA recipes, as digits is the CNN recipe's.
"""

from __future__ import annotations

import glob
import json
import logging
import os

import tensorflow as tf

from tpukit.data.pipeline import shard
from tpukit.environment import presets

logger = logging.getLogger("tpukit")

NUMBERS = range(10)
FORMATS = ("builtin", "jsonl", "text", "tfds")
TEST_EVERY = 5  # builtin, jsonl and text: every 5th example (in file order) is the test split
_SAID: set = (
    set()
)  # the data lines logged by this process: once each, though a run reads a split several times


def builtin_examples() -> list[tuple[str, str]]:
    """(prompt, response) pairs: every `a plus b` and `a minus b` (a >= b) for single digits, in a fixed order."""
    examples = []
    for a in NUMBERS:
        for b in NUMBERS:
            examples.append((f"what is {a} plus {b} ?", str(a + b)))
            if a >= b:
                examples.append((f"what is {a} minus {b} ?", str(a - b)))
    return examples


def builtin_texts() -> list[str]:
    """Every prompt and response of `builtin_examples`, one string each (what a tiny preset's vocabulary covers)."""
    return [text for pair in builtin_examples() for text in pair]


def keras_hub_text(
    split: str = "train",
    input_context: tf.distribute.InputContext | None = None,
    preset: str | None = None,
    sequence_length: int | None = None,
    format: str = "builtin",  # noqa: A002 - the recipe key
    files: str | None = None,
    prompt_key: str = "prompt",
    response_key: str = "response",
    text_key: str | None = None,
    name: str | None = None,
) -> tf.data.Dataset:
    """One split of text for the preset's causal LM, as `(x, y, sample_weight)` (see the module docstring).

    Args:
        split: `train` or `test` (every 5th example, in file order, is `test`); for `tfds`, the TFDS split name.
        preset: the KerasHub preset whose preprocessor tokenizes; a recipe's `model.preset` when unset.
        sequence_length: tokens per example; a recipe's `model.sequence_length` when unset.
        format: `builtin` (the sums and differences above), `jsonl` (`files`: a glob; one JSON object per line with
            `prompt_key` and `response_key`, or `text_key` for plain text), `text` (`files`; one example per
            non-empty line) or `tfds` (`name`; `text_key`, or `prompt_key` and `response_key`).
    """
    if preset is None or sequence_length is None:
        raise ValueError(
            f"keras_hub_text: preset and sequence_length are needed; received preset={preset!r}, "
            f"sequence_length={sequence_length!r}. Fix: set model.preset and model.sequence_length (a "
            "keras_hub_causal_lm model), or data.preset and data.sequence_length."
        )
    if format not in FORMATS:
        raise ValueError(
            f"keras_hub_text: format must be one of {', '.join(FORMATS)}; received {format!r}."
        )
    preprocessor = _preprocessor(preset, sequence_length)
    if format == "tfds":
        examples, kind = _tfds(name, split, prompt_key, response_key, text_key)
        logger.info(
            "tpukit: data keras_hub_text (tfds %s, %s): split %s, each example padded or truncated to "
            "sequence_length %d (no packing; lengths not counted)",
            name,
            kind,
            split,
            sequence_length,
        )
        return _tokenized(shard(examples, input_context), preprocessor, kind)
    if split not in ("train", "test"):
        raise ValueError(
            f"keras_hub_text: unknown split {split!r}; valid splits: train, test. Fix: data.train_split: train, "
            "data.eval_split: test."
        )
    rows = _rows(format, files, prompt_key, response_key, text_key)
    rows = [
        row
        for index, row in enumerate(rows)
        if (index % TEST_EVERY == TEST_EVERY - 1) == (split == "test")
    ]
    if not rows:
        raise ValueError(
            f"keras_hub_text: split {split!r} of {format} data is empty (every {TEST_EVERY}th example is test). "
            "Fix: more examples."
        )
    kind = "prompt/response" if isinstance(rows[0], tuple) else "text"
    said = (format, files, split, preset, sequence_length)
    if said in _SAID:
        return dataset(preprocessor, **_columns(rows), input_context=input_context)
    _SAID.add(said)
    longer = _longer(preprocessor, rows, sequence_length)
    logger.info(
        "tpukit: data keras_hub_text (%s, %s): %d examples of split %s, each padded or truncated to sequence_length "
        "%d (no packing); %d longer than that, truncated (the end cut)",
        format,
        kind,
        len(rows),
        split,
        sequence_length,
        longer,
    )
    return dataset(preprocessor, **_columns(rows), input_context=input_context)


def dataset(
    preprocessor,
    texts=None,
    prompts=None,
    responses=None,
    sequence_length: int | None = None,
    input_context: tf.distribute.InputContext | None = None,
) -> tf.data.Dataset:
    """`(x, y, sample_weight)` examples of `texts`, or of `prompts` and `responses` (lists of strings), tokenized by
    `preprocessor` (a KerasHub `CausalLMPreprocessor`, or a preset to load one from at `sequence_length`)."""
    if isinstance(preprocessor, str):
        if sequence_length is None:
            raise ValueError(
                "dataset: a preset needs sequence_length. Fix: e.g. sequence_length=256."
            )
        preprocessor = _preprocessor(preprocessor, sequence_length)
    if (texts is None) == (prompts is None):
        raise ValueError("dataset: pass texts, or prompts and responses (one of the two).")
    if prompts is not None:
        if responses is None or len(prompts) != len(responses):
            raise ValueError(
                f"dataset: prompts and responses must be lists of the same length; received {len(prompts)} prompts "
                f"and {None if responses is None else len(responses)} responses."
            )
        examples = tf.data.Dataset.from_tensor_slices((list(prompts), list(responses)))
        return _tokenized(shard(examples, input_context), preprocessor, "prompt/response")
    examples = tf.data.Dataset.from_tensor_slices(list(texts))
    return _tokenized(shard(examples, input_context), preprocessor, "text")


def _preprocessor(preset: str, sequence_length: int):
    import keras_hub

    if not isinstance(sequence_length, int) or sequence_length < 2:
        raise ValueError(
            f"keras_hub_text: sequence_length must be an integer >= 2; received {sequence_length!r}."
        )
    with presets.reading(preset, "model.preset (or data.preset)"):
        return keras_hub.models.CausalLMPreprocessor.from_preset(
            preset, sequence_length=sequence_length
        )


def _tokenized(examples: tf.data.Dataset, preprocessor, kind: str) -> tf.data.Dataset:
    """Batches of 64 through the tokenizer (KerasHub's layers take batches), then one example at a time again."""
    if kind == "text":
        batches = examples.batch(64).map(preprocessor, num_parallel_calls=tf.data.AUTOTUNE)
    else:
        batches = examples.batch(64).map(
            lambda p, r: _prompt_response(preprocessor, p, r), num_parallel_calls=tf.data.AUTOTUNE
        )
    return batches.unbatch()


def _prompt_response(preprocessor, prompts: tf.Tensor, responses: tf.Tensor):
    """KerasHub's packing (start, tokens, end; padded or truncated to sequence_length + 1; shifted by one) of
    prompt + response, with the weight 1 only on the response's tokens and the end token of `y`."""
    tokenizer = preprocessor.tokenizer
    length = preprocessor.sequence_length + 1
    prompt, response = tokenizer(prompts), tokenizer(responses)
    if not isinstance(
        prompt, tf.RaggedTensor
    ):  # a tokenizer of fixed length: its padding is not text
        raise ValueError(
            "keras_hub_text: the preset's tokenizer returns fixed-length tokens; it must not pad."
        )
    rows = prompt.nrows()
    parts, weights = [], []
    if preprocessor.add_start_token and tokenizer.start_token_id is not None:
        start = tf.fill([rows, 1], tf.cast(tokenizer.start_token_id, prompt.dtype))
        parts.append(tf.RaggedTensor.from_tensor(start))
        weights.append(tf.RaggedTensor.from_tensor(tf.zeros([rows, 1], tf.int32)))
    parts += [prompt, response]
    weights += [tf.zeros_like(prompt, tf.int32), tf.ones_like(response, tf.int32)]
    if preprocessor.add_end_token and tokenizer.end_token_id is not None:
        end = tf.fill([rows, 1], tf.cast(tokenizer.end_token_id, prompt.dtype))
        parts.append(tf.RaggedTensor.from_tensor(end))
        weights.append(tf.RaggedTensor.from_tensor(tf.ones([rows, 1], tf.int32)))
    tokens = tf.concat(parts, axis=1)
    pad = tokenizer.pad_token_id if getattr(tokenizer, "pad_token_id", None) is not None else 0
    token_ids = tokens.to_tensor(default_value=tf.cast(pad, tokens.dtype), shape=[None, length])
    real = tf.ones_like(tokens, tf.bool).to_tensor(default_value=False, shape=[None, length])
    weight = tf.concat(weights, axis=1).to_tensor(default_value=0, shape=[None, length])
    x = {"token_ids": token_ids[:, :-1], "padding_mask": real[:, :-1]}
    return x, token_ids[:, 1:], tf.cast(weight[:, 1:], tf.bool)


def _longer(preprocessor, rows: list, sequence_length: int) -> int:
    """How many examples have more tokens (start and end included) than sequence_length + 1."""
    tokenizer = preprocessor.tokenizer
    texts = [" ".join(row) if isinstance(row, tuple) else row for row in rows]
    tokens = tokenizer(
        tf.constant(texts)
    )  # eagerly, KerasHub returns lists (a RaggedTensor inside tf.data)
    lengths = (
        tokens.row_lengths().numpy() if hasattr(tokens, "row_lengths") else [len(t) for t in tokens]
    )
    return int(sum(int(n) + 2 > sequence_length + 1 for n in lengths))


def _columns(rows: list) -> dict:
    if isinstance(rows[0], tuple):
        return {"prompts": [p for p, _ in rows], "responses": [r for _, r in rows]}
    return {"texts": rows}


def _rows(format: str, files, prompt_key, response_key, text_key) -> list:  # noqa: A002
    if format == "builtin":
        return builtin_examples()
    paths = sorted(glob.glob(os.path.expanduser(files))) if files else []
    if not paths:
        raise ValueError(
            f"keras_hub_text: format {format} reads data.files, which matched no file; received files={files!r}. "
            "Fix: a glob of your files, e.g. --set data.files='data/*.jsonl'."
        )
    rows: list = []
    for path in paths:
        with open(path, encoding="utf-8") as file:
            for number, line in enumerate(file, 1):
                if not line.strip():
                    continue
                if format == "text":
                    rows.append(line.rstrip("\n"))
                    continue
                rows.append(_jsonl_row(line, path, number, prompt_key, response_key, text_key))
    kinds = {type(row) for row in rows}
    if len(kinds) > 1:
        raise ValueError(
            "keras_hub_text: the files mix prompt/response lines and plain-text lines. Fix: one kind per run."
        )
    return rows


def _jsonl_row(line: str, path: str, number: int, prompt_key, response_key, text_key):
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"keras_hub_text: {path} line {number} is not JSON ({error.msg}). Fix: one JSON object per line."
        ) from None
    if not isinstance(record, dict):
        raise ValueError(
            f"keras_hub_text: {path} line {number} is not a JSON object. Fix: one object per line."
        )
    if text_key is not None and text_key in record:
        return str(record[text_key])
    if prompt_key in record and response_key in record:
        return (str(record[prompt_key]), str(record[response_key]))
    wanted = f"{prompt_key!r} and {response_key!r}" + (f", or {text_key!r}" if text_key else "")
    raise ValueError(
        f"keras_hub_text: {path} line {number} has keys {sorted(record)}, not {wanted}. Fix: set "
        "data.prompt_key and data.response_key (or data.text_key) to your keys."
    )


def _tfds(name, split, prompt_key, response_key, text_key):
    import tensorflow_datasets as tfds

    if not name:
        raise ValueError(
            "keras_hub_text: format tfds needs data.name (a TFDS dataset). Fix: e.g. name: imdb_reviews."
        )
    examples = tfds.load(name, split=split)
    if text_key is not None:
        return examples.map(lambda e: e[text_key]), "text"
    return examples.map(lambda e: (e[prompt_key], e[response_key])), "prompt/response"
