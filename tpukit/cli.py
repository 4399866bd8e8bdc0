"""`tpukit`: one command for what tpukit does from a shell (also `python -m tpukit`).

    tpukit recipes                                   # the shipped recipes: what, data, command, measured
    tpukit show cifar10_resnet --set data.global_batch_size=256    # resolved recipe + plan here, nothing written
    tpukit train digits_cnn                          # = python -m tpukit.train digits_cnn
    tpukit doctor | check RECIPE | smoke             # = python -m tpukit.doctor | check | smoke

Thin by design: `train`, `doctor`, `check` and `smoke` hand their arguments, unchanged, to the functions behind
`python -m tpukit.train|doctor|check|smoke` (same flags, same exit statuses); `recipes` reads
`tpukit.recipe.catalogue`; `show` loads the recipe and calls `tpukit.plan`, as `train` does before it builds
anything. `--help` at every level prints a short manual page; the options in it come from each command's own
parser, so they cannot drift.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import json
import logging
import os
import shlex
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from typing import NoReturn

from tpukit import __version__
from tpukit.environment import quiet

EXIT_USAGE = 2


@dataclasses.dataclass(frozen=True)
class Command:
    """One subcommand: its manual page (without OPTIONS, which `options` gives) and what runs it."""

    summary: str
    synopsis: str
    description: str
    exit_status: str
    examples: str
    run: Callable[[list[str]], int]
    options: Callable[[], str]


def _train(args: list[str]) -> int:
    from tpukit import train

    saved = train.PROG, train.HELP
    train.PROG, train.HELP = "tpukit train", "tpukit train --help"
    try:
        return _exit_status(lambda: train.entry_point(["tpukit train", *args]))
    finally:
        train.PROG, train.HELP = saved


def _tool(name: str) -> Callable[[list[str]], int]:
    def run(args: list[str]) -> int:
        import importlib

        tool = importlib.import_module(f"tpukit.tools.{name}")
        with _usage_errors_with_fix():
            return _exit_status(lambda: tool.main(args, prog=f"tpukit {name}"))

    return run


def _usage_error_with_fix(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """argparse's usage error (a missing argument, a bad value) as every tpukit usage error: one line that ends with
    the fix, exit 2. argparse's own prints the usage and the error, and no fix."""
    parser.exit(
        EXIT_USAGE, f"tpukit: error: {parser.prog}: {message}. Fix: see `{parser.prog} --help`.\n"
    )


class _Parser(argparse.ArgumentParser):
    error = _usage_error_with_fix


@contextlib.contextmanager
def _usage_errors_with_fix() -> Iterator[None]:
    """The tools' own argparse parsers (tpukit.tools) report usage errors as `_Parser` does, while they run."""
    error = argparse.ArgumentParser.error
    argparse.ArgumentParser.error = _usage_error_with_fix
    try:
        yield
    finally:
        argparse.ArgumentParser.error = error


def _exit_status(function: Callable[[], int | None]) -> int:
    """`function()`'s status, also when it leaves by `sys.exit` (absl's app.run, argparse's errors)."""
    try:
        return function() or 0
    except SystemExit as exit_:
        code = exit_.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1


