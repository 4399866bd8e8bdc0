"""Two real MultiWorkerMirroredStrategy workers on 127.0.0.1 read disjoint shards that together hold every id."""

import json
import sys
import textwrap

import pytest
from helpers import start_workers

# Starts 2 worker processes on 127.0.0.1.
pytestmark = pytest.mark.cluster

NUM_IDS = 50

WORKER = textwrap.dedent(
    """
    import json, os, sys
    import tensorflow as tf

    # The strategy must exist before any other TensorFlow op runs in this process.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    import numpy as np
    from tpukit import data

    ids = np.arange({num_ids}, dtype=np.int32)

    def eval_fn(ctx):
        return data.eval_batches(data.arrays(ids[:, None].astype(np.float32), ids, ctx), {num_ids}, 8, ctx)

    def train_fn(ctx):
        return data.training_batches(data.arrays(ids[:48, None].astype(np.float32), ids[:48], ctx), 8, ctx,
                                     shuffle_buffer=4, repeat=False)

    seen = {{"eval": [], "train": [], "replicas": strategy.num_replicas_in_sync}}
    for _, labels, weights in strategy.distribute_datasets_from_function(eval_fn):
        for y, w in zip(strategy.experimental_local_results(labels), strategy.experimental_local_results(weights)):
            seen["eval"] += [int(i) for i, wi in zip(y.numpy(), w.numpy()) if wi > 0]
    for _, labels in strategy.distribute_datasets_from_function(train_fn):
        for y in strategy.experimental_local_results(labels):
            seen["train"] += [int(i) for i in y.numpy()]
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)
    """
)


def test_two_workers_read_disjoint_shards_covering_every_id(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(num_ids=NUM_IDS))
    codes = start_workers(
        tmp_path,
        lambda i: [sys.executable, str(script), str(tmp_path / f"seen{i}.json")],
        timeout=150,
    )
    for index, code in enumerate(codes):
        assert code == 0, (tmp_path / f"worker{index}.log").read_text()[-3000:]
    seen = [json.loads((tmp_path / f"seen{i}.json").read_text()) for i in range(2)]
    assert [s["replicas"] for s in seen] == [2, 2]
    eval_ids = [set(s["eval"]) for s in seen]
    assert not eval_ids[0] & eval_ids[1]
    assert sorted(seen[0]["eval"] + seen[1]["eval"]) == list(range(NUM_IDS))
    assert sorted(seen[0]["train"] + seen[1]["train"]) == list(range(48))
