"""What a jax-engine checkpoint costs at the ~100M-parameter scale, before and after issue 39, in one run:

* `whole` (before): every process gathers every variable whole (`process_allgather`), serializes all of them into
  one in-memory `.npz` and writes it (tpukit's jax checkpoints until issue 39);
* `orbax` (after): `tpukit.engines.jax.checkpoint.Checkpointer`: each process writes the shards it owns, and
  training waits only for the copy off the devices (`save`), not for the write (`wait`); a restore reads the slices
  each process's devices hold.

    python benchmarks/checkpoints.py                    # 2 processes x 4 virtual CPU devices, mesh 2x4, ~100M params
    python benchmarks/checkpoints.py --mesh 1x8         # the model axis across both processes
    python benchmarks/checkpoints.py --width 1024 --layers 2   # a small, quick model

Each process builds the same model (`--layers` Dense layers of `--width` units; kernels split over the `model`
axis), AdamW built (weights + two moments: 3x the parameters in float32), then saves `--rounds` times with each
method and reports, per process: the seconds training waits, the seconds until the checkpoint is on disk, the peak
resident memory above its level before the save (sampled every 2 ms from /proc/self/statm) against the bytes of the
shards it owns, and the bytes it wrote; then `--rounds` restores of the newest checkpoint with each method (seconds, peak memory).
Nothing here runs on a TPU; results go to benchmarks/results/checkpoints.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(HERE, "results", "checkpoints.json")
PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakMemory:
    """The peak resident set size above the level at entry, sampled every 2 ms by a thread."""

    def __enter__(self):
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        self.above = self.peak - self.base


def _bytes_under(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _written_by(directory: str, process: int, method: str) -> int:
    """Bytes one save of this process wrote: its newest `.npz` (whole), or in the newest Orbax step its
    `ocdbt.process_<i>` shards, plus for process 0 everything else in the step (metadata, the shared `d/`)."""
    if method == "whole":
        target = os.path.join(directory, f"whole{process}")
        return max(os.path.getsize(os.path.join(target, f)) for f in os.listdir(target))
    newest = max(
        (n for n in os.listdir(directory) if n.startswith("ckpt_")), key=lambda n: int(n[5:])
    )
    step = os.path.join(directory, newest)
    own = _bytes_under(os.path.join(step, "state", f"ocdbt.process_{process}"))
    if process:
        return own
    others = sum(
        _bytes_under(os.path.join(step, "state", n))
        for n in os.listdir(os.path.join(step, "state"))
        if n.startswith("ocdbt.process_") and n != "ocdbt.process_0"
    )
    return _bytes_under(step) - others


def _model(width: int, layers: int, mesh_shape: tuple[int, int]):
    import keras

    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh(mesh_shape, ["data", "model"], devices)
    layout = keras.distribution.LayoutMap(mesh)
    layout[".*kernel"] = (None, "model")  # Keras matches the whole path: "sequential/dense/kernel"
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="data")
    )
    model = keras.Sequential(
        [keras.Input((width,))] + [keras.layers.Dense(width) for _ in range(layers)]
    )
    model.compile(optimizer=keras.optimizers.AdamW(1e-3), loss="mse")
    model.optimizer.build(model.trainable_variables)
    # Moments of a trained run, not the zeros of a new one (zeros compress to nothing in Orbax's files).
    import numpy as np

    for i, v in enumerate(model.optimizer.variables):
        if v.dtype == "float32" and len(v.shape):
            v.assign(
                np.random.default_rng(i).standard_normal(tuple(v.shape), dtype=np.float32) * 1e-3
            )
    return model


def _owned_bytes(variables) -> int:
    """The bytes of the distinct shards this process holds (a value replicated on its devices counted once)."""
    total = 0
    for v in variables:
        seen = set()
        for shard in v.value.addressable_shards:
            key = str(shard.index)
            if key not in seen:
                seen.add(key)
                total += shard.data.nbytes
    return total


def _save_whole(checkpointer, directory: str, process: int) -> float:
    """tpukit's jax checkpoint before issue 39: gather whole, serialize to memory, write one stream."""
    import io

    import numpy as np

    from tpukit.engines.jax.checkpoint import host_value

    started = time.perf_counter()
    variables = checkpointer._variables()
    arrays = {f"v{i}": host_value(v.value) for i, v in enumerate(variables)}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    target = os.path.join(directory, f"whole{process}")
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, f"ckpt-{time.monotonic_ns()}.npz"), "wb") as f:
        f.write(buffer.getvalue())
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - started


def _restore_whole(checkpointer, directory: str, process: int) -> None:
    """The restore before issue 39: every process reads its whole newest `.npz` and assigns every variable."""
    import numpy as np

    target = os.path.join(directory, f"whole{process}")
    newest = max(os.listdir(target))
    with open(os.path.join(target, newest), "rb") as f:
        loaded = np.load(f, allow_pickle=False)
        arrays = [loaded[f"v{i}"] for i in range(len(checkpointer._variables()))]
    for variable, value in zip(checkpointer._variables(), arrays, strict=True):
        variable.assign(value)


