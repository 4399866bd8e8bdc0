"""`python -m tpukit.smoke`: a few minutes on a TPU (or a CPU) through every path a recipe uses, then one report.

    python -m tpukit.smoke                  # --engine auto: jax on a TPU without tensorflow-tpu, else tensorflow
    python -m tpukit.smoke --tpu=local      # a TPU VM / Colab / Kaggle TPU, explicitly
    python -m tpukit.smoke --engine=jax --mesh_model=2   # Keras on JAX: every device, weights split over 2
    python -m tpukit.smoke --json           # the report as one JSON object

A synthetic recipe (a small CNN on random 32x32 images; `smoke_recipe`) goes through the same public seams as
`python -m tpukit.train` (`tpukit.plan`, `tpukit.run`, and the engine's `build/train/evaluate/export/report`), so
nothing here is a second trainer. `--engine` picks the recipe's `runtime.engine` (default auto, resolved as a run
resolves it: `tpukit.environment.engine_choice`), and with it the Keras backend, which is set before anything imports
Keras (this module imports no engine at the top). Paths, each passed or failed
in the report:

1. `connect`: the hardware. The tensorflow engine: the strategy `tpukit.connect(tpu)` returns, its replicas and (on
   a TPU) topology. The jax engine: its devices and the `runtime.mesh` it makes of them (`--mesh_data` x
   `--mesh_model`; on a CPU, XLA_FLAGS=--xla_force_host_platform_device_count=8 makes 8 devices).
2. `train`: one epoch with `steps_per_execution` > 1 in the plan's precision (`auto`: bfloat16 on TPUs and recent
   GPUs, float32 on a CPU unless `--precision` says otherwise); the loss is finite and the step count exact.
3. `checkpoint`: a new plan of two epochs resumes at the first epoch's step, the restored weights equal the weights
   the first run exported, and the second epoch trains from there (train, stop, resume).
4. `exact_eval`: the evaluation counted exactly the split's examples (the accuracy metric's total weight equals
   the example count, although the last batches are padded), so the reported accuracy is correct/examples.
5. `export`: the SavedModel reloads without tpukit's code, and its `serve` endpoint matches the trained model's
   predictions (computed in this process, by either engine; the jax engine's SavedModel is written by a
   TensorFlow-backend process).

The report is one block to paste into an issue: versions, engine, device and topology or mesh, examples/s and MFU,
and PASS/FAIL per path. Exit status 0 when every path passes, 1 otherwise. On a CPU it runs the same paths with the
default strategy (or 8 virtual JAX devices) in well under a minute (tests/tools/test_smoke.py and
tests/tools/test_smoke_jax.py run it); only a report from a TPU says anything about a TPU.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
from typing import Any

# Nothing here imports Keras, TensorFlow or JAX, nor an engine package (the tensorflow engine's sets the default
# Keras backend when imported): the engines are imported inside the paths, after `use_engine` chose the backend.
from tpukit import engines
from tpukit.environment import diagnose, engine_choice
from tpukit.environment.backend import use_engine
from tpukit.logs import enable_logging
from tpukit.recipe import from_dict
from tpukit.tools import start_tool

ENGINES = ("tensorflow", "jax")
STEPS_PER_EXECUTION = 4
# (examples per replica per step, steps per epoch) on a CPU and on an accelerator: small enough for the test suite
# on a CPU; on a TPU a per-core batch that fills the matrix units and enough steps for a throughput number.
SIZES = {"cpu": (16, 8), "accelerator": (128, 64)}
PATHS = ("connect", "train", "checkpoint", "exact_eval", "export")


@dataclasses.dataclass
class Path:
    """One path's verdict: `status` is "pass", "fail" or "skip" (an earlier path it needs failed)."""

    name: str
    status: str
    detail: str