def _train_options() -> str:
    from absl import flags

    from tpukit import train

    values = {
        "set": "SECTION.KEY=VALUE",
        "output_dir": "DIR",
        "tpu": "ADDR",
        "checkpoint": "PATH",
        "accept_changes": "KEY,...",
    }
    lines = []
    for flag in flags.FLAGS.get_flags_for_module(train.__name__):
        value = "" if flag.flag_type() == "bool" else "=" + values.get(flag.name, flag.name.upper())
        lines.append(f"--{flag.name}{value}")
        text = flag.help.split(";\n")[0]  # without absl's "repeat this option ..." note
        lines += textwrap.wrap(text, 88, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def _argparse_options(main: Callable[..., object], prog: str) -> str:
    """An argparse `main`'s arguments as a manual page lists them (`RECIPE`, `--cores=N`, each with its help
    indented below), read from the parser it builds: `parse_args` is stopped before anything runs."""
    parsers: list[argparse.ArgumentParser] = []

    def stop(self, *args, **kwargs):
        parsers.append(self)
        raise SystemExit(0)

    parse_args = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = stop
    try:
        with contextlib.suppress(SystemExit):
            main([], prog=prog)
    finally:
        argparse.ArgumentParser.parse_args = parse_args
    lines = []
    for action in parsers[0]._actions:  # argparse keeps no public list of its arguments
        if isinstance(action, argparse._HelpAction):
            continue
        value = action.metavar or (
            "|".join(map(str, action.choices)) if action.choices else action.dest.upper()
        )
        if not action.option_strings:
            name = value
        elif action.nargs == 0:
            name = ", ".join(action.option_strings)
        else:
            name = ", ".join(f"{option}={value}" for option in action.option_strings)
        try:  # argparse's own %(default)s and %(prog)s; any other % is left as written
            text = (action.help or "") % {"default": action.default, "prog": prog}
        except (KeyError, TypeError, ValueError):
            text = action.help or ""
        if isinstance(action, argparse._AppendAction):
            text += " (repeatable)" if "repeatable" not in text else ""
        lines.append(name)
        lines += textwrap.wrap(text, 88, initial_indent="    ", subsequent_indent="    ")
    return "\n".join(lines)


def _tool_options(name: str) -> Callable[[], str]:
    def options() -> str:
        import importlib

        return _argparse_options(
            importlib.import_module(f"tpukit.tools.{name}").main, f"tpukit {name}"
        )

    return options


# ---- recipes -------------------------------------------------------------------------------------------------------


def _recipes_parser(prog: str = "tpukit recipes") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="The recipes shipped with tpukit.")
    parser.add_argument("--json", action="store_true", help="one JSON list, for machines")
    return parser


def recipes_main(argv: list[str], prog: str = "tpukit recipes") -> int:
    """Prints every shipped recipe: what it trains, its data, the command, a quick try, what was measured."""
    from tpukit.recipe.catalogue import catalogue

    args = _recipes_parser(prog).parse_args(argv)
    entries = catalogue()
    if args.json:
        print(json.dumps([dataclasses.asdict(e) for e in entries], indent=2))
        return 0
    print(
        f"{len(entries)} recipes ship with tpukit. `tpukit show NAME` prints one resolved, with its plan on "
        "this machine.\n"
    )
    for entry in entries:
        print(entry.name)
        rows = [
            ("trains", entry.trains),
            ("data", entry.data),
            ("run", entry.command),
            ("try", entry.smoke_test),
            ("measured", entry.measured),
        ]
        for label, value in rows:
            if value and label in ("run", "try"):  # commands stay on one line, to copy
                print(f"    {label:<10}{value}")
            elif value:
                print(
                    textwrap.fill(
                        value,
                        100,
                        initial_indent=f"    {label:<10}",
                        subsequent_indent=" " * 14,
                        break_on_hyphens=False,
                        break_long_words=False,
                    )
                )
        print()
    return 0


# ---- show ----------------------------------------------------------------------------------------------------------


def _show_parser(prog: str = "tpukit show") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="The resolved recipe and its plan on this machine.")
    parser.add_argument("recipe", help="a recipe YAML file or the name of a shipped recipe")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a recipe key (repeatable; the value is YAML), as train's --set",
    )
    parser.add_argument(
        "--output_dir", default=None, help="the run directory train would use (default runs/NAME)"
    )
    parser.add_argument("--tpu", default=None, help="a TPU name, grpc://host:port or 'local'")
    parser.add_argument(
        "--mode", default="train_and_eval", choices=["train_and_eval", "train", "eval"]
    )
    parser.add_argument("--checkpoint", default=None, help="for --mode=eval: the checkpoint")
    parser.add_argument(
        "--accept_changes",
        default="",
        metavar="KEY,...",
        help="recipe keys allowed to differ from the run in --output_dir, as train's",
    )
    return parser


