"""Which precision and XLA setting is fastest for a recipe's train step on THIS host (run by hand).

    python benchmarks/precision_xla.py [RECIPE] [--steps 200]

Builds the recipe's model and input pipeline the way `tpukit.run` does, then times `--steps` train steps for each
of float32 / mixed_bfloat16 x XLA on / off in one process, and prints steps/s and the ratio to the float32,
no-XLA baseline measured in the same run. Shared, noisy machines: compare ratios, not absolute numbers, and run it
twice. The result decides `tpukit.planner.hardware.choose_precision` / `choose_jit_compile` for CPUs (see README "Measured").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from tpukit import data  # noqa: E402
from tpukit.recipe import load_recipe  # noqa: E402
from tpukit.task import build_model, count_examples, input_fns  # noqa: E402


def steps_per_second(recipe, precision: str, jit: bool, steps: int) -> float:
    keras.mixed_precision.set_global_policy(precision)
    keras.utils.set_random_seed(0)
    strategy = tf.distribute.get_strategy()
    train_fn, _ = input_fns(recipe, 0)
    with strategy.scope():
        model = build_model(recipe, total_steps=steps + 10, jit_compile=jit, steps_per_execution=1)
    dataset = data.distribute(strategy, train_fn)
    model.fit(dataset, epochs=1, steps_per_epoch=10, verbose=0)  # compile and warm up
    start = time.perf_counter()
    model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0)
    return steps / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default="digits_cnn")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    count_examples(recipe, recipe.data.train_split)  # fail early on missing data
    results = {}
    for precision in ("float32", "mixed_bfloat16"):
        for jit in (False, True):
            results[(precision, jit)] = steps_per_second(recipe, precision, jit, args.steps)
    baseline = results[("float32", False)]
    print(
        f"{recipe.path}: {args.steps} steps, global batch {recipe.data.global_batch_size}, "
        f"TF {tf.__version__}, Keras {keras.__version__}"
    )
    print(f"{'precision':<16}{'XLA':<6}{'steps/s':>10}{'vs float32 no-XLA':>20}")
    for (precision, jit), rate in results.items():
        print(f"{precision:<16}{'on' if jit else 'off':<6}{rate:>10.1f}{rate / baseline:>19.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
