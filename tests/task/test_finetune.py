"""Fine-tuning keys (issue 18, item 4): `model.init_weights`, `model.freeze`, `model.lora_rank` (tpukit.task.finetune)."""

import logging
import os
import shutil

import keras
import numpy as np
import pytest

import tpukit
from tpukit.recipe import RecipeError, from_dict
from tpukit.task import build_model

X = np.random.RandomState(0).randn(128, 4).astype("float32")
Y = (X.sum(1) > 0).astype("int32")


def mlp(hidden: int = 8, num_classes: int = 2) -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(hidden, activation="relu", name="hidden"),
            keras.layers.Dense(num_classes, name="head"),
        ]
    )


def convnet() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Reshape((4, 1)),
            keras.layers.Conv1D(2, 2, name="conv"),
            keras.layers.GlobalAveragePooling1D(),
        ]
    )


def source(split="train", input_context=None):
    return tpukit.data.arrays(X, Y, input_context)


@pytest.fixture(autouse=True)
def _registered(monkeypatch):
    # Registered for this module's tests only: other tests list the built-in names.
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    monkeypatch.setitem(MODELS, "ft_mlp", mlp)
    monkeypatch.setitem(MODELS, "ft_conv", convnet)
    monkeypatch.setitem(SOURCES, "ft_source", source)


def recipe(epochs=1, name="ft_mlp", **model):
    return from_dict(
        {
            "model": {"name": name, **model},
            "data": {
                "source": "ft_source",
                "global_batch_size": 32,
                "eval_split": None,
                "shuffle_buffer": 1,
            },
            "train": {"epochs": epochs, "learning_rate": 0.05, "optimizer": "sgd", "seed": 3},
            "runtime": {"verbose": 0},
        },
        "ft.yaml",
    )


def built(**model):
    keras.utils.set_random_seed(
        0
    )  # as the engine does: every build starts from the same initialization
    return build_model(recipe(**model), total_steps=8, jit_compile=False, steps_per_execution=1)


def short(variable) -> str:
    """`layer/weight` (a Sequential's variable paths start with its own, numbered, name)."""
    return "/".join(variable.path.split("/")[-2:])