def show_main(argv: list[str], prog: str = "tpukit show") -> int:
    """Prints the resolved recipe and the plan `tpukit train` would make with the same arguments; writes nothing."""
    from tpukit.environment.backend import use_engine
    from tpukit.recipe import RecipeError, raw_recipe, registry
    from tpukit.recipe.loading import requested_runtime
    from tpukit.tools import start_tool

    args = _show_parser(prog).parse_args(argv)
    # As train: --tpu quoted (JSON is YAML), so that a TPU named `yes` or `1234` stays a name.
    overrides = list(args.set) + ([f"runtime.tpu={json.dumps(args.tpu)}"] if args.tpu else [])
    try:
        _, raw = raw_recipe(args.recipe, overrides)  # the quick refusals, before TensorFlow loads
        engine = use_engine(*requested_runtime(args.recipe, overrides))
        if engine == "jax":
            # Nothing is compiled: no compilation cache directory to make (tpukit.engines.jax.compilation_cache).
            os.environ["TPUKIT_JAX_COMPILATION_CACHE"] = "0"
        problem = start_tool(engine)
    except RecipeError as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as error:  # Keras imported already with another backend (in a notebook)
        problem = str(error)
    if problem:
        print(f"tpukit: error: {problem}", file=sys.stderr)
        return 1
    try:
        # A `module:function` the recipe names is not imported: its module's top-level code would run.
        with registry.stand_ins(raw) as not_imported:
            return _show(args, argv, overrides, not_imported)
    except RecipeError as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return EXIT_USAGE


def _show(args, argv: list[str], overrides: list[str], not_imported: dict[str, list[str]]) -> int:
    """`show` once the engine is started: the recipe (its named code not imported), then the plan."""
    from tpukit.recipe import load_recipe, recipe_text
    from tpukit.recipe.catalogue import placeholder_error, recipe_name

    recipe = load_recipe(args.recipe, overrides)
    print(recipe_text(recipe))
    for key, names in not_imported.items():
        shown = repr(names[0]) if len(names) == 1 else repr(names)
        arguments = (
            ", so its arguments are shown as written, unchecked"
            if key in ("model.name", "data.source")
            else ""
        )
        print(
            f"tpukit show: {key}={shown} is code the recipe names; show does not import it (its module's code "
            f"would run){arguments}. `tpukit check` and `tpukit train` import it."
        )
    placeholder = placeholder_error(recipe)
    if placeholder:  # the recipe is shown; its plan needs the data
        print(f"tpukit: error: {placeholder}", file=sys.stderr)
        return EXIT_USAGE
    output_dir = args.output_dir or os.path.join("runs", recipe_name(recipe.path))
    accepted = [k for k in args.accept_changes.split(",") if k]
    with _own_temporary_directory():
        status, text = _plan_text(recipe, args.mode, output_dir, args.checkpoint, accepted)
    print(text, file=sys.stdout if status == 0 else sys.stderr)
    if status == 0:
        command = shlex.join(["tpukit", "train", *argv])
        print(f"tpukit show: nothing was written. To train: {command}")
    return status


@contextlib.contextmanager
def _own_temporary_directory() -> Iterator[None]:
    """Python's temporary files and directories in one of show's own, removed after, so that show leaves nothing:
    TFDS makes a `tmp*tfds` directory each time it reads the info of a dataset that is not prepared here, and keeps
    it (`DatasetInfo.initialize_from_bucket`, tensorflow_datasets/core/dataset_info.py)."""
    saved = tempfile.tempdir
    own = tempfile.mkdtemp(prefix="tpukit-show-")
    tempfile.tempdir = own
    try:
        yield
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(own, ignore_errors=True)


