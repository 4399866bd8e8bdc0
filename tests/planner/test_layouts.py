"""`tpukit.planner.layouts`: a layout is checked against the model before anything trains (pure; no JAX)."""

import logging
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


# Keras' own LayoutMap, its mesh on placeholder devices: only the axis names and sizes are read (this process's Keras
# is on TensorFlow; matching and conversion touch no backend).
def keras_layout_map(entries: dict, shape=(2, 4), names=("data", "model")):
    import keras
    import numpy as np

    devices = np.array([f"device{i}" for i in range(int(np.prod(shape)))])
    layout_map = keras.distribution.LayoutMap(
        keras.distribution.DeviceMesh(shape, list(names), devices=devices)
    )
    for key, axes in entries.items():
        layout_map[key] = axes
    return layout_map


@pytest.mark.parametrize(
    "keys,path",
    [
        (["d1/kernel"], "d1/kernel"),  # exact
        # Matched whole: re.search would find it, Keras 3.15 does not.
        (["d1/kernel"], "sequential/d1/kernel"),
        ([".*d1/kernel"], "sequential/d1/kernel"),
        (["dense.*kernel"], "my_model/dense_1/kernel"),
        # The exact key wins over a regex that also matches.
        (["d1/kernel", ".*kernel"], "d1/kernel"),
        ([".*kernel", "dense.*"], "dense/kernel"),  # two regexes: an error in both
        (["d.(1)/kernel"], "dx1/kernel"),
        (
            ["decoder_block.*attention.*(query|key|value).kernel"],
            "decoder_block_0/attention/key/kernel",
        ),
        (["d2/output", ".*"], "d2/output"),
    ],
)
def test_keys_match_as_the_installed_keras_layout_map_matches_them(keys, path):
    from tpukit.planner.layouts import matching

    layout_map = keras_layout_map({key: (None,) for key in keys})
    found = matching(dict.fromkeys(keys), path)
    try:
        expected = layout_map[path]
    except ValueError as error:  # Keras: "matches multiple layout specification keys"
        assert len(found) > 1 and all(repr(key) in str(error) for key in found)
        return
    assert found == ([k for k in keys if layout_map._layout_map[k] is expected] if expected else [])


def test_an_activation_entry_lays_out_a_layer_output_and_needs_a_layer():
    layout = {"d1/kernel": (None, "model"), "d2/output": ("data", None)}
    paths = ["d1/kernel", "d2/kernel", "d2/bias"]
    layouts = Layouts(layout, MESH, "runtime.layout")
    for path in paths:
        layouts.axes_for(path, (8, 8) if path.endswith("kernel") else (8,))
    layouts.check_matched(paths, ["functional", "flatten", "d1", "dropout", "d2"])
    assert layouts.outputs() == {"d2/output": ["data", None]}
    assert layouts.sharded() == {"d1/kernel": [None, "model"]}
    # A layer without variables is found through its path, or through Keras asking for its output's layout.
    seen = Layouts({"dropout/output": ("data", None)}, MESH, "runtime.layout")
    seen.output_seen("dropout/output")
    seen.check_matched(paths)
    assert seen.outputs() == {"dropout/output": ["data", None]}
    missing = Layouts({"d3/output": ("data", None)}, MESH, "runtime.layout")
    with pytest.raises(
        RecipeError, match=re.escape("'d3/output', matches no variable of the model")
    ):
        missing.check_matched(paths, ["d1", "d2"])


def test_an_entry_for_a_variable_its_layer_lacks_warns(caplog, monkeypatch):
    # tpukit.enable_logging (any tpukit API call) stops propagation to the root logger, where caplog listens.
    monkeypatch.setattr(logging.getLogger("tpukit"), "propagate", True)
    # The distribution guide's map has "d1/bias" for Dense(200, use_bias=False, name="d1"): nothing to lay out.
    layouts = Layouts({"d1/kernel": (None, "model"), "d1/bias": ("model",)}, MESH, "runtime.layout")
    layouts.axes_for("d1/kernel", (784, 200))
    with caplog.at_level("WARNING", logger="tpukit"):
        layouts.check_matched(["d1/kernel", "d2/kernel", "d2/bias"], ["d1", "d2"])
    assert (
        "entry 'd1/bias' names a variable that layer d1 does not have (its variables: kernel)"
        in caplog.text
    )
    # A layer that does not exist is still an error: "x1/bias" names no layer.
    wrong = Layouts({"x1/bias": ("model",)}, MESH, "runtime.layout")
    with pytest.raises(RecipeError, match="matches no variable"):
        wrong.check_matched(["d1/kernel"], ["d1"])


