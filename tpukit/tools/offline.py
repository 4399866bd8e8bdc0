"""Data that is not here, for the commands that download nothing (`tpukit show`, `tpukit check`): the recipe with
downloads switched off, the split sizes a catalogue publishes, and examples generated from a TFDS dataset's feature
spec (`tfds.testing.mock_data`) in place of the data. A failed download retries for minutes; these answer at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from tpukit.recipe import Recipe


@dataclasses.dataclass(frozen=True)
class Published:
    """A dataset's split sizes from what its catalogue publishes: `size(split, **source options)`, None where not
    known; `note` says why they are approximate ("" where exact)."""

    name: str
    size: Callable[..., int | None]
    note: str = ""


def published_sizes(config) -> Published | None:
    """What the catalogue publishes about the data of the recipe's data section `config`: a TFDS dataset (sizes
    from `tpukit.data.tfds.PUBLISHED_SPLIT_SIZES`, None for one it does not list), `movielens`; None for other
    sources."""
    from tpukit.data import movielens
    from tpukit.data import tfds as tfds_source

    if config.source == "tfds":
        name = config.options.get("name", "mnist")
        return Published(name, lambda split, **_: tfds_source.published_split_size(name, split))
    if config.source == "movielens":
        variant = config.options.get("variant", "100k-ratings")
        total = movielens.PUBLISHED_RATINGS.get(variant, 0)
        note = (
            f": test_fraction of its {total:,} ratings; the exact split, by a hash of user and movie, "
            "needs the data"
        )
        return Published(f"movielens/{variant}", movielens.published_split_size, note)
    return None


def without_downloads(recipe: Recipe) -> tuple[Recipe, list[str]]:
    """(`recipe` with `download: false` for a source that downloads (TFDS, movielens), the keys so changed)."""
    from tpukit.data import SOURCES
    from tpukit.recipe import registry

    source = registry.lookup(SOURCES, recipe.data.source, "data.source")
    options = recipe.data.options
    if "download" not in inspect.signature(source).parameters or options.get("download") is False:
        return recipe, []
    data = dataclasses.replace(recipe.data, options={**options, "download": False})
    return dataclasses.replace(recipe, data=data), ["data.download"]


def not_downloaded(error: BaseException) -> bool:
    """Whether `error` is TFDS' answer for a dataset that is not prepared here and may not be downloaded."""
    return isinstance(error, AssertionError) and "could not find data" in str(error)


@contextlib.contextmanager
def catalogue_data(config, num_examples: int = 64) -> Iterator[Published]:
    """Within: the source of `config` counts its splits with the published sizes (`tpukit.data.EXAMPLE_COUNTS`), and
    TFDS yields `num_examples` examples per split generated from the dataset's feature spec, reading and writing
    nothing. Yields the `Published` sizes (`published_sizes(config)`, which must not be None)."""
    import tensorflow_datasets as tfds

    from tpukit import data

    published = published_sizes(config)
    counted = data.EXAMPLE_COUNTS.get(config.source)
    data.EXAMPLE_COUNTS[config.source] = published.size
    try:
        with quiet_tfds(), tfds.testing.mock_data(num_examples=num_examples):
            yield published
    finally:
        if counted is None:
            del data.EXAMPLE_COUNTS[config.source]
        else:
            data.EXAMPLE_COUNTS[config.source] = counted


@contextlib.contextmanager
def quiet_tfds() -> Iterator[None]:
    """Within: TFDS' warnings (logged through absl) are not printed. Looking for data that is not here, TFDS warns
    about its own state, not the user's: "Variant folder .../cifar10/3.0.2 has no dataset_info.json" (a download
    that never finished), and its mock, once per feature, that `TensorInfo.dtype` is deprecated."""
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl_logger.setLevel(level)


class Unanswered(TimeoutError):
    """`within` gave up waiting: the call did not return in time (a remote path with no network, say)."""


def within(seconds: float, function: Callable[[], Any], what: str) -> Any:
    """`function()`, waited for at most `seconds`: its result or its exception, or `Unanswered` naming `what`.

    The call runs in a daemon thread, left behind when it does not answer (a read blocked in TensorFlow's file
    system cannot be interrupted); the process does not wait for it at exit."""
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["value"] = function()
        except BaseException as error:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=call, name=f"tpukit-bounded-{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise Unanswered(f"{what} did not answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")
