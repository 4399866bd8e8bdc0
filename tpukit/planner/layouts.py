"""Which weights shard how over the jax engine's device mesh, checked before anything trains. Pure.

A layout is {key: axes}: `axes` names a mesh axis ("model", "data") or None for each dimension of the variables the
key matches. Keys match as Keras 3.15's `LayoutMap.__getitem__` matches them (`matching`): a key equal to the
variable's path (`block0/mlp_in/kernel`), else every key that `re.fullmatch`es it (older Keras used `re.search`,
until keras-team/keras#22164), and a path matched by two keys is an error naming both. A key that matches a layer's
output (`d2/output`, as Keras' `ModelParallel.get_tensor_layout` looks them up) lays out that activation.

Keras' own `LayoutMap` leaves a variable that no entry matches replicated, silently: `"d1/kernel"` misses
`sequential/d1/kernel`, training runs, the losses match and nothing is sharded. Here an entry that matches no
variable and no layer output is an error naming the variables it may have meant (an entry naming a variable that
its layer does not have, `d1/bias` of a `Dense(use_bias=False)`, is a warning: there is nothing to lay out), and a
dimension that does not divide by its axis is an error naming the variable and the numbers (JAX's own message names
neither).

A Keras `LayoutMap` (or a builder of one, such as KerasHub's `GemmaBackbone.get_layout_map`) becomes such a layout
when the recipe is validated (`tpukit.recipe.layout_maps`).
"""

from __future__ import annotations

import difflib
import logging
import math
import re

from tpukit.recipe import RecipeError

logger = logging.getLogger("tpukit")


def matching(keys, path: str) -> list[str]:
    """The keys of a layout that match `path`, as Keras 3.15's `LayoutMap.__getitem__` finds them
    (keras/src/distribution/distribution_lib.py): the key equal to `path` alone, else every key that
    `re.fullmatch`es it."""
    if path in keys:
        return [path]
    return [key for key in keys if re.fullmatch(key, path)]