def smoke_recipe(
    replicas: int,
    accelerator: bool,
    epochs: int = 1,
    precision: str = "auto",
    tpu: str | None = None,
    engine: str = "tensorflow",
    mesh: dict | None = None,
) -> dict:
    """The synthetic recipe as a dict (what a YAML file would hold), sized for `replicas` devices (the jax
    engine: the mesh's `data` size) on `engine`, with `runtime.mesh` = `mesh` ({"data": n | "auto", "model": m}).

    The eval batch is 3/4 of the training batch, so the eval split (4 training batches of examples) ends in a
    partly padded batch and the last execution of an eval pass ends early (where the finite pass ends).
    """
    per_replica, steps = SIZES["accelerator" if accelerator else "cpu"]
    global_batch = per_replica * replicas
    examples = 4 * global_batch
    runtime = {
        "engine": engine,
        "tpu": tpu,
        "precision": precision,
        "jit_compile": "auto",
        "steps_per_execution": STEPS_PER_EXECUTION,
        "verbose": 0,
    }
    if mesh is not None:
        runtime["mesh"] = dict(mesh)
    return {
        "model": {
            "name": "small_cnn",
            "input_shape": [32, 32, 3],
            "num_classes": 10,
            "filters": [32, 64],
            "dense_units": 128,
            "dropout": 0.1,  # exercises the Dropout RNG state in checkpoints
        },
        "data": {
            "source": "synthetic",
            "input_shape": [32, 32, 3],
            "num_classes": 10,
            "num_examples": examples,
            "global_batch_size": global_batch,
            "eval_global_batch_size": global_batch * 3 // 4,
            "train_split": "train",
            "eval_split": "test",
            "shuffle_buffer": examples,
        },
        "train": {
            "epochs": epochs,
            "steps_per_epoch": steps,
            "optimizer": "adam",
            "learning_rate": 0.001,
            "seed": 0,
        },
        "runtime": runtime,
    }


def _versions() -> dict[str, str | None]:
    import platform

    from tpukit import __version__
    from tpukit.tools import doctor

    found = {"tpukit": __version__, "python": platform.python_version()}
    found.update(
        {
            k: v
            for k, v in doctor.installed_versions().items()
            if k in ("tensorflow", "tensorflow-tpu", "tensorflow-cpu", "libtpu", "keras", "jax")
        }
    )
    return found


def _tensorflow_device(strategy, tpu: str | None) -> dict[str, Any]:
    from tpukit.engines.keras import flops
    from tpukit.engines.tensorflow import strategy as strategy_lib

    kind = strategy_lib.kind_of(strategy)
    found = {
        "engine": "tensorflow",
        "strategy": type(strategy).__name__,
        "kind": kind,
        "replicas": int(strategy.num_replicas_in_sync),
        "hosts": strategy_lib.num_input_pipelines(strategy),
        "device_kind": flops.detect_device_kind(kind),
    }
    if kind == "tpu":
        topology = strategy_lib.tpu_topology(strategy_lib.choose(tpu).tpu)
        if topology is not None:
            found["topology"] = {
                "mesh_shape": [int(d) for d in topology.mesh_shape],
                "num_tasks": int(topology.num_tasks),
                "num_tpus_per_task": int(topology.num_tpus_per_task),
            }
    return found


def _jax_device(hardware) -> dict[str, Any]:
    """The jax engine's `Hardware`: its `handle` is the mesh (`tpukit.engines.jax.engine.Mesh`)."""
    mesh = hardware.handle
    return {
        "engine": "jax",
        "strategy": type(mesh).__name__,
        "kind": hardware.kind,
        "replicas": int(mesh.data),
        "hosts": int(mesh.processes),
        "device_kind": str(mesh.devices[0].device_kind),
        "platform": str(mesh.devices[0].platform),
        "devices": len(mesh.devices),
        "mesh": dict(mesh.sizes),
    }


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {(lines[0] if lines else '')[:300]}"
    explanation = diagnose.explain(error)
    return f"{text} ({explanation})" if explanation else text


def _accuracy_metric(model):
    """The compiled `accuracy` metric (a weighted mean: its `count` is the total sample weight it has seen)."""
    for metric in model.metrics:
        for inner in getattr(metric, "metrics", None) or [metric]:
            if inner.name == "accuracy":
                return inner
    raise LookupError(f"no 'accuracy' metric among {[m.name for m in model.metrics]}")


class _Smoke:
    """Runs the paths in order, recording each; a path whose input is missing is skipped, not crashed."""

    def __init__(self):
        self.paths: dict[str, Path] = {}

    def record(self, name: str, status: str, detail: str) -> None:
        self.paths[name] = Path(name, status, detail)

    @contextlib.contextmanager
    def path(self, name: str):
        try:
            yield
        except Exception as error:  # noqa: BLE001 - a failed path is the finding, reported with the others
            self.record(name, "fail", _first_line(error))

    def ok(self, *names: str) -> bool:
        return all(n in self.paths and self.paths[n].status == "pass" for n in names)

    def skip_missing(self, because: str) -> None:
        for name in PATHS:
            if name not in self.paths:
                self.record(name, "skip", because)


