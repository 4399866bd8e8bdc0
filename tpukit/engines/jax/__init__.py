"""The jax engine: Keras on the JAX backend with `keras.distribution` over a device mesh of a `data` and a `model`
axis (`runtime.mesh`): data parallelism, and weights split over the `model` axis (`runtime.layout`, else the model's
default in `tpukit.models.layouts`), on one host or many (`keras.distribution.initialize`).

`engine` is what `tpukit.runner` calls (the functions `tpukit.engines.tensorflow.engine` provides). Beneath it:
`checkpoint` (whole-value `.npz` checkpoints, resumable on another mesh), `compat` (version checks). The fit loop
with its guarantees (checkpoints every N steps, SIGTERM/Ctrl-C, NaN rollback, mid-epoch resume), the callbacks and
the TPU peak-FLOPs table are Keras-generic and shared with the TensorFlow engine (`tpukit.engines.tensorflow.trainer`,
`callbacks`, `flops`): the jax engine installs TensorFlow's CPU build for tf.data anyway. Keras' backend must be
"jax" before Keras is first imported: the CLI sets it from `runtime.engine`; in Python, `tpukit.use_engine("jax")`.
"""
