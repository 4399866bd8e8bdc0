"""Strict recipe loading: each error class names the file, the key path, the value received and the fix."""

import os

import pytest
import yaml
from helpers import RECIPES, digits_recipe

from tpukit import recipe as recipe_lib
from tpukit.recipe import RecipeError, from_dict, load_recipe


def write(tmp_path, raw, name="r.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw) if not isinstance(raw, str) else raw)
    return str(path)


def load_error(tmp_path, raw, overrides=()):
    path = write(tmp_path, raw)
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    return str(info.value), path


def test_digits_recipe_loads_with_types_and_defaults():
    recipe = load_recipe(os.path.join(RECIPES, "digits_cnn.yaml"))
    assert recipe.model.name == "small_cnn"
    assert recipe.model.kwargs["input_shape"] == (8, 8, 1)  # YAML list -> the builder's tuple
    assert recipe.data.global_batch_size == 64
    assert recipe.train.learning_rate == 0.002
    assert recipe.runtime.jit_compile == "auto"
    assert recipe.data.options == {}


def test_every_packaged_recipe_validates():
    shipped = recipe_lib.packaged_recipes()
    assert "digits_cnn" in shipped
    for name, path in shipped.items():
        assert load_recipe(path).path == path, name


def test_unknown_key_names_file_key_value_suggestion_and_valid_keys(tmp_path):
    raw = digits_recipe()
    raw["train"]["epoch"] = 3
    message, path = load_error(tmp_path, raw)
    assert message.startswith(f"{path}: unknown key train.epoch (received 3).")
    assert "Did you mean 'epochs'?" in message
    assert "Valid keys in train: decay_boundaries, decay_rate, early_stopping_metric" in message


def test_unknown_model_key_lists_the_builders_arguments(tmp_path):
    raw = digits_recipe()
    raw["model"]["num_clases"] = 10
    message, _ = load_error(tmp_path, raw)
    assert "unknown key model.num_clases" in message and "Did you mean 'num_classes'?" in message
    assert "for model 'small_cnn'" in message and "dense_units" in message


def test_missing_required_key(tmp_path):
    raw = digits_recipe()
    del raw["data"]["global_batch_size"]
    message, path = load_error(tmp_path, raw)
    assert message.startswith(f"{path}: missing required key data.global_batch_size (an integer).")
    assert "Fix: add `global_batch_size: ...` under `data:`" in message


def test_missing_section(tmp_path):
    raw = digits_recipe()
    del raw["train"]
    message, _ = load_error(tmp_path, raw)
    assert "missing required section `train:`" in message


def test_wrong_type_names_expected_type_and_received_value(tmp_path):
    raw = digits_recipe()
    raw["train"]["epochs"] = "three"
    message, path = load_error(tmp_path, raw)
    assert message == (
        f"{path}: train.epochs must be an integer; received 'three' (str). Fix: change the value of train.epochs."
    )


def test_bool_is_not_an_integer(tmp_path):
    raw = digits_recipe()
    raw["data"]["global_batch_size"] = True
    message, _ = load_error(tmp_path, raw)
    assert "data.global_batch_size must be an integer; received True (bool)" in message


def test_wrong_type_in_a_model_argument(tmp_path):
    raw = digits_recipe()
    raw["model"]["filters"] = 32
    message, _ = load_error(tmp_path, raw)
    assert "model.filters must be a list of an integer; received 32 (int)" in message


def test_bad_choice_lists_valid_choices(tmp_path):
    raw = digits_recipe()
    raw["runtime"]["precision"] = "bf16"
    message, _ = load_error(tmp_path, raw)
    assert "runtime.precision must be one of 'auto' or 'float32' or 'mixed_bfloat16' or 'mixed_float16'" in message
    assert "received 'bf16' (str)" in message


def test_bad_registry_name_lists_valid_names(tmp_path):
    raw = digits_recipe()
    raw["model"]["name"] = "small_cn"
    message, _ = load_error(tmp_path, raw)
    assert "model.name must be one of" in message and "small_cnn" in message
    assert "received 'small_cn'" in message and "Did you mean 'small_cnn'?" in message


def test_unknown_data_source(tmp_path):
    raw = digits_recipe()
    raw["data"]["source"] = "digitz"
    message, _ = load_error(tmp_path, raw)
    assert "data.source must be one of" in message and "digits" in message and "received 'digitz'" in message


def test_non_positive_numbers_are_rejected(tmp_path):
    raw = digits_recipe()
    raw["data"]["global_batch_size"] = 0
    message, _ = load_error(tmp_path, raw)
    assert "data.global_batch_size must be >= 1; received 0" in message


def test_unknown_top_level_section(tmp_path):
    raw = digits_recipe()
    raw["trian"] = {}
    message, _ = load_error(tmp_path, raw)
    assert "unknown key <top level>.trian" in message and "Did you mean 'train'?" in message


def test_invalid_yaml(tmp_path):
    message, path = load_error(tmp_path, "model:\n  name: [unclosed\n")
    assert message.startswith(f"{path}: not valid YAML")


def test_missing_file_lists_packaged_recipes():
    with pytest.raises(RecipeError) as info:
        load_recipe("no/such/recipe.yaml")
    assert "recipe 'no/such/recipe.yaml' not found" in str(info.value)
    assert "digits_cnn" in str(info.value)


def test_packaged_recipe_by_name_and_by_clone_path_from_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ folder here: as after `pip install tpukit` on Colab
    assert load_recipe("digits_cnn").model.name == "small_cnn"
    assert load_recipe("recipes/digits_cnn.yaml").model.name == "small_cnn"


def test_overrides_are_parsed_as_yaml_and_validated(tmp_path):
    path = write(tmp_path, digits_recipe())
    recipe = load_recipe(path, ["train.epochs=2", "data.eval_split=null", "model.filters=[8]", "runtime.jit_compile=false"])
    assert recipe.train.epochs == 2 and recipe.data.eval_split is None
    assert recipe.model.kwargs["filters"] == (8,) and recipe.runtime.jit_compile is False


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.epochz=2", "unknown key train.epochz (received 2). Did you mean 'epochs'?"),
        ("epochs=2", "the key must be section.key"),
        ("train.epochs", "expected section.key=value"),
        ("train.epochs=two", "train.epochs must be an integer; received 'two' (str)"),
    ],
)
def test_bad_overrides(tmp_path, override, expected):
    message, _ = load_error(tmp_path, digits_recipe(), [override])
    assert expected in message


def test_resolved_recipe_round_trips(tmp_path):
    recipe = load_recipe(os.path.join(RECIPES, "digits_cnn.yaml"), ["train.epochs=7"])
    out = tmp_path / "resolved.yaml"
    recipe_lib.save_recipe(recipe, str(out))
    again = load_recipe(str(out))
    assert again.to_dict() == recipe.to_dict()
    assert again.train.epochs == 7


def test_from_dict_rejects_a_non_mapping():
    with pytest.raises(RecipeError, match="a recipe is a mapping with sections model, data, train, runtime"):
        from_dict(["model"], "x.yaml")