@dataclasses.dataclass
class _Setting:
    """What every path reads: the engine and its options (the recipe's `runtime`)."""

    engine: str
    tpu: str | None
    precision: str
    mesh: dict | None

    def recipe(self, replicas: int, accelerator: bool, epochs: int):
        raw = smoke_recipe(
            replicas, accelerator, epochs, self.precision, self.tpu, self.engine, self.mesh
        )
        return from_dict(raw, path=f"tpukit.smoke ({epochs} epoch(s))")


def run_smoke(
    output_dir: str | None = None,
    tpu: str | None = None,
    precision: str = "auto",
    strategy=None,
    engine: str = "tensorflow",
    mesh_data: int | str = "auto",
    mesh_model: int = 1,
) -> dict:
    """Runs every path and returns the report (see `format_report`); never raises for a failed path.

    Args:
        output_dir: where the two runs write (checkpoints, exports); default a temporary directory, deleted after.
        tpu: as `tpukit.connect(tpu)` / `runtime.tpu`: a TPU name, grpc://host:port, "local" or None (detect).
        precision: `runtime.precision` ("auto": bfloat16 on TPUs and recent GPUs, float32 on a CPU).
        strategy: the tensorflow engine: a strategy to use instead of `tpukit.connect(tpu)` (tests pass a
            MirroredStrategy); the jax engine: a `tpukit.engines.jax.engine.Mesh` instead of the one
            `runtime.mesh` makes.
        engine: `runtime.engine`, "tensorflow", "jax" or "auto" (`engine_choice.resolve`). Keras' backend must be
            that engine's: the process has not imported Keras yet, or imported it with that backend (else the
            `connect` path fails with the fix).
        mesh_data, mesh_model: `runtime.mesh` for the jax engine (data: "auto" = every device not on the model
            axis); the tensorflow engine ignores them.
    """
    if engine not in (engine_choice.AUTO, *ENGINES):
        raise ValueError(
            f"run_smoke: unknown engine; received engine={engine!r}, valid: {(engine_choice.AUTO, *ENGINES)}."
        )
    choice = engine_choice.resolve(engine)
    why = choice.reason if engine == engine_choice.AUTO else None  # --engine auto: what it found
    engine = choice.engine
    temporary = output_dir is None
    output_dir = output_dir or tempfile.mkdtemp(prefix="tpukit_smoke_")
    started = time.time()
    smoke = _Smoke()
    setting = _Setting(
        engine,
        tpu,
        precision,
        {"data": mesh_data, "model": mesh_model} if engine == "jax" else None,
    )
    report: dict[str, Any] = {
        "engine": engine,
        "engine_reason": why,
        "versions": _versions(),
        "output_dir": output_dir,
    }
    try:
        _run_paths(smoke, report, output_dir, setting, strategy)
    finally:
        if temporary:
            shutil.rmtree(output_dir, ignore_errors=True)
    smoke.skip_missing("an earlier path failed")
    report["paths"] = [dataclasses.asdict(smoke.paths[name]) for name in PATHS]
    report["ok"] = all(p["status"] == "pass" for p in report["paths"])
    report["seconds"] = round(time.time() - started, 1)
    return report


def _run_paths(smoke: _Smoke, report: dict, output_dir, setting: _Setting, strategy) -> None:
    """Runs the paths in order; each later path needs the earlier ones."""
    if setting.engine == "jax":
        strategy, accelerator = _connect_jax(smoke, report, setting, strategy, output_dir)
    else:
        strategy, accelerator = _connect_tensorflow(smoke, report, setting.tpu, strategy)
    if not smoke.ok("connect"):
        return

    def recipe(epochs):
        return setting.recipe(report["device"]["replicas"], accelerator, epochs)

    metrics = _train_path(smoke, report, recipe(1), output_dir, strategy)
    if not smoke.ok("train"):
        return
    import tpukit

    second = recipe(2)
    with smoke.path("checkpoint"):
        the_plan = tpukit.plan(second, strategy, output_dir=output_dir)
    if "checkpoint" in smoke.paths:  # the plan failed
        return
    engine = engines.get(the_plan.engine)
    # As in `tpukit.run`: build, train, evaluate and export under the plan's dtype policy and the engine's error
    # translation (which restores the jax engine's global distribution when it ends).
    with engine.dtype_policy(the_plan.precision), engine.explained(the_plan):
        session, outcome = _checkpoint_path(smoke, engine, the_plan, metrics)
        if smoke.ok("checkpoint"):
            _eval_and_export_paths(smoke, report, engine, session, outcome)