def _plan_text(recipe, mode, output_dir, checkpoint, accepted) -> tuple[int, str]:
    """(0, the plan) or (exit status, the error) for `show`: what `tpukit.plan` decides, or why it cannot."""
    from tpukit.data import DataUnavailableError
    from tpukit.engines.tensorflow.strategy import ClusterUnreachableError, TPUConnectionError
    from tpukit.environment import diagnose
    from tpukit.recipe import RecipeError, registry
    from tpukit.tools.offline import not_downloaded, without_downloads

    offline, switched = without_downloads(recipe)
    said = _Said()
    logging.getLogger("tpukit").addHandler(said)
    try:
        the_plan = _planned(offline, mode, output_dir, checkpoint, accepted, switched)
    except RecipeError as error:
        return EXIT_USAGE, f"tpukit: error: {error}"
    except (DataUnavailableError, TPUConnectionError, ClusterUnreachableError) as error:
        return 1, f"tpukit: error: {error}"
    except registry.NotImportedError as error:
        # The plan needs what the named code computes (the examples a source yields): not shown, as promised.
        return 0, f"tpukit show: no plan: making it would call {error}"
    except AssertionError as error:
        # TFDS' answer when the dataset is not prepared here (and show downloads nothing).
        if not not_downloaded(error):
            raise
        with said.no_repeats():
            try:
                published = _plan_with_published_sizes(
                    offline, mode, output_dir, checkpoint, accepted, switched
                )
            except RecipeError as again:
                return EXIT_USAGE, f"tpukit: error: {again}"
        if published is not None:
            return published
        return 1, (
            f"tpukit: error: {recipe.path}: the plan needs the example counts of "
            f"{recipe.data.options.get('name', recipe.data.source)!r}, which is not downloaded here "
            f"({' '.join(str(error).split())[:300]}). `tpukit show` downloads nothing. Fix: run `tpukit train` "
            "(it downloads the data first), or `--set data.data_dir=...` where it is prepared."
        )
    except Exception as error:  # noqa: BLE001 - known environment errors get cause and fix, as in train
        explanation = diagnose.explain(error) or _unreadable_path(error, recipe, output_dir)
        if explanation is None:
            raise
        first = " ".join(str(error).split())[:300]
        return 1, f"tpukit: error: {type(error).__name__}: {first}\ntpukit: {explanation}"
    finally:
        logging.getLogger("tpukit").removeHandler(said)
    return 0, the_plan.describe()


def _unreadable_path(error: Exception, recipe, output_dir: str) -> str | None:
    """Cause and fix for a TensorFlow file error while the plan reads what it needs (a gs:// path with no network or
    no access), else None. The error's own text names the path."""
    import tensorflow as tf

    if not isinstance(error, tf.errors.OpError):
        return None
    options = recipe.data.options.items()
    data = ", ".join(f"data.{k}={v!r}" for k, v in options if isinstance(v, str) and "/" in v)
    return (
        f"the plan could not read a path it needs (the data{': ' + data if data else ''}; the run directory "
        f"{output_dir!r}). Fix: check that the path in the error exists and this machine can read it (gs://: the "
        "network and your credentials, e.g. `gcloud storage ls PATH`), or --set the key (or --output_dir) to one "
        "that does."
    )


def _planned(recipe, mode, output_dir, checkpoint, accepted, switched):
    """`make_plan` with the keys `_without_downloads` switched accepted, and left out of the plan's report."""
    from tpukit.runner import make_plan

    the_plan = make_plan(
        recipe,
        mode=mode,
        output_dir=output_dir,
        checkpoint=checkpoint,
        accept_changes=[*accepted, *switched],
    )
    if switched and the_plan.accepted_changes:
        kept = {k: v for k, v in the_plan.accepted_changes.items() if k not in switched}
        the_plan = dataclasses.replace(the_plan, accepted_changes=kept)
    return the_plan


