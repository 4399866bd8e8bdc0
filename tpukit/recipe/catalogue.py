"""The shipped recipes as a catalogue (`tpukit recipes`): what each trains, its data, the command, what was measured.

Read from the recipes themselves, so nothing is written twice: every recipe opens with a comment block (its header;
tests/recipe/test_recipes_catalogue.py keeps its shape) whose first paragraph starts `# NAME: what it trains`, whose
commands start `python -m tpukit.train`, whose `smoke test:` line gives a quick try, and whose `Measured` paragraph
says what was measured where; the data is the recipe's `data.source` and the dataset it names. A value the recipe
cannot know (your bucket) is a placeholder spelled `YOUR_...`, which `placeholder_error` refuses before a run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex

import yaml

from tpukit.recipe.loading import packaged_recipes
from tpukit.recipe.schema import Recipe


@dataclasses.dataclass(frozen=True)
class RecipeInfo:
    """One recipe of the catalogue.

    Attributes:
        name: the name `tpukit train NAME` takes.
        path: the YAML file.
        trains: the first sentence of the header: what it trains, on what.
        data: `data.source`, and the dataset it names (`tfds cifar10`, `text_files`).
        command: the header's first command, as `tpukit train NAME ...`.
        smoke_test: the header's quick try, as a command: the first command (with what it needs, e.g. your TPU and
            bucket) and the try's overrides (None: the header has none).
        measured: the header's `Measured` paragraph, without that word ("not yet measured." where nothing was).
    """

    name: str
    path: str
    trains: str
    data: str
    command: str
    smoke_test: str | None
    measured: str


def header_lines(text: str) -> list[str]:
    """The comment block a recipe opens with, without the `# ` (an empty string for a bare `#`)."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return lines


def first_sentence(text: str) -> str:
    """Up to the first full stop followed by a space (or the end) outside parentheses."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "." and depth <= 0 and (i + 1 == len(text) or text[i + 1] == " "):
            if not text[:i].endswith("."):  # an ellipsis
                return text[: i + 1]
    return text


def as_tpukit_command(line: str, name: str) -> str:
    """`python -m tpukit.train recipes/NAME.yaml --x  # note` -> `tpukit train NAME --x`."""
    line = re.split(r"\s{2,}#", line.strip(), maxsplit=1)[0].strip()
    line = re.sub(r"^python -m tpukit\.train\s+", "tpukit train ", line)
    return re.sub(rf"(?<=^tpukit train )(?:\S*/)?{re.escape(name)}(?:\.yaml)?(?=\s|$)", name, line)


def _data(raw: dict) -> str:
    data = raw.get("data") or {}
    dataset = next((data[k] for k in ("name", "variant", "file_pattern") if data.get(k)), None)
    return f"{data.get('source')} {dataset}" if dataset else str(data.get("source"))


def describe(name: str, path: str) -> RecipeInfo:
    """The catalogue entry of the recipe file `path`, named `name`."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = header_lines(text)
    paragraphs = [p.strip() for p in "\n".join(lines).split("\n\n") if p.strip()]
    first = " ".join(paragraphs[0].split()) if paragraphs else ""
    trains = first_sentence(first.removeprefix(f"{name}:").strip())
    commands = [line.strip() for line in lines if line.strip().startswith("python -m tpukit.train")]
    smoke = next((line.strip() for line in lines if line.strip().startswith("smoke test:")), None)
    measured = next((p for p in paragraphs if "\nMeasured" in f"\n{p}"), "")
    measured = " ".join(measured[measured.find("Measured") :].split()) if measured else ""
    command = as_tpukit_command(commands[0], name) if commands else f"tpukit train {name}"
    return RecipeInfo(
        name=name,
        path=path,
        trains=trains,
        data=_data(yaml.safe_load(text) or {}),
        command=command,
        smoke_test=f"{command} {smoke.removeprefix('smoke test:').strip()}" if smoke else None,
        measured=re.sub(r"^Measured:?\s*", "", measured) or "not yet measured.",
    )


def catalogue() -> list[RecipeInfo]:
    """Every recipe shipped with tpukit (`tpukit.recipes`), by name."""
    return [describe(name, path) for name, path in sorted(packaged_recipes().items())]


def recipe_name(path: str) -> str:
    """The name a run of the recipe file `path` is known by (its output directory's default: runs/NAME)."""
    return os.path.splitext(os.path.basename(path))[0]


# A value a shipped recipe cannot know, for the user to set: `file_pattern: gs://YOUR_BUCKET/imagenet/{split}-*`.
_PLACEHOLDER = re.compile(r"YOUR_[A-Z0-9_]*[A-Z0-9]")


def fill_placeholders(text: str) -> str:
    """`gs://YOUR_BUCKET/...` -> `gs://your-bucket/...`: each placeholder as the fix spells a value of yours."""
    return _PLACEHOLDER.sub(lambda m: m[0].lower().replace("_", "-"), text)


def placeholder_error(recipe: Recipe) -> str | None:
    """The error for a `data` value that is still a placeholder (`YOUR_BUCKET`), naming the key, the value and the
    fix; None when there is none. `train` and `show` refuse it before connecting: read as it is, the path fails in
    GCS' client with a traceback, after minutes of retries where there is no network."""
    for key, value in recipe.data.options.items():
        found = _PLACEHOLDER.search(value) if isinstance(value, str) else None
        if found:
            yours = fill_placeholders(value)
            what = found[0].removeprefix("YOUR_").lower().replace("_", " ")
            return (
                f"{recipe.path}: data.{key}={value!r} is the recipe's placeholder ({found[0]}), not your data. "
                f"Fix: add --set {shlex.quote(f'data.{key}={yours}')} with your own {what}."
            )
    return None
