"""The jax engine's Orbax checkpointer on its own (tpukit/engines/jax/checkpoint.py), in a JAX-backend child with
4 virtual CPU devices: a save restores bit for bit onto another mesh, with the run state; the same step saved again
replaces the first; a `ckpt-N.npz` of tpukit before issue 39 still resumes; another model is a mismatch. A damaged
step is in test_jax_engine.py, several processes in test_jax_multihost.py."""

import pytest
from helpers import run_jax_snippet

CODE = r"""
import json, os, sys, io
import numpy as np
import keras
from tpukit.engines.jax import checkpoint as ck
from tpukit.engines.keras.checkpoint import CheckpointMismatchError

directory = sys.argv[1]

def build(mesh_shape, units=8):
    keras.backend.clear_session()  # the names of a new process's model (the checkpoint matches by path)
    mesh = keras.distribution.DeviceMesh(mesh_shape, ["data", "model"], keras.distribution.list_devices())
    layout = keras.distribution.LayoutMap(mesh)
    layout[".*kernel"] = (None, "model")  # Keras matches the whole path ("sequential/dense/kernel")
    keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="data"))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units), keras.layers.Dense(4)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model

def values(model):
    return [np.asarray(v.value) for v in list(model.variables) + list(model.optimizer.variables)]

result = {}
first = build((1, 4))
x = np.random.default_rng(0).standard_normal((8, 4)).astype("float32")
first.fit(x, x, batch_size=8, epochs=3, verbose=0)
saver = ck.Checkpointer(directory, first, first.optimizer, max_to_keep=2)
saver.state.skipped_steps.assign(5)
saver.state.early_stopping_best.assign(0.25)
path = saver.save()
saver.state.skipped_steps.assign(6)  # the same step saved again: the second save replaces the first
saver.save()
saver.close()
result["committed"] = sorted(os.listdir(directory))
result["path"] = os.path.basename(path)

second = build((4, 1))  # another mesh: the kernels split over 1 device instead of 4
reader = ck.Checkpointer(directory, second, second.optimizer)
result["step"] = reader.restore()
result["equal"] = all(np.array_equal(a, b) for a, b in zip(values(first), values(second), strict=True))
result["mesh"] = dict(second.layers[0].kernel.value.sharding.mesh.shape)
result["saved_split"] = str(first.layers[0].kernel.value.sharding.spec)
result["run_state"] = [reader.state.skipped_steps.value, reader.state.early_stopping_best.value]

# A ckpt-N.npz of tpukit before issue 39 (whole values, the paths, the run state as JSON), at a newer step.
legacy = build((2, 2))
variables = list(legacy.variables) + list(legacy.optimizer.variables)
arrays = {f"v{i}": np.asarray(v.value) + (1 if v.dtype == "float32" else 0) for i, v in enumerate(variables)}
arrays["__paths__"] = np.array([v.path for v in variables])
arrays["__run_state__"] = np.array(json.dumps({"skipped_steps": 9, "early_stopping_best": None}))
step = 10
for i, v in enumerate(variables):
    if v.path.endswith("iteration"):
        arrays[f"v{i}"] = np.asarray(step, dtype=arrays[f"v{i}"].dtype)
with open(os.path.join(directory, f"ckpt-{step}.npz"), "wb") as f:
    np.savez(f, **arrays)
third = build((2, 2))
reader = ck.Checkpointer(directory, third, third.optimizer)
result["legacy_step"] = [step, reader.restore()]
result["legacy_equal"] = all(
    np.array_equal(arrays[f"v{i}"], a) for i, a in enumerate(values(third)) if f"v{i}" in arrays
)
result["legacy_skipped"] = reader.state.skipped_steps.value

# Another model (a wider first layer): a mismatch, not a damaged checkpoint.
os.remove(os.path.join(directory, f"ckpt-{step}.npz"))
wider = build((1, 4), units=16)
try:
    ck.Checkpointer(directory, wider, wider.optimizer).restore()
    result["mismatch"] = None
except CheckpointMismatchError as error:
    result["mismatch"] = str(error)
print("RESULT " + json.dumps(result))
"""


@pytest.mark.integration
def test_a_save_restores_on_another_mesh_and_a_legacy_npz_still_resumes(tmp_path):
    result = run_jax_snippet(
        CODE, str(tmp_path / "checkpoints"), XLA_FLAGS="--xla_force_host_platform_device_count=4"
    )
    assert result["committed"] == ["ckpt_3"], result  # one step, saved twice: no temporary left
    assert result["path"] == "ckpt_3"
    assert result["step"] == 3 and result["equal"], result
    assert result["mesh"] == {"data": 4, "model": 1}, (
        result
    )  # placed on the new mesh, not the saved one
    assert result["run_state"] == [6, 0.25], result  # the second save's run state
    assert result["legacy_step"][0] == result["legacy_step"][1], result
    assert result["legacy_equal"] and result["legacy_skipped"] == 9, result
    assert result["mismatch"] and "does not match the model" in result["mismatch"], result
