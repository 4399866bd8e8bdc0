"""Strict recipe loading: each error class names the file, the key path, the value received and the fix."""

import dataclasses
import os
import re

import pytest
import yaml
from helpers import RECIPES, digits_recipe

import tpukit
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
    assert "Valid keys in train: baseline, class_weight, " in message  # sorted
    assert "decay_boundaries, decay_rate, early_stopping_metric" in message


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
    assert (
        "runtime.precision must be one of 'auto' or 'float32' or 'mixed_bfloat16' or 'mixed_float16'"
        in message
    )
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
    assert (
        "data.source must be one of" in message
        and "digits" in message
        and "received 'digitz'" in message
    )


def test_non_positive_numbers_are_rejected(tmp_path):
    raw = digits_recipe()
    raw["data"]["global_batch_size"] = 0
    message, _ = load_error(tmp_path, raw)
    assert (
        "data.global_batch_size must be >= 1 and <= 2147483647; received 0. Fix: e.g. global_batch_size: 64."
        in message
    )


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
    recipe = load_recipe(
        path,
        [
            "train.epochs=2",
            "data.eval_split=null",
            "model.filters=[8]",
            "runtime.jit_compile=false",
        ],
    )
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
    with pytest.raises(
        RecipeError, match="a recipe is a mapping with sections model, data, train, runtime"
    ):
        from_dict(["model"], "x.yaml")


# ---- issue 8: bad input fails fast, in files, in --set and in Python ------------------------------------------


@pytest.mark.parametrize(
    "content, expected",
    [
        ("latin-1", "not UTF-8 text (byte 0xe9 at line 1"),
        (bytes(range(256)), "not UTF-8 text (byte 0x80 at line 2, offset 128)"),
        (b"", "the file is empty (or only comments)"),
        (b"# only a comment\n", "the file is empty (or only comments)"),
        (
            b"- model\n- data\n",
            "a recipe is a mapping with sections model, data, train, runtime; received list",
        ),
        (
            b"42\n",
            "a recipe is a mapping with sections model, data, train, runtime; received int 42",
        ),
        (
            b"model:\n\tname: x\n",
            "not valid YAML: found character '\\t' that cannot start any token at line 2",
        ),
        (
            b"model: {name: small_cnn}\nmodel: {name: vit}\n",
            "found duplicate key 'model' (first on line 1)",
        ),
        (
            b"[" * 5000,
            "not a recipe: its YAML is nested too deeply",
        ),  # PyYAML recurses: RecursionError
    ],
)
def test_files_that_are_not_recipes(tmp_path, content, expected):
    if content == "latin-1":
        content = (
            "# d\u00e9j\u00e0 vu\n".encode("latin-1")
            + open(os.path.join(RECIPES, "digits_cnn.yaml"), "rb").read()
        )
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    with pytest.raises(RecipeError) as info:
        load_recipe(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: ") and expected in message and "Fix:" in message
    assert "\n" not in message  # one paragraph: PyYAML's own messages span several lines


def test_a_directory_and_an_unreadable_file(tmp_path, monkeypatch):
    with pytest.raises(
        RecipeError, match=r"is a directory, not a YAML file\. Fix: pass the recipe file inside it"
    ):
        load_recipe(str(tmp_path))
    path = write(tmp_path, digits_recipe())

    def denied(
        *args, **kwargs
    ):  # chmod 000 does not stop root, who runs these tests in CI containers
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(recipe_lib.loading, "open", denied, raising=False)
    with pytest.raises(
        RecipeError, match=r"r\.yaml: cannot read the recipe file \(Permission denied\)\. Fix:"
    ):
        load_recipe(path)


@pytest.mark.parametrize(
    "override, key",
    [
        ("train.learning_rate=.nan", "train.learning_rate"),
        ("train.learning_rate=.inf", "train.learning_rate"),
        ("train.label_smoothing=-.inf", "train.label_smoothing"),
        ("model.dropout=.nan", "model.dropout"),
        ("model.filters=[8, .inf]", "model.filters"),
        ("data.test_fraction=.NaN", "data.test_fraction"),
        (
            "runtime.steps_per_execution_target_seconds=.inf",
            "runtime.steps_per_execution_target_seconds",
        ),
    ],
)
def test_nan_and_infinity_are_refused_at_load_time(tmp_path, override, key):
    overrides = (
        [override, "runtime.steps_per_execution=auto"] if key.startswith("runtime") else [override]
    )
    message, path = load_error(tmp_path, digits_recipe(), overrides)
    assert message.startswith(f"{path}: {key} must be a finite number; received ")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train.epochs=1.5", "train.epochs must be an integer; received 1.5 (float)"),
        (
            "data.global_batch_size=1.0e+30",
            "data.global_batch_size must be an integer; received 1e+30 (float)",
        ),
        ("data.global_batch_size=" + "1" + "0" * 30, "data.global_batch_size is too large"),
        ("model.num_classes=" + "1" + "0" * 30, "model.num_classes is too large"),
        (
            "data.global_batch_size=4294967296",
            "data.global_batch_size must be >= 1 and <= 2147483647; received 4294967296",
        ),
        ("train.epochs=-3", "train.epochs must be >= 1 and <= 2147483647; received -3"),
        ("train.seed=-1", "train.seed must be >= 0 and <= 4294967295; received -1"),
        ("train.learning_rate=-0.1", "train.learning_rate must be >= 0; received -0.1"),
        (
            "data.prefetch_batches=-2",
            "data.prefetch_batches must be >= 0 and <= 2147483647; received -2",
        ),
        ("runtime.verbose=3", "runtime.verbose must be >= 0 and <= 2; received 3"),
        ("runtime.max_checkpoints_to_keep=0", "runtime.max_checkpoints_to_keep must be >= 1"),
        (
            "train.decay_boundaries=[0.75, 0.5]",
            "key train.decay_boundaries (received (0.75, 0.5)) does not apply",
        ),
    ],
)
def test_numbers_out_of_range_name_the_valid_range(tmp_path, override, expected):
    message, path = load_error(tmp_path, digits_recipe(), [override])
    assert message.startswith(f"{path}: {expected}") and "Fix:" in message


