"""Command line: `tpukit train RECIPE [--set section.key=value ...] [--output_dir DIR] [--tpu ADDR]
[--mode train_and_eval|train|eval] [--checkpoint PATH]`, also `python -m tpukit.train ...`.

RECIPE is a YAML file, or the name of a recipe shipped with tpukit (e.g. `digits_cnn`). Thin by design: it parses
flags, loads the recipe and calls `tpukit.run`. Exit status: 0 done, 2 bad recipe or flags (one-paragraph message,
no traceback, nothing written; also a recipe changed since the run in --output_dir was trained), 1 the TPU or the
cluster's workers could not be reached, another run holds --output_dir, training diverged, or an output could not
be exported (metrics.json is written then, with `status: failed` and `outputs_missing`; the checkpoint is kept and
the same command exports again without training again), 130 stopped by Ctrl-C
(after saving a checkpoint, or at once on a second Ctrl-C), 143 stopped by SIGTERM after saving a checkpoint (run the
same command again to resume).
"""

from __future__ import annotations

import json
import os
import sys

from absl import app, flags

from tpukit.engines import OutputDirError
from tpukit.environment import diagnose
from tpukit.environment.backend import use_engine
from tpukit.logs import enable_logging
from tpukit.recipe import RecipeError, load_recipe, raw_recipe
from tpukit.recipe.catalogue import placeholder_error
from tpukit.recipe.loading import requested_runtime
from tpukit.tools import start_tool

FLAGS = flags.FLAGS
flags.DEFINE_multi_string(
    "set", [], "Override a recipe key: --set train.epochs=3 (repeatable). Values are YAML."
)
flags.DEFINE_string(
    "output_dir",
    None,
    "Where checkpoints, logs, the model and metrics.json go. "
    "Default: runs/<recipe name>. Re-running with the same directory resumes.",
)
flags.DEFINE_string(
    "tpu", None, "TPU to use: a name, grpc://host:port or 'local' (overrides runtime.tpu)."
)
flags.DEFINE_enum(
    "mode",
    "train_and_eval",
    ["train_and_eval", "train", "eval"],
    "train_and_eval: validate during training and at the end; train: no evaluation; "
    "eval: evaluate a checkpoint (--checkpoint, default the newest in --output_dir).",
)
flags.DEFINE_string("checkpoint", None, "For --mode=eval: the checkpoint to evaluate.")
flags.DEFINE_list(
    "accept_changes",
    [],
    "Recipe keys that may differ from those the run in --output_dir was trained with, e.g. "
    "--accept_changes=train.learning_rate,train.epochs (recorded in runs.jsonl). Others are refused on resume.",
)
flags.DEFINE_bool(
    "break_lock",
    False,
    "Take over a lease-guarded output directory (gs://) whose run is known to be gone. Local directories never "
    "need it: a stopped run's lock is released by the operating system.",
)

EXIT_PREEMPTED = 128 + 15  # the shell's code for "terminated by SIGTERM"
EXIT_INTERRUPTED = 128 + 2  # ... and for "interrupted by SIGINT" (Ctrl-C)
# How the user started this command, and where its flags are described, for usage and error messages
# (`tpukit train` sets its own).
PROG = "python -m tpukit.train"
HELP = "python -m tpukit.train --help"
# What asks for the manual page, rather than absl's list of every flag (which exits 1).
HELP_FLAGS = ("-h", "--help", "--helpshort")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        given = f"{len(argv) - 1} given: {' '.join(argv[1:])}" if len(argv) > 2 else "none given"
        print(
            f"tpukit: error: one RECIPE expected, {given}. Fix: `{PROG} RECIPE [--set section.key=value ...] "
            f"[--output_dir DIR]` with one recipe file or shipped recipe, e.g. `{PROG} digits_cnn`; see `{HELP}`.",
            file=sys.stderr,
        )
        return 2
    from absl import logging as absl_logging

    # absl's app.run shows TensorFlow's Python INFO lines (one per checkpoint write); tpukit's own lines stay.
    absl_logging.set_verbosity(absl_logging.WARNING)
    enable_logging()  # first: `use_engine` warns when it replaces the shell's KERAS_BACKEND
    overrides = list(FLAGS.set)
    if FLAGS.tpu:
        # Quoted (JSON is YAML): --set values are parsed as YAML, and a TPU named `yes`, `null` or `1234` is a name.
        overrides.append(f"runtime.tpu={json.dumps(FLAGS.tpu)}")
    try:  # the quick refusals (no such recipe, YAML that does not parse, a malformed --set) before TensorFlow loads
        raw_recipe(argv[1], overrides)
    except RecipeError as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 2
    # Keras fixes its backend when first imported: set it from the recipe's runtime.engine (`auto` resolved here,
    # `tpukit.environment.engine_choice`) before anything imports Keras (the recipe's models and sources do),
    # whatever KERAS_BACKEND the shell had.
    engine = use_engine(*requested_runtime(argv[1], overrides))
    problem = start_tool(engine)  # TensorFlow imported with its C++ start-up lines hidden
    if problem:
        print(f"tpukit: error: {problem}", file=sys.stderr)
        return 1
    try:
        recipe = load_recipe(argv[1], overrides)
        placeholder = placeholder_error(recipe)
        if placeholder:
            print(f"tpukit: error: {placeholder}", file=sys.stderr)
            return 2
        name = os.path.splitext(os.path.basename(recipe.path))[0]
        output_dir = FLAGS.output_dir or os.path.join("runs", name)
        metrics = _train(recipe, output_dir)
    except RecipeError as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 2
    if isinstance(metrics, int):  # stopped, or an error that was printed
        return metrics
    return _report(metrics, output_dir)


