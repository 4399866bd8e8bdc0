"""Recipes bounded (issue 19, item 8): no file or `--set` value makes tpukit spin or answer with megabytes.

Before: a YAML alias bomb ("billion laughs", 9 levels of 9 aliases: 9**9 values from a few hundred bytes) in an
untyped builder argument loaded fine, then spun at 100% CPU while `recipe.yaml` was written (left empty); in an
unknown section it was refused with a 10 KB message; a value containing itself (`&a [*a]`) or nested 330 levels
loaded, then the run failed with a RecursionError traceback after creating its output directory; a 300 KB key was
echoed whole, and a 6000-digit integer or a deeply nested `freeze` pattern gave a traceback. Now each is refused at
load, in milliseconds, with one short message naming the key, the problem and the fix; the CLI exits 2 and writes
nothing. Legitimate anchors, aliases and merge keys still load, and shared values are saved shared, not copied out.
"""

import os
import textwrap
import time

import pytest
import yaml
from helpers import RECIPES, train_in_process

from tpukit.recipe import RecipeError, from_dict, load_recipe, recipe_text, save_recipe
from tpukit.recipe.loading import MAX_ALIAS_VALUES, MAX_NESTING
from tpukit.recipe.schema import _show

MESSAGE_MAX = 2000  # bytes: every message below stays a paragraph, whatever the file holds
DIGITS = os.path.join(RECIPES, "digits_cnn.yaml")
BOMB_SAYS = f"its YAML aliases (*name) expand to more than {MAX_ALIAS_VALUES:,} values"


def bomb_lines(levels=9, width=9):
    """The classic alias bomb as YAML lines: `x0` holds `width` strings, each `x{i}` `width` aliases of the one before."""
    lines = [f"x0: &x0 [{', '.join(['lol'] * width)}]"]
    lines += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * width)}]" for i in range(1, levels)]
    return lines


def indented(lines, spaces):
    return "".join(" " * spaces + line + "\n" for line in lines)


@pytest.fixture
def untyped_builder(tmp_path, monkeypatch):
    """A `module:function` builder whose `payload` argument has no annotation: the schema passes it through as is
    (the issue's first case). Removed from tpukit.models.MODELS afterwards, so other tests see the built-ins only."""
    from tpukit.models import MODELS

    package = tmp_path / "src" / "bounds_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(
        textwrap.dedent("""
            import keras

            def build(payload=None, num_classes: int = 10):
                inputs = keras.Input((8, 8, 1))
                x = keras.layers.Flatten()(inputs)
                return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
        """)
    )
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    before = dict(MODELS)
    yield "bounds_pkg.models:build"
    MODELS.clear()
    MODELS.update(before)


def digits_text(model_lines=None, extra=""):
    """The digits_cnn recipe as YAML text; `model_lines` replace its model section's keys, `extra` is appended."""
    raw = yaml.safe_load(open(DIGITS))
    text = yaml.safe_dump({k: v for k, v in raw.items() if k != "model"}, sort_keys=False)
    model = (
        model_lines if model_lines is not None else yaml.safe_dump(raw["model"], sort_keys=False)
    )
    return "model:\n" + textwrap.indent(model, "  ") + text + extra


def write(tmp_path, text, name="recipe.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refused(path, overrides=()):
    """load_recipe's message, checked for what every message here must be: short, one paragraph, with a fix."""
    start = time.perf_counter()
    with pytest.raises(RecipeError) as info:
        load_recipe(path, overrides)
    seconds = time.perf_counter() - start
    message = str(info.value)
    assert len(message.encode()) < MESSAGE_MAX, (len(message), message[:500])
    assert "\n" not in message and "Fix:" in message, message
    return message, seconds


# --------------------------------------------------------------------------------------------------------------
# The cases, run as described: `python -m tpukit.train RECIPE.yaml --output_dir DIR` (in this process).


def test_alias_bomb_in_an_untyped_builder_argument_exits_2_at_once_and_writes_nothing(
    tmp_path, untyped_builder
):
    payload = "payload:\n" + indented(bomb_lines(), 2)
    recipe = write(tmp_path, digits_text(f"name: {untyped_builder}\n{payload}"))
    out = tmp_path / "out"
    start = time.perf_counter()
    result = train_in_process(recipe, "--output_dir", str(out))
    seconds = time.perf_counter() - start
    assert result.returncode == 2
    assert f"tpukit: error: {recipe}: model.payload: {BOMB_SAYS}" in result.stderr
    assert "Fix: write the values out, or alias only a value reused a few times" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.encode()) < MESSAGE_MAX
    assert not out.exists()  # before: created, with an empty recipe.yaml, while the dump spun
    assert seconds < 5, seconds


