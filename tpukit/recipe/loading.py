"""Recipe files: YAML read strictly (no duplicate keys, no aliases into untyped values, a size cap), recipes
shipped inside the package (`digits_cnn` works after a plain `pip install`), and `--set section.key=value`
overrides that must name an existing key. The schema they are checked against is `tpukit.recipe.schema`.
"""

from __future__ import annotations

import importlib.resources
import os
from typing import Any

import yaml

from tpukit.recipe.schema import MAX_RECIPE_BYTES, SECTIONS, Recipe, RecipeError, _show, from_dict


def packaged_recipes() -> dict[str, str]:
    """Recipes shipped inside the installed package: {name: path}."""
    root = importlib.resources.files("tpukit.recipes")
    return {
        entry.name[: -len(".yaml")]: str(entry)
        for entry in root.iterdir()
        if entry.name.endswith(".yaml")
    }


def resolve_path(name_or_path: str) -> str:
    """A recipe file path: an existing file as given, else a packaged recipe by name or by file name.

    So `recipes/cifar10_resnet.yaml` works both in a clone and after `pip install tpukit` (e.g. on Colab).
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise RecipeError(
            f"a recipe is a file path or a packaged recipe name; received {_show(name_or_path)} "
            f"({type(name_or_path).__name__}). Fix: pass a string such as 'digits_cnn'."
        )
    name_or_path = os.fspath(name_or_path)
    if os.path.isfile(name_or_path):
        return name_or_path
    if os.path.isdir(name_or_path):
        raise RecipeError(
            f"recipe {name_or_path!r} is a directory, not a YAML file. Fix: pass the recipe file inside it, "
            "e.g. recipes/digits_cnn.yaml."
        )
    stem = os.path.basename(name_or_path)
    stem = stem[: -len(".yaml")] if stem.endswith(".yaml") else stem
    shipped = packaged_recipes()
    if stem in shipped:
        return shipped[stem]
    raise RecipeError(
        f"recipe {name_or_path!r} not found: no such file, and no packaged recipe named {stem!r}. "
        f"Packaged recipes: {', '.join(sorted(shipped))}. Fix: pass a path to a YAML file or one of those names."
    )


def apply_override(raw: dict[str, Any], override: str, path: str) -> None:
    """Applies one `section.key=value` override (value parsed as YAML) to the raw recipe in place."""
    if not isinstance(override, str) or "=" not in override:
        raise RecipeError(
            f"--set {_show(override)}: expected section.key=value, e.g. --set train.epochs=3. Fix: add `=value`."
        )
    dotted, text = override.split("=", 1)
    section, _, key = dotted.strip().partition(".")
    if section not in SECTIONS or not key or "." in key:
        raise RecipeError(
            f"--set {override!r}: the key must be section.key with section one of {', '.join(SECTIONS)}; "
            f"received {dotted!r}. Fix: e.g. --set data.global_batch_size=256."
        )
    try:
        value = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        raise RecipeError(
            f"--set {override!r}: the value of {section}.{key} is not valid YAML ({_yaml_problem(error)}). "
            f"Fix: quote it or correct it, e.g. --set {section}.{key}=3."
        ) from None
    except RecursionError:
        raise RecipeError(
            f"--set {override!r}: the value of {section}.{key} is nested too deeply. Fix: simplify it."
        ) from None
    if raw.get(section) is None:
        raw[section] = {}
    if not isinstance(raw[section], dict):
        raise RecipeError(
            f"{path}: --set {override!r}: section {section} must be a mapping of keys; received "
            f"{_show(raw[section])}. Fix: write `{section}:` followed by indented `key: value` lines."
        )
    raw[section][key] = value  # unknown keys are rejected by from_dict with the valid names


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key written twice in one mapping is an error instead of the last one winning."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {_show(key)} (first on line {seen[key].line + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's message in one line: the problem and where (its own message spans several lines with a snippet)."""
    problem = getattr(error, "problem", None) or getattr(error, "reason", None)
    mark = getattr(error, "problem_mark", None)
    if problem:
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        context = getattr(error, "context", None)
        return f"{problem}{where}" + (f", {context}" if context else "")
    return " ".join(str(error).split())


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_RECIPE_BYTES + 1)
    except OSError as error:
        raise RecipeError(
            f"{path}: cannot read the recipe file ({error.strerror or error}). Fix: check that the path is a "
            "readable file (permissions, mounts)."
        ) from None
    if len(data) > MAX_RECIPE_BYTES:
        raise RecipeError(
            f"{path}: larger than {MAX_RECIPE_BYTES} bytes, so it is not a recipe (recipes are a few KB of YAML). "
            "Fix: pass the recipe's YAML file."
        )
    try:
        return data.decode("utf-8-sig")  # a UTF-8 byte order mark, as some editors write, is fine
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise RecipeError(
            f"{path}: not UTF-8 text (byte 0x{data[error.start]:02x} at line {line}, offset {error.start}); a recipe "
            "is a YAML text file in UTF-8. Fix: pass the recipe's .yaml file, or re-save it as UTF-8 (e.g. "
            "`iconv -f latin1 -t utf-8`)."
        ) from None


def load_recipe(name_or_path: str, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Loads, overrides and validates a recipe. Raises RecipeError with a one-paragraph message."""
    path = resolve_path(name_or_path)
    text = _read_text(path)
    try:
        raw = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        raise RecipeError(
            f"{path}: not valid YAML: {_yaml_problem(error)}. Fix: check indentation and `key: value` syntax."
        ) from None
    except RecursionError:
        raise RecipeError(
            f"{path}: not a recipe: its YAML is nested too deeply. Fix: pass the recipe's YAML file."
        ) from None
    if raw is None:
        raise RecipeError(
            f"{path}: the file is empty (or only comments). Fix: a recipe needs sections model, data and train "
            "(and optionally runtime); see recipes/digits_cnn.yaml."
        )
    if isinstance(raw, dict):
        for override in overrides:
            apply_override(raw, override, path)
    return from_dict(raw, path)


def save_recipe(recipe: Recipe, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# Resolved from {recipe.path} (with overrides applied)\n")
        yaml.safe_dump(_plain(recipe.to_dict()), f, sort_keys=False)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
