"""Recipe files: YAML read strictly (no duplicate keys, a size cap, aliases and nesting bounded), recipes shipped
inside the package (`digits_cnn` works after a plain `pip install`), and `--set section.key=value` overrides that
must name an existing key. The schema they are checked against is `tpukit.recipe.schema`.

Bounds, so that no file or `--set` value can make tpukit spin or answer with megabytes: a file is at most
`MAX_RECIPE_BYTES`; its YAML aliases (`*name`) may repeat values, but the document they expand to holds at most
`MAX_ALIAS_VALUES` values, no value contains itself and none nests beyond `MAX_NESTING` levels (all checked on the
parsed node graph, before any Python object is built); a message shortens every value it echoes back
(`schema._show`, `schema._clip`). A recipe is still code: its `module:function` names are imported and run (see
docs/recipes.md, "Security: a recipe is code").
"""

from __future__ import annotations

import importlib.resources
import os
from typing import Any

import yaml

from tpukit.recipe.schema import (
    MAX_RECIPE_BYTES,
    SECTIONS,
    Recipe,
    RecipeError,
    _clip,
    _key_name,
    _show,
    from_dict,
)

# A recipe holds a few hundred values. Aliases (`lr: &lr 0.1` ... `*lr`) may repeat some, but a document whose
# aliases expand it beyond this many values is an alias bomb ("billion laughs": 9 levels of 9 aliases are 9**9
# values), not a recipe: everything that walks the values (saving recipe.yaml, comparing recipes, a builder given
# the value) would spin on it. Generous: 100,000 values take well under a second to save.
MAX_ALIAS_VALUES = 100_000
# A recipe nests two or three levels (section, key, a list or mapping of options). Deeper values are refused at
# load: the code that walks them recursively (saving recipe.yaml, validation, a builder) would otherwise fail
# with a RecursionError after the run started, at some depth between 300 and 500.
MAX_NESTING = 100


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
    # The argument as typed, shortened: a message never echoes megabytes.
    shown = _clip(repr(override))
    if section not in SECTIONS or not key or not all(key.split(".")):
        raise RecipeError(
            f"--set {shown}: the key must be section.key (or section.key.subkey for a mapping such as "
            f"runtime.mesh.model) with section one of {', '.join(SECTIONS)}; "
            f"received {_clip(repr(dotted))}. Fix: e.g. --set data.global_batch_size=256."
        )
    name = f"{section}.{_clip(key)}"
    try:
        value = yaml.load(text, Loader=_StrictLoader)
    except _ShapeError as error:
        where = f"{name}.{error.where}" if error.where else name
        raise RecipeError(
            f"--set {shown}: the value of {where}: {_shape_problem(error)}."
        ) from None
    except yaml.YAMLError as error:
        raise RecipeError(
            f"--set {shown}: the value of {name} is not valid YAML ({_yaml_problem(error)}). "
            f"Fix: quote it or correct it, e.g. --set {name}=3."
        ) from None
    except RecursionError:
        raise RecipeError(
            f"--set {shown}: the value of {name} is nested too deeply. Fix: simplify it."
        ) from None
    if raw.get(section) is None:
        raw[section] = {}
    if not isinstance(raw[section], dict):
        raise RecipeError(
            f"{path}: --set {shown}: section {section} must be a mapping of keys; received "
            f"{_show(raw[section])}. Fix: write `{section}:` followed by indented `key: value` lines."
        )
    *parents, leaf = key.split(".")
    target = raw[section]
    for depth, part in enumerate(parents):
        # A mapping key (runtime.mesh.model=4): a missing or `auto`/null value becomes a mapping of its keys.
        if target.get(part) is None or target.get(part) == "auto":
            target[part] = {}
        if not isinstance(target[part], dict):
            where = ".".join([section, *parents[: depth + 1]])
            raise RecipeError(
                f"{path}: --set {shown}: {where} is {_show(target[part])}, not a mapping, so it has no key "
                f"{leaf!r}. Fix: set {where} itself, e.g. --set {where}=...."
            )
        target = target[part]
    target[leaf] = value  # unknown keys are rejected by from_dict with the valid names