def test_a_keras_layout_map_becomes_a_layout_over_its_own_mesh():
    from tpukit.recipe.layout_maps import from_keras

    layout_map = keras_layout_map(
        {"token_embedding/embeddings": ("model", "batch"), "d2/output": ("batch", None)},
        names=("batch", "model"),
    )
    layout, mesh, line = from_keras(layout_map, "auto")
    assert layout == {"token_embedding/embeddings": ("model", "data"), "d2/output": ("data", None)}
    assert mesh == {"data": 2, "model": 4}
    assert "axes 'batch' -> data, 'model' -> model" in line and "data 2 x model 4" in line
    # runtime.mesh agreeing with the map's, or auto, is no conflict; another size is.
    assert from_keras(layout_map, {"data": "auto", "model": 4})[1] == {"data": 2, "model": 4}
    with pytest.raises(RecipeError) as error:
        from_keras(layout_map, {"model": 2})
    assert "runtime.mesh {model: 2} conflicts with the device_mesh" in str(error.value)
    assert "shape (2, 4), axes ['batch', 'model']: {data: 2, model: 4}" in str(error.value)
    # A one-axis mesh: data parallelism only.
    assert from_keras(keras_layout_map({}, (8,), ("data",)), "auto")[1] == {"data": 8, "model": 1}


@pytest.mark.parametrize(
    "shape,names,expected",
    [
        ((2, 4), ("x", "y"), "neither is named data or batch"),
        ((2, 4), ("data", "batch"), "both 'data' and 'batch' name a data-parallel axis"),
        ((2, 2, 2), ("data", "model", "seq"), "tpukit's mesh has two axes, this one 3"),
    ],
)
def test_mesh_axes_that_cannot_be_mapped_are_refused(shape, names, expected):
    from tpukit.recipe.layout_maps import from_keras

    with pytest.raises(RecipeError, match=re.escape(expected)):
        from_keras(keras_layout_map({}, shape, names), "auto")


def test_a_layout_builder_is_called_with_tpukits_mesh_and_axis_names():
    from tpukit.recipe.layout_maps import from_keras

    calls = []

    def get_layout_map(
        device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch"
    ):
        calls.append(
            (tuple(device_mesh.shape), list(device_mesh.axis_names), data_parallel_dim_name)
        )
        import keras

        layout_map = keras.distribution.LayoutMap(device_mesh)
        layout_map[".*ffw_gating.kernel"] = (data_parallel_dim_name, model_parallel_dim_name)
        return layout_map

    layout, mesh, line = from_keras(get_layout_map, {"data": "auto", "model": 4})
    assert calls == [((1, 4), ["data", "model"], "data")]
    assert layout == {".*ffw_gating.kernel": ("data", "model")}
    assert mesh == {"data": "auto", "model": 4}  # runtime.mesh sizes the mesh, not the builder's
    assert "data_parallel_dim_name='data', model_parallel_dim_name='model'" in line

    def broken(device_mesh):
        raise ValueError("batch is not found in the device_mesh.axis_names")

    with pytest.raises(RecipeError, match=re.escape("calling test_a_layout_builder")):
        from_keras(broken, "auto")
    with pytest.raises(RecipeError, match="returned a dict, not a keras.distribution.LayoutMap"):
        from_keras(lambda mesh: {}, "auto")


def test_with_a_layout_maps_mesh_the_messages_name_its_device_mesh_not_runtime_mesh():
    # runtime.mesh conflicts with a LayoutMap's mesh, so the fix and the engine's line name the DeviceMesh.
    import jax
    import keras

    from tpukit.engines.jax import engine as jax_engine
    from tpukit.recipe import from_dict

    layout_map = keras_layout_map({".*mlp_in/kernel": (None, "model")}, names=("batch", "model"))
    raw = {
        "model": {"name": "small_cnn"},
        "data": {"source": "digits", "global_batch_size": 8},
        "train": {"epochs": 1, "learning_rate": 0.01},
        "runtime": {"layout": layout_map},
    }
    runtime = from_dict(raw, "r.yaml").runtime
    assert runtime.mesh == {"data": 2, "model": 4}
    assert runtime.mesh_from == "the Keras LayoutMap's DeviceMesh of shape (2, 4)"
    layouts = Layouts(runtime.layout, runtime.mesh, "runtime.layout", runtime.mesh_from)
    with pytest.raises(RecipeError) as error:
        layouts.axes_for("block0/mlp_in/kernel", (128, 510))
    message = str(error.value)
    assert (
        "Fix: a DeviceMesh whose model axis has 2 devices (the mesh is the Keras LayoutMap's"
        in message
    )
    assert "runtime.mesh.model=" not in message
    mesh = jax_engine.Mesh(2, 4, [jax.devices()[0]] * 8, mesh_from=runtime.mesh_from)
    line = jax_engine.describe(mesh, runtime.mesh)
    assert "mesh data 2 x model 4 as the Keras LayoutMap's DeviceMesh of shape (2, 4) asks;" in line
    assert "runtime.mesh" not in line and keras.__version__ in line
    # A mesh runtime.mesh sized keeps its own fix and line.
    plain = from_dict({**raw, "runtime": {"mesh": {"data": 2, "model": 4}}}, "r.yaml").runtime
    assert plain.mesh_from is None
    assert "because runtime.mesh is {data: 2, model: 4}" in jax_engine.describe(
        jax_engine.Mesh(2, 4, [jax.devices()[0]] * 8), plain.mesh
    )