class _Said(logging.Handler):
    """The tpukit log lines of `show`'s first plan attempt, so that a second attempt (with the published split
    sizes) does not print the connection line again."""

    def __init__(self):
        super().__init__()
        self.messages: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.add(record.getMessage())

    @contextlib.contextmanager
    def no_repeats(self):
        logger = logging.getLogger("tpukit")
        logger.removeHandler(self)
        repeat = logging.Filter()
        repeat.filter = lambda record: record.getMessage() not in self.messages
        logger.addFilter(repeat)
        try:
            yield
        finally:
            logger.removeFilter(repeat)


def _plan_with_published_sizes(recipe, mode, output_dir, checkpoint, accepted, switched):
    """(0, a plan) for data that is not downloaded here but whose split sizes its catalogue publishes (a TFDS dataset
    in `tpukit.data.tfds.PUBLISHED_SPLIT_SIZES`, `movielens`), the first line saying so; None for any other.

    The counts are the catalogue's; the label checks run on examples TFDS generates from the dataset's feature spec
    (`tfds.testing.mock_data`), so the task and the shapes are the real ones and nothing is read or written."""
    from tpukit.tools import offline

    config = recipe.data
    published = offline.published_sizes(config)
    splits = [config.train_split] + ([config.eval_split] if config.eval_split else [])
    if published is None or any(published.size(s, **config.options) is None for s in splits):
        return None
    with offline.catalogue_data(config):
        the_plan = _planned(recipe, mode, output_dir, checkpoint, accepted, switched)
    about = "~" if published.note else ""
    sizes = ", ".join(f"{s} {about}{published.size(s, **config.options):,}" for s in splits)
    return 0, (
        f"tpukit show: {published.name!r} is not downloaded here, so this plan counts the split sizes the TFDS "
        f"catalogue publishes ({sizes}{published.note}) and checks the labels on examples generated from its "
        "feature spec; `tpukit train` downloads the data and counts it.\n" + the_plan.describe()
    )


# ---- the commands and their manual pages --------------------------------------------------------------------------