def _connect_tensorflow(smoke: _Smoke, report: dict, tpu, strategy):
    import tpukit

    accelerator = False
    with smoke.path("connect"):
        use_engine("tensorflow")
        strategy = strategy or tpukit.connect(tpu)
        device = _tensorflow_device(strategy, tpu)
        report["device"] = device
        accelerator = device["kind"] == "tpu" or device["device_kind"].startswith("GPU")
        detail = (
            f"{device['strategy']} with {device['replicas']} replica(s) on {device['device_kind']}"
        )
        if device.get("topology"):
            topology = device["topology"]
            detail += (
                f", TPU mesh {'x'.join(map(str, topology['mesh_shape']))}, {topology['num_tasks']} host(s) x "
                f"{topology['num_tpus_per_task']} device(s)"
            )
        smoke.record("connect", "pass", detail)
    return strategy, accelerator


def _connect_jax(smoke: _Smoke, report: dict, setting: _Setting, mesh, output_dir: str):
    """The jax engine's devices and the mesh `runtime.mesh` makes of them (the engine's `hardware`, which
    `tpukit.plan` calls too; its mesh is then passed on, as a strategy is on the tensorflow engine)."""
    accelerator = False
    with smoke.path("connect"):
        use_engine("jax")  # raises the fix if this process imported Keras with another backend
        engine = engines.get("jax")
        hardware = engine.hardware(setting.recipe(1, False, 1), mesh, output_dir)
        device = _jax_device(hardware)
        report["device"] = device
        mesh = hardware.handle
        accelerator = device["kind"] != "jax_cpu"
        smoke.record(
            "connect",
            "pass",
            f"jax mesh data {mesh.data} x model {mesh.model} over {device['devices']} {device['device_kind']} "
            f"device(s) in {device['hosts']} process(es)",
        )
    return mesh, accelerator


def _train_path(smoke: _Smoke, report: dict, first, output_dir, strategy) -> dict:
    import numpy as np

    import tpukit

    steps = first.train.steps_per_epoch
    metrics: dict = {}
    with smoke.path("train"):
        metrics = tpukit.run(first, output_dir, strategy=strategy)
        report["plan"] = {
            key: metrics[key]
            for key in (
                "engine",
                "precision",
                "jit_compile",
                "steps_per_execution",
                "global_batch_size",
                "steps_per_epoch",
            )
        }
        if metrics.get("mesh"):
            report["plan"]["mesh"] = metrics["mesh"]
            report["plan"]["sharded"] = metrics.get("sharded", {})
        loss = metrics["train"].get("loss", math.nan)
        if metrics["status"] != "done" or metrics["step"] != steps or not np.isfinite(loss):
            raise AssertionError(
                f"status {metrics['status']}, step {metrics['step']} of {steps}, loss {loss}"
            )
        smoke.record(
            "train",
            "pass",
            f"{steps} steps at steps_per_execution {metrics['steps_per_execution']} in {metrics['precision']} "
            f"(jit_compile {metrics['jit_compile']}), loss {loss:.4f}",
        )
    return metrics


def _checkpoint_path(smoke: _Smoke, engine, the_plan, metrics: dict):
    import numpy as np

    steps = metrics["step"]
    session = outcome = None
    with smoke.path("checkpoint"):
        session = engine.build(the_plan)
        exported_first = _load_keras(metrics["exported"]["keras"])
        differences = [
            float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
            for a, b in zip(session.model.get_weights(), exported_first.get_weights(), strict=True)
        ]
        if session.start_step != steps or max(differences) != 0.0:
            raise AssertionError(
                f"resumed at step {session.start_step} (expected {steps}); the restored weights differ from "
                f"the saved ones by up to {max(differences):g}"
            )
        outcome = engine.train(session)
        if session.checkpointer.step != 2 * steps:
            raise AssertionError(
                f"the resumed run ended at step {session.checkpointer.step}, not {2 * steps}"
            )
        smoke.record(
            "checkpoint",
            "pass",
            f"resumed at step {session.start_step} with the saved weights ({len(differences)} arrays equal), "
            f"trained to step {session.checkpointer.step}",
        )
    return session, outcome


