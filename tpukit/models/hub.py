"""A KerasHub causal language model from a preset, the way KerasHub's fine-tuning guides build one.

    model = keras_hub_causal_lm("gemma_2b_en", sequence_length=256)      # a Kaggle handle
    model = keras_hub_causal_lm("hf://Qwen/Qwen2.5-0.5B", sequence_length=512)
    model = keras_hub_causal_lm("/data/my_preset")                       # a local preset directory

The builder returns the task (`GemmaCausalLM`, `QwenCausalLM`, ...) with its own preprocessor (the preset's tokenizer
at `sequence_length`) and sampler, compiled as KerasHub compiles it. Like every builder it never sees a device: built
in the jax engine's distribution scope, each variable is created on the mesh with its layout and filled from the
preset's weights there (`tpukit.engines.jax.compat.sharded_assign`). LoRA is the recipe's `model.lora_rank` and
`model.lora_targets` (KerasHub's `backbone.enable_lora`, applied by `tpukit.task.finetune`).

`tiny_preset` writes a preset of a few thousand random weights with a word-level vocabulary of a few texts, saved
with KerasHub's own `save_to_preset`: what tests, the notebook and offline machines load instead of a download.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from typing import Any

import keras

from tpukit.environment import presets

logger = logging.getLogger("tpukit")

# The preset families `tiny_preset` makes, and the backbone settings of their tiny configurations: 4 query heads
# over 2 key/value heads (grouped-query attention, as the real presets), so a model axis of 4 leaves the key/value
# projections unsplit.
TINY_FAMILIES = {
    "gemma": dict(
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        head_dim=8,
    ),
    "qwen": dict(
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
    ),
}
# The words of tpukit.data.causal_lm's built-in examples ("what is 3 plus 4 ?" -> "7"), the default vocabulary of a
# tiny preset (written out here: models do not import the data layer; tests/models keep the two equal).
TINY_WORDS = ("what", "is", "plus", "minus", "?", *(str(n) for n in range(19)))
SAMPLERS = ("greedy", "top_k", "top_p", "random", "beam", "contrastive")


def keras_hub_causal_lm(
    preset: str,
    sequence_length: int = 256,
    dtype: str | None = None,
    load_weights: bool = True,
    backbone: dict[str, Any] | None = None,
    sampler: str = "greedy",
    remat: bool = False,
):
    """The preset's causal LM task, with its preprocessor at `sequence_length` and its compile.

    Args:
        preset: a KerasHub preset: a Kaggle handle (`gemma_2b_en`, `kaggle://keras/gemma/keras/gemma_2b_en`), a
            Hugging Face one (`hf://google/gemma-2b`) or a local directory written by `save_to_preset`.
        sequence_length: tokens per example; the preprocessor pads or truncates to it (`data.sequence_length` of a
            `keras_hub_text` source defaults to it).
        dtype: the backbone's dtype policy (`float32`, `bfloat16`, `mixed_bfloat16`); null: the run's precision.
        load_weights: read the preset's weights; false builds the architecture with fresh weights (what
            `tpukit check --topology` compiles: no weight is read).
        backbone: backbone config keys to change (`num_layers: 28`, ...), only with `load_weights: false`: a model of
            another size with the preset's tokenizer, for `tpukit check`.
        sampler: the sampler `generate` uses (KerasHub's names: greedy, top_k, top_p, random, beam, contrastive).
        remat: rematerialize each decoder block (Keras' `RematScope` over the backbone's `transformer_layers`): the
            backward pass recomputes a block's activations instead of keeping them, for about one more forward
            pass of compute. The same losses; the jax engine only (TensorFlow's `recompute_grad` refuses the
            blocks' keyword arguments in a compiled step).

    Returns:
        The KerasHub `CausalLM` subclass of the preset's family, built, its preprocessor attached.
    """
    keras_hub = _keras_hub("model.name=keras_hub_causal_lm")
    if not isinstance(preset, str) or not preset:
        raise ValueError(
            f"keras_hub_causal_lm: preset must be a KerasHub preset handle or directory; received {preset!r}. "
            "Fix: e.g. preset: gemma_2b_en, or a directory written by save_to_preset."
        )
    if sequence_length < 2:
        raise ValueError(
            f"keras_hub_causal_lm: sequence_length must be >= 2 (a token and its next); received {sequence_length}."
        )
    if sampler not in SAMPLERS:
        raise ValueError(
            f"keras_hub_causal_lm: sampler must be one of {', '.join(SAMPLERS)}; received {sampler!r}."
        )
    overrides = dict(backbone or {})
    if overrides and load_weights:
        raise ValueError(
            f"keras_hub_causal_lm: backbone={overrides} changes the preset's architecture, whose weights then do "
            "not fit it. Fix: set load_weights: false as well (tpukit check does), or leave backbone unset."
        )
    if not isinstance(remat, bool):
        raise ValueError(
            f"keras_hub_causal_lm: remat must be true or false; received {remat!r}. Fix: remat: true."
        )
    if remat and keras.backend.backend() != "jax":
        raise ValueError(
            f"keras_hub_causal_lm: remat=true needs the jax engine; this is Keras' {keras.backend.backend()} "
            "backend, whose recompute_grad refuses the decoder blocks' keyword arguments in a compiled step. "
            "Fix: --set runtime.engine=jax, or leave model.remat unset."
        )
    with presets.reading(preset, "model.preset"):
        built = _backbone(keras_hub, preset, load_weights, dtype, overrides, remat)
        preprocessor = keras_hub.models.CausalLMPreprocessor.from_preset(
            preset, sequence_length=sequence_length
        )
    task = task_class(type(built))(backbone=built, preprocessor=preprocessor)
    task.compile(
        sampler=sampler
    )  # KerasHub's own compile (its loss and weighted accuracy), with the sampler
    return task


def _backbone(keras_hub, preset: str, load_weights: bool, dtype, overrides: dict, remat: bool):
    """The preset's backbone; with `remat` (checked by the caller), its decoder blocks built under a `RematScope`
    that names them."""
    names = _block_names(preset, overrides) if remat else []
    scope = keras.RematScope(mode="list_of_layers", layer_names=names) if remat else None
    with scope or contextlib.nullcontext():
        built = keras_hub.models.Backbone.from_preset(
            preset, load_weights=load_weights, **({"dtype": dtype} if dtype else {}), **overrides
        )
    if remat:
        _check_rematerialized(built, names)
        logger.info(
            "tpukit: model.remat: the %d decoder blocks of %s are rematerialized (recomputed in the backward "
            "pass, not kept)",
            len(built.transformer_layers),
            type(built).__name__,
        )
    return built


def _preset_config(preset: str) -> dict:
    """The preset's `config.json` (a download of that file only, for a handle), read as KerasHub's loaders read it."""
    from keras_hub.src.utils import preset_utils

    return preset_utils.load_json(preset, preset_utils.CONFIG_FILE)


# The names KerasHub's causal LM backbones give their decoder blocks: `decoder_block_{i}` (Gemma, Gemma 3),
# `transformer_layer_{i}` (Llama, Mistral, Qwen, GPT-2, ...).
_BLOCK_NAMES = ("decoder_block_{}", "transformer_layer_{}")


def _block_names(preset: str, overrides: dict) -> list[str]:
    """The names the backbone `from_preset` builds will give its decoder blocks, from the preset's config (and
    `backbone` overrides): what `RematScope(mode="list_of_layers")` rematerializes. Not `mode="full"` on the whole
    task: that remats the task's own call too, which fails to trace in Keras 3.15 ("'str' object has no attribute
    '_error_repr'")."""
    config = _preset_config(preset)
    # A Keras preset's backbone config, or a Transformers config.json (hf:// handles, a run's safetensors/).
    found = [
        value
        for value in (
            overrides.get("num_layers"),
            config.get("config", {}).get("num_layers"),
            config.get("num_hidden_layers"),
            config.get("n_layer"),
        )
        if isinstance(value, int) and not isinstance(value, bool)
    ]
    if not found:
        raise ValueError(
            f"keras_hub_causal_lm: remat=true could not read the number of decoder blocks from {preset!r}'s "
            "config.json (no num_layers, num_hidden_layers or n_layer). Fix: leave model.remat unset for this preset."
        )
    return [pattern.format(i) for pattern in _BLOCK_NAMES for i in range(found[0])]


def _check_rematerialized(backbone, names: list[str]) -> None:
    """Every decoder block was built under the scope's names (a family naming its blocks otherwise would be
    rematerialized nowhere, silently, as a LayoutMap key that matches nothing)."""
    blocks = getattr(backbone, "transformer_layers", None) or []
    if not blocks or any(block.name not in names for block in blocks):
        raise ValueError(
            f"keras_hub_causal_lm: remat=true found no decoder blocks named decoder_block_N or transformer_layer_N "
            f"in {type(backbone).__name__} (its transformer_layers: {[block.name for block in blocks][:4]}), so "
            "nothing would be rematerialized. Fix: leave model.remat unset for this family."
        )


def task_class(backbone_cls: type):
    """The KerasHub `CausalLM` subclass whose backbone is `backbone_cls` (`GemmaCausalLM` for `GemmaBackbone`)."""
    keras_hub = _keras_hub("model.name=keras_hub_causal_lm")
    found = [
        cls
        for cls in vars(keras_hub.models).values()
        if isinstance(cls, type)
        and issubclass(cls, keras_hub.models.CausalLM)
        and getattr(cls, "backbone_cls", None) is backbone_cls
    ]
    if not found:
        raise ValueError(
            f"keras_hub_causal_lm: {backbone_cls.__name__} has no causal LM task in KerasHub "
            f"{keras_hub.__version__} (no CausalLM subclass names it as its backbone). Fix: a preset of a text "
            "generation family (Gemma, Llama, Mistral, Qwen, ...)."
        )
    return min(found, key=lambda cls: len(cls.__mro__))  # the family's own, not a subclass of it


def backbone_class(preset: str):
    """The preset's backbone class, read from its `config.json` (a download of that file only, for a handle)."""
    keras_hub = _keras_hub("model.name=keras_hub_causal_lm")
    with presets.reading(preset, "model.preset"):
        config = _preset_config(preset)
    cls = keras.saving.get_registered_object(config.get("registered_name") or "")
    if cls is None:
        cls = getattr(keras_hub.models, config.get("class_name", ""), None)
    return cls


def layout_map_builder(preset: str):
    """The family's `get_layout_map` (e.g. `GemmaBackbone.get_layout_map`), or None where KerasHub has none."""
    cls = backbone_class(preset)
    return getattr(cls, "get_layout_map", None) if cls is not None else None


def tiny_preset(
    directory: str,
    family: str = "gemma",
    texts: list[str] | None = None,
    sequence_length: int = 64,
    seed: int = 0,
    **backbone,
) -> str:
    """Writes a tiny KerasHub preset of `family` ("gemma" or "qwen") to `directory` with `save_to_preset` and
    returns the directory: random weights (`keras.utils.set_random_seed(seed)`), a word-level vocabulary of
    `texts` (default: `TINY_WORDS`, the words of `tpukit.data.causal_lm`'s built-in examples), the backbone settings of
    `TINY_FAMILIES[family]` updated by `backbone`. It loads with `from_preset(directory)` as a download would."""
    keras_hub = _keras_hub("tiny_preset")
    if family not in TINY_FAMILIES:
        raise ValueError(
            f"tiny_preset: family must be one of {', '.join(TINY_FAMILIES)}; received {family!r}."
        )
    if texts is None:
        texts = [" ".join(TINY_WORDS)] * 2
    tokenizer = _gemma_tokenizer(texts) if family == "gemma" else _qwen_tokenizer(texts)
    keras.utils.set_random_seed(seed)
    settings = {**TINY_FAMILIES[family], **backbone}
    if family == "gemma":
        net = keras_hub.models.GemmaBackbone(
            vocabulary_size=tokenizer.vocabulary_size(), **settings
        )
        preprocessor = keras_hub.models.GemmaCausalLMPreprocessor(
            tokenizer, sequence_length=sequence_length
        )
        task = keras_hub.models.GemmaCausalLM(backbone=net, preprocessor=preprocessor)
    else:
        net = keras_hub.models.QwenBackbone(vocabulary_size=tokenizer.vocabulary_size(), **settings)
        preprocessor = keras_hub.models.QwenCausalLMPreprocessor(
            tokenizer, sequence_length=sequence_length
        )
        task = keras_hub.models.QwenCausalLM(backbone=net, preprocessor=preprocessor)
    os.makedirs(directory, exist_ok=True)
    task.save_to_preset(directory)
    return directory


def _gemma_tokenizer(texts: list[str]):
    """A `GemmaTokenizer` over a word-level SentencePiece model of `texts`, Gemma's special pieces included."""
    import keras_hub
    import sentencepiece

    words = sorted({word for text in texts for word in text.split()})
    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=proto,
        vocab_size=len(words)
        + 10,  # the words, 4 special pieces, 2 turn markers with and without "▁"
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
        hard_vocab_limit=False,  # else a few words of a tiny corpus are dropped for <unk>
        minloglevel=2,
    )
    return keras_hub.models.GemmaTokenizer(proto=proto.getvalue())


