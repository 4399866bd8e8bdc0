"""`model.lora_rank` on a KerasHub model means KerasHub's own `backbone.enable_lora(rank)` (issue 40, item 5): the
query/value layers adapted and the rest of the backbone frozen, not every Dense/EinsumDense. Tiny models built
from configs: nothing is downloaded."""

import logging
import types

import keras
import pytest
from helpers import tiny_gemma_backbone

from tpukit.recipe import RecipeError
from tpukit.task import finetune

keras_hub = pytest.importorskip(
    "keras_hub", reason="keras-hub is not installed: pip install -e '.[hub]' (.ci/run installs it)"
)


def gemma():
    keras.utils.set_random_seed(0)
    return tiny_gemma_backbone(64, num_layers=2)


def bert_classifier():
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=64,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=8,
    )
    return keras_hub.models.BertTextClassifier(backbone=backbone, num_classes=2, preprocessor=None)


def _functional(task):
    return keras.Model(task.input, task.output)


def lora(rank, **keys):
    return types.SimpleNamespace(lora_rank=rank, **keys)


def trainable(model) -> list[str]:
    return sorted(variable.path for variable in model.trainable_weights)


@pytest.mark.parametrize(
    "make, backbone_of",
    [
        pytest.param(gemma, lambda model: model, id="backbone"),
        pytest.param(
            lambda: keras_hub.models.GemmaCausalLM(backbone=gemma(), preprocessor=None),
            lambda task: task.backbone,
            id="causal_lm",
        ),
        pytest.param(bert_classifier, lambda task: task.backbone, id="classifier_with_head"),
        pytest.param(  # a backbone inside a functional model (as tpukit re-wraps a task today)
            lambda: _functional(
                keras_hub.models.GemmaCausalLM(backbone=gemma(), preprocessor=None)
            ),
            lambda model: next(x for x in model.layers if isinstance(x, keras_hub.models.Backbone)),
            id="inside_a_functional_model",
        ),
    ],
)
def test_lora_rank_trains_what_keras_hub_enable_lora_trains(make, backbone_of, caplog):
    plain = make()
    backbone_of(plain).enable_lora(2)
    model = make()
    with caplog.at_level(logging.INFO, logger="tpukit"):
        assert finetune.prepare(model, lora(2), resuming=False) is model
    assert trainable(model) == trainable(plain)
    adapted = [v for v in trainable(model) if "lora_kernel" in v]
    assert adapted and all(("query" in v or "value" in v) for v in adapted)
    # KerasHub's own bookkeeping is set, so backbone.save_lora_weights works on the trained model
    assert backbone_of(model)._lora_enabled_layers == backbone_of(plain)._lora_enabled_layers
    assert (
        "LoRA on" in caplog.text
        and "enable_lora(2) (the rest of the backbone frozen)" in caplog.text
    )


def test_gemma_adapts_query_and_value_only(caplog):
    model = gemma()
    with caplog.at_level(logging.INFO, logger="tpukit"):
        finetune.prepare(model, lora(4), resuming=False)
    # 2 blocks x (query, value) x (lora_kernel_a, lora_kernel_b); the embedding, norms and other kernels frozen
    assert len(model.trainable_weights) == 8
    assert "model.lora_rank=4: LoRA on 4 layer(s) (" in caplog.text
    for block in (0, 1):
        for name in ("query", "value"):
            assert f"decoder_block_{block}/attention/{name}" in caplog.text
    assert "/key" not in caplog.text and "ffw" not in caplog.text


def test_a_freeze_that_covers_a_layer_keras_hub_adapts_is_an_error():
    with pytest.raises(
        RecipeError,
        match=r"freezes decoder_block_0/attention/\w+, decoder_block_0/attention/\w+, which KerasHub.*Fix: leave",
    ):
        finetune.prepare(gemma(), lora(2, freeze=["^decoder_block_0$"]), resuming=False)


def test_lora_enabled_by_the_builder_already_is_an_error():
    model = gemma()
    model.enable_lora(2)
    with pytest.raises(
        RecipeError, match=r"LoRA is already enabled on the backbone.*lora_rank: null"
    ):
        finetune.prepare(model, lora(2), resuming=False)


def test_a_model_without_a_keras_hub_backbone_keeps_every_dense_adapted():
    inputs = keras.Input((4,))
    model = keras.Model(
        inputs, keras.layers.Dense(2, name="head")(keras.layers.Dense(8, name="hidden")(inputs))
    )
    finetune.prepare(model, lora(2), resuming=False)
    assert model.get_layer("hidden").lora_enabled and model.get_layer("head").lora_enabled
