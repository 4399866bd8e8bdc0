"""A Keras `LayoutMap`, or a builder of one (KerasHub's `GemmaBackbone.get_layout_map`), as a recipe's
`runtime.layout` {key: axes}: its mesh axes renamed to tpukit's (`data` or `batch` is the data axis, the other the
model axis) and its `device_mesh` giving the mesh's sizes. Run when a recipe is validated, so the recipe stays YAML;
Keras is imported only to build the mesh a builder is called with (`tpukit.models.layouts.placeholder_mesh`)."""

from __future__ import annotations

import collections.abc
import inspect
from typing import Any

from tpukit.recipe.schema import RecipeError

# The names a Keras mesh gives its data-parallel axis: the distribution guide's and `ModelParallel(batch_dim_name=
# "data")`'s `data`; KerasHub's `get_layout_map(data_parallel_dim_name="batch")`'s `batch`.
DATA_AXIS_NAMES = ("data", "batch")


def from_keras(value: Any, mesh: dict | str) -> tuple[dict, dict | str, str] | None:
    """A Keras `LayoutMap`, or a builder of one (a callable taking a `DeviceMesh`), as tpukit's layout:
    ({key: axes named data/model}, the mesh, a line saying how the axes were mapped); None for anything else.

    A `LayoutMap`'s `device_mesh` gives the mesh's sizes unless `mesh` (runtime.mesh) states others. A builder is
    called with a `DeviceMesh` of tpukit's axes (`data`, `model`) sized as `mesh` asks (`data: auto` as 1: the
    devices are not known before connecting, so its devices are placeholders and only its axis names are meant to
    be read), naming them through `data_parallel_dim_name`/`model_parallel_dim_name` where it takes those (KerasHub's
    `get_layout_map`); `mesh` is kept."""
    call = None
    if not is_layout_map(value):
        if not callable(value) or isinstance(value, (str, bytes)):
            return None
        value, call = _called(value, mesh)
    layout_map = value
    device_mesh = layout_map.device_mesh
    if device_mesh is None:
        raise RecipeError(
            "runtime.layout is a Keras LayoutMap without a device_mesh, so its axes have no sizes or names tpukit "
            "can read. Fix: keras.distribution.LayoutMap(keras.distribution.DeviceMesh(shape=(2, 4), "
            'axis_names=["data", "model"], devices=keras.distribution.list_devices())).'
        )
    names, shape = list(device_mesh.axis_names), tuple(int(s) for s in device_mesh.shape)
    layout, renamed, shown = _entries(layout_map, "runtime.layout")
    if call is not None:
        return (
            layout,
            mesh,
            (
                f"tpukit: runtime.layout: {call} gave a LayoutMap of {len(layout)} entries (axes {shown}); "
                "runtime.mesh sizes the mesh"
            ),
        )
    sizes = {renamed[name]: size for name, size in zip(names, shape, strict=True)}
    sizes = {"data": sizes.get("data", 1), "model": sizes.get("model", 1)}
    stated = {} if mesh == "auto" else {k: v for k, v in dict(mesh).items() if v != "auto"}
    conflict = {k: v for k, v in stated.items() if k in sizes and v != sizes[k]}
    if conflict:
        raise RecipeError(
            f"runtime.mesh {_yaml_map(stated)} conflicts with the device_mesh of the Keras LayoutMap in "
            f"runtime.layout (shape {shape}, axes {names}: {_yaml_map(sizes)}). Fix: leave runtime.mesh out (the "
            "LayoutMap's mesh is used), or build the LayoutMap on a DeviceMesh of the sizes you want."
        )
    return (
        layout,
        {**dict(mesh if mesh != "auto" else {}), **sizes},
        (
            f"tpukit: runtime.layout is a Keras LayoutMap of {len(layout)} entries on a DeviceMesh of shape {shape} "
            f"(axes {shown}): the mesh is data {sizes['data']} x model {sizes['model']}"
        ),
    )


def from_builder(builder, mesh: dict, what: str) -> tuple[dict, str]:
    """The LayoutMap that `builder` (a KerasHub family's `get_layout_map`) makes for tpukit's mesh of `mesh`'s
    sizes, as tpukit's layout {key: axes named data/model}, and the call and axis mapping as a plan line shows them.
    `what` names the builder in errors (the engine's default layout for a KerasHub preset, not runtime.layout)."""
    layout_map, call = _called(builder, mesh, what)
    layout, _, shown = _entries(layout_map, what)
    return layout, f"{call}, axes {shown}"


