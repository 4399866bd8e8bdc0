"""Recipes under fuzz (issue 13): hypothesis mutates every shipped recipe and checks how tpukit answers.

The property, for every mutation: `load_recipe` either returns a `Recipe` (whose saved, resolved form loads again
to the same thing) or raises `RecipeError` -- never another exception -- with a one-paragraph message that says
"Fix:" and names the key (or file, or --set) that was mutated. Mutations that are invalid by an oracle written
here independently of `tpukit.recipe` (NaN, infinities, integers beyond int64, counts below their minimum, wrong
kinds for schema fields, missing required keys, unknown keys, files that are not UTF-8 YAML mappings, paths that
do not exist) must raise. Many mutations are valid recipes (another positive batch size, a different dropout):
those must load.

Batches that do not divide by the replicas are refused by `planner.check_batch_sizes` (before anything is
written), fuzzed on its own below. The CLI is fuzzed twice: its `main()` in this process with absl flags parsed
exactly as `python -m tpukit.train` does and `runner.run` replaced by a stub (the property: exit 2, one
`tpukit: error:` line, no traceback, nothing written -- or the recipe reaches `run`), and, for a few cases known to
be invalid, the real command in a subprocess (~5 s each for TensorFlow's import).

Budgets: the default suite runs FAST_EXAMPLES per property (derandomized, so CI sees the same cases every run);
`-m slow` runs SLOW_EXAMPLES per property with fresh random cases. TPUKIT_FUZZ_EXAMPLES overrides both.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import glob
import inspect
import io
import math
import os
import typing

import pytest
import yaml
from helpers import RECIPES, run_cli
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tpukit import recipe as recipe_lib
from tpukit.recipe import RecipeError, load_recipe
from tpukit.recipe.catalogue import fill_placeholders

FAST_EXAMPLES = int(os.environ.get("TPUKIT_FUZZ_EXAMPLES", 150))
SLOW_EXAMPLES = int(os.environ.get("TPUKIT_FUZZ_EXAMPLES", 3000))
FAST = settings(
    max_examples=FAST_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
SLOW = settings(
    max_examples=SLOW_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# Not the jax-engine recipes (the LoRA ones): this process's Keras is on TensorFlow, fixed at import, and a
# recipe naming runtime.engine: jax needs a process of its own (tests/engines/jax/test_llm_lora.py runs them).
SHIPPED = sorted(
    p
    for p in glob.glob(os.path.join(RECIPES, "*.yaml"))
    if "\n  engine: jax" not in open(p, encoding="utf-8").read()
)
# A placeholder a shipped recipe leaves for the user (`gs://YOUR_BUCKET/...`) filled in as its fix says, so every
# mutation is judged on its own (a recipe still holding one is refused before run: tests/test_train_cli.py).
TEXTS = {path: fill_placeholders(open(path, encoding="utf-8").read()) for path in SHIPPED}
RAWS = {path: yaml.safe_load(text) for path, text in TEXTS.items()}
SECTIONS = ("model", "data", "train", "runtime")
INT64_MAX = 2**63 - 1

# ---- the oracle: what the README and the dataclass comments promise, written out by hand -------------------------

# Integer schema keys and their smallest valid value; all are counts at most 2**31 - 1, except the seed.
INT_KEYS = {
    "data.global_batch_size": 1,
    "data.eval_global_batch_size": 1,
    "data.shuffle_buffer": 1,
    "data.prefetch_batches": 0,
    "data.private_threadpool_size": 0,
    "train.epochs": 1,
    "train.steps_per_epoch": 1,
    "train.warmup_steps": 0,
    "train.reference_batch_size": 1,
    "train.seed": 0,
    "train.eval_every_epochs": 1,
    "train.early_stopping_patience": 0,
    "train.max_nan_retries": 0,
    "runtime.checkpoint_every_steps": 1,
    "runtime.max_checkpoints_to_keep": 1,
}
NULLABLE = {
    "data.eval_global_batch_size",
    "data.prefetch_batches",
    "train.steps_per_epoch",
    "train.reference_batch_size",
    "train.early_stopping_patience",
    "runtime.checkpoint_every_steps",
}
NON_NEGATIVE_NUMBERS = {"train.learning_rate", "train.weight_decay", "train.label_smoothing"}
BOOL_KEYS = {"data.cache", "data.deterministic", "data.cast_to_compute_dtype", "data.skip_corrupt"}
REQUIRED = {
    "model.name",
    "data.source",
    "data.global_batch_size",
    "train.epochs",
    "train.learning_rate",
}


def schema_keys(section: str, raw: dict) -> set[str]:
    """The keys a section accepts: the dataclass fields, or the builder's / source's keyword arguments."""
    from tpukit.data import SOURCE_RESERVED_ARGS, SOURCES
    from tpukit.models import MODELS

    if section == "model":
        return set(recipe_lib.MODEL_FIELDS) | set(
            inspect.signature(MODELS[raw["model"]["name"]]).parameters
        )
    cls = {
        "data": recipe_lib.DataConfig,
        "train": recipe_lib.TrainConfig,
        "runtime": recipe_lib.RuntimeConfig,
    }[section]
    keys = {f.name for f in dataclasses.fields(cls)} - {"options"}
    if section == "data":
        keys |= set(inspect.signature(SOURCES[raw["data"]["source"]]).parameters) - set(
            SOURCE_RESERVED_ARGS
        )
    return keys


def required_arguments(section: str, raw: dict) -> set[str]:
    from tpukit.data import SOURCES
    from tpukit.models import MODELS

    fn = MODELS[raw["model"]["name"]] if section == "model" else SOURCES[raw["data"]["source"]]
    return {
        name
        for name, p in inspect.signature(fn).parameters.items()
        if p.default is inspect.Parameter.empty
    }


def has_bad_number(value) -> bool:
    """NaN, an infinity or an integer beyond int64 anywhere inside `value`."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) > INT64_MAX
    if isinstance(value, dict):
        return any(has_bad_number(k) or has_bad_number(v) for k, v in value.items())
    if isinstance(value, list):
        return any(has_bad_number(v) for v in value)
    return False


