"""A notebook's second `tpukit.fit` on the jax engine (one process, the same `output_dir`) resumes: the model is
built with the names a new process gives it (`keras_private.fresh_names`), so the checkpoint's variable paths
(`dense_1/kernel`, `adam/dense_1_kernel_momentum`, `seed_generator/seed_generator_state`) match, where Keras'
own counters would have built `dense_3` and refused the checkpoint. The resumed run ends with the weights of one
2-epoch run, and the user's own layers, built before, between and after, keep names of their own. In a JAX-backend
child process (the test process is on Keras' TensorFlow backend)."""

import pytest
from helpers import run_jax_snippet

CODE = r"""
import json, os, sys
import numpy as np
import keras
import tpukit

root = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 4)).astype("float32")
y = rng.integers(0, 3, 64)

def build():
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.2),
         keras.layers.Dense(3)]
    )

def fit(output_dir, epochs):
    return tpukit.fit(build, x, y, epochs=epochs, batch_size=16, output_dir=output_dir, engine="jax", seed=0)

def saved(output_dir):
    model = keras.saving.load_model(os.path.join(output_dir, "model.keras"), compile=False)
    return [layer.name for layer in model.layers], model.get_weights()

mine = [keras.layers.Dense(2).name]  # the user's own layers, before tpukit's
first = fit(os.path.join(root, "rerun"), 1)
mine.append(keras.layers.Dense(2).name)
first_names, _ = saved(os.path.join(root, "rerun"))
resumed = fit(os.path.join(root, "rerun"), 2)  # the same output_dir, 2 epochs: resumes after the first
mine.append(keras.layers.Dense(2).name)
once = fit(os.path.join(root, "once"), 2)  # one 2-epoch run, in the same process too
mine.append(keras.layers.Dense(2).name)
resumed_names, resumed_weights = saved(os.path.join(root, "rerun"))
once_names, once_weights = saved(os.path.join(root, "once"))
print("RESULT " + json.dumps({
    "statuses": [first["status"], resumed["status"], once["status"]],
    "resumed_from": resumed["resumed_from_step"], "first_step": first["step"], "step": resumed["step"],
    "names": [first_names, resumed_names, once_names],
    "equal": len(resumed_weights) == len(once_weights) and all(
        np.array_equal(a, b) for a, b in zip(resumed_weights, once_weights)),
    "losses": [resumed["train"]["loss"], once["train"]["loss"]],
    "mine": mine,
}))
"""


@pytest.mark.integration
def test_a_second_fit_in_the_same_process_resumes_to_the_weights_of_one_run(tmp_path):
    result = run_jax_snippet(CODE, str(tmp_path))
    assert result["statuses"] == ["done", "done", "done"]
    assert result["resumed_from"] == result["first_step"] == 4 and result["step"] == 8
    # Every build has a new process's names (what a CLI run, and tpukit before this fix, named it).
    assert result["names"] == [["dense", "dropout", "dense_1"]] * 3
    assert result["equal"], result["losses"]
    assert result["losses"][0] == result["losses"][1]
    # The user's layers: unique, and none named as one of their own earlier ones.
    assert len(set(result["mine"])) == 4, result["mine"]