def _eval_and_export_paths(smoke: _Smoke, report: dict, engine, session, outcome) -> None:
    from tpukit import runner

    evaluation = exported = None
    with smoke.path("exact_eval"):
        evaluation = engine.evaluate(session, outcome)
        _check_exact_eval(smoke, session, evaluation)
    with smoke.path("export"):
        exported = engine.export(session, outcome)
        _check_export(smoke, session, exported)
    final = runner.write_metrics(
        session.plan, engine.report(session, outcome, evaluation or {}, exported or {})
    )
    report["throughput"] = {
        key: final[key]
        for key in (
            "examples_per_second",
            "steps_per_second",
            "time_to_first_step_seconds",
            "flops_per_example",
            "mfu",
            "peak_flops_source",
        )
    }


def _load_keras(path: str):
    import keras

    return keras.saving.load_model(path, compile=False)


def _check_exact_eval(smoke: _Smoke, session, evaluation: dict) -> None:
    import numpy as np

    the_plan = session.plan
    counted = float(np.asarray(_accuracy_metric(session.model).count))
    batches = the_plan.eval_steps * the_plan.eval_global_batch_size
    expected = the_plan.eval_examples
    correct = evaluation["accuracy"] * expected
    if counted != expected or abs(correct - round(correct)) > 1e-3 * max(1, expected) ** 0.5:
        raise AssertionError(
            f"the evaluation counted {counted:g} examples of {expected} (accuracy x examples = {correct:.3f})"
        )
    smoke.record(
        "exact_eval",
        "pass",
        f"{counted:.0f} of {expected} examples counted in {the_plan.eval_steps} steps of "
        f"{the_plan.eval_global_batch_size} ({batches - expected} padding slots weighed 0); accuracy "
        f"{evaluation['accuracy']:.4f} = {round(correct)}/{expected}",
    )


def _check_export(smoke: _Smoke, session, exported: dict) -> None:
    import numpy as np
    import tensorflow as tf

    from tpukit import data
    from tpukit.engines.keras import export as export_lib

    the_plan = session.plan
    if "saved_model" not in exported:
        raise AssertionError(
            f"the {the_plan.engine} engine exported {sorted(exported)} but no SavedModel (its log says why)"
        )
    serve = export_lib.load_serving(exported["saved_model"], io_device=the_plan.io_device)
    options = the_plan.recipe.data.options
    test_batch = next(iter(data.synthetic("test", None, **options).batch(32)))
    features = test_batch[0].numpy()
    served = serve(tf.constant(features, tf.float32))
    served = np.asarray(served, np.float32)
    # The trained model's own predictions, in this process (on the jax engine: on its mesh, by JAX).
    expected = np.asarray(session.model.predict(features, verbose=0), np.float32)
    # bfloat16 keeps 8 bits of mantissa: compare at its resolution, relative to the logits' scale.
    tolerance = 1e-4 if the_plan.precision == "float32" else 0.05
    scale = max(1.0, float(np.max(np.abs(expected))))
    difference = float(np.max(np.abs(served - expected)))
    if (
        served.dtype != np.float32
        or served.shape != expected.shape
        or difference > tolerance * scale
    ):
        raise AssertionError(
            f"the reloaded SavedModel gives {served.dtype} {served.shape}, max |difference| {difference:g} from the "
            f"trained model (allowed {tolerance * scale:g})"
        )
    smoke.record(
        "export",
        "pass",
        f"SavedModel reloaded without tpukit; serve() on {len(features)} examples matches the "
        f"{the_plan.engine} engine's model within {difference:.2g} (float32 outputs)",
    )


