"""`runtime.layout` as Keras writes it (issue 40): a `keras.distribution.LayoutMap` or a builder of one becomes
plain recipe data (so `recipe.yaml` and the resume check keep working), its mesh becomes `runtime.mesh`, and the
tensorflow engine refuses a layout before it connects. Pure: no training."""

import logging
import re

import pytest
import yaml
from helpers import digits_recipe

from tpukit import planner
from tpukit.recipe import RecipeError, from_dict
from tpukit.recipe.loading import recipe_text


def guide_layout_map(names=("data", "model")):
    """The Keras distribution guide's map (keras.io/guides/distribution), on placeholder devices."""
    import keras
    import numpy as np

    mesh = keras.distribution.DeviceMesh(
        (2, 4), list(names), devices=np.array([f"d{i}" for i in range(8)])
    )
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["d1/kernel"] = (None, names[1])
    layout_map["d1/bias"] = (names[1],)
    layout_map["d2/output"] = (names[0], None)
    return layout_map


def test_a_layout_map_is_taken_as_is_and_saved_as_plain_yaml(caplog, monkeypatch):
    # tpukit.enable_logging (any tpukit API call) stops propagation to the root logger, where caplog listens.
    monkeypatch.setattr(logging.getLogger("tpukit"), "propagate", True)
    raw = digits_recipe()
    raw["runtime"] = {"engine": "jax", "layout": guide_layout_map(("batch", "model"))}
    with caplog.at_level(logging.INFO, logger="tpukit"):
        recipe = from_dict(raw)
    assert recipe.runtime.layout == {
        "d1/kernel": (None, "model"),
        "d1/bias": ("model",),
        "d2/output": ("data", None),
    }
    assert recipe.runtime.mesh == {"data": 2, "model": 4}
    assert "axes 'batch' -> data, 'model' -> model" in caplog.text  # the mapping, stated once
    saved = yaml.safe_load(recipe_text(recipe))["runtime"]
    assert saved["layout"]["d2/output"] == ["data", None] and saved["mesh"] == {
        "data": 2,
        "model": 4,
    }
    # What `with_engine` and the resume check rebuild from it is the same recipe.
    assert recipe.with_engine("tensorflow").runtime.layout == recipe.runtime.layout


def test_runtime_mesh_stated_against_the_layout_maps_is_a_conflict():
    raw = digits_recipe()
    raw["runtime"] = {
        "engine": "jax",
        "layout": guide_layout_map(),
        "mesh": {"data": 4, "model": 2},
    }
    with pytest.raises(RecipeError, match=re.escape("runtime.mesh {data: 4, model: 2} conflicts")):
        from_dict(raw)


def test_anything_else_names_what_runtime_layout_takes():
    raw = digits_recipe()
    raw["runtime"] = {"layout": [".*kernel", [None, "model"]]}
    with pytest.raises(
        RecipeError, match="a keras.distribution.LayoutMap or a builder of one, or null"
    ):
        from_dict(raw)


@pytest.mark.parametrize("kind", ["LayoutMap", "dict"])
def test_the_tensorflow_engine_refuses_a_layout_before_connecting(kind):
    raw = digits_recipe()
    layout = guide_layout_map() if kind == "LayoutMap" else {".*kernel": [None, "model"]}
    raw["runtime"] = {"engine": "tensorflow", "layout": layout}
    with pytest.raises(RecipeError, match="runtime.layout .* is a jax-engine feature") as error:
        planner.check_model_axis(from_dict(raw))
    assert "runtime.engine=jax" in str(error.value)


def test_a_recipe_cannot_set_mesh_from_which_tpukit_sets():
    from tpukit.recipe import RecipeError, RuntimeConfig

    with pytest.raises(
        RecipeError, match=r"runtime.mesh_from is set by tpukit.*received 'hello'.*Fix: remove it"
    ):
        RuntimeConfig(mesh_from="hello")
    kept = RuntimeConfig(
        mesh_from="the Keras LayoutMap's DeviceMesh of shape (2, 4)"
    )  # a resolved recipe.yaml
    assert kept.mesh_from.endswith("(2, 4)")