def test_alias_bomb_in_an_unknown_section_exits_2_with_a_short_message(tmp_path):
    recipe = write(tmp_path, digits_text(extra="extra:\n" + indented(bomb_lines(), 2)))
    out = tmp_path / "out"
    result = train_in_process(recipe, "--output_dir", str(out))
    assert result.returncode == 2
    assert f"tpukit: error: {recipe}: extra.x8: {BOMB_SAYS}" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.encode()) < MESSAGE_MAX  # before: 10,177 bytes of nested lists
    assert not out.exists()


def test_alias_bomb_in_a_set_value_exits_2(tmp_path):
    bomb = "[" + ", ".join(f"&x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, 9)) + "]"
    value = "[&x0 [lol, lol, lol, lol, lol, lol, lol, lol, lol], " + bomb[1:]
    out = tmp_path / "out"
    result = train_in_process(DIGITS, "--output_dir", str(out), "--set", f"model.dropout={value}")
    assert result.returncode == 2
    assert f"the value of model.dropout: {BOMB_SAYS}" in result.stderr and "Fix:" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.encode()) < MESSAGE_MAX
    assert not out.exists()


def test_a_value_that_contains_itself_exits_2_instead_of_a_recursion_error(
    tmp_path, untyped_builder
):
    recipe = write(tmp_path, digits_text(f"name: {untyped_builder}\npayload: &loop [1, *loop]\n"))
    out = tmp_path / "out"
    result = train_in_process(recipe, "--output_dir", str(out))
    assert result.returncode == 2
    assert (
        f"tpukit: error: {recipe}: model.payload: a YAML alias (*name) refers to the value that contains it"
        in result.stderr
    )
    assert "Traceback" not in result.stderr and not out.exists()
    message, _ = refused(DIGITS, ["model.dropout=&loop {a: *loop}"])
    assert (
        "the value of model.dropout" in message
        and "refers to the value that contains it" in message
    )


def test_nesting_beyond_the_cap_is_refused_at_load_not_when_saving(tmp_path, untyped_builder):
    # 330 levels load with PyYAML and passed validation (untyped), then recipe.yaml's dump hit a RecursionError.
    deep = "[" * 330 + "1" + "]" * 330
    message, seconds = refused(
        write(tmp_path, digits_text(f"name: {untyped_builder}\npayload: {deep}\n"))
    )
    assert f"model.payload: nested more than {MAX_NESTING} levels deep" in message
    assert seconds < 2, seconds
    message, _ = refused(DIGITS, [f"model.dropout={deep}"])
    assert f"the value of model.dropout: nested more than {MAX_NESTING} levels deep" in message
    # Deeper than PyYAML's own recursion: the message that was already there.
    message, _ = refused(write(tmp_path, digits_text(extra=f"extra: {'[' * 5000}{']' * 5000}\n")))
    assert "its YAML is nested too deeply" in message


# --------------------------------------------------------------------------------------------------------------
# Legitimate aliases keep working; shared values are saved shared.