COMMANDS: dict[str, Command] = {
    "train": Command(
        summary="train, evaluate and export a recipe; run it again to resume",
        synopsis="tpukit train RECIPE [--set SECTION.KEY=VALUE ...] [--output_dir DIR] [--tpu ADDR]\n"
        "             [--mode train_and_eval|train|eval] [--checkpoint PATH] [--accept_changes KEY,...]",
        description="RECIPE is a YAML file or the name of a shipped recipe (`tpukit recipes`). Picks the "
        "hardware (TPU, TF_CONFIG cluster, GPUs, CPU), prints its plan, trains with checkpoints in "
        "--output_dir (default runs/NAME), evaluates exactly and exports model.keras and a SavedModel. The "
        "same as `python -m tpukit.train`.",
        exit_status="0 done; 1 the environment (TPU or workers unreachable, output directory locked or full, "
        "diverged), or training ended but an output could not be exported (metrics.json says which; the same "
        "command again exports without training); 2 bad input (recipe, flag, changed recipe); 130 Ctrl-C; 143 SIGTERM (both after saving).",
        examples="tpukit train digits_cnn\n"
        "tpukit train digits_cnn --set train.epochs=5 --output_dir runs/digits\n"
        "tpukit train textfiles_char_lm --set runtime.engine=jax",
        run=_train,
        options=_train_options,
    ),
    "show": Command(
        summary="print a recipe resolved with its overrides, and its plan on this machine; writes nothing",
        synopsis="tpukit show RECIPE [--set SECTION.KEY=VALUE ...] [--output_dir DIR] [--tpu ADDR] [--mode MODE]",
        description="Takes train's arguments and stops where train would start building: prints the resolved "
        "recipe (what train saves as recipe.yaml) and the plan `tpukit.plan` makes here (replicas, global and "
        "per-replica batch, steps, precision, XLA, resume step). Connects to the hardware and counts the data "
        "that is here (a TFDS dataset or MovieLens not downloaded yet: the split sizes its catalogue publishes, "
        "where known); downloads nothing and writes nothing, $TMPDIR included. A placeholder the recipe leaves "
        "for you (gs://YOUR_BUCKET) is refused with the --set that fixes it.",
        exit_status="0 shown; 1 the environment (engine missing, TPU unreachable, data not here); 2 bad input.",
        examples="tpukit show cifar10_resnet --set data.global_batch_size=256\n"
        "tpukit show digits_cnn --set runtime.engine=jax",
        run=show_main,
        options=lambda: _argparse_options(show_main, "tpukit show"),
    ),
    "recipes": Command(
        summary="list the shipped recipes: what each trains, its data, the command, what was measured",
        synopsis="tpukit recipes [--json]",
        description="Read from each recipe file's header and data section (recipes/ in a clone, tpukit.recipes "
        "in an install).",
        exit_status="0.",
        examples="tpukit recipes\ntpukit recipes --json",
        run=recipes_main,
        options=lambda: _argparse_options(recipes_main, "tpukit recipes"),
    ),
    "check": Command(
        summary="is this recipe ready for a TPU? checked on a CPU, rule by rule",
        synopsis="tpukit check RECIPE [--cores N] [--tpu-type v5e] [--set SECTION.KEY=VALUE ...] [--json]\n"
        "tpukit check RECIPE --topology NAME [--set ...] [--json] [--price-per-chip-hour P] [--no-fixes] [--largest-batch]",
        description="Static shapes, batch divisibility, Python ops in the input, gs:// paths, one XLA step, one "
        "step in the TPU's precision, memory against HBM: pass, warn or fail, each failure with its fix. With "
        "--topology (v5e-8, v6e-16, v5p-32, ...): the training step compiled by libtpu, the TPU compiler, on this "
        "machine (no TPU; the tpu-check extra): fits in HBM? bytes per chip, FLOPs, the roofline step time, "
        "collectives, and compiled fixes when it does not fit. The same as `python -m tpukit.check`.",
        exit_status="0 no rule failed (warnings allowed) / the step fits; 1 a rule failed / it does not fit; 2 bad "
        "recipe or flags.",
        examples="tpukit check mnist_cnn\ntpukit check cifar10_resnet --cores 32 --tpu-type v4\n"
        "tpukit check textfiles_char_lm --topology v5e-8 --set runtime.mesh.model=2 --json",
        run=_tool("check"),
        options=_tool_options("check"),
    ),
    "doctor": Command(
        summary="can this environment train? runtime, versions, accelerator, and the fix",
        synopsis="tpukit doctor [--tpu ADDR] [--json]",
        description="Detects the runtime (Colab, Kaggle, Cloud TPU VM, GPU, CPU), checks the installed versions, "
        "connects, and prints the exact install command when something is wrong. Runs where TensorFlow is "
        "missing or broken. The same as `python -m tpukit.doctor`.",
        exit_status="0 this environment can train; 1 a check failed; 2 bad flags.",
        examples="tpukit doctor\ntpukit doctor --json",
        run=_tool("doctor"),
        options=_tool_options("doctor"),
    ),
    "smoke": Command(
        summary="a synthetic recipe through every path on this machine, one report to share",
        synopsis="tpukit smoke [--engine auto|tensorflow|jax] [--tpu ADDR] [--precision P] [--json]",
        description="Connect, train with steps_per_execution, checkpoint and resume, exact eval, SavedModel "
        "reload; prints versions, devices, examples/s, MFU and PASS/FAIL per path. The same as "
        "`python -m tpukit.smoke`.",
        exit_status="0 every path passed; 1 one failed; 2 bad flags.",
        examples="tpukit smoke\ntpukit smoke --engine jax --json",
        run=_tool("smoke"),
        options=_tool_options("smoke"),
    ),
}

ENVIRONMENT = (
    "TPUKIT_VERBOSE=1      show TensorFlow's and XLA's C++ start-up lines (as --verbose)\n"
    "TF_CPP_MIN_LOG_LEVEL  respected when set (0 shows every C++ line); tpukit sets 1 otherwise: C++ INFO off"
)