class _ShapeError(Exception):
    """The parsed document is no recipe's shape: `problem` is "aliases" (they expand beyond MAX_ALIAS_VALUES
    values), "cycle" (a value contains itself) or "depth" (nested beyond MAX_NESTING). `where` is the key path
    (`model.payload`, at most section.key) of the value at fault, '' for the document itself."""

    def __init__(self, problem: str, where: str):
        super().__init__(problem, where)
        self.problem, self.where = problem, where


def _check_shape(root: yaml.Node) -> None:
    """Raises _ShapeError when the node graph, with every alias expanded, holds more than MAX_ALIAS_VALUES values,
    when a value contains itself (`&a [*a]`: it expands without end), or when it nests beyond MAX_NESTING levels.

    PyYAML's composer makes an alias the very node its anchor names, so the document is a graph in which a shared
    node counts once per reference. A node's expanded size and its depth are memoized, so the check costs one
    visit per node and edge (a bomb's few hundred bytes), never the billions of values a bomb expands to. A
    document without aliases holds exactly as many values as nodes, so only aliases can trip the value cap (the
    file size cap bounds the rest).
    """
    memo: dict[int, tuple[int, int]] = {}  # id(node) -> (values once expanded, levels of nesting)
    active: set[int] = set()  # the nodes being visited: meeting one again is a cycle
    path: list[str] = []

    def visit(node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in memo:
            return memo[key]
        if key in active:
            raise _ShapeError("cycle", ".".join(path[:2]))
        values, depth = 1, 0
        if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)):
            active.add(key)
            pairs = (
                node.value
                if isinstance(node, yaml.MappingNode)
                else [(None, n) for n in node.value]
            )
            for key_node, value_node in pairs:  # a loop, not a generator: one stack frame per level
                if key_node is not None:
                    values += visit(key_node)[0]
                    path.append(_node_name(key_node))
                child_values, child_depth = visit(value_node)
                if key_node is not None:
                    path.pop()
                values, depth = values + child_values, max(depth, child_depth)
            active.discard(key)
            depth += 1
        memo[key] = values, depth
        return memo[key]

    values, depth = visit(root)
    if depth > MAX_NESTING:
        raise _ShapeError("depth", _heaviest(root, lambda node: memo[id(node)][1]))
    if values > MAX_ALIAS_VALUES and values > len(memo):  # the second: aliases made it so
        raise _ShapeError("aliases", _heaviest(root, lambda node: memo[id(node)][0]))


def _node_name(node: yaml.Node) -> str:
    return _key_name(node.value) if isinstance(node, yaml.ScalarNode) else "<key>"


def _heaviest(node: yaml.Node, weight) -> str:
    """The key path (at most section.key) of the heaviest value under `node`: where the problem sits."""
    names = []
    while isinstance(node, yaml.MappingNode) and node.value and len(names) < 2:
        key_node, node = max(node.value, key=lambda pair: weight(pair[1]))
        names.append(_node_name(key_node))
    return ".".join(names)


def _shape_problem(error: _ShapeError) -> str:
    if error.problem == "cycle":
        return (
            "a YAML alias (*name) refers to the value that contains it (like `a: &a [*a]`), which expands without "
            "end. Fix: remove that alias, or write the value out"
        )
    if error.problem == "depth":
        return (
            f"nested more than {MAX_NESTING} levels deep (a recipe nests a few). Fix: flatten the value, or pass "
            "deep data as a file path"
        )
    return (
        f"its YAML aliases (*name) expand to more than {MAX_ALIAS_VALUES:,} values (an alias bomb: a recipe holds "
        "a few hundred). Fix: write the values out, or alias only a value reused a few times (e.g. `lr: &lr 0.1`, "
        "then `*lr`)"
    )


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, but a key written twice in one mapping is an error instead of the last one winning, a
    document whose aliases expand too far (or into themselves) or that nests too deeply is refused before anything
    is built (`_check_shape`), and `<<` merge keys work."""

    def construct_document(self, node):
        _check_shape(node)
        return super().construct_document(node)

    def construct_yaml_int(self, node):
        """An integer of more decimal digits than Python converts (4300) is a YAML error naming its line, not the
        bare ValueError PyYAML lets out."""
        try:
            return super().construct_yaml_int(node)
        except ValueError:
            digits = f"{len(node.value):,}"
            problem = f"found an integer of {digits} digits, beyond what Python reads (4300)"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` merges a mapping in (the base class does it); its own keys may override
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


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)


def _yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's message in one line: the problem and where (its own message spans several lines with a snippet)."""
    problem = getattr(error, "problem", None) or getattr(error, "reason", None)
    mark = getattr(error, "problem_mark", None)
    if problem:
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        context = getattr(error, "context", None)
        # A problem can quote the file (an undefined alias's name, an unknown tag): shortened like any echo.
        return f"{_clip(problem)}{where}" + (f", {_clip(context)}" if context else "")
    return _clip(" ".join(str(error).split()))


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
    path, raw = _raw_recipe(name_or_path, overrides)
    return from_dict(raw, path)


