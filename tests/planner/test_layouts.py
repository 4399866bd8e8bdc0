"""`tpukit.planner.layouts`: a layout is checked against the model before anything trains (pure; no JAX)."""

import re

import pytest

from tpukit.models.layouts import DEFAULT_LAYOUTS
from tpukit.planner.layouts import Layouts
from tpukit.recipe import RecipeError

MESH = {"data": 2, "model": 4}


def test_a_matching_entry_splits_and_is_reported():
    layouts = Layouts({r".*mlp_in/kernel": (None, "model")}, MESH, "runtime.layout")
    assert layouts.axes_for("block0/mlp_in/kernel", (128, 512)) == (None, "model")
    assert layouts.axes_for("block0/mlp_out/kernel", (512, 128)) == (None, None)
    layouts.check_matched(["block0/mlp_in/kernel", "block0/mlp_out/kernel"])
    assert layouts.sharded() == {"block0/mlp_in/kernel": [None, "model"]}


def test_an_axis_of_one_device_splits_nothing():
    layouts = Layouts({r".*kernel": (None, "model")}, {"data": 8, "model": 1}, "runtime.layout")
    assert layouts.axes_for("dense/kernel", (3, 5)) == (None, "model")  # any size divides by 1
    assert layouts.sharded() == {}


def test_an_entry_that_matches_nothing_names_the_path_it_missed():
    # Keras matches the key whole: "d1/kernel" misses "sequential/d1/kernel" and silently shards nothing.
    layouts = Layouts({"d1/kernel": (None, "model")}, MESH, "runtime.layout")
    paths = ["sequential/d1/kernel", "sequential/d1/bias"]
    for path in paths:
        layouts.axes_for(path, (8,) * (2 if path.endswith("kernel") else 1))
    with pytest.raises(RecipeError) as error:
        layouts.check_matched(paths)
    message = str(error.value)
    assert "runtime.layout, entry 'd1/kernel', matches no variable" in message
    assert "'sequential/d1/kernel' needs '.*d1/kernel'" in message


def test_a_dimension_that_does_not_divide_names_the_variable_and_the_numbers():
    layouts = Layouts({r".*embeddings": ("model", None)}, MESH, "runtime.layout")
    with pytest.raises(RecipeError) as error:
        layouts.axes_for("movie_embedding/embeddings", (3706, 32))
    message = str(error.value)
    assert "movie_embedding/embeddings (shape [3706, 32])" in message
    assert "4 devices of mesh axis 'model'" in message and "3706 does not divide by 4" in message
    assert "--set runtime.mesh.model=2 (it divides 3706 and the 8 devices)" in message
    assert "3708 instead of 3706" in message


def test_the_suggested_axis_divides_the_devices_too():
    # 510 = 2 x 3 x 5 x 17: 3 divides it but not the 8 devices, so the run would refuse mesh.model=3.
    layouts = Layouts({r".*mlp_in/kernel": (None, "model")}, MESH, "runtime.layout")
    with pytest.raises(RecipeError, match=re.escape("--set runtime.mesh.model=2 (it divides 510")):
        layouts.axes_for("block0/mlp_in/kernel", (128, 510))


@pytest.mark.parametrize(
    "layout,path,shape,expected",
    [
        (
            {".*kernel": (None, "model"), "dense.*": (None, None)},
            "dense/kernel",
            (4, 4),
            "matches 2 entries",
        ),
        (
            {".*kernel": ("model",)},
            "dense/kernel",
            (4, 4),
            "gives 1 dimension(s) ([model]), but variable dense/kernel",
        ),
    ],
)
def test_ambiguous_or_misshapen_entries(layout, path, shape, expected):
    layouts = Layouts(layout, MESH, "runtime.layout")
    with pytest.raises(RecipeError, match=re.escape(expected)):
        layouts.axes_for(path, shape)


def test_an_unknown_axis_is_refused_at_once():
    with pytest.raises(
        RecipeError, match="entry '.\\*kernel', names axis 'tensor'; the mesh has data, model"
    ):
        Layouts({".*kernel": (None, "tensor")}, MESH, "runtime.layout")


def test_every_default_layout_names_only_mesh_axes():
    for name, layout in DEFAULT_LAYOUTS.items():
        Layouts(layout, MESH, name)  # raises on an axis the mesh lacks
        for pattern in layout:
            re.compile(pattern)