def _section(title: str, body: str) -> str:
    return f"{title}\n" + textwrap.indent(body.strip("\n"), "    ") + "\n"


def _wrapped(text: str) -> str:
    return "\n".join(textwrap.wrap(text, 96))


def manual(name: str | None = None) -> str:
    """The manual page of `tpukit` (None) or of one of its commands."""
    if name is None:
        commands = "\n".join(f"{n:<9}{c.summary}" for n, c in COMMANDS.items())
        return "\n".join(
            [
                _section(
                    "NAME", "tpukit - train Keras 3 models on TPUs, GPUs and CPUs from YAML recipes"
                ),
                _section(
                    "SYNOPSIS",
                    "tpukit [--verbose] COMMAND [ARGS ...]\ntpukit COMMAND --help\ntpukit --version",
                ),
                _section("COMMANDS", commands),
                _section(
                    "OPTIONS",
                    "--verbose    show TensorFlow's and XLA's C++ start-up lines, hidden by default; "
                    "also after COMMAND\n--version    print tpukit's version\n-h, --help   this page",
                ),
                _section("ENVIRONMENT", ENVIRONMENT),
                _section(
                    "EXIT STATUS",
                    "The command's own (`tpukit COMMAND --help`); 2 for an unknown command or option.",
                ),
                _section(
                    "EXAMPLES",
                    "tpukit recipes\ntpukit show cifar10_resnet --set data.global_batch_size=256\n"
                    "tpukit train digits_cnn\ntpukit doctor",
                ),
            ]
        )
    command = COMMANDS[name]
    return "\n".join(
        [
            _section("NAME", f"tpukit {name} - {command.summary}"),
            _section("SYNOPSIS", command.synopsis),
            _section("DESCRIPTION", _wrapped(command.description)),
            _section("OPTIONS", command.options()),
            _section("EXIT STATUS", _wrapped(command.exit_status)),
            _section("EXAMPLES", command.examples),
        ]
    )


def _usage_error(message: str) -> int:
    print(f"tpukit: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    """Runs `tpukit ARGS` (default: sys.argv[1:]) and returns its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    while argv and argv[0].startswith("-"):
        option = argv.pop(0)
        if option in ("-h", "--help"):
            print(manual())
            return 0
        if option == "--version":
            print(f"tpukit {__version__}")
            return 0
        if option != "--verbose":
            return _usage_error(
                f"unknown option {option!r} before the command. The options: --verbose, --version, --help. "
                "Fix: put a command's own options after it, e.g. `tpukit train digits_cnn --set train.epochs=1`."
            )
        os.environ[quiet.VERBOSE_VARIABLE] = "1"
    if not argv:
        print(manual(), file=sys.stderr)
        return _usage_error("no command given. Fix: `tpukit COMMAND`, e.g. `tpukit recipes`.")
    name, args = argv[0], argv[1:]
    if name == "help":
        name, args = (args[0], ["--help"]) if args else (None, [])
        if name is None:
            print(manual())
            return 0
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, list(COMMANDS), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return _usage_error(
            f"unknown command {name!r}{hint}. The commands: {', '.join(COMMANDS)}. "
            "Fix: `tpukit --help` describes each."
        )
    if "-h" in args or "--help" in args:
        print(manual(name))
        return 0
    if "--verbose" in args:
        args = [a for a in args if a != "--verbose"]
        os.environ[quiet.VERBOSE_VARIABLE] = "1"
    return _exit_status(lambda: COMMANDS[name].run(args))  # argparse's errors leave by sys.exit


def entry_point() -> None:
    """The `tpukit` console script."""
    try:
        status = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # `tpukit recipes | head`: the reader left; say nothing more (Python's docs: "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        status = 1
    except KeyboardInterrupt:
        # Ctrl-C outside a training run (which saves and says so itself): one line, the shell's status for SIGINT.
        print("tpukit: interrupted", file=sys.stderr)
        status = 128 + 2
    sys.exit(status)
