"""The same recipe on 1, 2, 4 and 8 virtual CPU devices and on 2 loopback workers: identical results, and what
distribution costs per step. One CPU cannot speed up: this checks that nothing falls apart and prices the overhead.

    python benchmarks/scaling.py --quick      # 1 epoch, ~2 minutes
    python benchmarks/scaling.py              # 3 epochs

Each configuration is its own process (virtual devices must be set before TensorFlow starts):

* `default`: the default strategy (one device, what `tpukit.connect()` picks on a CPU), the reference;
* `mirrored N` (N = 1, 2, 4, 8): `tpukit.cpu_mirrored_strategy(N)`, N replicas of the global batch of 64;
* `2 workers`: two processes on 127.0.0.1 with `TF_CONFIG` (`tpukit.connect()` picks MultiWorkerMirroredStrategy),
  one CPU device each, the chief's results reported.

The recipe is digits_cnn at global batch 64 (22 steps per epoch), `data.deterministic: true`, dropout 0 (dropout
masks are drawn per replica, so they could not match), `runtime.steps_per_execution: 2` (auto is refused on
multi-worker clusters). Every single-host run must end with the reference's train loss and exact eval losses within
`--tolerance` (weights and accuracy differences are reported: Adam turns float reassociation in near-zero gradients
into weight differences of up to one update); the 2-worker run reads its data in another order (each worker reads its
own shard), so it is reported, not compared; per-step cost is steady-state seconds per optimizer step (`workloads.SteadyRate`) relative to the
reference. Nothing here runs on a TPU or on more than one machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results", "scaling.json")
CONFIGS = ("default", "mirrored 1", "mirrored 2", "mirrored 4", "mirrored 8", "2 workers")


def recipe(epochs: int):
    from tpukit.recipe import load_recipe

    return load_recipe(
        os.path.join(REPO, "recipes", "digits_cnn.yaml"),
        [
            f"train.epochs={epochs}",
            "data.global_batch_size=64",
            "data.deterministic=true",
            "model.dropout=0",
            "runtime.steps_per_execution=2",
            "runtime.verbose=0",
        ],
    )


def child(args) -> int:
    """One configuration: trains the recipe and writes metrics, steady-state step time and the final weights."""
    import numpy as np

    import tpukit

    sys.path.insert(0, HERE)
    from workloads import SteadyRate

    strategy = (
        tpukit.cpu_mirrored_strategy(args.devices) if args.devices else None
    )  # None: tpukit.connect()
    the_recipe = recipe(args.epochs)
    timer = SteadyRate(the_recipe.data.global_batch_size)
    started = time.perf_counter()
    metrics = tpukit.run(the_recipe, args.output_dir, strategy=strategy, callbacks=[timer])
    import keras

    model = keras.saving.load_model(os.path.join(args.output_dir, "model.keras"))
    np.savez(args.result + ".npz", *model.get_weights())
    result = {
        "strategy": metrics["strategy"],
        "replicas": metrics["replicas"],
        "step": metrics["step"],
        "train_loss": metrics["train"].get("loss"),
        "eval": metrics["eval"],
        "seconds_per_step": timer.seconds / timer.steps if timer.steps else None,
        "time_to_first_step": timer.time_to_first_step,
        "run_seconds": time.perf_counter() - started,
    }
    with open(args.result, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_config(config: str, epochs: int, work: str) -> dict:
    """Runs one configuration in its own process(es); returns the chief's result with the weights loaded."""
    import numpy as np

    name = config.replace(" ", "_")
    base_env = dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES=""
    )
    base_env.pop("TF_CONFIG", None)

    def command(index: int, devices: int) -> list[str]:
        return [
            sys.executable,
            os.path.abspath(__file__),
            "--_child",
            "--devices",
            str(devices),
            "--epochs",
            str(epochs),
            "--output_dir",
            os.path.join(work, name),  # the chief writes here; another worker under worker<i>/
            "--result",
            os.path.join(work, f"{name}-{index}.json"),
        ]

    if config == "2 workers":
        workers = [f"127.0.0.1:{port}" for port in _free_ports(2)]
        envs = [
            dict(
                base_env,
                TF_CONFIG=json.dumps(
                    {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}
                ),
            )
            for i in range(2)
        ]
        commands = [command(i, 0) for i in range(2)]
    else:
        devices = 0 if config == "default" else int(config.split()[1])
        envs, commands = [base_env], [command(0, devices)]
    logs = [open(os.path.join(work, f"{name}-{i}.log"), "w") for i in range(len(commands))]
    start = time.perf_counter()
    processes = [
        subprocess.Popen(c, env=e, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        for c, e, log in zip(commands, envs, logs, strict=True)
    ]
    try:
        codes = [p.wait(timeout=900) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    wall = time.perf_counter() - start
    if any(codes):
        with open(os.path.join(work, f"{name}-0.log"), encoding="utf-8", errors="replace") as f:
            raise SystemExit(f"scaling: {config} exited {codes}:\n{f.read()[-3000:]}")
    result_path = os.path.join(work, f"{name}-0.json")
    with open(result_path, encoding="utf-8") as f:
        result = json.load(f)
    with np.load(result_path + ".npz") as weights:
        result["weights"] = [
            weights[k] for k in sorted(weights.files, key=lambda k: int(k.split("_")[1]))
        ]
    result["wall_seconds"] = wall
    return result


def differences(a: dict, b: dict) -> tuple[float, float]:
    """(largest |difference| of the train loss and eval losses, largest |difference| of any weight)."""
    import numpy as np

    weights = max(
        float(np.max(np.abs(x - y))) for x, y in zip(a["weights"], b["weights"], strict=True)
    )
    losses = [abs(a["train_loss"] - b["train_loss"])]
    losses += [abs(a["eval"][k] - b["eval"][k]) for k in a["eval"] if k != "accuracy"]
    return max(losses), weights


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 epoch instead of 3")
    parser.add_argument(
        "--tolerance", type=float, default=1e-3, help="max |difference| of losses to the reference"
    )
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--epochs", type=int, default=3, help=argparse.SUPPRESS)
    parser.add_argument("--output_dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        return child(args)
    epochs = 1 if args.quick else 3
    results = {}
    with tempfile.TemporaryDirectory(prefix="scaling-") as work:
        for config in CONFIGS:
            results[config] = run_config(config, epochs, work)
            print(f"  {config}: {results[config]['wall_seconds']:.1f} s", flush=True)
    reference = results["default"]
    header = (
        f"{'configuration':<14}{'replicas':>9}{'ms/step':>9}{'vs default':>11}{'first step':>11}"
        f"{'loss diff':>11}{'weight diff':>12}{'acc diff':>9}  within tolerance"
    )
    lines = [header, "-" * len(header)]
    failed = []
    for config, r in results.items():
        r["loss_difference"], r["weight_difference"] = differences(r, reference)
        r["accuracy_difference"] = abs(r["eval"]["accuracy"] - reference["eval"]["accuracy"])
        r["step_cost_vs_default"] = r["seconds_per_step"] / reference["seconds_per_step"]
        ok = r["loss_difference"] <= args.tolerance and r["step"] == reference["step"]
        if config == "2 workers":
            # Each worker reads its own shard of the examples (per-host sharding, as on a TPU pod), so a global
            # batch holds other examples than on one host: a different data order, not a numerical difference.
            verdict = "n/a (other data order)"
        else:
            verdict = "yes" if ok else "NO"
            failed += [] if ok else [config]
        lines.append(
            f"{config:<14}{r['replicas']:>9}{r['seconds_per_step'] * 1e3:>9.1f}{r['step_cost_vs_default']:>10.2f}x"
            f"{r['time_to_first_step']:>10.1f}s{r['loss_difference']:>11.1e}{r['weight_difference']:>12.1e}"
            f"{r['accuracy_difference']:>9.3f}  {verdict}"
        )
    print("\n".join(lines))
    for r in results.values():
        del r["weights"]
    report = {
        "command": " ".join(
            ["python", "benchmarks/scaling.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "epochs": epochs,
        "tolerance": args.tolerance,
        "load_average_at_end": os.getloadavg(),
        "results": results,
        "failed": failed,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
