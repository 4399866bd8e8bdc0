"""tpukit against the Keras a user would write, in one run: steady-state examples/s and whole-process wall time.

    python benchmarks/vs_keras.py --quick                 # 1 round per row, a few minutes on a 2-core CPU
    python benchmarks/vs_keras.py                         # 3 rounds per row, more steps (~15-20 min)
    python benchmarks/vs_keras.py --rows mlp cnn --rounds 5 --out /tmp/vs_keras.json
    python benchmarks/vs_keras.py --engine jax --quick    # the same rows on Keras' JAX backend

For each row of `workloads.py` (MLP, small CNN, ResNet, transformer), three variants, each a whole subprocess:

* (a) plain Keras as the tutorials write it: the same model, `compile(optimizer, loss, metrics=["accuracy"])`,
  `fit(x, y, batch_size, epochs, validation_data)` with Keras' defaults on NumPy arrays, `evaluate`,
  `model.save`. The MLP row is the seed-style script: `tf.distribute.MirroredStrategy()` and compile + fit under
  `strategy.scope()`.
* (b) plain Keras hand-tuned with what tpukit chose in the previous (c) run of the same row (its `metrics.json`,
  written by `tpukit.engines.tensorflow.engine.report` from the plan and the build): the strategy kind, precision, `jit_compile`,
  `steps_per_execution`, and a hand-written `tf.data` pipeline (cache, shuffle, repeat, batch with
  `drop_remainder`, prefetch AUTOTUNE, non-deterministic order) with `verbose=2`.
* (c) tpukit: `tpukit.fit` (MLP) or `tpukit.run` on the row's recipe with `runtime.steps_per_execution: auto`, and
  every output on (checkpoints, TensorBoard logs, `model.keras` + SavedModel export, `metrics.json`).

Runs alternate c a b c a b ... per row (c first: b needs its choices). Steady-state examples/s is measured the same
way in all three (`workloads.SteadyRate`: optimizer steps after each `fit`'s first execution, validation time
excluded); wall time is measured by this process around each subprocess (startup, imports, data, compile, training,
validation, evaluation and outputs). Ratios: `c/a` and `c/b` of examples/s, and `a/c` and `b/c` of wall time (so
above 1.0 means tpukit is faster in both). Medians over rounds; on a shared machine only ratios within one run mean
anything. Nothing here runs on a TPU: CPU figures say nothing about TPU speed.

`--engine jax` runs the same rows on Keras' JAX backend (`KERAS_BACKEND=jax` in every child, results in
`results/vs_keras_jax.json`): (a) is the same tutorial script, except that the MLP row distributes with
`keras.distribution.DataParallel()` (Keras' JAX distribution guide) instead of `MirroredStrategy`; (b) sets
tpukit's precision, `jit_compile` and `steps_per_execution` on the same hand-written `tf.data` pipeline, without a
distribution (it refuses a mesh of more than one device); (c) is tpukit with `runtime.engine: jax` and its default
mesh (every device on `data`: one CPU device unless XLA_FLAGS asks for more).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
VARIANTS = ("c", "a", "b")  # the order of one round
ENGINES = ("tensorflow", "jax")
DEFAULT_OUT = {
    "tensorflow": os.path.join(HERE, "results", "vs_keras.json"),
    "jax": os.path.join(HERE, "results", "vs_keras_jax.json"),
}


# -- the child process: one variant of one row ---------------------------------------------------------------------
def _plain_keras(row, variant: str, settings: dict, output_dir: str) -> dict:
    import keras
    import tensorflow as tf
    from workloads import SteadyRate

    timer = SteadyRate(row.global_batch_size)
    x, y = row.arrays("train")
    validation = row.arrays("test") if row.eval_examples else None
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if variant == "a":
        # The tutorial script: NumPy arrays into fit, every other argument at Keras' default.
        strategy = (
            tf.distribute.MirroredStrategy() if row.name == "mlp" else tf.distribute.get_strategy()
        )
        with strategy.scope():
            model = row.build_model()
            model.compile(optimizer=row.keras_optimizer(), loss=loss, metrics=["accuracy"])
            model.fit(
                x,
                y,
                batch_size=row.global_batch_size,
                epochs=row.epochs,
                validation_data=validation,
                callbacks=[timer],
            )
        if validation is not None:
            model.evaluate(*validation, batch_size=row.global_batch_size)
    else:
        # Hand-tuned with tpukit's choices: what a careful user would write after reading tpukit's plan.
        keras.mixed_precision.set_global_policy(settings["precision"])
        if settings["strategy"] not in ("_DefaultDistributionStrategy",):
            raise SystemExit(
                f"vs_keras: (b) knows only the default strategy; tpukit chose {settings['strategy']}"
            )
        strategy = tf.distribute.get_strategy()
        train, validation_data = _tuned_datasets(row, x, y, validation)
        with strategy.scope():
            model = row.build_model()
            model.compile(
                optimizer=row.keras_optimizer(),
                loss=loss,
                metrics=["accuracy"],
                jit_compile=settings["jit_compile"],
                steps_per_execution=settings["steps_per_execution"],
            )
        model.fit(
            train,
            epochs=row.epochs,
            steps_per_epoch=row.steps_per_epoch,
            validation_data=validation_data,
            callbacks=[timer],
            verbose=2,
        )
        if validation_data is not None:
            model.evaluate(validation_data, verbose=2)
    model.save(os.path.join(output_dir, "model.keras"))
    return {
        "examples_per_second": timer.examples_per_second,
        "time_to_first_step": timer.time_to_first_step,
        "steps_timed": timer.steps,
    }


def _tuned_datasets(row, x, y, validation) -> tuple:
    """(b)'s hand-written tf.data pipelines: train (cache, shuffle, repeat, batch with `drop_remainder`, prefetch,
    non-deterministic order) and validation (batch, cache, prefetch; None without evaluation)."""
    import tensorflow as tf

    options = tf.data.Options()
    options.deterministic = False
    train = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .cache()
        .shuffle(row.shuffle_buffer)
        .repeat()
        .batch(row.global_batch_size, drop_remainder=True, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )
    validation_data = None
    if validation is not None:
        validation_data = (
            tf.data.Dataset.from_tensor_slices(validation).batch(row.global_batch_size).cache()
        )
        validation_data = validation_data.prefetch(tf.data.AUTOTUNE)
    return train, validation_data


def _plain_keras_jax(row, variant: str, settings: dict, output_dir: str) -> dict:
    """(a) and (b) on Keras' JAX backend (the child has KERAS_BACKEND=jax)."""
    import keras
    from workloads import SteadyRate

    timer = SteadyRate(row.global_batch_size)
    x, y = row.arrays("train")
    validation = row.arrays("test") if row.eval_examples else None
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if variant == "a":
        # The tutorial script on JAX; the MLP row distributes as Keras' JAX distribution guide does.
        if row.name == "mlp":
            keras.distribution.set_distribution(keras.distribution.DataParallel())
        model = row.build_model()
        model.compile(optimizer=row.keras_optimizer(), loss=loss, metrics=["accuracy"])
        model.fit(
            x,
            y,
            batch_size=row.global_batch_size,
            epochs=row.epochs,
            validation_data=validation,
            callbacks=[timer],
        )
        if validation is not None:
            model.evaluate(*validation, batch_size=row.global_batch_size)
    else:
        if settings.get("devices", 1) != 1:
            raise SystemExit(
                f"vs_keras: (b) on jax knows only one device; tpukit's mesh had {settings['devices']}"
            )
        keras.mixed_precision.set_global_policy(settings["precision"])
        train, validation_data = _tuned_datasets(row, x, y, validation)
        model = row.build_model()
        model.compile(
            optimizer=row.keras_optimizer(),
            loss=loss,
            metrics=["accuracy"],
            jit_compile=settings["jit_compile"],
            steps_per_execution=settings["steps_per_execution"],
        )
        model.fit(
            train,
            epochs=row.epochs,
            steps_per_epoch=row.steps_per_epoch,
            validation_data=validation_data,
            callbacks=[timer],
            verbose=2,
        )
        if validation_data is not None:
            model.evaluate(validation_data, verbose=2)
    model.save(os.path.join(output_dir, "model.keras"))
    return {
        "examples_per_second": timer.examples_per_second,
        "time_to_first_step": timer.time_to_first_step,
        "steps_timed": timer.steps,
    }