def worker(args) -> dict:
    import jax
    import keras

    if args.processes > 1:
        keras.distribution.initialize(args.address, args.processes, args.process)
    from tpukit.engines.jax.checkpoint import Checkpointer

    mesh_shape = tuple(int(n) for n in args.mesh.split("x"))
    model = _model(args.width, args.layers, mesh_shape)
    directory = args.directory
    checkpointer = Checkpointer(
        os.path.join(directory, "orbax"), model, model.optimizer, max_to_keep=2
    )
    variables = checkpointer._variables()
    state_bytes = sum(v.value.nbytes for v in variables)
    owned = _owned_bytes(variables)
    results = {"whole": [], "orbax": []}
    checkpointer.save()  # the first save starts Orbax's threads: not measured
    checkpointer.wait()
    for round_ in range(args.rounds):
        for method in ("whole", "orbax"):
            _barrier(jax, f"{method}{round_}")
            with PeakMemory() as memory:
                if method == "whole":
                    waited = written = _save_whole(checkpointer, directory, args.process)
                else:
                    started = time.perf_counter()
                    model.optimizer.iterations.assign(round_ + 1)  # a new step each round
                    checkpointer.save()
                    waited = time.perf_counter() - started
                    checkpointer.wait()
                    written = time.perf_counter() - started
            results[method].append(
                {"waited_s": waited, "on_disk_s": written, "peak_above_bytes": memory.above}
            )
    checkpointer.close()
    restores = {"whole": [], "orbax": []}
    for round_ in range(args.rounds):
        for method in ("whole", "orbax"):
            _barrier(jax, f"restore-{method}{round_}")
            with PeakMemory() as memory:
                started = time.perf_counter()
                if method == "whole":
                    _restore_whole(checkpointer, directory, args.process)
                else:
                    checkpointer.restore()
                seconds = time.perf_counter() - started
            restores[method].append({"seconds": seconds, "peak_above_bytes": memory.above})
    _barrier(jax, "end")
    return {
        "process": args.process,
        "state_bytes": state_bytes,
        "owned_bytes": owned,
        "written_bytes": {
            m: _written_by(
                os.path.join(directory, "orbax" if m == "orbax" else ""), args.process, m
            )
            for m in ("whole", "orbax")
        },
        "rounds": results,
        "restores": restores,
    }


def _barrier(jax, name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(args) -> list[dict]:
    directory = tempfile.mkdtemp(prefix="tpukit-ckpt-bench-")
    address = f"127.0.0.1:{_free_port()}"
    devices = 8 // args.processes
    children = []
    for index in range(args.processes):
        env = dict(
            os.environ,
            KERAS_BACKEND="jax",
            XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONPATH=REPO,
        )
        command = [
            sys.executable,
            __file__,
            "--child",
            "--process",
            str(index),
            "--address",
            address,
            "--directory",
            directory,
            "--processes",
            str(args.processes),
            "--mesh",
            args.mesh,
            "--width",
            str(args.width),
            "--layers",
            str(args.layers),
            "--rounds",
            str(args.rounds),
        ]
        children.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True))
    results = []
    for child in children:
        out, _ = child.communicate(timeout=1800)
        if child.returncode:
            raise SystemExit(f"process failed (exit {child.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    subprocess.run(["rm", "-rf", directory], check=False)
    return results


def _median(values):
    values = sorted(values)
    return values[len(values) // 2]


def _report(results: list[dict], args) -> str:
    gb = 1e9
    lines = [
        f"{args.layers} x Dense({args.width}) + AdamW, mesh {args.mesh}, {args.processes} process(es); state "
        f"{results[0]['state_bytes'] / gb:.2f} GB; medians of {args.rounds} rounds",
        "| process | method | training waits | on disk after | peak memory above | / owned shards | written |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        owned = result["owned_bytes"]
        for method in ("whole", "orbax"):
            rounds = result["rounds"][method]
            peak = _median([r["peak_above_bytes"] for r in rounds])
            lines.append(
                f"| {result['process']} | {method} | {_median([r['waited_s'] for r in rounds]):.2f} s | "
                f"{_median([r['on_disk_s'] for r in rounds]):.2f} s | {peak / gb:.2f} GB | {peak / owned:.2f}x "
                f"of {owned / gb:.2f} GB | {result['written_bytes'][method] / gb:.3f} GB |"
            )
    lines += [
        "",
        "| process | method | restore | peak memory above | / owned shards |",
        "|---|---|---|---|---|",
    ]
    for result in results:
        for method in ("whole", "orbax"):
            rounds = result["restores"][method]
            peak = _median([r["peak_above_bytes"] for r in rounds])
            lines.append(
                f"| {result['process']} | {method} | {_median([r['seconds'] for r in rounds]):.2f} s | "
                f"{peak / gb:.2f} GB | {peak / result['owned_bytes']:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--mesh", default="2x4")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--process", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--address", default="", help=argparse.SUPPRESS)
    parser.add_argument("--directory", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(worker(args)))
        return
    started = time.time()
    results = _launch(args)
    table = _report(results, args)
    print(table)
    record = {
        "command": " ".join(sys.argv),
        "seconds": round(time.time() - started, 1),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load_average": os.getloadavg(),
        "results": results,
        "table": table,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
