"""Names a recipe may use for `model.name` and `data.source`: the built-ins, `register_model` / `register_source`,
and importable `module.path:function` names, which are imported and validated like the built-ins.

    # my_package/models.py
    def build_model(num_classes: int = 10) -> keras.Model: ...

    # recipe.yaml
    model:
      name: my_package.models:build_model
      num_classes: 10
    data:
      source: my_package.data:my_source     # my_source(split, input_context=None, **options) -> tf.data.Dataset

A builder's and a source's signature is its schema: recipe keys are checked against its parameters and annotations.
Importing a `module:function` runs that module's code, as running a script would: `tpukit check` and `tpukit train`
do; `tpukit show` does not (`stand_ins`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import inspect
import reprlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class RegistryError(ValueError):
    """A name that is neither registered nor an importable `module:function`."""


def lookup(registry: dict[str, Callable], name: Any, key: str) -> Callable:
    """`registry[name]`; a `module:function` name is imported, checked callable and added to `registry`.

    Raises:
        RegistryError: the message names the key, the value received and the fix.
    """
    if isinstance(name, str) and name in registry:
        return registry[name]
    if isinstance(name, str) and ":" in name:
        registry[name] = _import(name, key)
        return registry[name]
    close = difflib.get_close_matches(str(name), list(registry), n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise RegistryError(
        f"{key} must be one of {', '.join(sorted(registry))}, or an importable 'module.path:function'; received "
        f"{reprlib.repr(name)}.{hint} Fix: set {key} to one of those names."
    )


def _import(name: str, key: str) -> Callable:
    module_name, _, attribute = name.partition(":")
    try:
        target = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, ValueError) as error:
        raise RegistryError(
            f"{key}={name!r} cannot be imported ({type(error).__name__}: {error}). Fix: check the spelling, and that "
            f"the package holding {module_name!r} is installed or on PYTHONPATH (run from its parent directory)."
        ) from None
    if not callable(target):
        raise RegistryError(
            f"{key}={name!r} is a {type(target).__name__}, not a function. Fix: name a function."
        )
    return target


class NotImportedError(RuntimeError):
    """A `module:function` that `stand_ins` stood in for was called: the code a recipe names is not run here."""


def _stand_in(name: str, key: str, keys: list[str], positional: tuple[str, ...] = ()) -> Callable:
    """A function that takes what the recipe passes to `name` (`positional`, then `keys` by keyword, untyped) and
    raises `NotImportedError` when called; its module is not imported."""
    kinds = [(k, inspect.Parameter.POSITIONAL_OR_KEYWORD) for k in positional] + [
        (k, inspect.Parameter.KEYWORD_ONLY) for k in keys if k not in positional
    ]

    def not_imported(*args, **kwargs):
        raise NotImportedError(
            f"{key}={name!r}, code (module {name.partition(':')[0]!r}) that `tpukit show` does not import or run. "
            "Fix: `tpukit check RECIPE` or `tpukit train RECIPE`, which import it."
        )

    not_imported.__signature__ = inspect.Signature(
        [inspect.Parameter(k, kind, default=None) for k, kind in kinds]
    )
    not_imported.__name__ = not_imported.__qualname__ = name.rpartition(":")[2] or "not_imported"
    return not_imported


@contextlib.contextmanager
def stand_ins(raw: Mapping[str, Any]) -> Iterator[dict[str, list[str]]]:
    """Within: the `module:function` names of the raw recipe `raw` (`model.name`, `data.source`) that are not
    registered stand for themselves without being imported, so that loading the recipe runs no code it names.
    Yields each key naming code that is not imported, with the names ({"model.name": ["my_models:build"], ...}):
    those two, whose arguments are taken as written, unchecked, and `train.loss` and `train.metrics`, which only
    compiling the model imports.

    `tpukit show` promises to run nothing: importing a module runs its top-level code.
    """
    from tpukit.data import SOURCE_RESERVED_ARGS, SOURCES
    from tpukit.models import MODELS
    from tpukit.recipe.schema import DataConfig, ModelConfig

    added: list[tuple[dict, str]] = []
    keys: dict[str, list[str]] = {}
    for section, registry, config, positional in (
        ("model", MODELS, ModelConfig, ()),
        ("data", SOURCES, DataConfig, SOURCE_RESERVED_ARGS[:2]),
    ):
        values = raw.get(section) if isinstance(raw, Mapping) else None
        field = "name" if section == "model" else "source"
        name = values.get(field) if isinstance(values, Mapping) else None
        if not isinstance(name, str) or ":" not in name or name in registry:
            continue
        own = {f.name for f in dataclasses.fields(config)}
        arguments = [k for k in values if isinstance(k, str) and k not in own]
        registry[name] = _stand_in(name, f"{section}.{field}", arguments, positional)
        added.append((registry, name))
        keys[f"{section}.{field}"] = [name]
    train = raw.get("train") if isinstance(raw, Mapping) else None
    for field in ("loss", "metrics"):
        value = train.get(field) if isinstance(train, Mapping) else None
        # A name, or a list or per-output mapping of names (or of lists of names).
        names = [n for n in _strings(value) if ":" in n]
        if names:
            keys[f"train.{field}"] = names
    try:
        yield keys
    finally:
        for registry, name in added:
            registry.pop(name, None)


def _strings(value: Any) -> list[str]:
    """The strings in `value`, a string or nested lists and mappings of them (in order; mappings' values)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [s for item in value for s in _strings(item)]
    return []


def _register(registry: dict[str, Callable], kind: str, name: str, fn: Callable | None):
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"register_{kind}: name must be a non-empty string. Received: name={name!r}"
        )

    def add(function: Callable) -> Callable:
        if not callable(function):
            raise ValueError(
                f"register_{kind}({name!r}): expected a function. Received: {function!r}"
            )
        registry[name] = function
        return function

    return add if fn is None else add(fn)


def register_model(name: str, builder: Callable | None = None):
    """Makes `builder` (keyword arguments in, `keras.Model` out) available as `model.name: <name>`.

    Use as `register_model("my_cnn", build)` or as a decorator `@register_model("my_cnn")`. Its parameters are the
    recipe keys of the `model` section. Model code never sees a strategy: tpukit builds it under the strategy scope.
    """
    from tpukit.models import MODELS

    return _register(MODELS, "model", name, builder)


def register_source(name: str, source: Callable | None = None):
    """Makes `source(split, input_context=None, **options) -> tf.data.Dataset` available as `data.source: <name>`.

    The source returns unbatched `(features, label)` or `(features, label, sample_weight)` examples of one split
    (as `keras.Model.fit` takes a dataset), this input pipeline's shard when `input_context` is given
    (`tpukit.data.shard`); tpukit batches, shuffles, pads eval (its padding weights times yours) and distributes.
    """
    from tpukit.data import SOURCES

    return _register(SOURCES, "source", name, source)