def _qwen_tokenizer(texts: list[str]):
    """A `QwenTokenizer` (byte-level BPE) whose vocabulary is `<|endoftext|>`, every byte character of `texts` and
    each whole word of `texts` (with its leading space), merged character by character."""
    import keras_hub

    space = "\u0120"  # byte-level BPE's character for " " (GPT-2's bytes_to_unicode)
    words = sorted({word for text in texts for word in text.split()})
    vocabulary = {"<|endoftext|>": 0}
    merges: list[str] = []

    def add(token: str) -> None:
        vocabulary.setdefault(token, len(vocabulary))

    for char in sorted({c for word in words for c in word} | {space}):
        add(char)
    for word in words:
        for piece in (word, space + word):
            token = piece[0]
            for char in piece[1:]:
                merge = f"{token} {char}"
                if token + char not in vocabulary:
                    merges.append(merge)
                add(token + char)
                token += char
    return keras_hub.models.QwenTokenizer(vocabulary=vocabulary, merges=merges)


def _keras_hub(what: str):
    try:
        import keras_hub
    except ImportError:
        raise ImportError(
            f"{what} needs KerasHub, which is not installed. Fix: pip install 'tpukit[hub]' (keras-hub 0.32)."
        ) from None
    return keras_hub


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as file:
        return json.load(file)
