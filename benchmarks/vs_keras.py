"""tpukit against the Keras a user would write, on both engines, in one run: steady-state examples/s, whole-process
wall time, and where tpukit's seconds go.

    python benchmarks/vs_keras.py --quick                 # 1 round per row and engine, fewer steps
    python benchmarks/vs_keras.py                         # 3 rounds per row and engine, more steps
    python benchmarks/vs_keras.py --engines tensorflow --rows mlp cnn --rounds 5 --out /tmp/vs_keras.json

For each engine (default: tensorflow, then jax) and each row of `workloads.py` (MLP, small CNN, ResNet,
transformer, and keras-io's mnist_convnet and text_transformer), three variants, each a whole subprocess:

* (a) plain Keras as the tutorials write it: the same model, `compile(optimizer, loss, metrics=["accuracy"])`,
  `fit(x, y, batch_size, epochs, validation_data)` with Keras' defaults on NumPy arrays, `evaluate`,
  `model.save`. The MLP row is the seed-style script: `tf.distribute.MirroredStrategy()` and compile + fit under
  `strategy.scope()` (on JAX: `keras.distribution.DataParallel()`, as Keras' JAX distribution guide does). The
  keras-io rows compile with their scripts' loss names on their softmax outputs (one-hot labels and
  `categorical_crossentropy` in mnist_convnet, which fits with `validation_split=0.1` and evaluates on its test
  set); text_transformer's script ends at `fit`, and is given the same `evaluate` as the others, since tpukit
  evaluates at the end.
* (b) plain Keras hand-tuned with what tpukit chose in (c) of the same round:
  the strategy kind, precision, `jit_compile`, `steps_per_execution`, on jax the XLA:CPU flags tpukit added, and
  a hand-written `tf.data` pipeline (cache, shuffle, repeat, batch with `drop_remainder`, prefetch AUTOTUNE,
  non-deterministic order) with `verbose=2`. Not the jax engine's unrolled threefry lowering on CPU (jax internals
  a script does not touch; docs/engines.md), nor the TF engine's combining of repeated embedding ids.
* (c) tpukit: `tpukit.fit` with the row's model builder and arrays, as a user hands tpukit their own model (MLP;
  mnist_convnet and text_transformer also with their loss and metrics by name, and mnist_convnet with its
  `validation_split=0.1`), or `tpukit.run` on the
  row's recipe (small CNN, ResNet, transformer); both with `runtime.steps_per_execution: auto`, and
  every output on (checkpoints, TensorBoard logs, `model.keras` + SavedModel export, `metrics.json`); on the jax
  engine `runtime.engine: jax` with its default mesh (every device on `data`), and its persistent compilation
  cache in a directory of this benchmark run and row (`TPUKIT_JAX_COMPILATION_CACHE`): round 1 of each row compiles
  into an empty cache, as a user's first run on a machine does, later rounds load from it, as a user's later runs do.
  (c)'s wall time of every round is printed.

Rounds alternate c a b c a b ... per row, each a whole process alone (c first: b copies its choices). On this
shared 2-core VM the machine's speed moves from second to second (one process training JAX ResNet for 30 epochs:
epoch means of 108-133 ms/step; three runs of the same Keras ResNet script one after another: 8-20% apart), so a
ratio near 1.0 is only known to within several percent. `--interleaved` (experimental, `run_round`) runs a round's
three processes in turn instead, their steady states in 0.05 s slices (SIGSTOP, SIGCONT), which cancels that drift
(three identical processes: 2.3-3.0% apart) but is not neutral: stopping a process upsets what runs on
TensorFlow's own clocks in plain Keras' variants (b's tf.data autotuning held its exit for 3-26 s; the TF MLP
tutorial script under MirroredStrategy fell to 5-77k examples/s from 63-78k alone), so it flatters (c) against (a)
and (b) on those rows.
Steady-state examples/s is measured the same way in all three (`workloads.SteadyRate`: optimizer steps after each
`fit`'s first execution, over the seconds the process ran, validation excluded); wall time is the time the process
ran, from its start to its exit (startup, imports, data, compile, training, validation, evaluation, outputs and
interpreter exit). (b) copies what (c) chose (its `metrics.json`; interleaved: as (c)'s model had it when its
training began, checked against its `metrics.json` at the end). Ratios: `c/a` and `c/b` of examples/s, and `a/c`
and `b/c` of wall time (above 1.0 means tpukit is faster in both). Medians over rounds; on a shared machine only ratios within one run mean anything.
The output also has (c)'s phases (`metrics.json` "phases_seconds", medians; interleaved, timed by a clock that
leaves out the seconds the process was stopped: `workloads.count_only_running_time`), and
`after_run`: the interpreter's exit), (c)'s MFU, a table of tpukit's two engines on the same rows, and the rows
below the issue-22 bar (c/a >= 1.0, a/c >= 1.0, c/b >= 0.97). Nothing here runs on a TPU: CPU figures say
nothing about TPU speed.
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
DEFAULT_OUT = os.path.join(HERE, "results", "vs_keras.json")


# -- the child process: one variant of one row ---------------------------------------------------------------------
def _plain_keras(row, variant: str, settings: dict, output_dir: str) -> dict:
    import keras
    import tensorflow as tf
    from workloads import SteadyRate

    timer = SteadyRate(row.global_batch_size)
    loss = row.keras_loss()
    if variant == "a":
        # The tutorial script: NumPy arrays into fit, every other argument at Keras' default.
        x, y = row.arrays("train")
        test = row.arrays("test") if row.eval_examples else None
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
                callbacks=[timer],
                **_tutorial_validation(row, test),
            )
        if test is not None:
            model.evaluate(*test, batch_size=row.global_batch_size)
    else:
        # Hand-tuned with tpukit's choices: what a careful user would write after reading tpukit's plan.
        keras.mixed_precision.set_global_policy(settings["precision"])
        if settings["strategy"] not in ("_DefaultDistributionStrategy",):
            raise SystemExit(
                f"vs_keras: (b) knows only the default strategy; tpukit chose {settings['strategy']}"
            )
        strategy = tf.distribute.get_strategy()
        train, validation_data, test_data = _tuned_datasets(row)
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
        if test_data is not None:
            model.evaluate(test_data, verbose=2)
    model.save(os.path.join(output_dir, "model.keras"))
    return timer.result()


def _tutorial_validation(row, test) -> dict:
    """(a)'s validation argument to `fit`: `validation_split` where the script splits its training arrays
    (mnist_convnet, which then evaluates on `test`), else `validation_data` (the test arrays)."""
    if row.validation_split:
        return {"validation_split": row.validation_split}
    return {"validation_data": test}


def _tuned_datasets(row) -> tuple:
    """(b)'s hand-written tf.data pipelines: train (cache, shuffle, repeat, batch with `drop_remainder`, prefetch,
    non-deterministic order), validation and test (batch, cache, prefetch; None without evaluation; test is
    validation's pipeline unless the row splits validation off its training arrays)."""
    import tensorflow as tf

    (x, y), validation = row.fit_arrays()
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

    def evaluation(arrays):
        if arrays is None:
            return None
        batches = tf.data.Dataset.from_tensor_slices(arrays).batch(row.global_batch_size).cache()
        return batches.prefetch(tf.data.AUTOTUNE)

    validation_data = evaluation(validation)
    test_data = evaluation(row.arrays("test")) if row.validation_split else validation_data
    return train, validation_data, test_data


def _plain_keras_jax(row, variant: str, settings: dict, output_dir: str) -> dict:
    """(a) and (b) on Keras' JAX backend (the child has KERAS_BACKEND=jax)."""
    import keras
    from workloads import SteadyRate

    timer = SteadyRate(row.global_batch_size)
    loss = row.keras_loss()
    if variant == "a":
        # The tutorial script on JAX; the MLP row distributes as Keras' JAX distribution guide does.
        x, y = row.arrays("train")
        test = row.arrays("test") if row.eval_examples else None
        if row.name == "mlp":
            keras.distribution.set_distribution(keras.distribution.DataParallel())
        model = row.build_model()
        model.compile(optimizer=row.keras_optimizer(), loss=loss, metrics=["accuracy"])
        model.fit(
            x,
            y,
            batch_size=row.global_batch_size,
            epochs=row.epochs,
            callbacks=[timer],
            **_tutorial_validation(row, test),
        )
        if test is not None:
            model.evaluate(*test, batch_size=row.global_batch_size)
    else:
        if settings.get("devices", 1) != 1:
            raise SystemExit(
                f"vs_keras: (b) on jax knows only one device; tpukit's mesh had {settings['devices']}"
            )
        keras.mixed_precision.set_global_policy(settings["precision"])
        train, validation_data, test_data = _tuned_datasets(row)
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
        if test_data is not None:
            model.evaluate(test_data, verbose=2)
    model.save(os.path.join(output_dir, "model.keras"))
    return timer.result()


class _Choices:
    """Writes what tpukit chose for (b) to copy (the settings `_plain_keras` reads), read off the model when its
    training begins, so that (b) of an interleaved round can start before (c) has ended; `_tpukit` checks them
    against `metrics.json`."""

    def __init__(self, path: str, engine: str):
        import keras

        class Callback(keras.callbacks.Callback):
            def on_train_begin(inner, logs=None):
                model = inner.model
                chosen = {
                    "precision": model.dtype_policy.name,
                    "jit_compile": bool(model.jit_compile),
                    "steps_per_execution": int(model.steps_per_execution),
                }
                if engine == "jax":
                    import jax

                    chosen["devices"] = jax.device_count()
                    chosen["xla_cpu_flags"] = _added_xla_flags()
                else:
                    chosen["strategy"] = type(model.distribute_strategy).__name__
                self.chosen = chosen
                with open(path, "w", encoding="utf-8") as f:
                    json.dump(chosen, f)

        self.chosen = None
        self.callback = Callback()


def _added_xla_flags() -> list[str]:
    """The flags tpukit's jax engine added to $XLA_FLAGS in this process (the child starts with none of its own)."""
    return os.environ.get("XLA_FLAGS", "").split()


def _tpukit(
    row, output_dir: str, engine: str = "tensorflow", choices_path: str | None = None
) -> dict:
    from workloads import SteadyRate

    import tpukit

    timer = SteadyRate(row.global_batch_size)
    choices = _Choices(choices_path, engine) if choices_path else None
    extra = [choices.callback] if choices else []
    # The TensorFlow path passes no engine, as before; jax: runtime.engine=jax with the default mesh.
    engine_setting = {} if engine == "tensorflow" else {"engine": engine}
    if row.through == "fit":
        if row.validation_split:  # mnist_convnet: the script's own argument
            x, y = row.arrays("train")
            validation = {"validation_split": row.validation_split}
        else:
            (x, y), test = row.fit_arrays()
            validation = {"validation_data": test}
        if row.loss is None:
            # The MLP: logits and class ids, tpukit infers the loss; the row's optimizer settings.
            own = {
                "learning_rate": row.learning_rate,
                "optimizer": "adam",
                "shuffle_buffer": row.shuffle_buffer,
            }
        else:
            # keras-io's scripts: their loss and metrics by name (softmax outputs, their labels), the rest
            # tpukit's defaults (Adam at 0.001, as their compile(optimizer="adam")).
            own = {"loss": row.loss, "metrics": ["accuracy"]}
        metrics = tpukit.fit(
            row.builder,
            x,
            y,
            **validation,
            epochs=row.epochs,
            batch_size=row.global_batch_size,
            output_dir=output_dir,
            steps_per_execution="auto",
            callbacks=[*extra, timer],
            **own,
            **engine_setting,
        )
    else:
        metrics = tpukit.run(row.recipe(**engine_setting), output_dir, callbacks=[*extra, timer])
    chosen = {
        key: metrics[key] for key in ("strategy", "precision", "jit_compile", "steps_per_execution")
    }
    if engine == "jax":
        import jax

        chosen["devices"] = jax.device_count()
        chosen["xla_cpu_flags"] = metrics["xla_cpu_flags"]["added"]
    if choices is not None:
        differing = {
            k: (v, chosen.get(k)) for k, v in (choices.chosen or {}).items() if chosen.get(k) != v
        }
        if choices.chosen is None or differing:
            raise SystemExit(
                f"vs_keras: (b) copied {choices.chosen} from the model, but metrics.json says {chosen}: "
                f"{differing}"
            )
    return {
        **timer.result(),
        "tpukit_examples_per_second": metrics["examples_per_second"],
        "tpukit_time_to_first_step": metrics["time_to_first_step_seconds"],
        "settings": chosen,
        "steps_per_execution_decision": metrics.get("steps_per_execution_decision"),
        "phases_seconds": metrics.get("phases_seconds"),
        "mfu": metrics.get("mfu"),
    }


def child(args) -> int:
    import tpukit

    args.engine = args.engine or "tensorflow"
    tpukit.use_engine(args.engine)  # before workloads imports keras
    settings = json.loads(args.settings) if args.settings else {}
    if args.variant == "b" and not settings:
        # An interleaved round: (c) of the same round wrote its choices when its training began.
        with open(args.settings_file, encoding="utf-8") as f:
            settings = json.load(f)
    if args.variant == "b" and settings.get("xla_cpu_flags"):
        # The XLA:CPU flags tpukit's jax engine added, set as a user would: before JAX's backend starts.
        os.environ["XLA_FLAGS"] = " ".join(settings["xla_cpu_flags"])
    sys.path.insert(0, HERE)
    from workloads import count_only_running_time, workload

    count_only_running_time()  # in an interleaved round: before tpukit reads the clock
    row = workload(args.row, args.quick)
    with tempfile.TemporaryDirectory() as output_dir:
        if args.variant == "c":
            result = _tpukit(row, output_dir, args.engine, args.settings_file)
        elif args.engine == "jax":
            result = _plain_keras_jax(row, args.variant, settings, output_dir)
        else:
            result = _plain_keras(row, args.variant, settings, output_dir)
    result["xla_flags"] = os.environ.get("XLA_FLAGS", "")  # what each variant's XLA ran with
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
    command = _child_command(row, variant, quick, result_path, engine)
    if settings:
        command += ["--settings", json.dumps(settings)]
    env = _child_env(row, log_dir, engine)
    log_path = os.path.join(log_dir, f"{row}-{variant}-{index}.log")
    crashes = []
    while True:
        start = time.perf_counter()
        with open(log_path, "w") as log:
            code = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO
            ).returncode
        wall = time.perf_counter() - start
        if code >= 0 or crashes:
            break
        # Killed by a signal (a segfault inside TensorFlow was seen once in plain Keras' MirroredStrategy script,
        # variant a): run it once more, and record that it happened.
        crashes.append(f"{row} ({variant}) round {index + 1}: killed by signal {-code}; ran again")
        print(f"  {crashes[-1]}", flush=True)
    if code:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        raise SystemExit(
            f"vs_keras: {row} ({variant}) exited {code}; the end of {log_path}:\n{tail}"
        )
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    result["wall_seconds"] = wall
    if crashes:
        result["crashes"] = crashes
    return result