def _tpukit(row, output_dir: str, engine: str = "tensorflow") -> dict:
    from workloads import SteadyRate, mlp

    import tpukit

    timer = SteadyRate(row.global_batch_size)
    # The TensorFlow path passes no engine, as before; jax: runtime.engine=jax with the default mesh.
    engine_setting = {} if engine == "tensorflow" else {"engine": engine}
    if row.name == "mlp":
        x, y = row.arrays("train")
        metrics = tpukit.fit(
            mlp,
            x,
            y,
            validation_data=row.arrays("test"),
            epochs=row.epochs,
            batch_size=row.global_batch_size,
            output_dir=output_dir,
            learning_rate=row.learning_rate,
            optimizer="adam",
            steps_per_execution="auto",
            shuffle_buffer=row.shuffle_buffer,
            callbacks=[timer],
            **engine_setting,
        )
    else:
        metrics = tpukit.run(row.recipe(**engine_setting), output_dir, callbacks=[timer])
    chosen = {
        key: metrics[key] for key in ("strategy", "precision", "jit_compile", "steps_per_execution")
    }
    if engine == "jax":
        import jax

        chosen["devices"] = jax.device_count()
    return {
        "examples_per_second": timer.examples_per_second,
        "time_to_first_step": timer.time_to_first_step,
        "steps_timed": timer.steps,
        "tpukit_examples_per_second": metrics["examples_per_second"],
        "tpukit_time_to_first_step": metrics["time_to_first_step_seconds"],
        "settings": chosen,
    }