def requested_engine(name_or_path: str, overrides: list[str] | tuple[str, ...] = ()) -> str:
    """The `runtime.engine` a recipe (with its overrides) asks for, read without importing Keras, which fixes its
    backend when first imported: the CLI sets KERAS_BACKEND from it (`tpukit.use_engine`, which resolves "auto").
    "auto", the default, when the recipe does not say or cannot be read (`load_recipe` then reports why)."""
    return requested_runtime(name_or_path, overrides)[0]


def requested_runtime(
    name_or_path: str, overrides: list[str] | tuple[str, ...] = ()
) -> tuple[str, str | None]:
    """(`requested_engine`, the recipe's `runtime.tpu` where it is a string, else None): what `auto` reads."""
    try:
        _, raw = _raw_recipe(name_or_path, overrides)
    except RecipeError:
        return "auto", None
    runtime = raw.get("runtime") if isinstance(raw, dict) else None
    runtime = runtime if isinstance(runtime, dict) else {}
    engine, tpu = runtime.get("engine"), runtime.get("tpu")
    return (
        engine if engine in ("auto", "tensorflow", "jax") else "auto",
        tpu if isinstance(tpu, str) else None,
    )


def raw_recipe(name_or_path: str, overrides: list[str] | tuple[str, ...] = ()) -> tuple[str, Any]:
    """(path, the parsed YAML with the overrides applied), unvalidated and without importing Keras: the command
    line calls it first, so that a recipe that is not found, YAML that does not parse or a malformed `--set` is
    refused (RecipeError) before anything slow. `load_recipe` then checks the rest."""
    return _raw_recipe(name_or_path, overrides)


def _raw_recipe(name_or_path: str, overrides) -> tuple[str, Any]:
    """(path, the parsed YAML with the overrides applied), unvalidated."""
    path = resolve_path(name_or_path)
    text = _read_text(path)
    try:
        raw = yaml.load(text, Loader=_StrictLoader)
    except _ShapeError as error:
        where = f"{error.where}: " if error.where else ""
        raise RecipeError(f"{path}: {where}{_shape_problem(error)}.") from None
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
    return path, raw


def recipe_text(recipe: Recipe) -> str:
    """The resolved recipe as YAML text (what a run's `recipe.yaml` holds).

    A value the recipe shares (one YAML alias used twice, or one Python list passed twice) is written once with an
    anchor and then referenced, as the recipe wrote it, not copied out at each use.
    """
    source = " ".join(str(recipe.path).splitlines())  # one comment line, whatever the path holds
    return f"# Resolved from {source} (with any overrides applied)\n" + yaml.safe_dump(
        _plain(recipe.to_dict(), {}), sort_keys=False
    )


def save_recipe(recipe: Recipe, path: str) -> None:
    text = recipe_text(recipe)  # before the file is opened: a failure leaves no empty recipe.yaml
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _plain(value: Any, memo: dict[int, Any]) -> Any:
    """Lists for tuples, dicts for mappings, so safe_dump writes plain YAML. `memo` maps each container already
    converted to its copy: a shared value stays one shared value (safe_dump writes an anchor and aliases), so
    this and the dump stay as small as the recipe, and a value that contains itself does not recurse forever."""
    if not isinstance(value, (dict, list, tuple)):
        return value
    if not value:  # not memoized: `()` is one object in Python, and an empty value needs no anchor
        return {} if isinstance(value, dict) else []
    if id(value) in memo:
        return memo[id(value)]
    if isinstance(value, dict):
        out = memo[id(value)] = {}
        out.update((k, _plain(v, memo)) for k, v in value.items())
    else:
        out = memo[id(value)] = []
        out.extend(_plain(v, memo) for v in value)
    return out