def test_step_schedule_boundaries_must_increase(tmp_path):
    message, _ = load_error(
        tmp_path, digits_recipe(), ["train.schedule=step", "train.decay_boundaries=[0.75, 0.5]"]
    )
    assert (
        "train.decay_boundaries must be increasing fractions of the run in (0, 1); received [0.75, 0.5]"
        in message
    )


@pytest.mark.parametrize(
    "overrides, key, decider",
    [
        (
            ["train.trust_coefficient=0.01"],
            "train.trust_coefficient",
            "train.optimizer is lars, and train.optimizer is 'adamw'",
        ),
        (
            ["train.momentum=0.9"],
            "train.momentum",
            "train.optimizer is sgd or lars, and train.optimizer is 'adamw'",
        ),
        (
            ["train.optimizer=adam", "train.weight_decay=0", "train.momentum=0.9"],
            "train.momentum",
            "is 'adam'",
        ),
        (
            ["train.decay_boundaries=[0.3]"],
            "train.decay_boundaries",
            "train.schedule is step, and train.schedule is 'cosine'",
        ),
        (
            ["train.decay_rate=0.5"],
            "train.decay_rate",
            "train.schedule is step, and train.schedule is 'cosine'",
        ),
        (
            ["train.early_stopping_metric=val_accuracy"],
            "train.early_stopping_metric",
            "train.early_stopping_patience is set, and train.early_stopping_patience is null",
        ),
        (
            ["runtime.steps_per_execution_target_seconds=2"],
            "runtime.steps_per_execution_target_seconds",
            "runtime.steps_per_execution is auto, and runtime.steps_per_execution is 1",
        ),
    ],
)
def test_keys_that_do_not_apply_to_the_chosen_option(tmp_path, overrides, key, decider):
    message, path = load_error(tmp_path, digits_recipe(), overrides)
    assert message.startswith(f"{path}: key {key} (received ")
    assert "does not apply: it is read only when " in message and decider in message
    assert f"Fix: remove {key} (or set it to null)" in message
    section = key.split(".")[0]
    assert f"Valid keys in {section} with these choices: " in message