def surely_invalid(dotted: str, value) -> bool:
    """True when the oracle knows `value` is invalid for the key `section.key` (else: it may be valid)."""
    if has_bad_number(value):
        return True
    if dotted in INT_KEYS:
        if value is None:
            return dotted not in NULLABLE
        high = 2**32 - 1 if dotted == "train.seed" else 2**31 - 1
        return not (
            isinstance(value, int)
            and not isinstance(value, bool)
            and INT_KEYS[dotted] <= value <= high
        )
    if dotted == "train.learning_rate" and value is None:
        return False  # null: the model's own optimizer (refused where optimizer settings are set)
    if dotted in NON_NEGATIVE_NUMBERS:
        return not (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)
    if dotted in BOOL_KEYS:
        return not isinstance(value, bool)
    return False


# ---- cases ------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    kind: str  # for hypothesis' statistics (event)
    recipe: str  # the shipped recipe it starts from
    raw: typing.Any = None  # the mutated YAML data (dumped to the file), or
    content: bytes | None = None  # the file's bytes as they are
    path: str | None = (
        None  # a path to load instead of the written file ("{tmp}" is the test's directory)
    )
    overrides: list = dataclasses.field(default_factory=list)
    must_fail: bool = False
    must_load: bool = False  # a value within the documented range of a schema key
    names: tuple = ()  # the message must contain one of these ("{path}": the recipe file's path)


def misspellings(key: str):
    """Typos of a real key: a character dropped, doubled, swapped or changed; case; dash for underscore; plural."""
    n = len(key)
    index = st.integers(0, max(n - 1, 0))
    return st.one_of(
        index.map(lambda i: key[:i] + key[i + 1 :]),
        index.map(lambda i: key[:i] + key[i : i + 1] * 2 + key[i + 1 :]),
        index.map(lambda i: key[:i] + key[i + 1 : i + 2] + key[i : i + 1] + key[i + 2 :]),
        st.tuples(index, st.sampled_from("abcdefghijklmnopqrstuvwxyz_")).map(
            lambda t: key[: t[0]] + t[1] + key[t[0] + 1 :]
        ),
        st.just(key.upper()),
        st.just(key.replace("_", "-")),
        st.just(key + "s"),
    )


NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
HUGE = st.integers(min_value=2**63, max_value=2**130).flatmap(lambda v: st.sampled_from([v, -v]))
EDGE_INTS = st.sampled_from(
    [0, -1, 1, 2, 3, 7, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, -(2**31)]
)
INTS = st.integers(-(10**6), 10**6) | EDGE_INTS
NONINTEGRAL = st.floats(-1e6, 1e6, allow_nan=False).filter(lambda x: not x.is_integer())
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    INTS,
    st.floats(allow_nan=False, allow_infinity=False),
    NONINTEGRAL,
    NONFINITE,
    HUGE,
    st.text(max_size=12),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