def child(args) -> int:
    import tpukit

    tpukit.use_engine(args.engine)  # before workloads imports keras
    sys.path.insert(0, HERE)
    from workloads import workload

    row = workload(args.row, args.quick)
    settings = json.loads(args.settings) if args.settings else {}
    with tempfile.TemporaryDirectory() as output_dir:
        if args.variant == "c":
            result = _tpukit(row, output_dir, args.engine)
        elif args.engine == "jax":
            result = _plain_keras_jax(row, args.variant, settings, output_dir)
        else:
            result = _plain_keras(row, args.variant, settings, output_dir)
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


# -- the parent: alternating subprocesses, medians, ratios ---------------------------------------------------------
def machine() -> dict:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_at_start": os.getloadavg(),
    }


def versions(engine: str = "tensorflow") -> dict:
    code = "import tensorflow as tf, keras; print(tf.__version__, keras.__version__)"
    names = ["tensorflow", "keras"]
    if engine == "jax":
        code = "import jax, jaxlib; " + code.replace(
            "print(", "print(jax.__version__, jaxlib.__version__, "
        )
        names = ["jax", "jaxlib", *names]
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND=engine),
    ).stdout.split()
    return dict(zip(names, out, strict=True)) if len(out) == len(names) else {}


def run_variant(
    row: str,
    variant: str,
    quick: bool,
    settings: dict | None,
    log_dir: str,
    index: int,
    engine: str = "tensorflow",
) -> dict:
    result_path = os.path.join(log_dir, f"{row}-{variant}-{index}.json")
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--_child",
        "--row",
        row,
        "--variant",
        variant,
        "--result",
        result_path,
        "--engine",
        engine,
    ] + (["--quick"] if quick else [])
    if settings:
        command += ["--settings", json.dumps(settings)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND=engine, CUDA_VISIBLE_DEVICES="")
    if engine == "jax":
        env["JAX_PLATFORMS"] = "cpu"  # like CUDA_VISIBLE_DEVICES="" for TensorFlow: the CPU only
    log_path = os.path.join(log_dir, f"{row}-{variant}-{index}.log")
    start = time.perf_counter()
    with open(log_path, "w") as log:
        code = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO
        ).returncode
    wall = time.perf_counter() - start
    if code:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        raise SystemExit(
            f"vs_keras: {row} ({variant}) exited {code}; the end of {log_path}:\n{tail}"
        )
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    result["wall_seconds"] = wall
    return result


