"""Every registered model: shapes and dtypes, .keras round trip, one XLA train step, one mixed_bfloat16 step."""

import re

import keras
import numpy as np
import pytest

from tpukit.models import MODELS, causal_lm, resnet50, resnet_cifar, transformer_classifier, vit
from tpukit.models.layers import PositionEmbedding, SelfAttention, TransformerBlock

VOCAB = 50
# The smallest config of each registered model (resnet50 keeps its real depth and widths at 64x64).
TINY = {
    "small_cnn": dict(input_shape=(8, 8, 1), num_classes=3, filters=(4,), dense_units=8),
    "resnet_cifar": dict(depth=8, num_classes=3, input_shape=(16, 16, 3), width=4),
    "resnet50": dict(num_classes=3, input_shape=(64, 64, 3)),
    "transformer_classifier": dict(
        vocab_size=VOCAB,
        sequence_length=8,
        num_classes=3,
        num_layers=1,
        hidden_dim=16,
        num_heads=2,
        mlp_dim=32,
    ),
    "causal_lm": dict(
        vocab_size=VOCAB, sequence_length=8, num_layers=1, hidden_dim=16, num_heads=2, mlp_dim=32
    ),
    "vit": dict(
        input_shape=(16, 16, 3),
        num_classes=3,
        patch_size=4,
        num_layers=1,
        hidden_dim=16,
        num_heads=2,
        mlp_dim=32,
    ),
    "dcn_ranking": dict(
        tables={
            "user_id": {"vocabulary_size": 11, "embedding_dim": 4},
            "movie_id": {"vocabulary_size": 13, "embedding_dim": 4},
        },
        cross_layers=1,
        deep_units=(8,),
    ),
}
BATCH = 2
# The float32 output layer of each model whose head is not named "logits" (a regression score).
HEAD = {"dcn_ranking": "score"}


def _batch(model, seed=0):
    """Inputs and integer labels of the right shape for `model` (token ids end in padding 0s)."""
    rng = np.random.default_rng(seed)
    if model.name == "dcn_ranking":  # one id per table; a rating to regress
        tables = TINY["dcn_ranking"]["tables"]
        x = {
            name: rng.integers(0, t["vocabulary_size"], (BATCH,)).astype("int32")
            for name, t in tables.items()
        }
        return x, rng.uniform(1, 5, (BATCH, 1)).astype("float32")
    if model.inputs[0].dtype == "int32":
        x = rng.integers(1, VOCAB, (BATCH, *model.input_shape[1:])).astype("int32")
        x[:, -2:] = 0
    else:
        x = rng.random((BATCH, *model.input_shape[1:]), dtype=np.float32)
    num_classes = model.output_shape[-1]
    y = rng.integers(0, num_classes, (BATCH, *model.output_shape[1:-1]))
    return x, y


def _expected_output_shape(name):
    if name == "causal_lm":
        return (BATCH, TINY[name]["sequence_length"], VOCAB)
    if name == "dcn_ranking":
        return (BATCH, 1)
    return (BATCH, 3)


def _unnumbered(path):
    return re.sub(r"_\d+(?=/|$)", "", path)


def _loss(name):
    if name == "dcn_ranking":
        return keras.losses.MeanSquaredError()
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# ResNet-50's train step (XLA or bfloat16) takes 6-11 s here: the slow tier runs it, the default tier the others.
WITH_RESNET50_SLOW = [
    pytest.param(n, marks=pytest.mark.slow) if n == "resnet50" else n for n in sorted(TINY)
]


# Builders of a pretrained model need its preset: tests/engines/jax/test_llm_lora.py and tests/test_hub_outputs.py
# build keras_hub_causal_lm from a tiny preset they make.
FROM_A_PRESET = {"keras_hub_causal_lm"}


def test_every_registered_model_has_a_tiny_config():
    assert set(TINY) | FROM_A_PRESET == set(MODELS)


@pytest.mark.parametrize("name", sorted(TINY))
def test_builds_uncompiled_with_float32_logits(name):
    model = MODELS[name](**TINY[name])
    x, _ = _batch(model)
    logits = model(x, training=False)
    assert tuple(logits.shape) == _expected_output_shape(name)
    assert logits.dtype == "float32"
    assert not model.compiled  # uncompiled: run.py compiles under the strategy scope
    assert model.get_layer(HEAD.get(name, "logits")).dtype_policy.name == "float32"


@pytest.mark.parametrize("name", WITH_RESNET50_SLOW)
@pytest.mark.integration
def test_saved_model_loads_back_and_predicts_the_same(name, tmp_path):
    model = MODELS[name](**TINY[name])
    x, _ = _batch(model)
    expected = model.predict(x, verbose=0)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    # keras-rs' FeatureCross names its inner Dense by Keras' per-process counter (dense_1, dense_2, ...).
    assert [_unnumbered(w.path) for w in loaded.weights] == [
        _unnumbered(w.path) for w in model.weights
    ]
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), expected)