class Layouts:
    """The recipe's layout (`runtime.layout`, else the model's default) over a mesh of {axis: size}.

    `axes_for(path, shape)` is called once per variable as the engine creates it, `output_seen(path)` for each
    layer output Keras lays out; `check_matched(paths, layer_paths)` after the model is built; `sharded()` and
    `outputs()` say what was split and which activations were laid out, for the plan and `metrics.json`.
    """

    def __init__(
        self,
        layout: dict,
        mesh: dict[str, int],
        source: str,
        mesh_from: str | None = None,
        lenient: bool = False,
    ):
        self.layout = {pattern: tuple(axes) for pattern, axes in (layout or {}).items()}
        self.mesh = dict(mesh)
        self.source = source  # "runtime.layout" or "the default layout of model causal_lm"
        # A layout tpukit chose for a model it did not write (a KerasHub family's `get_layout_map`, or tpukit's
        # rules for KerasHub decoders): a dimension its axis does not divide (2 key/value heads on a model axis of
        # 4), or an entry of another rank, leaves the variable's dimension whole (`unsplit`) instead of failing,
        # and an entry that matches nothing is noted (`unmatched`). A user's own layout stays strict.
        self.lenient = lenient
        self._unsplit: dict[tuple, list[str]] = {}
        self._matched_nothing: list[str] = []
        # What sized the mesh when not runtime.mesh (`RuntimeConfig.mesh_from`: a Keras LayoutMap's DeviceMesh).
        self.mesh_from = mesh_from
        self._matched: dict[str, int] = dict.fromkeys(self.layout, 0)
        self._outputs_seen: dict[str, int] = dict.fromkeys(self.layout, 0)
        self._outputs: dict[str, list] = {}
        self._sharded: dict[str, list] = {}
        for pattern, axes in self.layout.items():
            unknown = [a for a in axes if a is not None and a not in mesh]
            if unknown:
                raise RecipeError(
                    f"{source}, entry {pattern!r}, names axis {unknown[0]!r}; the mesh has {', '.join(mesh)}. Fix: "
                    "use one of those (or null for a dimension that is not split)."
                )

    def axes_for(self, path: str, shape: tuple[int, ...]) -> tuple[str | None, ...]:
        """The axis of each dimension of the variable at `path`: the matching entry's, or all None."""
        matches = matching(self.layout, path)
        if len(matches) > 1:
            raise RecipeError(
                f"{self.source}: variable {path} matches {len(matches)} entries ({', '.join(map(repr, matches))}). "
                "Fix: make the patterns exclusive, so each variable matches at most one."
            )
        if not matches:
            return (None,) * len(shape)
        pattern = matches[0]
        axes = self.layout[pattern]
        self._matched[pattern] += 1
        if len(axes) != len(shape) and self.lenient:
            self._unsplit.setdefault((pattern, None, None, None, None, len(axes)), []).append(path)
            return (None,) * len(shape)
        if len(axes) != len(shape):
            raise RecipeError(
                f"{self._where(pattern)} gives {len(axes)} dimension(s) ({_yaml(axes)}), but variable {path} has "
                f"shape {list(shape)} ({len(shape)} dimensions). Fix: one axis name or null per dimension, e.g. "
                f"{_yaml([None] * (len(shape) - 1) + ['model'])}."
            )
        total = math.prod(self.mesh.values())
        for dimension, (size, axis) in enumerate(zip(shape, axes, strict=True)):
            devices = self.mesh.get(axis, 1) if axis else 1
            if size % devices and self.lenient:
                key = (pattern, dimension, size, axis, devices, None)
                self._unsplit.setdefault(key, []).append(path)
                axes = axes[:dimension] + (None,) + axes[dimension + 1 :]
                continue
            if size % devices:
                # A smaller axis must divide the variable and the mesh's devices.
                options = [d for d in range(1, devices) if size % d == 0 and total % d == 0]
                smaller = (
                    f"a DeviceMesh whose {axis} axis has {max(options)} devices (the mesh is "
                    f"{self.mesh_from}, so runtime.mesh cannot change it)"
                    if self.mesh_from
                    else f"--set runtime.mesh.{axis}={max(options)}"
                )
                raise RecipeError(
                    f"{self._where(pattern)} splits dimension {dimension} of variable {path} (shape "
                    f"{list(shape)}) over the {devices} devices of mesh axis {axis!r}, but {size} does not divide by "
                    f"{devices}. Fix: {smaller} (it divides {size} and the {total} devices), a model size that "
                    f"divides by {devices} (e.g. {_multiple(size, devices)} instead of {size}), or a layout that "
                    "leaves that dimension unsplit (null)."
                )
        if any(axis and self.mesh.get(axis, 1) > 1 for axis in axes):
            self._sharded[path] = list(axes)
        return axes

    def output_seen(self, path: str) -> None:
        """Notes that Keras laid out the layer output at `path` (`<layer path>/output`) with an entry."""
        for pattern in matching(self.layout, path):
            self._outputs_seen[pattern] += 1

    def check_matched(self, paths: list[str], layer_paths: list[str] = ()) -> None:
        """Raises for an entry that matches no variable of `paths` and no output of a layer of `layer_paths` (or
        of a layer a variable path names), naming the nearest variable paths; warns for one that names a variable
        its layer does not have."""
        layers = set(layer_paths) | {p.rsplit("/", 1)[0] for p in paths if "/" in p}
        layers |= {prefix for p in layers for prefix in _prefixes(p)}
        outputs = [f"{layer}/output" for layer in sorted(layers)]
        for pattern, count in self._matched.items():
            if count:
                continue
            if self._outputs_seen[pattern] or any(matching({pattern: None}, o) for o in outputs):
                self._outputs[pattern] = list(self.layout[pattern])
                continue
            if self.lenient:
                self._matched_nothing.append(pattern)
                continue
            owner = _layer_without(pattern, layers)
            if owner:
                logger.warning(
                    "tpukit: %s names a variable that layer %s does not have (its variables: %s), so it lays out "
                    "nothing, as in Keras (a layer built without it, e.g. Dense(use_bias=False), has none)",
                    self._where(pattern).rstrip(","),
                    owner,
                    ", ".join(p[len(owner) + 1 :] for p in paths if p.startswith(owner + "/"))
                    or "none",
                )
                continue
            raise RecipeError(self._unmatched(pattern, paths))

    def _unmatched(self, pattern: str, paths: list[str]) -> str:
        tail = pattern.split("/")[-1]
        near = (
            [p for p in paths if p.endswith(pattern)]
            or difflib.get_close_matches(pattern, paths, n=3, cutoff=0.3)
            or [p for p in paths if p.endswith(tail)][:3]
        )
        hint = (
            f" It is matched whole against each path: {near[0]!r} needs '.*{pattern}' or '(.*/)?{pattern}'."
            if near and near[0].endswith(pattern)
            else f" Nearest paths: {', '.join(near[:3])}."
            if near
            else ""
        )
        return (
            f"{self._where(pattern)} matches no variable of the model ({len(paths)} variables) and no layer's "
            f"output (<layer path>/output), so it would shard nothing.{hint} Fix: correct the pattern "
            "(tpukit.plan(...).describe() and model.weights list the paths), or remove the entry."
        )

    def _where(self, pattern: str) -> str:
        return f"{self.source}, entry {pattern!r},"

    def sharded(self) -> dict[str, list]:
        """{variable path: its axes} of every variable split over a mesh axis with more than one device."""
        return dict(self._sharded)

    def unsplit(self) -> list[dict]:
        """What a lenient layout left whole: one record per entry and dimension, {entry, dimension, size, axis,
        devices, variables} (`dimension` None: the entry's rank is not the variables', `rank` then says its)."""
        return [
            {
                "entry": pattern,
                "dimension": dimension,
                "size": size,
                "axis": axis,
                "devices": devices,
                "rank": rank,
                "variables": list(paths),
            }
            for (pattern, dimension, size, axis, devices, rank), paths in self._unsplit.items()
        ]

    def unmatched(self) -> list[str]:
        """The entries of a lenient layout that matched no variable and no layer output (after `check_matched`)."""
        return list(self._matched_nothing)

    def leniency_lines(self) -> list[str]:
        """Plan lines for what a lenient layout left whole or matched nothing, naming the variables and numbers:

        layout: dimension 0 of decoder_block_0/attention/key/kernel, decoder_block_1/attention/key/kernel (2
        variables, size 2) left unsplit: mesh axis 'model' has 4 devices, which do not divide 2 (entry
        'decoder_block.*attention.*(query|key|value).kernel' of GemmaBackbone.get_layout_map (KerasHub))
        """
        lines = []
        for record in self.unsplit():
            paths = record["variables"]
            shown = ", ".join(paths[:4]) + (", ..." if len(paths) > 4 else "")
            where = f"(entry {record['entry']!r} of {self.source})"
            if record["dimension"] is None:
                lines.append(
                    f"layout: {shown} ({_plural_variables(paths)}) left whole: entry of {record['rank']} "
                    f"dimension(s) for variables of another rank {where}"
                )
                continue
            lines.append(
                f"layout: dimension {record['dimension']} of {shown} ({_plural_variables(paths)}, size "
                f"{record['size']}) left unsplit: mesh axis {record['axis']!r} has {record['devices']} devices, "
                f"which do not divide {record['size']} {where}"
            )
        nothing = self._matched_nothing
        if nothing:
            lines.append(
                f"layout: {len(nothing)} entr{'y' if len(nothing) == 1 else 'ies'} of {self.source} matched no "
                f"variable of this model: {', '.join(map(repr, nothing))}"
            )
        return lines

    def outputs(self) -> dict[str, list]:
        """{entry: its axes} of the entries that lay out layer outputs (activations), not variables."""
        return dict(self._outputs)


def _plural_variables(paths: list) -> str:
    return f"{len(paths)} variable" + ("" if len(paths) == 1 else "s")


def _prefixes(path: str) -> list[str]:
    """`a`, `a/b` of `a/b/c`: the layers that hold a layer's path."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _layer_without(pattern: str, layers: set[str]) -> str | None:
    """The layer that an entry `<layer>/<variable>` names when the layer exists (its part before the last `/`
    matches a layer's path) but has no such variable; None otherwise."""
    if "/" not in pattern:
        return None
    head = pattern.rsplit("/", 1)[0]
    try:
        return next((layer for layer in sorted(layers) if matching({head: None}, layer)), None)
    except re.error:  # the part before the `/` is no expression of its own, e.g. "(a/b)"
        return None


def _yaml_map(mapping: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"


def _yaml(axes) -> str:
    """Axes as a recipe writes them: [null, model]."""
    return "[" + ", ".join("null" if a is None else str(a) for a in axes) + "]"


def _multiple(size: int, devices: int) -> int:
    return math.ceil(size / devices) * devices