ODD_KEYS = st.one_of(st.text(min_size=1, max_size=20), st.integers(-5, 5), st.booleans(), st.none())


def key_name(section: str, key) -> str:
    name = key if isinstance(key, str) and key.isidentifier() else repr(key)
    return f"{section}.{name}"


@st.composite
def unknown_key(draw, path):
    raw = copy.deepcopy(RAWS[path])
    section = draw(st.sampled_from(("<top level>", *SECTIONS)))
    existing = list(SECTIONS) if section == "<top level>" else sorted(schema_keys(section, raw))
    key = draw(st.one_of(st.sampled_from(existing).flatmap(misspellings), ODD_KEYS))
    value = draw(VALUES)
    if section == "<top level>":
        target = raw
    else:
        target = raw[section] = raw.get(section) or {}
    target[key] = value
    if key not in existing:
        return Case("unknown key", path, raw=raw, must_fail=True, names=(key_name(section, key),))
    # the typo is another real key: this is a new value for it (a whole section, at the top level)
    names = (str(key),) if section == "<top level>" else (f"{section}.",)
    return Case("unknown key", path, raw=raw, must_fail=False, names=names)


@st.composite
def new_value(draw, path):
    raw = copy.deepcopy(RAWS[path])
    section = draw(st.sampled_from(SECTIONS))
    keys = sorted(schema_keys(section, raw) | set(raw.get(section) or {}))
    key = draw(st.sampled_from(keys))
    dotted = f"{section}.{key}"
    value = draw(
        st.one_of(
            VALUES, NONFINITE, HUGE, NONINTEGRAL, EDGE_INTS, st.just(0), st.integers(-100, -1)
        )
    )
    raw.setdefault(section, {})
    raw[section] = raw[section] or {}
    raw[section][key] = value
    # a model or source change invalidates the others' arguments; a choice (optimizer, schedule...) the keys it decides
    names = (f"{section}.",) if key in ("name", "source") else (dotted,)
    return Case("new value", path, raw=raw, must_fail=surely_invalid(dotted, value), names=names)


@st.composite
def plausible_value(draw, path):
    """A value inside a schema key's documented range: it must load (the schema is not stricter than documented)."""
    raw = copy.deepcopy(RAWS[path])
    dotted = draw(
        st.sampled_from(
            sorted([*INT_KEYS, *BOOL_KEYS, "train.learning_rate", "train.label_smoothing"])
        )
    )
    section, key = dotted.split(".")
    if dotted in INT_KEYS:
        high = 2**32 - 1 if dotted == "train.seed" else 2**31 - 1
        value = draw(
            st.integers(INT_KEYS[dotted], high) | st.just(INT_KEYS[dotted]) | st.just(high)
        )
    elif dotted in BOOL_KEYS:
        value = draw(st.booleans())
    elif dotted == "train.label_smoothing":
        value = draw(st.floats(0, 1, exclude_max=True))
    else:
        value = draw(st.floats(0, 1e3) | st.integers(0, 10))
    raw[section] = raw.get(section) or {}
    raw[section][key] = value
    return Case("plausible value", path, raw=raw, must_load=True, names=(dotted,))


@st.composite
def removed_key(draw, path):
    raw = copy.deepcopy(RAWS[path])
    section = draw(st.sampled_from([s for s in SECTIONS if raw.get(s)]))
    key = draw(st.sampled_from(sorted(raw[section])))
    required = f"{section}.{key}" in REQUIRED
    if section in ("model", "data") and key not in ("name", "source"):
        required = required or key in required_arguments(section, raw)
    del raw[section][key]
    return Case("removed key", path, raw=raw, must_fail=required, names=(f"{section}.",))


@st.composite
def section_replaced(draw, path):
    raw = copy.deepcopy(RAWS[path])
    section = draw(st.sampled_from(SECTIONS))
    removed = draw(st.booleans())
    value = (
        None
        if removed
        else draw(st.one_of(st.none(), st.just({}), SCALARS, st.lists(SCALARS, max_size=3)))
    )
    if removed:
        raw.pop(section, None)
    else:
        raw[section] = value
    empty_is_fine = section == "runtime" and value in (None, {})
    return Case("section", path, raw=raw, must_fail=not empty_is_fine, names=(section,))


def _ascii_gaps(data: bytes) -> list[int]:
    return [i for i in range(1, len(data)) if data[i - 1] < 0x80 and data[i] < 0x80]