def test_conditional_keys_get_their_defaults_where_they_apply(tmp_path):
    path = write(tmp_path, digits_recipe())
    train = load_recipe(path, ["train.optimizer=lars", "train.schedule=step"]).train
    assert (train.momentum, train.trust_coefficient, train.decay_boundaries, train.decay_rate) == (
        0.9,
        0.001,
        (0.5, 0.75),
        0.1,
    )
    assert train.early_stopping_metric is None
    adamw = load_recipe(path).train
    assert (adamw.momentum, adamw.trust_coefficient, adamw.decay_boundaries, adamw.decay_rate) == (
        None,
    ) * 4
    runtime = load_recipe(path, ["runtime.steps_per_execution=auto"]).runtime
    assert runtime.steps_per_execution_target_seconds == 0.5
    # null is "not set": a saved resolved recipe of another optimizer loads again
    assert (
        load_recipe(path, ["train.momentum=null", "train.trust_coefficient=null"]).train.momentum
        is None
    )


def test_a_saved_recipe_with_every_conditional_key_resolved_loads_again(tmp_path):
    overrides = [
        "train.optimizer=lars",
        "train.schedule=step",
        "train.early_stopping_patience=2",
        "runtime.steps_per_execution=auto",
    ]
    recipe = load_recipe(os.path.join(RECIPES, "digits_cnn.yaml"), overrides)
    out = str(tmp_path / "resolved.yaml")
    recipe_lib.save_recipe(recipe, out)
    assert load_recipe(out).to_dict() == recipe.to_dict()


def test_python_built_recipes_are_checked_like_yaml_ones():
    recipe = load_recipe(os.path.join(RECIPES, "digits_cnn.yaml"))
    with pytest.raises(
        RecipeError, match=r"^train\.learning_rate must be a finite number; received nan"
    ):
        dataclasses.replace(recipe.train, learning_rate=float("nan"))
    with pytest.raises(RecipeError, match=r"^key train\.momentum \(received 0\.5\) does not apply"):
        dataclasses.replace(recipe.train, momentum=0.5)
    with pytest.raises(
        RecipeError, match=r"^train\.epochs must be >= 1 and <= 2147483647; received 0"
    ):
        recipe_lib.TrainConfig(epochs=0, learning_rate=0.1)
    with pytest.raises(
        RecipeError, match=r"^train\.epochs must be an integer; received '3' \(str\)"
    ):
        recipe_lib.TrainConfig(epochs="3", learning_rate=0.1)
    with pytest.raises(
        RecipeError, match=r"^unknown key data\.tset_fraction .* Did you mean 'test_fraction'\?"
    ):
        recipe_lib.DataConfig(source="digits", global_batch_size=8, options={"tset_fraction": 0.1})
    with pytest.raises(
        RecipeError, match=r"^unknown key model\.dropuot .* Did you mean 'dropout'\?"
    ):
        recipe_lib.ModelConfig(name="small_cnn", kwargs={"dropuot": 0.1})
    with pytest.raises(RecipeError, match=r"^runtime\.steps_per_execution must be >= 1"):
        dataclasses.replace(recipe.runtime, steps_per_execution=0)
    with pytest.raises(
        RecipeError,
        match=r"Recipe\.train must be a tpukit\.recipe\.TrainConfig; received \{\} \(dict\)",
    ):
        recipe_lib.Recipe(model=recipe.model, data=recipe.data, train={})
    # types are coerced as from YAML; conditional defaults resolve
    train = recipe_lib.TrainConfig(epochs=3, learning_rate=1, optimizer="sgd")
    assert (
        train.learning_rate == 1.0
        and isinstance(train.learning_rate, float)
        and train.momentum == 0.9
    )
    # a section changed in place is caught by validate() (run() calls it)
    recipe.train.epochs = 0
    with pytest.raises(RecipeError, match=r"digits_cnn\.yaml: train\.epochs must be >= 1"):
        recipe.validate()