def _child_command(row: str, variant: str, quick: bool, result_path: str, engine: str) -> list[str]:
    return [
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


def _child_env(row: str, log_dir: str, engine: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND=engine, CUDA_VISIBLE_DEVICES="")
    # Empty at this row's first round, whatever earlier runs on the machine or earlier rows compiled (docstring).
    env["TPUKIT_JAX_COMPILATION_CACHE"] = os.path.join(log_dir, "jax_compilation_cache", row)
    if engine == "jax":
        env["JAX_PLATFORMS"] = "cpu"  # like CUDA_VISIBLE_DEVICES="" for TensorFlow: the CPU only
    # Every variant starts with XLA's defaults: (b) sets what tpukit's jax engine added (`child`), (a) nothing.
    env.pop("XLA_FLAGS", None)
    return env


class _Crashed(Exception):
    """A process of an interleaved round was killed by a signal."""


def _interleaved_round(row: str, quick: bool, log_dir: str, index: int, engine: str) -> dict:
    """`run_round`, run once more if a process of it was killed by a signal (a segfault inside TensorFlow was seen
    once in plain Keras' MirroredStrategy script, variant a), recording that it happened."""
    try:
        return run_round(row, quick, log_dir, index, engine)
    except _Crashed as error:
        note = f"{error}; ran the round again"
        print(f"  {note}", flush=True)
    results = run_round(row, quick, log_dir, index, engine)
    for result in results.values():
        result["crashes"] = [note]
    return results


# The longest one variant runs alone (its start, a compile, its end) before the round is stopped as hung.
ALONE_TIMEOUT_SECONDS = 1800
SLICE_SECONDS = 0.05  # how long one variant's steady state runs before the next one's continues
# A pause with every child stopped after their starts and after each exit: what the kernel does after a process
# allocates or frees its gigabyte or so (page zeroing, compaction) then runs in nobody's slice.
SETTLE_SECONDS = 0.5


def _overlap(intervals: list, start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


def active_seconds(result: dict, ran: list) -> float:
    """The seconds of a child's steady-state windows in which it ran (`ran`: the intervals between the parent's
    SIGCONT and SIGSTOP, on the same `time.monotonic()` clock), validation left out."""
    total = 0.0
    for start, end in result["windows"]:
        total += _overlap(ran, start, end)
        for v_start, v_end in result["validations"]:
            if v_end is not None:
                total -= _overlap(ran, max(start, v_start), min(end, v_end))
    return total


def _die_with_parent() -> None:
    """In a child of an interleaved round, before it runs: SIGKILL when the parent dies (Linux `prctl`
    PR_SET_PDEATHSIG), which ends a stopped process too. Without it a parent killed by a signal left its stopped
    children behind, holding their memory."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


class _Stopped(BaseException):
    """SIGTERM or SIGHUP reached the parent of an interleaved round: raised so that its cleanup runs."""


def run_round(row: str, quick: bool, log_dir: str, index: int, engine: str) -> dict:
    """One interleaved round: c, a and b of `row` as three processes of which only one runs at any time.

    A variant runs alone from its start to the beginning of its steady state (imports, data, build, compilation
    and first execution), and again from its end (evaluation, export, exit); inside its steady state it runs in
    slices of `SLICE_SECONDS`, stopped (SIGSTOP) and continued (SIGCONT) in turn with the others' steady states. So
    all three train over the same stretch of the shared machine's time: its load changes from second to second
    (30 epochs of one JAX ResNet process here: epoch means of 108-133 ms/step), which whole processes run one
    after another do not share, and slices shorter than an execution of `steps_per_execution` steps do. Each
    variant's wall time is the time it ran (spawn to exit, stopped time left out) and its examples/s count only
    the seconds its steady state ran (`active_seconds`). (b) copies the choices that (c) wrote when its training
    began (`_Choices`). Returns {variant: result}."""
    import mmap
    import select
    import signal
    import struct

    settings_path = os.path.join(log_dir, f"{row}-choices-{index}.json")
    env = _child_env(row, log_dir, engine)
    children: dict[str, dict] = {}
    live = list(VARIANTS)  # c first: b reads its choices

    def start(variant: str) -> dict:
        report_read, report_write = os.pipe()
        stopped_path = os.path.join(log_dir, f"{row}-{variant}-{index}.stopped")
        with open(stopped_path, "wb") as f:
            f.write(struct.pack("d", 0.0))
        stopped_file = open(stopped_path, "r+b")  # noqa: SIM115 - closed with the round
        stopped = mmap.mmap(stopped_file.fileno(), 8)
        result_path = os.path.join(log_dir, f"{row}-{variant}-{index}.json")
        log_path = os.path.join(log_dir, f"{row}-{variant}-{index}.log")
        log = open(log_path, "w")  # noqa: SIM115 - closed with the round
        command = _child_command(row, variant, quick, result_path, engine)
        command += ["--settings-file", settings_path]
        began = time.monotonic()
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env, VS_KERAS_GATE=str(report_write), VS_KERAS_STOPPED=stopped_path),
            cwd=REPO,
            pass_fds=(report_write,),
            preexec_fn=_die_with_parent,
        )
        os.close(report_write)
        return {
            "process": process,
            "reports": report_read,
            "log": log,
            "log_path": log_path,
            "result_path": result_path,
            "stopped_file": stopped_file,
            "stopped_seconds": stopped,
            "ran": [[began, None]],
            "steady": False,
            "stopped": False,
        }

    def run(variant: str, alone: bool) -> None:
        """Runs `variant` (alone: until its steady state begins or it exits; else one slice, and alone on from the
        end of its steady state), then stops it (SIGSTOP) unless it has exited."""
        child = children[variant]
        if child["stopped"]:
            now = time.monotonic()
            # Its clock (`workloads.count_only_running_time`) leaves out every stop, this one included.
            total = now - sum(end - begin for begin, end in child["ran"]) - child["ran"][0][0]
            child["stopped_seconds"][:8] = struct.pack("d", total)
            child["ran"].append([now, None])
            os.kill(child["process"].pid, signal.SIGCONT)
            child["stopped"] = False
        slice_end = time.monotonic() + SLICE_SECONDS
        while True:
            timeout = ALONE_TIMEOUT_SECONDS if alone else max(0.0, slice_end - time.monotonic())
            ready, _, _ = select.select([child["reports"]], [], [], timeout)
            if not ready:
                if alone:
                    raise SystemExit(
                        f"vs_keras: {row} ({variant}) ran alone for {ALONE_TIMEOUT_SECONDS} s; see "
                        f"{child['log_path']}"
                    )
                break
            report = os.read(child["reports"], 1)
            if report == b"s":  # its steady state began
                child["steady"] = True
                if alone:
                    break
            elif report == b"e":  # it ended: alone on to its exit (or its next fit's steady state)
                child["steady"], alone = False, True
            else:  # the pipe closed: the process has ended
                child["code"] = child["process"].wait()
                child["ran"][-1][1] = time.monotonic()
                live.remove(variant)
                time.sleep(SETTLE_SECONDS)
                return
        os.kill(child["process"].pid, signal.SIGSTOP)
        child["ran"][-1][1] = time.monotonic()
        child["stopped"] = True

    def stop_round(signum, frame):
        raise _Stopped(f"vs_keras: stopped by signal {signum}")

    previous = {
        number: signal.signal(number, stop_round) for number in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        # Each one alone from its start to its steady state; then, after the machine settles, their steady states
        # in turn, from a different variant each round.
        for variant in VARIANTS:
            children[variant] = start(variant)
            run(variant, alone=True)
        time.sleep(SETTLE_SECONDS)
        turn = index
        while live:
            variant = VARIANTS[turn % len(VARIANTS)]
            turn += 1
            if variant in live:
                run(variant, alone=not children[variant]["steady"])
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for child in children.values():
            if child["process"].poll() is None:
                if child["stopped"]:
                    os.kill(child["process"].pid, signal.SIGCONT)
                child["process"].kill()
                child["process"].wait()
            os.close(child["reports"])
            child["stopped_seconds"].close()
            child["stopped_file"].close()
            child["log"].close()
    crashed = [f"{v} (signal {-c['code']})" for v, c in children.items() if c["code"] < 0]
    if crashed:
        raise _Crashed(f"{row} round {index + 1}: {', '.join(crashed)} killed by a signal")
    results = {}
    for variant, child in children.items():
        if child["code"]:
            with open(child["log_path"], encoding="utf-8", errors="replace") as f:
                tail = f.read()[-3000:]
            raise SystemExit(
                f"vs_keras: {row} ({variant}) exited {child['code']}; the end of {child['log_path']}:\n{tail}"
            )
        with open(child["result_path"], encoding="utf-8") as f:
            result = json.load(f)
        ran = child["ran"]
        result["wall_seconds"] = sum(end - begin for begin, end in ran)
        result["slices"] = len(ran)
        result["ran"] = ran
        # The child's own rate (its clock left out the stops: `workloads.count_only_running_time`), and the rate
        # over the seconds this process saw it run, which is the one compared.
        result["own_examples_per_second"] = result["examples_per_second"]
        steady = active_seconds(result, ran)
        if result["examples_per_second"] and steady > 0:
            result["examples_per_second"] = (
                result["steps_timed"] * _global_batch_size(row, quick) / steady
            )
        results[variant] = result
    return results


def _global_batch_size(row: str, quick: bool) -> int:
    from workloads import workload

    return workload(row, quick).global_batch_size


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
    summary["tpukit_mfu"] = median([r.get("mfu") for r in runs["c"]])
    summary["tpukit_phases_seconds"] = phases(runs["c"])
    return summary


def phases(runs: list[dict]) -> dict:
    """The median of each phase of tpukit's runs (`metrics.json` "phases_seconds"), and `after_run`: the wall time
    this process measured around the child less the child's own total (interpreter exit)."""
    from workloads import median

    timed = [dict(r["phases_seconds"]) for r in runs if r.get("phases_seconds")]
    for run, timing in zip(runs, timed, strict=False):
        timing["after_run"] = run["wall_seconds"] - timing["total"]
    names = [name for name in (timed[0] if timed else {}) if name != "total"] + ["total"]
    return {name: median([t.get(name) for t in timed]) for name in names}


def table(results: dict) -> str:
    header = (
        f"{'row':<18}{'a ex/s':>9}{'b ex/s':>9}{'c ex/s':>9}{'c/a':>7}{'c/b':>7}"
        f"{'a wall':>8}{'b wall':>8}{'c wall':>8}{'a/c':>7}{'b/c':>7}{'c MFU':>8}  spe chosen"
    )
    lines = [header, "-" * len(header)]
    for name, summary in results.items():
        s, r = summary, summary["ratios"]
        chosen = ",".join(str(x["steps_per_execution"]) for x in summary["tpukit_settings"])
        mfu = summary.get("tpukit_mfu")
        lines.append(
            f"{name:<18}{s['a']['examples_per_second']:>9.0f}{s['b']['examples_per_second']:>9.0f}"
            f"{s['c']['examples_per_second']:>9.0f}{r['examples_per_second_c_over_a']:>7.2f}"
            f"{r['examples_per_second_c_over_b']:>7.2f}{s['a']['wall_seconds']:>7.1f}s{s['b']['wall_seconds']:>7.1f}s"
            f"{s['c']['wall_seconds']:>7.1f}s{r['wall_a_over_c']:>7.2f}{r['wall_b_over_c']:>7.2f}"
            f"{(f'{mfu:.1%}' if mfu else '-'):>8}  {chosen}"
        )
    lines.append("")
    lines.append(
        "where (c)'s wall time goes (medians, seconds; metrics.json phases_seconds, after_run: exit):"
    )
    for name, summary in results.items():
        timing = summary.get("tpukit_phases_seconds") or {}
        lines.append(
            f"  {name:<18}"
            + ", ".join(f"{k} {v:.1f}" for k, v in timing.items() if v is not None and k != "total")
        )
    lines.append("(c)'s wall time by round (s):")
    for name, summary in results.items():
        walls = [run["wall_seconds"] for run in summary["runs"]["c"]]
        lines.append(f"  {name:<18}" + ", ".join(f"{w:.1f}" for w in walls))
    return "\n".join(lines)


def engines_table(report: dict) -> str:
    """tpukit's TensorFlow engine against its JAX engine on the same rows ((c) of each: examples/s, wall, MFU)."""
    tf_rows = report["engines"].get("tensorflow", {}).get("rows", {})
    jax_rows = report["engines"].get("jax", {}).get("rows", {})
    both = [name for name in tf_rows if name in jax_rows]
    if not both:
        return ""
    header = (
        f"{'row':<18}{'tf ex/s':>9}{'jax ex/s':>10}{'jax/tf':>8}{'tf wall':>9}{'jax wall':>10}"
        f"{'tf/jax wall':>12}{'tf MFU':>8}{'jax MFU':>9}"
    )
    lines = ["tpukit's engines on the same rows ((c) of each):", header, "-" * len(header)]
    for name in both:
        t, j = tf_rows[name], jax_rows[name]
        tmfu, jmfu = t.get("tpukit_mfu"), j.get("tpukit_mfu")
        lines.append(
            f"{name:<18}{t['c']['examples_per_second']:>9.0f}{j['c']['examples_per_second']:>10.0f}"
            f"{j['c']['examples_per_second'] / t['c']['examples_per_second']:>8.2f}"
            f"{t['c']['wall_seconds']:>8.1f}s{j['c']['wall_seconds']:>9.1f}s"
            f"{t['c']['wall_seconds'] / j['c']['wall_seconds']:>12.2f}"
            f"{(f'{tmfu:.1%}' if tmfu else '-'):>8}{(f'{jmfu:.1%}' if jmfu else '-'):>9}"
        )
    return "\n".join(lines)


def check(report: dict) -> list[str]:
    """The issue's bar, row by row: c/a >= 1.0 (examples/s), a/c >= 1.0 (whole process), c/b >= 0.97."""
    misses = []
    for engine, section in report["engines"].items():
        for name, summary in section["rows"].items():
            r = summary["ratios"]
            for key, floor in (
                ("examples_per_second_c_over_a", 1.0),
                ("wall_a_over_c", 1.0),
                ("examples_per_second_c_over_b", 0.97),
            ):
                if r[key] < floor:
                    misses.append(f"{engine} {name}: {key} {r[key]:.2f} < {floor}")
    return misses


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
        "--engines",
        nargs="+",
        choices=ENGINES,
        default=list(ENGINES),
        help="Keras backends of (a) and (b), and tpukit's runtime.engine for (c) (default: both, one after the other)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="one engine only (the same as --engines ENGINE)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="JSON results (default benchmarks/results/vs_keras.json)",
    )
    parser.add_argument(
        "--interleaved",
        action="store_true",
        help="experimental: run each round's c, a and b interleaved in slices (run_round; see its caveats)",
    )
    parser.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--settings-file", dest="settings_file", help=argparse.SUPPRESS)
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
    engines = [args.engine] if args.engine else args.engines
    out = args.out or DEFAULT_OUT
    started = time.time()
    report = {
        "command": " ".join(
            ["python", "benchmarks/vs_keras.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": machine(),
        "quick": args.quick,
        "rounds": rounds,
        "engines": {},
    }
    with tempfile.TemporaryDirectory(prefix="vs_keras-") as log_dir:
        for engine in engines:
            section = {"versions": versions(engine), "rows": {}}
            report["engines"][engine] = section
            for name in rows:
                runs = {variant: [] for variant in VARIANTS}
                for index in range(rounds):
                    if not args.interleaved:
                        results = {}
                        for variant in VARIANTS:
                            settings = results["c"]["settings"] if variant == "b" else None
                            results[variant] = run_variant(
                                name, variant, args.quick, settings, log_dir, index, engine
                            )
                    else:
                        results = _interleaved_round(name, args.quick, log_dir, index, engine)
                    for variant in VARIANTS:
                        result = results[variant]
                        runs[variant].append(result)
                        print(
                            f"  {engine} {name} ({variant}) round {index + 1}: "
                            f"{result['examples_per_second'] or 0:.0f} ex/s, {result['wall_seconds']:.1f} s wall"
                            + (f", {result['slices']} slices" if result.get("slices") else ""),
                            flush=True,
                        )
                section["rows"][name] = {"runs": runs, **summarize(runs)}
    report["seconds"] = time.time() - started
    report["machine"]["load_average_at_end"] = os.getloadavg()
    for engine, section in report["engines"].items():
        print(f"\n== {engine} engine against Keras on the {engine} backend ==")
        print(table(section["rows"]))
    text = engines_table(report)
    if text:
        print("\n" + text)
    report["misses"] = check(report)
    print(
        "\n"
        + (
            "every row: c/a >= 1.0, a/c >= 1.0, c/b >= 0.97"
            if not report["misses"]
            else "below the bar:\n  " + "\n  ".join(report["misses"])
        )
    )
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {out} ({report['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