@st.composite
def bad_file(draw, path):
    text = TEXTS[path]
    data = text.encode("utf-8")
    kind = draw(
        st.sampled_from(
            ["empty", "comments", "not utf-8", "binary", "truncated", "list", "scalar", "tab"]
        )
    )
    must_fail = True
    if kind == "empty":
        content = draw(st.sampled_from([b"", b"\n", b"   \n\n", b"---\n", b"..."]))
    elif kind == "comments":
        content = b"# nothing but a comment\n# and another\n"
    elif kind == "not utf-8":
        # a byte >= 0x80 between two ASCII bytes is never valid UTF-8 (a lead byte needs continuation bytes after it)
        at = draw(st.sampled_from(_ascii_gaps(data)))
        content = data[:at] + bytes([draw(st.integers(0x80, 0xFF))]) + data[at:]
    elif kind == "binary":
        content = draw(st.binary(min_size=1, max_size=200))
    elif kind == "truncated":
        content = data[: draw(st.integers(0, len(data) - 1))]
        must_fail = False  # a cut after the last meaningful line is the same recipe
    elif kind == "list":
        content = yaml.safe_dump(draw(st.lists(SCALARS, max_size=4))).encode()
    elif kind == "scalar":
        content = yaml.safe_dump(
            draw(st.one_of(st.booleans(), INTS, st.text(max_size=10)))
        ).encode()
    else:  # a tab indenting a line: YAML forbids tabs in indentation, but a tab in a comment is fine
        lines = text.splitlines(keepends=True)
        line = draw(st.integers(0, len(lines) - 1))
        lines[line] = "\t" + lines[line]
        content = "".join(lines).encode()
        must_fail = False
    return Case(f"file: {kind}", path, content=content, must_fail=must_fail, names=("{path}",))


@st.composite
def bad_path(draw, path):
    kind = draw(st.sampled_from(["missing", "directory", "missing in a subdirectory"]))
    name = draw(
        st.text(st.characters(codec="ascii", exclude_characters="/\x00"), min_size=1, max_size=15)
    )
    packaged = recipe_lib.packaged_recipes()
    stem = name[: -len(".yaml")] if name.endswith(".yaml") else name
    if kind == "directory":
        return Case(
            "path: directory", path, path="{tmp}", must_fail=True, names=("is a directory",)
        )
    if name in (".", "..") or stem in packaged:
        name = (
            "x" + name
        )  # a packaged recipe's name is found on purpose (python -m tpukit.train digits_cnn)
    where = "{tmp}/" + ("no/such/dir/" if kind.endswith("subdirectory") else "") + name
    return Case(f"path: {kind}", path, path=where, must_fail=True, names=("not found",))


# Keys whose value may be a mapping with any key names: `--set section.key.x=...` may be valid.
MAPPING_KEYS = {
    ("runtime", "layout"),
    ("runtime", "mesh"),
    ("train", "loss"),
    ("train", "metrics"),
    ("train", "loss_weights"),
}


@st.composite
def overrides(draw, path):
    """1-3 --set flags. The last value of a key wins; a malformed flag or a value that is not YAML fails at once."""
    raw = RAWS[path]
    result, must_fail, names, final = [], False, ["--set"], {}
    # Keys given a sub-key while null or `auto`: the loader makes them a mapping (`--set runtime.mesh.model=4`),
    # which the schema refuses unless a later --set of the key itself replaces it.
    pending = set()
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["value", "value", "text", "no equals", "bad key"]))
        section = draw(st.sampled_from(SECTIONS))
        known = st.sampled_from(sorted(schema_keys(section, raw)))
        key = draw(
            known if draw(st.integers(0, 4)) else st.from_regex(r"[a-z_]{1,12}", fullmatch=True)
        )
        if kind == "no equals":
            result.append(f"{section}.{key}")
            must_fail = True
            continue
        if kind == "bad key":
            dotted = draw(
                st.sampled_from([key, f"{section}.{key}.x", f"{section}.", f"trian.{key}", ""])
            )
            result.append(f"{dotted}={draw(st.text(max_size=8))}")
            if dotted == f"{section}.{key}.x":
                # A key of a mapping (`--set runtime.mesh.model=4`): refused, naming the key, unless the key is a
                # mapping that may take it (runtime.layout's keys are regular expressions; train.loss, metrics and
                # loss_weights take one entry per output name).
                names.append(f"{section}.{key}")
                if (section, key) in MAPPING_KEYS:
                    continue
                section_raw = raw.get(section) if isinstance(raw.get(section), dict) else {}
                current = final.get((section, key), section_raw.get(key))
                if (section, key) in pending or current is None or current == "auto":
                    pending.add((section, key))
                    continue
            must_fail = True
            continue
        if kind == "value":
            text = yaml.safe_dump(draw(VALUES), default_flow_style=True).strip()
            if text.endswith("\n..."):
                text = text[: -len("\n...")]
        else:
            text = draw(st.text(max_size=15))
        try:
            final[(section, key)] = yaml.safe_load(text)
            pending.discard((section, key))
        except yaml.YAMLError:
            must_fail = True
        names += (
            [f"{section}.{key}", f"{section}."]
            if key in ("name", "source")
            else [f"{section}.{key}"]
        )
        result.append(f"{section}.{key}={text}")
    must_fail = must_fail or bool(pending)
    # a new model or source brings its own keys: an unknown key is only surely unknown when neither changed
    registry_changed = {section for (section, key) in final if key in ("name", "source")}
    for (section, key), value in final.items():
        unknown = key not in schema_keys(section, raw) and section not in registry_changed
        must_fail = must_fail or unknown or surely_invalid(f"{section}.{key}", value)
    return Case(
        "--set",
        path,
        raw=copy.deepcopy(raw),
        overrides=result,
        must_fail=must_fail,
        names=tuple(names),
    )


