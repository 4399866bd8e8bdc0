"""Which weights shard how over the jax engine's device mesh, checked before anything trains. Pure.

A layout is {regex: axes}: the regex is matched whole (`re.fullmatch`, as Keras' `LayoutMap` does) against a
variable's path (`block0/mlp_in/kernel`), and `axes` names a mesh axis ("model", "data") or None for each dimension
of the variables it matches. Keras' own `LayoutMap` leaves a variable that no entry matches replicated, silently:
`"d1/kernel"` misses `sequential/d1/kernel`, training runs, the losses match and nothing is sharded. Here an entry
that matches no variable is an error naming the variables it may have meant, a dimension that does not divide by
its axis is an error naming the variable and the numbers (JAX's own message names neither), and a path matched by
two entries is an error naming both.
"""

from __future__ import annotations

import difflib
import math
import re

from tpukit.recipe import RecipeError


class Layouts:
    """The recipe's layout (`runtime.layout`, else the model's default) over a mesh of {axis: size}.

    `axes_for(path, shape)` is called once per variable as the engine creates it; `check_matched(paths)` after
    the model is built; `sharded()` says what was split, for the plan and `metrics.json`.
    """

    def __init__(self, layout: dict, mesh: dict[str, int], source: str):
        self.layout = {pattern: tuple(axes) for pattern, axes in (layout or {}).items()}
        self.mesh = dict(mesh)
        self.source = source  # "runtime.layout" or "the default layout of model causal_lm"
        self._matched: dict[str, int] = dict.fromkeys(self.layout, 0)
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
        matches = [p for p in self.layout if re.fullmatch(p, path)]
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
        if len(axes) != len(shape):
            raise RecipeError(
                f"{self._where(pattern)} gives {len(axes)} dimension(s) ({_yaml(axes)}), but variable {path} has "
                f"shape {list(shape)} ({len(shape)} dimensions). Fix: one axis name or null per dimension, e.g. "
                f"{_yaml([None] * (len(shape) - 1) + ['model'])}."
            )
        total = math.prod(self.mesh.values())
        for dimension, (size, axis) in enumerate(zip(shape, axes, strict=True)):
            devices = self.mesh.get(axis, 1) if axis else 1
            if size % devices:
                # A smaller axis must divide the variable and the mesh's devices.
                options = [d for d in range(1, devices) if size % d == 0 and total % d == 0]
                raise RecipeError(
                    f"{self._where(pattern)} splits dimension {dimension} of variable {path} (shape "
                    f"{list(shape)}) over the {devices} devices of mesh axis {axis!r}, but {size} does not divide by "
                    f"{devices}. Fix: --set runtime.mesh.{axis}={max(options)} (it divides {size} and the "
                    f"{total} devices), a model size that divides by {devices} (e.g. {_multiple(size, devices)} "
                    f"instead of {size}), or a layout that leaves that dimension unsplit (null)."
                )
        if any(axis and self.mesh.get(axis, 1) > 1 for axis in axes):
            self._sharded[path] = list(axes)
        return axes

    def check_matched(self, paths: list[str]) -> None:
        """Raises for an entry that matched no variable, naming the nearest variable paths."""
        for pattern, count in self._matched.items():
            if count:
                continue
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
            raise RecipeError(
                f"{self._where(pattern)} matches no variable of the model ({len(paths)} variables), so it would "
                f"shard nothing.{hint} Fix: correct the pattern (tpukit.plan(...).describe() and "
                "model.weights list the paths), or remove the entry."
            )

    def _where(self, pattern: str) -> str:
        return f"{self.source}, entry {pattern!r},"

    def sharded(self) -> dict[str, list]:
        """{variable path: its axes} of every variable split over a mesh axis with more than one device."""
        return dict(self._sharded)


def _yaml(axes) -> str:
    """Axes as a recipe writes them: [null, model]."""
    return "[" + ", ".join("null" if a is None else str(a) for a in axes) + "]"


def _multiple(size: int, devices: int) -> int:
    return math.ceil(size / devices) * devices
