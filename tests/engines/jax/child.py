"""A jax-engine run in its own process (the test process is on Keras' TensorFlow backend, fixed at import):

    python tests/engines/jax/child.py '{"recipe": ..., "overrides": [...], "output_dir": ..., "kill_at_step": 3}'

Runs `tpukit.run` on the JAX backend and prints one line `RESULT {json}`: the metrics, the loss logged after every
step, and for each trainable variable its global shape, the shape of the shard on the first device and its
`PartitionSpec` (read from the arrays themselves, so a layout that shards nothing cannot pass for one that does).
`kill_at_step`: SIGKILL this process once that step has ended (a checkpoint saved at it may still be in flight;
with `kill_after_commit: N`, once step N's checkpoint is committed and no save is in flight). `cache_hits`:
computations loaded from the persistent compilation cache (JAX's monitoring event). `compiles`: the XLA
compilations of the run (`jax_log_compiles`), each as [the jitted function's name, the epoch of `fit` it happened in
(None: outside fit)]. `open_exports`: SavedModel export processes the engine left running; before a
`kill_at_step` SIGKILL, a line `EXPORT_PROCESSES [pids]` names those running.
"""

import contextlib
import json
import logging
import os
import re
import signal
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tpukit  # noqa: E402

tpukit.use_engine("jax")

import keras  # noqa: E402


class Compiles(logging.Handler):
    """JAX's "Compiling jit(NAME) ..." records (`jax_log_compiles`), with the epoch of `fit` they came in."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.epoch = None
        self.seen = []

    def emit(self, record):
        found = re.match(r"Compiling (?:jit\()?([\w<>.]+)", record.getMessage())
        if found:
            self.seen.append([found.group(1), self.epoch])


COMPILES = Compiles()


class Recorder(keras.callbacks.Callback):
    def __init__(self, kill_at_step, committed_dir=None, committed_step=None):
        super().__init__()
        self.losses, self.shards, self.kill_at_step = [], {}, kill_at_step
        self.committed_dir = committed_dir  # `kill_after_commit`: this run's checkpoint directory
        self.committed_step = committed_step  # ... and the step whose checkpoint must be committed

    def on_epoch_begin(self, epoch, logs=None):
        COMPILES.epoch = epoch

    def on_train_end(self, logs=None):
        COMPILES.epoch = None
        self._record_shards()

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        step = int(self.model.optimizer.iterations.numpy())
        if self.kill_at_step and step >= self.kill_at_step:
            if self.committed_dir:
                # The asynchronous save of the step asked for committed first: its checkpoint there and no
                # temporary left. (Waiting only for no temporary raced a save whose thread had not yet made its
                # directory; Orbax makes it in a thread of its own.)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and not _committed(
                    self.committed_dir, self.committed_step
                ):
                    time.sleep(0.02)
            # The SavedModel export processes (paused now, while steps train) must end with this one.
            print("EXPORT_PROCESSES " + json.dumps(_export_pids()), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def _record_shards(self):
        for v in self.model.trainable_variables:
            array = v.value
            self.shards[v.path] = {
                "shape": list(array.shape),
                "shard": list(array.addressable_shards[0].data.shape),
                "spec": str(getattr(array.sharding, "spec", "")),
                "devices": len(array.sharding.device_set),
            }


def _committed(directory: str, step: int) -> bool:
    names = os.listdir(directory) if os.path.isdir(directory) else []
    return f"ckpt_{step}" in names and not any("tmp" in n for n in names)


def _open_exports() -> int:
    from tpukit.engines.jax import engine

    return len(engine._STARTED_EXPORTS)


def _export_pids() -> list[int]:
    from tpukit.engines.jax import engine

    return [export._process.pid for export in engine._STARTED_EXPORTS]


def main(config: dict) -> None:
    if (
        "runs" in config
    ):  # several runs in this one process (one JAX start): a RESULT line each, errors included
        for run in config["runs"]:
            try:
                main(run)
            except Exception as error:  # noqa: BLE001 - reported to the test, which names the recipe
                print(
                    "RESULT "
                    + json.dumps(
                        {
                            "name": run.get("name"),
                            "error": f"{type(error).__name__}: {error}",
                            "open_exports": _open_exports(),
                        }
                    )
                )
        return
    recipe = tpukit.load_recipe(
        config["recipe"], ["runtime.engine=jax", *config.get("overrides", [])]
    )
    recorder = Recorder(
        config.get("kill_at_step"),
        os.path.join(config["output_dir"], "checkpoints")
        if config.get("kill_after_commit")
        else None,
        config.get("kill_after_commit"),
    )
    COMPILES.seen = []
    mock = contextlib.nullcontext()
    if config.get("mock_tfds"):
        import tensorflow_datasets as tfds

        mock = tfds.testing.mock_data(num_examples=64)
    with mock:
        metrics = tpukit.run(recipe, config["output_dir"], callbacks=[recorder])
    print(
        "RESULT "
        + json.dumps(
            {
                "name": config.get("name"),
                "metrics": metrics,
                "losses": recorder.losses,
                "shards": recorder.shards,
                "compiles": COMPILES.seen,
                "cache_hits": CACHE_HITS[0],
                "open_exports": _open_exports(),
            },
            default=str,
        )
    )


CACHE_HITS = [0]  # computations this process loaded from the persistent compilation cache


def _count_cache_hits(event: str, **kwargs) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        CACHE_HITS[0] += 1


if __name__ == "__main__":
    import jax

    jax.monitoring.register_event_listener(_count_cache_hits)
    jax.config.update("jax_log_compiles", True)
    logging.getLogger("jax").addHandler(COMPILES)
    main(json.loads(sys.argv[1]))