def cases():
    return st.sampled_from(SHIPPED).flatmap(
        lambda path: st.one_of(
            unknown_key(path),
            new_value(path),
            plausible_value(path),
            removed_key(path),
            section_replaced(path),
            bad_file(path),
            bad_path(path),
            overrides(path),
        )
    )


# ---- the property -----------------------------------------------------------------------------------------------


def materialize(case: Case, tmp: str) -> str:
    """Writes the case's recipe file under `tmp` and returns what to pass as RECIPE."""
    if case.path is not None:
        return case.path.replace("{tmp}", tmp)
    target = os.path.join(tmp, "recipe.yaml")
    with open(target, "wb") as f:
        f.write(case.content if case.content is not None else yaml.safe_dump(case.raw).encode())
    return target


def check_message(case: Case, message: str, path: str) -> None:
    assert "\n" not in message and "Traceback" not in message, message
    assert "Fix" in message, message
    names = [name.replace("{path}", path) for name in case.names]
    assert any(name in message for name in names), (names, message)


def check_load(case: Case, tmp: str) -> str:
    """The property for one case; returns 'loaded' or 'refused'."""
    event(case.kind)
    path = materialize(case, tmp)
    try:
        recipe = load_recipe(path, case.overrides)
    except RecipeError as error:
        assert not case.must_load, f"{case} was refused: {error}"
        check_message(case, str(error), path)
        event(f"{case.kind}: refused")
        return "refused"
    assert not case.must_fail, f"{case} loaded, but the oracle says it is invalid: {recipe}"
    saved = os.path.join(tmp, "resolved.yaml")
    recipe_lib.save_recipe(recipe, saved)
    assert load_recipe(saved).to_dict() == recipe.to_dict()
    event(f"{case.kind}: loaded")
    return "loaded"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fuzz"))


def _clean(tmp: str) -> str:
    case_dir = os.path.join(tmp, "case")
    if os.path.isdir(case_dir):
        for name in os.listdir(case_dir):
            os.remove(os.path.join(case_dir, name))
    os.makedirs(case_dir, exist_ok=True)
    return case_dir


@FAST
@given(case=cases())
@pytest.mark.integration
def test_every_mutation_loads_or_is_refused_naming_the_key(scratch, case):
    check_load(case, _clean(scratch))


@pytest.mark.slow
@SLOW
@given(case=cases())
def test_every_mutation_loads_or_is_refused_naming_the_key_many(scratch, case):
    check_load(case, _clean(scratch))


# ---- batches that do not divide ---------------------------------------------------------------------------------


def check_batches(
    path: str, batch: int, eval_batch: int | None, replicas: int, examples: int
) -> None:
    from tpukit.planner import check_batch_sizes

    recipe = load_recipe(
        path,
        [
            f"data.global_batch_size={batch}",
            f"data.eval_global_batch_size={yaml.safe_dump(eval_batch).splitlines()[0]}",
        ],
    )
    recipe = dataclasses.replace(
        recipe, train=dataclasses.replace(recipe.train, steps_per_epoch=None)
    )
    divides = batch % replicas == 0 and (eval_batch or batch) % replicas == 0
    try:
        steps = check_batch_sizes(recipe, replicas, examples)
    except RecipeError as error:
        message = str(error)
        assert "\n" not in message and "Fix:" in message
        assert ("data.global_batch_size" in message) or (
            "data.eval_global_batch_size" in message
        ), message
        if not divides:
            assert f"does not divide by the {replicas} replicas" in message
        else:
            assert (
                batch > examples
                and f"data.global_batch_size={batch} is larger than the {examples} examples"
                in message
            )
        return
    assert divides and steps == examples // batch >= 1