@pytest.mark.parametrize("name", WITH_RESNET50_SLOW)
@pytest.mark.integration
def test_one_xla_train_step(name):
    model = MODELS[name](**TINY[name])
    x, y = _batch(model)
    before = [w.numpy().copy() for w in model.trainable_weights]
    model.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss=_loss(name),
        jit_compile=True,
    )
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
    changed = [
        not np.array_equal(b, w.numpy())
        for b, w in zip(before, model.trainable_weights, strict=True)
    ]
    assert any(changed)


@pytest.mark.parametrize("name", WITH_RESNET50_SLOW)
@pytest.mark.integration
def test_one_mixed_bfloat16_train_step(name):
    # XLA is covered above; compiling bfloat16 with XLA on CPU is slow and adds nothing here.
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = MODELS[name](**TINY[name])
    x, y = _batch(model)
    logits = model(x, training=False)
    assert logits.dtype == "float32"
    assert {w.dtype for w in model.weights} == {"float32"}
    assert model.dtype_policy.compute_dtype == "bfloat16"  # the policy is really mixed
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=_loss(name),
    )
    loss = model.train_on_batch(x, y)
    assert np.isfinite(loss)
    assert {w.dtype for w in model.weights} == {"float32"}


# ---- ResNet ----------------------------------------------------------------------------------------------


def _convs(model):
    return [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]


def test_resnet_cifar_20_has_the_paper_layout():
    model = resnet_cifar(depth=20)
    # 19 3x3 convs + the logits layer = 20 weighted layers, plus 2 projection shortcuts.
    assert len(_convs(model)) == 21
    assert [c.filters for c in _convs(model) if c.kernel_size == (1, 1)] == [32, 64]
    assert model.get_layer("pool").output.shape == (None, 64)
    # 269,722 (He et al.'s ResNet-20 with identity shortcuts) + 2,752 for the two projection shortcuts.
    assert (
        model.count_params() - sum(w.numpy().size for w in model.non_trainable_weights) == 272_474
    )


def test_resnet50_matches_the_reference_parameter_count_and_v1_5_strides():
    model = resnet50(input_shape=(64, 64, 3))
    trainable = sum(w.numpy().size for w in model.trainable_weights)
    assert (
        trainable == 25_557_032
    )  # torchvision / Model Garden ResNet-50 (v1 and v1.5 have the same weights)
    assert len(_convs(model)) == 53
    # v1.5: the stride sits on the 3x3 conv of the first block of stages 2-4.
    assert model.get_layer("stage2_block1_conv1").strides == (1, 1)
    assert model.get_layer("stage2_block1_conv2").strides == (2, 2)
    assert model.get_layer("stage2_block1_proj_conv").strides == (2, 2)


@pytest.mark.parametrize("zero_init", [True, False])
def test_zero_init_residual_sets_the_last_gamma_of_each_block(zero_init):
    model = resnet_cifar(depth=8, width=4, zero_init_residual=zero_init)
    last = [layer for layer in model.layers if layer.name.endswith("_bn2")]
    assert len(last) == 3  # one block per stage at depth 8
    for layer in last:
        np.testing.assert_array_equal(layer.gamma.numpy(), 0.0 if zero_init else 1.0)
    np.testing.assert_array_equal(model.get_layer("stage1_block1_bn1").gamma.numpy(), 1.0)


def test_resnet_batchnorm_options_and_no_regularizers():
    model = resnet_cifar(depth=8, width=4, bn_momentum=0.8, bn_epsilon=1e-3)
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert {(n.momentum, n.epsilon) for n in norms} == {(0.8, 1e-3)}
    assert model.losses == []  # weight decay lives in the optimizer
    assert all(c.kernel_regularizer is None and not c.use_bias for c in _convs(model))


def test_resnet_cifar_rejects_a_depth_that_is_not_6n_plus_2():
    with pytest.raises(ValueError, match=r"depth must be 6n \+ 2.*received depth=21"):
        resnet_cifar(depth=21)


# ---- Transformers ----------------------------------------------------------------------------------------


def test_causal_lm_logits_do_not_see_later_tokens():
    model = causal_lm(**TINY["causal_lm"])
    tokens = np.arange(1, 9, dtype="int32")[None]
    changed = tokens.copy()
    changed[0, 5] = 42
    a, b = model.predict(tokens, verbose=0), model.predict(changed, verbose=0)
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-6, atol=1e-6)
    assert not np.allclose(a[:, 5:], b[:, 5:])


def test_transformer_classifier_pools_an_all_padding_row_to_zeros():
    model = transformer_classifier(**TINY["transformer_classifier"], dropout=0.0)
    tokens = np.array([[5, 6, 7, 0, 0, 0, 0, 0], [0] * 8], dtype="int32")
    logits = model.predict(tokens, verbose=0)
    assert np.isfinite(logits).all()  # an all-padding row pools to zeros, not NaN
    bias = model.get_layer("logits").bias.numpy()
    np.testing.assert_allclose(logits[1], bias, rtol=1e-6)