def test_set_into_a_section_that_is_not_a_mapping(tmp_path):
    raw = digits_recipe()
    raw["train"] = 3
    message, path = load_error(tmp_path, raw, ["train.epochs=2"])
    assert message.startswith(
        f"{path}: --set 'train.epochs=2': section train must be a mapping of keys; received 3."
    )


def test_odd_keys_never_crash_the_message(tmp_path):
    raw = digits_recipe()
    raw["train"][3] = "x"  # YAML allows integer (and boolean: `on:`) keys
    message, path = load_error(tmp_path, raw)
    assert message.startswith(f"{path}: unknown key train.3 (received 'x').")


@pytest.mark.parametrize(
    "text, spelled", [("1e-6", "1.0e-6"), ("2E3", "2.0e+3"), ("-5e+2", "-5.0e+2")]
)
def test_an_exponent_yaml_reads_as_text_gets_the_spelling_it_reads_as_a_number(text, spelled):
    with pytest.raises(
        RecipeError, match=f"received '{re.escape(text)}' \\(str\\). Fix: write it with a dot"
    ) as info:
        load_recipe(
            os.path.join(RECIPES, "digits_cnn.yaml"), [f"runtime.checkpoint_max_overhead={text}"]
        )
    assert spelled in str(info.value)
    assert yaml.safe_load(spelled) == float(
        text
    )  # the suggested spelling really is a number to PyYAML


def test_runtime_engine_mesh_and_layout():
    recipe = tpukit.load_recipe(
        "textfiles_char_lm",
        [
            "runtime.engine=jax",
            "runtime.mesh.model=4",
            'runtime.layout={".*kernel": [null, model]}',
        ],
    )
    assert recipe.runtime.engine == "jax"
    assert recipe.runtime.mesh == {"data": "auto", "model": 4}
    assert recipe.runtime.layout == {".*kernel": (None, "model")}
    assert tpukit.load_recipe("textfiles_char_lm", ["runtime.mesh=auto"]).runtime.mesh == {
        "data": "auto",
        "model": 1,
    }
    assert tpukit.load_recipe("textfiles_char_lm").runtime.engine == "auto"  # the default


@pytest.mark.parametrize(
    "override,expected",
    [
        ("runtime.mesh.tensor=2", "runtime.mesh has no axis 'tensor'"),
        ("runtime.mesh.model=0", "runtime.mesh.model must be a positive integer; received 0"),
        (
            "runtime.mesh.data=two",
            "runtime.mesh.data must be a positive integer or auto; received 'two'",
        ),
        (
            "runtime.engine=torch",
            "runtime.engine must be one of 'auto' or 'tensorflow' or 'jax'; received 'torch'",
        ),
        ('runtime.layout={"(": [null]}', "runtime.layout key '(' is not a regular expression"),
        (
            "runtime.layout={x: [tensor]}",
            "runtime.layout['x'] must list one mesh axis (data or model) or null",
        ),
        ("runtime.tpu_timeout_seconds.x=1", "runtime.tpu_timeout_seconds must be a number"),
    ],
)
def test_runtime_engine_mesh_and_layout_errors(override, expected):
    with pytest.raises(tpukit.RecipeError, match=re.escape(expected)):
        tpukit.load_recipe("textfiles_char_lm", [override])


def test_requested_engine_is_read_without_building_the_recipe():
    from tpukit.recipe.loading import requested_engine

    assert requested_engine("textfiles_char_lm", ["runtime.engine=jax"]) == "jax"
    assert requested_engine("textfiles_char_lm", ["runtime.engine=tensorflow"]) == "tensorflow"
    assert requested_engine("textfiles_char_lm") == "auto"  # the default, resolved by use_engine
    assert requested_engine("no_such_recipe_anywhere") == "auto"  # load_recipe reports it