BATCHES = dict(
    path=st.sampled_from(SHIPPED),
    batch=st.integers(1, 5000),
    eval_batch=st.none() | st.integers(1, 5000),
    replicas=st.sampled_from([1, 2, 3, 4, 8, 32, 2048]),
    examples=st.integers(1, 100_000),
)


@FAST
@given(**BATCHES)
def test_batches_that_do_not_divide_are_refused_before_training(
    path, batch, eval_batch, replicas, examples
):
    check_batches(path, batch, eval_batch, replicas, examples)


@pytest.mark.slow
@SLOW
@given(**BATCHES)
def test_batches_that_do_not_divide_are_refused_before_training_many(
    path, batch, eval_batch, replicas, examples
):
    check_batches(path, batch, eval_batch, replicas, examples)


# ---- the command line -------------------------------------------------------------------------------------------


class _Reached(Exception):
    """Raised by the stand-in for runner.run: the recipe loaded and the CLI went on to train."""


def run_main(case: Case, tmp: str) -> None:
    """`python -m tpukit.train RECIPE --output_dir OUT --set ...`, in this process, with run() stubbed out."""
    from tpukit import runner, train

    recipe = materialize(case, tmp)
    output_dir = os.path.join(tmp, "out")
    argv = ["tpukit.train", recipe, "--output_dir", output_dir]
    argv += [f"--set={override}" for override in case.overrides]
    stderr = io.StringIO()

    def reached(*args, **kwargs):
        raise _Reached

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "run", reached)
        try:
            with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
                status = train.main(train.parse_flags(argv))
        except _Reached:
            event(f"{case.kind}: reached run()")
            assert not case.must_fail, f"{case} reached run(), but the oracle says it is invalid"
            return
        except SystemExit as exit_:  # parse_flags: a flag absl refuses
            status = exit_.code
        finally:
            train.FLAGS.unparse_flags()
    message = stderr.getvalue().strip()
    event(f"{case.kind}: exit {status}")
    assert not case.must_load, message
    assert status == 2, message
    assert message.startswith("tpukit: error: ") and "Traceback" not in message
    check_message(case, message, recipe)
    assert not os.path.exists(output_dir)


@settings(FAST, max_examples=max(FAST_EXAMPLES // 3, 1))
@given(case=cases())
def test_the_cli_exits_2_and_writes_nothing(scratch, case):
    run_main(case, _clean(scratch))


@pytest.mark.slow
@settings(SLOW, max_examples=max(SLOW_EXAMPLES // 3, 1))
@given(case=cases())
def test_the_cli_exits_2_and_writes_nothing_many(scratch, case):
    run_main(case, _clean(scratch))


def run_subprocess(case: Case, tmp: str) -> None:
    recipe = materialize(case, tmp)
    output_dir = os.path.join(tmp, "out")
    args = [
        recipe,
        "--output_dir",
        output_dir,
        *(f"--set={override}" for override in case.overrides),
    ]
    result = run_cli(*args, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("tpukit: error: ")]
    assert len(lines) == 1, result.stderr[-2000:]
    check_message(case, lines[0], recipe)
    assert not os.path.exists(output_dir) and set(os.listdir(tmp)) <= {"recipe.yaml"}


def _runnable(case: Case) -> bool:
    """Known invalid (a valid recipe would train), and expressible as a command line (no NUL byte)."""
    return case.must_fail and "\x00" not in "".join(case.overrides) + (case.path or "")


@pytest.mark.slow
@settings(FAST, max_examples=3)
@given(case=cases())
def test_the_real_command_exits_2_without_a_traceback(scratch, case):
    assume(_runnable(case))
    run_subprocess(case, _clean(scratch))


@pytest.mark.slow
@settings(SLOW, max_examples=20)
@given(case=cases())
def test_the_real_command_exits_2_without_a_traceback_many(scratch, case):
    assume(_runnable(case))
    run_subprocess(case, _clean(scratch))
