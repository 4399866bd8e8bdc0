"""The jax engine: Keras on the JAX backend with `keras.distribution` over a device mesh of a `data` and a `model`
axis (`runtime.mesh`): data parallelism, and weights split over the `model` axis (`runtime.layout`, else the model's
default in `tpukit.models.layouts`), on one host or many (`keras.distribution.initialize`).

`engine` implements `tpukit.engines.keras.protocols.Engine`; beneath it: `checkpoint` (Orbax checkpoints: each
process writes its own shards; resumable on another mesh), `compat` (version checks and the private JAX internals), `saved_model`
(the SavedModel, exported by a TensorFlow-backend process), `tpu_compile` (libtpu's compiler for `tpukit check`).
The fit loop, callbacks and peak FLOPs are the shared ones (`tpukit.engines.keras`); this package never imports the
TensorFlow engine. Keras' backend must be "jax" before Keras is first imported: the CLI sets it from
`runtime.engine`; in Python, `tpukit.use_engine("jax")`.
"""
