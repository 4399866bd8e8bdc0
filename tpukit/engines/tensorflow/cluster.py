"""What the workers of a multi-worker cluster (MultiWorkerMirroredStrategy, one process per host) must agree on.

Each worker runs the same command but reads its own files: a worker started with another recipe or tpukit version
would train a different model in lock-step collectives, and a worker whose newest checkpoint is older than the
others' (killed during a save, its own disk) would resume at another step. Both are settled before training by one
small all-gather across the workers.
"""

from __future__ import annotations

import hashlib
import json
import logging

import numpy as np

from tpukit.recipe import RecipeError

logger = logging.getLogger("tpukit")


def is_multi_worker(strategy) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def any_worker_function(strategy):
    """For a MultiWorkerMirroredStrategy, `agree(flag) -> bool`: True when the flag is set on any worker (one scalar
    all-reduce, called by every worker at the end of the same execution); None for other strategies."""
    import tensorflow as tf

    if not is_multi_worker(strategy):
        return None

    @tf.function
    def count(flag):
        return strategy.reduce(
            tf.distribute.ReduceOp.SUM, strategy.run(lambda: tf.identity(flag)), axis=None
        )

    return lambda flag: bool(count(tf.constant(1 if flag else 0, tf.int32)) > 0)


def gather(strategy, values: list[int]) -> np.ndarray:
    """`values` (int64s) of every replica of the cluster, as rows: shape [replicas, len(values)]. Every worker must
    call it at the same point, like any collective."""
    import tensorflow as tf

    local = tf.constant(values, tf.int64)

    @tf.function
    def run():
        return strategy.gather(strategy.run(lambda: tf.identity(local)[None]), axis=0)

    return run().numpy().reshape(-1, len(values))


def _digest(value) -> int:
    text = json.dumps(value, sort_keys=True, default=str)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "big")


def fingerprint(keys: dict[str, object], version: str) -> dict[str, int]:
    """One number per recipe key (`tpukit.planner.settings.recipe_keys`) and for the tpukit version."""
    return {
        **{key: _digest(value) for key, value in keys.items()},
        "tpukit version": _digest(version),
    }


def check_same_recipe(strategy, keys: dict[str, object], recipe_path: str, version: str) -> None:
    """Raises RecipeError on every worker when the workers' recipes (`keys`: every key the recipe decides, the Plan's
    `settings.keys`) or tpukit versions differ, naming the keys and this worker's values (each worker's log shows
    its own)."""
    if not is_multi_worker(strategy):
        return
    mine = fingerprint(keys, version)
    rows = gather(strategy, list(mine.values()))
    differ = [name for column, name in enumerate(mine) if len(set(rows[:, column])) > 1]
    if differ:
        values = {**keys, "tpukit version": version}
        shown = ", ".join(f"{key}={values[key]!r}" for key in differ)
        raise RecipeError(
            f"{recipe_path}: the workers of this cluster were started with different {', '.join(differ)} (compared "
            f"across all workers before training; this worker has {shown}). Fix: start the same command, with the "
            "same recipe, --set overrides and tpukit version, on every worker."
        )


def agree_resume_step(strategy, step: int) -> int:
    """The step every worker can resume from: the oldest of the workers' newest checkpoints."""
    if not is_multi_worker(strategy):
        return step
    steps = gather(strategy, [step])[:, 0]
    agreed = int(steps.min())
    if agreed != step:
        logger.warning(
            "tpukit: the workers' newest checkpoints are at steps %s: every worker resumes from step %d",
            sorted(set(int(s) for s in steps)),
            agreed,
        )
    return agreed