def _train(recipe, output_dir: str) -> dict | int:
    """`tpukit.run` with the command's flags: the metrics, or the exit status of a stop or an error it printed
    (a RecipeError is raised, for `main` to print)."""
    from tpukit.data import DataUnavailableError
    from tpukit.engines.keras.trainer import TrainingDivergedError
    from tpukit.engines.tensorflow.strategy import (
        ClusterUnreachableError,
        TPUConnectionError,
        WaitInterrupted,
    )
    from tpukit.rundir import RunLockedError
    from tpukit.runner import ExportFailedError, TrainingInterrupted, run

    try:
        return run(
            recipe,
            output_dir,
            mode=FLAGS.mode,
            checkpoint=FLAGS.checkpoint,
            accept_changes=FLAGS.accept_changes,
            break_lock=FLAGS.break_lock,
        )
    except TrainingInterrupted as stopped:
        print(f"{stopped}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except WaitInterrupted as stopped:  # SIGTERM or Ctrl-C while waiting for a TPU or the workers
        print(f"{stopped}", file=sys.stderr)
        return 128 + stopped.signum
    except KeyboardInterrupt:
        print(
            "tpukit: stopped at once by Ctrl-C; the checkpoints saved before are kept in "
            f"{output_dir}. Run the same command again to resume.",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except (
        TPUConnectionError,
        ClusterUnreachableError,
        TrainingDivergedError,
        DataUnavailableError,
        OutputDirError,
        RunLockedError,
        ExportFailedError,
    ) as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 1
    except Exception as error:  # noqa: BLE001 - known environment errors get cause and fix, not a traceback
        explanation = diagnose.explain(error)
        if explanation is None:
            raise
        first = (str(error).strip().splitlines() or [""])[0][:300]
        print(
            f"tpukit: error: {type(error).__name__}: {first}\ntpukit: {explanation}",
            file=sys.stderr,
        )
        return 1


def _report(metrics: dict, output_dir: str) -> int:
    """Prints the run's one-line summary (or how to resume a preempted run); returns the exit status."""
    if metrics["status"] == "preempted":
        print(
            f"tpukit: stopped by SIGTERM at step {metrics['step']} (checkpoint saved in {output_dir}); "
            "run the same command again to resume."
        )
        return EXIT_PREEMPTED
    shown = {k: v for k, v in metrics["eval"].items() if k != "weighted_loss"}  # reported as `loss`
    summary = ", ".join(f"eval {k} {v:.4f}" for k, v in shown.items()) or "no evaluation"
    baseline = metrics.get("baseline") or {}
    if (
        "predicts" in baseline
    ):  # train.baseline: what the trivial prediction scores beside the model
        scores = {k: v for k, v in baseline.items() if k not in ("predicts", "examples")}
        summary += "; baseline (" + baseline["predicts"].split(",")[0] + ") "
        summary += ", ".join(f"{k} {v:.4f}" for k, v in scores.items())
    elif "skipped" in baseline:
        summary += f"; no baseline: {baseline['skipped']}"
    speed = metrics["examples_per_second"]
    print(
        f"tpukit: done ({metrics['status']}, step {metrics['step']}). {summary}"
        + (f"; {speed:,.0f} examples/s" if speed else ""),
        f"({metrics['replicas']} replica(s), {metrics['strategy']}); outputs in {output_dir}",
    )
    return 0


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing, but a bad flag exits 2 like every other bad input (absl's own parser exits 1)."""
    try:
        return FLAGS(argv)
    except flags.Error as error:
        message = " ".join(str(error).split()).rstrip(".")
        print(
            f"tpukit: error: {message}. Fix: see `{HELP}`.",
            file=sys.stderr,
        )
        sys.exit(2)


def entry_point(argv: list[str] | None = None) -> None:
    """Parses `argv` (default: sys.argv; argv[0] is the program) with absl, runs `main` and exits with its status.
    `--help` prints `tpukit train --help`'s manual page and exits 0."""
    if any(arg in HELP_FLAGS for arg in (sys.argv if argv is None else argv)[1:]):
        sys.exit(_manual())
    app.run(_main_then_exit, argv=argv, flags_parser=parse_flags)


def _manual() -> int:
    """Prints the manual page of `tpukit train` (the same command). `tpukit.cli` lays out every page and sits above
    this module (setup.cfg's layers), so the page is asked of the command, not imported: one page, never two."""
    import subprocess

    return subprocess.run(
        [sys.executable, "-m", "tpukit", "train", "--help"], check=False
    ).returncode


def _main_then_exit(args) -> None:
    sys.exit(main(args))


if __name__ == "__main__":
    entry_point()
