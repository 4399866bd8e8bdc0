"""Command line: `python -m tpukit.train RECIPE [--set section.key=value ...] [--output_dir DIR] [--tpu ADDR]`.

RECIPE is a YAML file, or the name of a recipe shipped with tpukit (e.g. `digits_cnn`). Thin by design: it parses
flags, loads the recipe and calls `tpukit.run`. Bad recipes exit with status 2 and a one-paragraph message.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("set", [], "Override a recipe key: --set train.epochs=3 (repeatable). Values are YAML.")
flags.DEFINE_string("output_dir", None, "Where checkpoints, logs, the model and metrics.json go. "
                    "Default: runs/<recipe name>. Re-running with the same directory resumes.")
flags.DEFINE_string("tpu", None, "TPU to use: a name, grpc://host:port or 'local' (overrides runtime.tpu).")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[0].replace("Command line: ", "usage: "), file=sys.stderr)
        return 2
    from tpukit.logs import enable_logging
    from tpukit.recipe import RecipeError, load_recipe

    enable_logging()
    overrides = list(FLAGS.set)
    if FLAGS.tpu:
        overrides.append(f"runtime.tpu={FLAGS.tpu}")
    try:
        recipe = load_recipe(argv[1], overrides)
        name = os.path.splitext(os.path.basename(recipe.path))[0]
        output_dir = FLAGS.output_dir or os.path.join("runs", name)
        from tpukit.runner import run
        from tpukit.strategy import TPUConnectionError

        try:
            metrics = run(recipe, output_dir)
        except TPUConnectionError as error:
            print(f"tpukit: error: {error}", file=sys.stderr)
            return 1
    except RecipeError as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 2
    summary = ", ".join(f"eval {k} {v:.4f}" for k, v in metrics["eval"].items())
    speed = metrics["examples_per_second"]
    print(
        f"tpukit: done. {summary}; {speed:,.0f} examples/s" if speed else f"tpukit: done. {summary}",
        f"({metrics['replicas']} replica(s), {metrics['strategy']}); outputs in {output_dir}",
    )
    return 0


def entry_point() -> None:
    app.run(lambda argv: sys.exit(main(argv)))


if __name__ == "__main__":
    entry_point()