def test_a_few_anchors_and_aliases_still_load_and_save(tmp_path, untyped_builder):
    text = digits_text(
        f"name: {untyped_builder}\npayload: {{a: &shape [8, 8, 1], b: *shape, base: &base {{k: 1}}, "
        "more: {<<: *base, j: 2}}\n"
    )
    text = text.replace("learning_rate: 0.002", "learning_rate: &lr 0.002\n  global_clipnorm: *lr")
    recipe = load_recipe(write(tmp_path, text))
    assert recipe.train.learning_rate == recipe.train.global_clipnorm == 0.002
    payload = recipe.model.kwargs["payload"]
    assert payload["a"] == payload["b"] == [8, 8, 1]
    assert payload["more"] == {"k": 1, "j": 2}  # a merge key
    saved = tmp_path / "saved.yaml"
    save_recipe(recipe, str(saved))
    assert load_recipe(str(saved)).to_dict() == recipe.to_dict()  # it loads back to the same recipe


def test_a_shared_value_below_the_cap_is_saved_once_not_copied_out(tmp_path, untyped_builder):
    lines = bomb_lines(levels=5)  # 9**5 = 59,049 strings: under the cap, so it loads
    recipe = load_recipe(
        write(tmp_path, digits_text(f"name: {untyped_builder}\npayload:\n" + indented(lines, 2)))
    )
    start = time.perf_counter()
    text = recipe_text(recipe)
    assert time.perf_counter() - start < 1
    assert len(text) < 5000  # anchors and aliases, as written; copied out it would be ~470 KB
    assert "&id" in text and "*id" in text
    reloaded = yaml.safe_load(text)["model"]["payload"]
    assert len(reloaded["x4"]) == 9 and reloaded["x4"][0] == reloaded["x3"]


def test_a_recipe_built_in_python_with_a_shared_bomb_saves_and_reports_small(untyped_builder):
    value = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9  # 9**9 strings once expanded, 81 objects in memory
    raw = yaml.safe_load(open(DIGITS))
    raw["model"] = {"name": untyped_builder, "payload": value}
    start = time.perf_counter()
    recipe = from_dict(raw)
    assert len(recipe_text(recipe)) < 5000
    with pytest.raises(RecipeError) as info:
        from_dict({**raw, "extra": value})
    assert time.perf_counter() - start < 2
    assert "unknown key <top level>.extra" in str(info.value)
    assert len(str(info.value)) < MESSAGE_MAX


# --------------------------------------------------------------------------------------------------------------
# Every message stays short, whatever the file holds.

BIG = "y" * 300_000


def set_key(section, key, value):
    """digits_cnn as text with `section.key` set to the YAML text `value` (replacing the key if present)."""
    raw = yaml.safe_load(open(DIGITS))
    raw[section].pop(key, None)
    text = yaml.safe_dump(raw, sort_keys=False)
    return text.replace(f"{section}:\n", f"{section}:\n  {key}: {value}\n", 1)


def bomb_under(section, key):
    return digits_text().replace(
        f"{section}:\n", f"{section}:\n  {key}:\n" + indented(bomb_lines(), 4), 1
    )


