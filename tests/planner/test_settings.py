"""What the engines read instead of the recipe (`Plan.settings`, `planner.connection`) holds the recipe's values."""

import dataclasses

from helpers import digits_recipe

from tpukit import planner
from tpukit.planner import settings as settings_lib
from tpukit.recipe import from_dict

# RunSettings fields named otherwise than their recipe key
RENAMED = {
    "model_name": "model.name",
    "source": "data.source",
    "source_options": "data.options",
}


def recipe(**overrides):
    return from_dict(digits_recipe(**overrides), "digits_cnn.yaml")


def _recipe_value(the_recipe, key: str):
    section, name = key.split(".")
    return getattr(getattr(the_recipe, section), name)


def _key_of(field: str) -> str:
    if field in RENAMED:
        return RENAMED[field]
    (section,) = [
        s
        for s in ("train", "runtime", "data")
        if field in {f.name for f in dataclasses.fields(getattr(recipe(), s))}
    ]
    return f"{section}.{field}"


def test_every_run_setting_is_the_recipes_value():
    the_recipe = recipe(
        **{
            "train.seed": 7,
            "train.epochs": 3,
            "train.early_stopping_patience": 2,
            "train.export_best_by": "val_accuracy",
            "runtime.checkpoint_every_steps": 11,
            "runtime.profile_steps": [3, 5],
            "runtime.verbose": 0,
            "runtime.loop": "tpukit",
            "runtime.max_checkpoints_to_keep": 5,
            "data.eval_split": "test",
        }
    )
    settings = settings_lib.run_settings(the_recipe)
    fields = [f.name for f in dataclasses.fields(settings) if f.name != "keys"]
    for field in fields:
        assert getattr(settings, field) == _recipe_value(the_recipe, _key_of(field)), field
    assert (settings.seed, settings.epochs, settings.loop, settings.profile_steps) == (
        7,
        3,
        "tpukit",
        (3, 5),
    )
    assert settings.keys == settings_lib.recipe_keys(the_recipe)


def test_the_recipe_keys_are_every_key_but_the_tpu_address():
    keys = settings_lib.recipe_keys(recipe(**{"runtime.tpu": "local", "train.seed": 3}))
    assert "runtime.tpu" not in keys
    assert keys["train.seed"] == 3 and keys["model.name"] == "small_cnn"
    assert {"model arguments", "data source arguments", "data.global_batch_size"} <= keys.keys()
    assert "data.options" not in keys  # the source's arguments, under their own name


def test_the_connection_is_the_recipes_runtime():
    the_recipe = recipe(
        **{
            "runtime.tpu": "grpc://10.0.0.2:8470",
            "runtime.tpu_timeout_seconds": 12.0,
            "runtime.steps_per_execution": "auto",
        }
    )
    connection = planner.connection(the_recipe)
    assert connection == settings_lib.Connection(
        tpu="grpc://10.0.0.2:8470",
        tpu_timeout_seconds=12.0,
        workers_timeout_seconds=the_recipe.runtime.workers_timeout_seconds,
        steps_per_execution="auto",
        mesh={"data": "auto", "model": 1},
    )


def test_a_plan_s_settings_follow_its_recipe(tmp_path):
    facts = planner.Hardware(engine="tensorflow", kind="default", replicas=1, input_pipelines=1)
    the_plan = planner.decide(
        recipe(**{"train.seed": 1}),
        facts,
        planner.DataFacts(train_examples=1437, eval_examples=360),
        planner.CheckpointFacts(),
        output_dir=str(tmp_path),
    )
    assert the_plan.settings.seed == 1
    # The runner replaces the recipe (a model's padding as trained): the settings are read from the new one.
    replaced = dataclasses.replace(the_plan, recipe=recipe(**{"train.seed": 2}))
    assert replaced.settings.seed == 2 and the_plan.settings.seed == 1