def _entries(layout_map, what: str) -> tuple[dict, dict, str]:
    """A LayoutMap's entries with tpukit's axis names, the renaming, and the renaming as a log line shows it."""
    device_mesh = layout_map.device_mesh
    names, shape = list(device_mesh.axis_names), tuple(int(s) for s in device_mesh.shape)
    renamed = _axis_mapping(names, shape)
    layout = {}
    for key, tensor_layout in layout_map.items():
        axes = tuple(getattr(tensor_layout, "axes", tensor_layout))
        unknown = [a for a in axes if a is not None and a not in renamed]
        if unknown:
            raise RecipeError(
                f"{what} (a Keras LayoutMap), entry {key!r}, names axis {unknown[0]!r}; its device_mesh has "
                f"{', '.join(map(repr, names))}. Fix: use one of those (or None) per dimension."
            )
        layout[key] = tuple(None if a is None else renamed[a] for a in axes)
    return layout, renamed, ", ".join(f"{name!r} -> {renamed[name]}" for name in names)


def is_layout_map(value: Any) -> bool:
    """Whether `value` is a Keras `LayoutMap` (a mapping with a `device_mesh`; not a plain dict), told apart
    without importing Keras (the backend is fixed at its first import)."""
    return (
        isinstance(value, collections.abc.Mapping)
        and not isinstance(value, dict)
        and hasattr(value, "device_mesh")
    )


def _axis_mapping(names: list[str], shape: tuple[int, ...]) -> dict[str, str]:
    """{a Keras mesh's axis name: tpukit's axis}: `data` or `batch` is the data axis, the other the model axis."""
    data = [name for name in names if name in DATA_AXIS_NAMES]
    others = [name for name in names if name not in DATA_AXIS_NAMES]
    if len(names) > 2 or len(data) > 1 or (len(names) == 2 and not data):
        why = (
            f"tpukit's mesh has two axes, this one {len(names)}"
            if len(names) > 2
            else f"both {data[0]!r} and {data[1]!r} name a data-parallel axis"
            if len(data) > 1
            else f"neither is named {' or '.join(DATA_AXIS_NAMES)}, which is how tpukit finds the data-parallel axis"
        )
        raise RecipeError(
            f"runtime.layout: the Keras LayoutMap's device_mesh has axes {names} (shape {tuple(shape)}); {why}. "
            f"Fix: a DeviceMesh with a data-parallel axis named data or batch and one other (model) axis, e.g. "
            'DeviceMesh(shape=(2, 4), axis_names=["data", "model"]).'
        )
    return {**{name: "data" for name in data}, **{name: "model" for name in others}}


def _called(builder, mesh, what: str = "runtime.layout") -> tuple[Any, str]:
    """`builder(DeviceMesh)`'s LayoutMap (see `from_keras`), and the call as a log line shows it."""
    from tpukit.models.layouts import placeholder_mesh

    sizes = {} if mesh == "auto" else dict(mesh)
    shape = (
        sizes.get("data") if isinstance(sizes.get("data"), int) else 1,
        sizes.get("model") if isinstance(sizes.get("model"), int) else 1,
    )
    device_mesh = placeholder_mesh(shape, ["data", "model"])
    try:
        parameters = inspect.signature(builder).parameters
    except (TypeError, ValueError):
        parameters = {}
    names = {"data_parallel_dim_name": "data", "model_parallel_dim_name": "model"}
    kwargs = {k: v for k, v in names.items() if k in parameters}
    name = getattr(builder, "__qualname__", None) or type(builder).__name__
    call = (
        f"{name}(DeviceMesh({shape}, ['data', 'model'])"
        + "".join(f", {k}={v!r}" for k, v in kwargs.items())
        + ")"
    )
    try:
        built = builder(device_mesh, **kwargs)
    except Exception as error:  # noqa: BLE001 - the builder is the user's: its error, named and explained
        raise RecipeError(
            f"{what}: calling {call} raised {type(error).__name__}: {error}. tpukit calls a layout "
            "builder with its own mesh, whose axes are named data and model. Fix: pass the LayoutMap itself "
            "(layout=builder(your_mesh)), or a builder that takes those axis names."
        ) from None
    if not is_layout_map(built):
        raise RecipeError(
            f"{what}: {call} returned a {type(built).__name__}, not a keras.distribution.LayoutMap. Fix: "
            "pass a LayoutMap, a builder returning one (e.g. keras_hub.models.GemmaBackbone.get_layout_map), or "
            "a {regex: [axis or null per dimension]} mapping."
        )
    return built, call


def _yaml_map(mapping: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"
