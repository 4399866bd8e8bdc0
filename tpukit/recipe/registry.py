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
"""

from __future__ import annotations

import difflib
import importlib
import reprlib
from collections.abc import Callable
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