def test_transformer_block_padding_mask_hides_padded_keys():
    block = TransformerBlock(num_heads=2, mlp_dim=8)
    x = np.random.default_rng(0).random((1, 4, 4), dtype=np.float32)
    mask = np.array([[True, True, False, False]])
    other = x.copy()
    other[:, 2:] = 9.0  # changing padded positions must not change the real positions' outputs
    a = block(x, padding_mask=mask).numpy()
    b = block(other, padding_mask=mask).numpy()
    np.testing.assert_allclose(a[:, :2], b[:, :2], rtol=1e-5, atol=1e-6)


def test_vit_token_count_depends_on_pooling():
    with_token = vit(**TINY["vit"], pooling="class_token")
    mean = vit(**TINY["vit"], pooling="mean")
    assert with_token.get_layer("position_embedding").position_embeddings.shape == (
        17,
        16,
    )  # 4x4 patches + 1
    assert mean.get_layer("position_embedding").position_embeddings.shape == (16, 16)
    assert with_token.get_layer("patch_embedding").strides == (4, 4)


def test_vit_rejects_an_image_that_does_not_divide_into_patches():
    with pytest.raises(
        ValueError, match=r"patch_size.*received input_shape=\(30, 30, 3\), patch_size=4"
    ):
        vit(input_shape=(30, 30, 3), patch_size=4)


def test_transformer_rejects_heads_that_do_not_divide_the_width():
    with pytest.raises(ValueError, match="received hidden_dim=30, num_heads=4"):
        transformer_classifier(vocab_size=10, sequence_length=4, hidden_dim=30, num_heads=4)


@pytest.mark.parametrize(
    "layer",
    [
        TransformerBlock(
            num_heads=2,
            mlp_dim=8,
            dropout=0.1,
            attention_dropout=0.2,
            causal=True,
            layer_norm_epsilon=1e-5,
            activation="relu",
        ),
        SelfAttention(num_heads=3, causal=True, dropout=0.5),
        PositionEmbedding(sequence_length=7, initializer_stddev=0.1),
    ],
)
def test_layer_config_returns_every_constructor_argument(layer):
    config = layer.get_config()
    assert type(layer).from_config(config).get_config() == config
    for key in (
        "num_heads",
        "mlp_dim",
        "dropout",
        "attention_dropout",
        "causal",
        "layer_norm_epsilon",
        "activation",
        "sequence_length",
        "initializer_stddev",
    ):
        if hasattr(layer, key):
            assert config[key] == getattr(layer, key)


def test_remat_is_refused_where_it_cannot_work_and_names_only_real_decoder_blocks(tmp_path):
    """`keras_hub_causal_lm(remat=True)`: refused on Keras' TensorFlow backend (this process's: recompute_grad
    refuses the blocks' keyword arguments in a compiled step) before any preset is read; its block names come from
    the preset's config (and `backbone` overrides); a family whose blocks are named otherwise is an error, not a
    model rematerialized nowhere. Trained with remat on the jax engine: tests/engines/jax/test_llm_lora.py."""
    from tpukit.models import hub

    with pytest.raises(ValueError, match="remat=true needs the jax engine.*runtime.engine=jax"):
        hub.keras_hub_causal_lm(str(tmp_path / "not_read"), remat=True)
    with pytest.raises(ValueError, match="remat must be true or false; received 'yes'"):
        hub.keras_hub_causal_lm(str(tmp_path / "not_read"), remat="yes")
    preset = hub.tiny_preset(str(tmp_path / "tiny"), "gemma")
    assert hub._block_names(preset, {}) == [
        "decoder_block_0",
        "decoder_block_1",
        "transformer_layer_0",
        "transformer_layer_1",
    ]
    assert len(hub._block_names(preset, {"num_layers": 18})) == 36
    # A Transformers config.json (an hf:// handle, or a run's own safetensors/ export) names it num_hidden_layers.
    transformers = tmp_path / "hf"
    transformers.mkdir()
    (transformers / "config.json").write_text('{"model_type": "gemma", "num_hidden_layers": 3}')
    assert hub._block_names(str(transformers), {})[-1] == "transformer_layer_2"
    (transformers / "config.json").write_text('{"model_type": "gemma"}')
    with pytest.raises(ValueError, match="could not read the number of decoder blocks"):
        hub._block_names(str(transformers), {})
    named = keras.layers.Dense(2, name="decoder_block_0")
    backbone = type("Backbone", (), {"transformer_layers": [named]})()
    hub._check_rematerialized(backbone, ["decoder_block_0"])
    other = type("Backbone", (), {"transformer_layers": [keras.layers.Dense(2, name="block0")]})()
    with pytest.raises(ValueError, match=r"found no decoder blocks .* \['block0'\]"):
        hub._check_rematerialized(other, ["decoder_block_0"])