def summarize(runs: dict) -> dict:
    from workloads import median

    summary = {}
    for variant in VARIANTS:
        summary[variant] = {
            "examples_per_second": median([r["examples_per_second"] for r in runs[variant]]),
            "wall_seconds": median([r["wall_seconds"] for r in runs[variant]]),
            "time_to_first_step": median([r["time_to_first_step"] for r in runs[variant]]),
        }
    a, b, c = summary["a"], summary["b"], summary["c"]
    summary["ratios"] = {
        "examples_per_second_c_over_a": c["examples_per_second"] / a["examples_per_second"],
        "examples_per_second_c_over_b": c["examples_per_second"] / b["examples_per_second"],
        "wall_a_over_c": a["wall_seconds"] / c["wall_seconds"],
        "wall_b_over_c": b["wall_seconds"] / c["wall_seconds"],
    }
    summary["tpukit_settings"] = [r["settings"] for r in runs["c"]]
    return summary


def table(results: dict) -> str:
    header = (
        f"{'row':<12}{'a ex/s':>9}{'b ex/s':>9}{'c ex/s':>9}{'c/a':>7}{'c/b':>7}"
        f"{'a wall':>8}{'b wall':>8}{'c wall':>8}{'a/c':>7}{'b/c':>7}  spe chosen"
    )
    lines = [header, "-" * len(header)]
    for name, summary in results.items():
        s, r = summary, summary["ratios"]
        chosen = ",".join(str(x["steps_per_execution"]) for x in summary["tpukit_settings"])
        lines.append(
            f"{name:<12}{s['a']['examples_per_second']:>9.0f}{s['b']['examples_per_second']:>9.0f}"
            f"{s['c']['examples_per_second']:>9.0f}{r['examples_per_second_c_over_a']:>7.2f}"
            f"{r['examples_per_second_c_over_b']:>7.2f}{s['a']['wall_seconds']:>7.1f}s{s['b']['wall_seconds']:>7.1f}s"
            f"{s['c']['wall_seconds']:>7.1f}s{r['wall_a_over_c']:>7.2f}{r['wall_b_over_c']:>7.2f}  {chosen}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer steps and 1 round (a few minutes)"
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of c a b per row (default 3, quick 1)"
    )
    parser.add_argument(
        "--rows", nargs="+", default=None, help="rows of workloads.ROWS (default: all)"
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="tensorflow",
        help="Keras backend of (a) and (b), and tpukit's runtime.engine for (c) (default tensorflow)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="JSON results (default benchmarks/results/vs_keras.json, with --engine jax vs_keras_jax.json)",
    )
    parser.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        return child(args)
    sys.path.insert(0, HERE)
    from workloads import ROWS

    rows = args.rows or list(ROWS)
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {', '.join(unknown)}; valid: {', '.join(ROWS)}")
    rounds = args.rounds or (1 if args.quick else 3)
    out = args.out or DEFAULT_OUT[args.engine]
    started = time.time()
    report = {
        "command": " ".join(
            ["python", "benchmarks/vs_keras.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": machine(),
        "engine": args.engine,
        "versions": versions(args.engine),
        "quick": args.quick,
        "rounds": rounds,
        "rows": {},
    }
    with tempfile.TemporaryDirectory(prefix="vs_keras-") as log_dir:
        for name in rows:
            runs = {variant: [] for variant in VARIANTS}
            for index in range(rounds):
                for variant in VARIANTS:
                    settings = runs["c"][-1]["settings"] if variant == "b" else None
                    result = run_variant(
                        name, variant, args.quick, settings, log_dir, index, args.engine
                    )
                    runs[variant].append(result)
                    print(
                        f"  {name} ({variant}) round {index + 1}: {result['examples_per_second'] or 0:.0f} ex/s, "
                        f"{result['wall_seconds']:.1f} s wall",
                        flush=True,
                    )
            report["rows"][name] = {"runs": runs, **summarize(runs)}
    report["seconds"] = time.time() - started
    report["machine"]["load_average_at_end"] = os.getloadavg()
    text = table({name: row for name, row in report["rows"].items()})
    print(text)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {out} ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