def weights_of(model) -> dict:
    return {short(w): w.numpy() for w in model.weights}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A finished tpukit run (its output directory holds model.keras and checkpoints/)."""
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    output = str(tmp_path_factory.mktemp("pretrained"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(MODELS, "ft_mlp", mlp)
        patch.setitem(SOURCES, "ft_source", source)
        tpukit.run(recipe(), output)
    return output


def saved(pretrained) -> dict:
    return weights_of(tpukit.load_model(os.path.join(pretrained, "model.keras")))


# ---- init_weights --------------------------------------------------------------------------------------------


def test_init_weights_from_an_output_directory_loads_its_model_keras(pretrained, caplog):
    fresh = weights_of(built())
    with caplog.at_level(logging.INFO, logger="tpukit"):
        model = built(init_weights=pretrained)
    expected = saved(pretrained)
    assert weights_of(model).keys() == expected.keys()
    for path, value in weights_of(model).items():
        np.testing.assert_array_equal(value, expected[path])
        assert not np.array_equal(value, fresh[path]) or "bias" in path
    assert "loaded 2 of 2 layer(s) with weights from" in caplog.text


def test_init_weights_from_a_weights_h5_file_and_from_checkpoints_only(pretrained, tmp_path):
    expected = saved(pretrained)
    weights_file = str(tmp_path / "mlp.weights.h5")
    tpukit.load_model(os.path.join(pretrained, "model.keras")).save_weights(weights_file)
    from_file = weights_of(built(init_weights=weights_file))
    # A run stopped before its export: only checkpoints/ (its last one is the final step of a finished run).
    partial = str(tmp_path / "partial")
    shutil.copytree(os.path.join(pretrained, "checkpoints"), os.path.join(partial, "checkpoints"))
    from_checkpoint = weights_of(built(init_weights=partial))
    for path, value in expected.items():
        np.testing.assert_array_equal(from_file[path], value)
        np.testing.assert_array_equal(from_checkpoint[path], value)


def test_a_new_head_keeps_its_initialization_and_the_body_loads(pretrained, caplog):
    fresh = weights_of(built(num_classes=3))
    with caplog.at_level(logging.INFO, logger="tpukit"):
        model = built(num_classes=3, init_weights=pretrained)
    loaded, expected = weights_of(model), saved(pretrained)
    np.testing.assert_array_equal(loaded["hidden/kernel"], expected["hidden/kernel"])
    np.testing.assert_array_equal(
        loaded["head/kernel"], fresh["head/kernel"]
    )  # (8, 3): not in the file
    assert "new head layer(s) head do not fit" in caplog.text and "(8, 2)" in caplog.text


def test_a_body_that_does_not_fit_is_an_error_naming_the_layer(pretrained):
    with pytest.raises(
        RecipeError, match=r"model.init_weights=.*layer\(s\) hidden differ.*Fix: build the model"
    ):
        built(hidden=16, init_weights=pretrained)


def test_a_new_head_that_freeze_would_keep_random_is_an_error(pretrained):
    with pytest.raises(
        RecipeError, match=r"layer\(s\) head .*model.freeze=\['head'\] freezes them"
    ):
        built(num_classes=3, init_weights=pretrained, freeze=["head"])


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda d: os.path.join(d, "missing.keras"),
            r"missing.keras' does not exist.*Fix: give the path",
        ),
        (
            lambda d: d,
            r"is a directory without model.keras or checkpoints/ckpt-N.*Fix: name the output",
        ),
        (
            lambda d: _write(d, "old.h5", b"x"),
            r"neither a .keras nor a .weights.h5 file.*Fix: save the weights",
        ),
        (
            lambda d: _write(d, "junk.keras", b"not a zip"),
            r"junk.keras is not a Keras weights file.*Fix: name",
        ),
        (
            lambda d: _write(d, "junk.weights.h5", b"not hdf5"),
            r"not a Keras weights file.*Fix: name",
        ),
    ],
)
def test_init_weights_that_cannot_be_read_is_a_recipe_error(tmp_path, make, message):
    value = make(str(tmp_path))
    with pytest.raises(RecipeError, match=r"ft.yaml: model.init_weights=.*" + message):
        built(init_weights=value)


def _write(directory, name, data):
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


@pytest.mark.slow
def test_init_weights_is_not_loaded_on_resume(pretrained, tmp_path):
    """A resumed run continues from its checkpoint: loading init_weights again would restart epoch 2 from the
    pretrained weights and end elsewhere than the uninterrupted run."""
    whole = str(tmp_path / "whole")
    tpukit.run(recipe(epochs=2, init_weights=pretrained), whole)
    cut = str(tmp_path / "cut")
    tpukit.run(recipe(epochs=1, init_weights=pretrained), cut)
    resumed = tpukit.run(recipe(epochs=2, init_weights=pretrained), cut)
    assert resumed["resumed_from_step"] == 4 and resumed["step"] == 8
    for path, value in saved(whole).items():
        np.testing.assert_allclose(saved(cut)[path], value, atol=1e-6)
    assert not np.allclose(saved(cut)["hidden/kernel"], saved(pretrained)["hidden/kernel"])


# ---- freeze --------------------------------------------------------------------------------------------------


def test_frozen_layers_do_not_change_in_training_and_the_others_do(pretrained, tmp_path, caplog):
    output = str(tmp_path / "frozen")
    with caplog.at_level(logging.INFO, logger="tpukit"):
        tpukit.run(recipe(init_weights=pretrained, freeze=["^hid"]), output)
    before, after = saved(pretrained), saved(output)
    np.testing.assert_array_equal(after["hidden/kernel"], before["hidden/kernel"])
    np.testing.assert_array_equal(after["hidden/bias"], before["hidden/bias"])
    assert not np.allclose(after["head/kernel"], before["head/kernel"])
    assert "model.freeze=['^hid'] froze hidden; 18 trainable parameters left" in caplog.text


def test_freeze_by_weight_path_freezes_that_weight_alone():
    model = built(freeze=["head/bias"])
    assert [short(w) for w in model.trainable_weights] == [
        "hidden/kernel",
        "hidden/bias",
        "head/kernel",
    ]


def test_a_freeze_pattern_that_matches_nothing_lists_the_layers():
    with pytest.raises(
        RecipeError,
        match=r"model.freeze holds 'encoder', which matches no layer.*Layers with weights: hidden, head",
    ):
        built(freeze=["hidden", "encoder"])


def test_freezing_everything_is_an_error():
    with pytest.raises(RecipeError, match=r"model.freeze=\['.'\] freezes every layer.*Fix: narrow"):
        built(freeze=["."])


# ---- LoRA ----------------------------------------------------------------------------------------------------


def test_lora_trains_the_adapters_not_the_base_kernels_and_the_export_loads(
    pretrained, tmp_path, caplog
):
    with caplog.at_level(logging.INFO, logger="tpukit"):
        model = built(init_weights=pretrained, lora_rank=2)
    assert "model.lora_rank=2: LoRA on 2 layer(s) (hidden, head)" in caplog.text
    hidden, head = model.get_layer("hidden"), model.get_layer("head")
    start = weights_of(model)
    np.testing.assert_array_equal(start["hidden/kernel"], saved(pretrained)["hidden/kernel"])
    assert not np.any(
        start["head/lora_kernel_b"]
    )  # B starts at 0: the model starts exactly as loaded
    model.fit(X, Y, batch_size=32, epochs=2, verbose=0)
    np.testing.assert_array_equal(hidden._kernel.numpy(), start["hidden/kernel"])
    np.testing.assert_array_equal(head._kernel.numpy(), start["head/kernel"])
    for layer in (hidden, head):
        assert not np.allclose(layer.lora_kernel_a.numpy(), start[f"{layer.name}/lora_kernel_a"])
        assert not np.allclose(layer.lora_kernel_b.numpy(), start[f"{layer.name}/lora_kernel_b"])
    from tpukit.engines.keras.export import export_model

    exported = export_model(model, str(tmp_path))
    restored = tpukit.load_model(exported["keras"])
    np.testing.assert_allclose(
        restored.predict(X, verbose=0), model.predict(X, verbose=0), atol=1e-5
    )


def test_lora_skips_frozen_layers():
    model = built(freeze=["^hidden$"], lora_rank=2)
    assert not model.get_layer("hidden").lora_enabled and model.get_layer("head").lora_enabled
    assert [short(w) for w in model.trainable_weights] == [
        "head/bias",
        "head/lora_kernel_a",
        "head/lora_kernel_b",
    ]


def test_lora_without_dense_layers_or_with_all_of_them_frozen_is_an_error():
    with pytest.raises(
        RecipeError, match=r"model.lora_rank=4, but the model has no Dense or EinsumDense"
    ):
        built(name="ft_conv", lora_rank=4)
    with pytest.raises(RecipeError, match=r"model.freeze=\['hidden', 'head'\] freezes every Dense"):
        built(freeze=["hidden", "head"], lora_rank=4)


@pytest.mark.slow
def test_a_lora_run_resumes_from_its_checkpoint(pretrained, tmp_path):
    """The resumed model is rebuilt with the same LoRA layers, so its checkpoint restores into them."""
    whole = str(tmp_path / "whole")
    tpukit.run(recipe(epochs=2, init_weights=pretrained, lora_rank=2), whole)
    cut = str(tmp_path / "cut")
    tpukit.run(recipe(epochs=1, init_weights=pretrained, lora_rank=2), cut)
    assert (
        tpukit.run(recipe(epochs=2, init_weights=pretrained, lora_rank=2), cut)["resumed_from_step"]
        == 4
    )
    for path, value in saved(whole).items():
        np.testing.assert_allclose(saved(cut)[path], value, atol=1e-6)