PATHOLOGICAL = {
    # alias bombs, in each section and around them
    "bomb in model": (bomb_under("model", "filters"), f"model.filters: {BOMB_SAYS}"),
    "bomb in data": (bomb_under("data", "extra_option"), f"data.extra_option: {BOMB_SAYS}"),
    "bomb in train": (bomb_under("train", "metrics"), f"train.metrics: {BOMB_SAYS}"),
    "bomb in runtime": (
        bomb_under("runtime", "profile_steps"),
        f"runtime.profile_steps: {BOMB_SAYS}",
    ),
    "bomb as a section": (digits_text(extra=indented(bomb_lines(), 0)), f"x8: {BOMB_SAYS}"),
    "bomb as the document": (
        indented(["- " + line for line in bomb_lines()], 0),
        f".yaml: {BOMB_SAYS}",
    ),
    "bomb of mappings": (
        digits_text(extra="m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9}\n")
        + "".join(
            f"m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(9))}}}\n"
            for i in range(1, 9)
        ),
        BOMB_SAYS,
    ),
    # huge strings
    "huge choice": (set_key("train", "optimizer", BIG), "train.optimizer must be one of 'adam'"),
    "huge model name": (set_key("model", "name", BIG), "model.name='yyyy"),
    "huge module path": (
        set_key("data", "source", "a" * 300_000 + ":f"),
        "is neither a registered name",
    ),
    "huge unknown key": (
        digits_text().replace("train:\n", f"train:\n  ? {BIG}\n  : 1\n"),
        "unknown key train.'yyyy",
    ),
    "huge unknown section": (digits_text(extra=f"? {BIG}\n: 1\n"), "unknown key <top level>.'yyyy"),
    "unknown key, huge string value": (
        set_key("train", "bogus", BIG),
        "unknown key train.bogus (received 'yyyy",
    ),
    "unknown key, long list value": (
        set_key("train", "bogus", "[" + ", ".join(["1"] * 20_000) + "]"),
        "unknown key train.bogus (received [1, 1, 1, 1, 1, 1, ...])",
    ),
    "unknown key, nested value": (
        set_key("train", "bogus", "[" * 90 + "1" + "]" * 90),
        "unknown key train.bogus (received [[[[...]]]])",
    ),
    "long list of fractions": (
        set_key("train", "decay_boundaries", "[" + ", ".join(["0.9"] * 20_000) + "]").replace(
            "schedule: cosine", "schedule: step"
        ),
        "train.decay_boundaries must be increasing fractions",
    ),
    "regex nested too deeply": (
        set_key("model", "freeze", "['" + "(" * 100_000 + "']"),
        "nested too deeply",
    ),
    "exponent as text": (
        set_key("train", "seed", "1" * 300_000 + "e5"),
        "write it with a dot, e.g. seed: 1111",
    ),
    # numbers Python will not print
    "integer of 6000 digits": (
        set_key("train", "seed", "1" * 6000),
        "found an integer of 6,000 digits",
    ),
    "hex integer of 24000 bits": (
        set_key("train", "seed", "0x" + "f" * 6000),
        "train.seed is too large: received <an integer of 24,000 bits>",
    ),
    "hex integer as a key": (
        digits_text().replace("train:\n", "train:\n  ? 0x" + "f" * 6000 + "\n  : 1\n"),
        "unknown key train.<an integer of 24,000 bits>",
    ),
    # what PyYAML's own messages quote
    "undefined alias": (
        set_key("train", "seed", "*" + "a" * 300_000),
        "found undefined alias 'aaaa",
    ),
    "unknown tag": (
        set_key("train", "seed", "!" + "t" * 300_000 + " 1"),
        "could not determine a constructor",
    ),
    # many keys: the first unknown one is named
    "many unknown keys": (
        digits_text().replace(
            "train:\n", "train:\n" + "".join(f"  k{i}: {i}\n" for i in range(5000))
        ),
        "unknown key train.k0 (received 0)",
    ),
}


@pytest.mark.parametrize("case", PATHOLOGICAL)
def test_pathological_input_gets_a_short_message_naming_the_problem(tmp_path, case):
    text, expected = PATHOLOGICAL[case]
    message, seconds = refused(write(tmp_path, text))
    assert expected in message, message[:500]
    assert seconds < 5, seconds


@pytest.mark.parametrize(
    "override, expected",
    [
        ("train." + "k" * 300_000 + "=1", "unknown key train.'kkkk"),
        ("z" * 300_000 + "=1", "the key must be section.key"),
        (
            "train.seed=*" + "a" * 300_000,
            "the value of train.seed is not valid YAML (found undefined alias",
        ),
        ("train.seed=" + "[" * 5000 + "]" * 5000, "the value of train.seed is nested too deeply"),
        ("train.optimizer=" + BIG, "train.optimizer must be one of"),
    ],
)
def test_pathological_set_value_gets_a_short_message(override, expected):
    message, _ = refused(DIGITS, [override])
    assert expected in message, message[:500]


def test_show_is_bounded_for_any_value():
    deep = 1
    for _ in range(50):
        deep = [deep, deep, deep, deep, deep, deep, deep]
    for value in (BIG, list(range(100_000)), deep, {str(i): BIG for i in range(1000)}, 2**100_000):
        assert len(_show(value)) <= 240
    assert _show([1, 2, 3]) == "[1, 2, 3]" and _show("adam") == "'adam'" and _show(None) == "null"