def format_report(report: dict) -> str:
    """The shareable block: versions, device and topology, throughput and MFU, then PASS/FAIL per path."""
    lines = ["tpukit smoke report (paste this block into an issue)"]
    lines.append("  versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v))
    reason = f" ({report['engine_reason']})" if report.get("engine_reason") else ""
    lines.append(f"  engine: {report.get('engine', 'tensorflow')}{reason}")
    device = report.get("device")
    if device and device.get("mesh"):
        lines.append(
            f"  device: {device['device_kind']}; {device['devices']} {device['platform']} device(s) in "
            f"{device['hosts']} process(es), mesh data {device['mesh']['data']} x model {device['mesh']['model']} "
            f"({device['replicas']} replica(s))"
        )
    elif device:
        line = (
            f"  device: {device['device_kind']}; {device['strategy']}, {device['replicas']} replica(s), "
            f"{device['hosts']} host(s)"
        )
        if device.get("topology"):
            line += f", TPU mesh {'x'.join(map(str, device['topology']['mesh_shape']))}"
        lines.append(line)
    plan = report.get("plan")
    if plan:
        line = (
            f"  plan: {plan['precision']}, jit_compile {plan['jit_compile']}, steps_per_execution "
            f"{plan['steps_per_execution']}, global batch {plan['global_batch_size']}, "
            f"{plan['steps_per_epoch']} steps per epoch"
        )
        if plan.get("mesh"):
            line += f", {len(plan.get('sharded') or {})} variable(s) split on the model axis"
        lines.append(line)
    throughput = report.get("throughput")
    if throughput:
        rate = throughput["examples_per_second"]
        mfu = throughput["mfu"]
        lines.append(
            "  throughput: "
            + (f"{rate:,.0f} examples/s" if rate else "no examples/s")
            + (f", MFU {100 * mfu:.2f}%" if mfu is not None else ", MFU unknown")
            + f" ({throughput['peak_flops_source'] or 'no peak'})"
        )
    for path in report["paths"]:
        lines.append(f"  [{path['status'].upper():4}] {path['name']}: {path['detail']}")
    passed = sum(p["status"] == "pass" for p in report["paths"])
    lines.append(
        f"  result: {'PASS' if report['ok'] else 'FAIL'} ({passed}/{len(report['paths'])} paths) in "
        f"{report['seconds']} s"
    )
    return "\n".join(lines)


def _start(engine: str) -> str | None:
    """`start_tool` for `engine`: the Keras backend chosen first (nothing has imported Keras yet), then the engine's
    environment checked. Returns why it cannot run here, or None."""
    enable_logging()  # first: `use_engine` warns when it replaces the shell's KERAS_BACKEND
    try:
        use_engine(engine)
    except ImportError as error:  # Keras is imported already, with another backend (a notebook)
        return str(error)
    return start_tool(engine)  # TensorFlow's C++ start-up lines would bury the report


def main(argv: list[str] | None = None, prog: str = "python -m tpukit.smoke") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--engine",
        default=engine_choice.AUTO,
        choices=(engine_choice.AUTO, *ENGINES),
        help="runtime.engine: tensorflow (tf.distribute), jax (Keras on JAX over a device mesh) or auto (the "
        "default: jax on a TPU without tensorflow-tpu, else tensorflow)",
    )
    parser.add_argument(
        "--tpu", default=None, help="a TPU name, grpc://host:port or 'local' (default: detect)"
    )
    parser.add_argument(
        "--mesh_data",
        default="auto",
        type=_mesh_size,
        help="--engine=jax: runtime.mesh.data, the devices that split the batch (auto: all not on the model axis)",
    )
    parser.add_argument(
        "--mesh_model",
        default=1,
        type=int,
        help="--engine=jax: runtime.mesh.model, the devices each sharded weight is split over (default 1)",
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "float32", "mixed_bfloat16", "mixed_float16"],
        help="runtime.precision (auto: bfloat16 on TPU/recent GPUs, float32 on CPU)",
    )
    parser.add_argument(
        "--output_dir", default=None, help="keep the runs' outputs here (default: a temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    engine = engine_choice.resolve(args.engine).engine  # before Keras loads (`_start` sets it)
    if engine != "jax" and (args.mesh_data != "auto" or args.mesh_model != 1):
        parser.error(f"--mesh_data and --mesh_model need --engine=jax; the engine is {engine}")
    problem = _start(engine)
    if problem:
        print(f"tpukit: error: {problem}", file=sys.stderr)
        return 1
    report = run_smoke(
        args.output_dir,
        args.tpu,
        args.precision,
        engine=args.engine,  # auto: the same decision, with its reason
        mesh_data=args.mesh_data,
        mesh_model=args.mesh_model,
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0 if report["ok"] else 1


def _mesh_size(text: str) -> int | str:
    return text if text == "auto" else int(text)


if __name__ == "__main__":
    sys.exit(main())
