"""Model FLOPs utilization of each workload's train step against the matmul peak measured in the same process.

    python benchmarks/mfu.py --quick          # the vs_keras rows + the transformer recipe, ~3 minutes
    python benchmarks/mfu.py                  # more steps per row
    python benchmarks/mfu.py --rows transformer_recipe --out /tmp/mfu.json

For each row: `tpukit.run(recipe, mode="train", callbacks=[SteadyRate])` (plan, build, train through tpukit's own
trainer and pipeline, at the precision, XLA and steps_per_execution tpukit chooses), training FLOPs per example from
`tpukit.engines.tensorflow.flops.model_flops_per_example` (matmuls and convolutions only, x3 for the backward pass), and the peak from
`tpukit.engines.keras.flops.measure_matmul_flops` (a 2048x2048 matmul in the training dtype, best of 5) measured right before and
right after the row in this process (the larger one counts). MFU = FLOPs/example x examples/s / peak.

Rows: `workloads.ROWS`, plus `transformer_recipe`: recipes/synthetic_transformer.yaml (GPT-2 small's width: 768,
12 heads, MLP 3072, vocabulary 32768) at 2 layers and 256 tokens, batch 4, so that a step fits this CPU.

What limits the rest: for transformer rows, the matmul rate of the model's own matmul shapes, measured in isolation
(`shape_efficiency`: achieved FLOP/s of that shape / the 2048x2048 peak). A train step cannot beat its matmuls'
shapes; the gap between `shape_efficiency` and MFU is time outside matmuls (softmax, layer norm, GELU, the
optimizer update, the loss over the vocabulary, framework overhead). CPU figures say nothing about a TPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import tensorflow as tf  # noqa: E402
from workloads import ROWS, SteadyRate, workload  # noqa: E402

import tpukit  # noqa: E402
from tpukit.engines.keras import flops  # noqa: E402
from tpukit.recipe import load_recipe  # noqa: E402

DEFAULT_OUT = os.path.join(HERE, "results", "mfu.json")
EXTRA_ROWS = ("transformer_recipe",)


def recipe_for(name: str, quick: bool):
    """The row's recipe (train only, at least 3 executions timed) and its model kwargs."""
    if name == "transformer_recipe":
        steps = 6 if quick else 12
        recipe = load_recipe(
            os.path.join(os.path.dirname(HERE), "recipes", "synthetic_transformer.yaml"),
            [
                "model.num_layers=2",
                "model.sequence_length=256",
                "data.input_shape=[256]",
                "data.label_shape=[256]",
                "data.global_batch_size=4",
                f"data.num_examples={4 * steps}",
                f"train.steps_per_epoch={steps}",
                "train.epochs=2",
                "runtime.steps_per_execution=1",
                "runtime.verbose=0",
            ],
        )
        return recipe, dict(recipe.model.kwargs)
    row = workload(name, quick)
    return row.recipe(verbose=0), dict(row.model_kwargs)


def matmul_rate(m: int, k: int, n: int, dtype: str, repeats: int = 5) -> float:
    """FLOP/s of an (m, k) x (k, n) matmul in `dtype`, best of `repeats` (as `flops.measure_matmul_flops`)."""
    a = tf.cast(tf.random.stateless_normal((m, k), seed=(1, 2)), dtype)
    b = tf.cast(tf.random.stateless_normal((k, n), seed=(3, 4)), dtype)
    tf.reduce_sum(tf.matmul(a, b)).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        tf.reduce_sum(tf.matmul(a, b)).numpy()
        best = min(best, time.perf_counter() - start)
    return 2.0 * m * k * n / best


def transformer_shapes(kwargs: dict, tokens: int) -> dict[str, tuple[int, int, int]]:
    """The dense matmuls of one causal_lm block and its logits layer, as (m, k, n)."""
    d, mlp, vocab = kwargs.get("hidden_dim", 128), kwargs.get("mlp_dim", 512), kwargs["vocab_size"]
    return {
        "qkv/out projection": (tokens, d, d),
        "mlp up": (tokens, d, mlp),
        "mlp down": (tokens, mlp, d),
        "logits": (tokens, d, vocab),
    }


def measure(name: str, quick: bool) -> dict:
    recipe, kwargs = recipe_for(name, quick)
    dtype = flops.peak_dtype(
        tpukit.plan(recipe, mode="train", output_dir=tempfile.gettempdir()).precision
    )
    before = flops.measure_matmul_flops(2048, repeats=5, dtype=dtype)
    timer = SteadyRate(recipe.data.global_batch_size)
    with tempfile.TemporaryDirectory() as output_dir:
        metrics = tpukit.run(recipe, output_dir, mode="train", callbacks=[timer])
    after = flops.measure_matmul_flops(2048, repeats=5, dtype=dtype)
    peak = max(before, after)
    result = {
        "recipe": recipe.path,
        "precision": metrics["precision"],
        "jit_compile": metrics["jit_compile"],
        "steps_per_execution": metrics["steps_per_execution"],
        "global_batch_size": recipe.data.global_batch_size,
        "flops_per_example": metrics["flops_per_example"],
        "examples_per_second": timer.examples_per_second,
        "steps_timed": timer.steps,
        "peak_flops_before": before,
        "peak_flops_after": after,
        "mfu": flops.mfu(metrics["flops_per_example"], timer.examples_per_second, peak),
        "tpukit_reported_mfu": metrics["mfu"],
        "tpukit_peak_source": metrics["peak_flops_source"],
    }
    if recipe.model.name == "causal_lm":
        tokens = recipe.data.global_batch_size * kwargs["sequence_length"]
        result["shape_efficiency"] = {
            label: matmul_rate(*shape, dtype) / peak
            for label, shape in transformer_shapes(kwargs, tokens).items()
        }
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps per row")
    parser.add_argument("--rows", nargs="+", default=None, choices=[*ROWS, *EXTRA_ROWS])
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    rows = args.rows or [*ROWS, *EXTRA_ROWS]
    report = {
        "command": " ".join(
            ["python", "benchmarks/mfu.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "cpu_load_average_at_start": os.getloadavg(),
        "versions": {"tensorflow": tf.__version__},
        "rows": {},
    }
    for name in rows:
        report["rows"][name] = measure(name, args.quick)
        print(f"  {name}: mfu {report['rows'][name]['mfu']:.1%}", flush=True)
    print(f"{'row':<20}{'GFLOP/ex':>10}{'ex/s':>9}{'peak GF/s':>11}{'MFU':>7}  notes")
    for name, r in report["rows"].items():
        peak = max(r["peak_flops_before"], r["peak_flops_after"])
        notes = ", ".join(f"{k} {v:.0%}" for k, v in r.get("shape_efficiency", {}).items())
        print(
            f"{name:<20}{r['flops_per_example'] / 1e9:>10.3f}{r['examples_per_second']:>9.1f}"
            f"{peak / 1e9:>11.1f}{r['mfu']:>7.1%}  {notes and 'matmul shapes alone reach: ' + notes}"
        )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
