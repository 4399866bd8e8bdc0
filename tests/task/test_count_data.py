"""`task.count_data`: every way a source refuses its data is a RecipeError (one message, exit 2 in the CLI)."""

import pytest

from tpukit import task
from tpukit.recipe import RecipeError, load_recipe


def test_a_file_pattern_that_matches_nothing_is_a_recipe_error_naming_the_key_and_the_fix(tmp_path):
    pattern = str(tmp_path / "missing" / "{split}-*")
    recipe = load_recipe("imagenet_resnet50", [f"data.file_pattern={pattern}"])
    with pytest.raises(RecipeError) as error:
        task.count_data(recipe, evaluating=True)
    message = str(error.value)
    assert "no file matches" in message and f"file_pattern='{pattern}'" in message
    assert "Fix: point file_pattern at the TFRecord files" in message
