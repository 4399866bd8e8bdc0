"""The TensorFlow engine: tf.distribute strategies (TPUStrategy, MirroredStrategy, MultiWorkerMirroredStrategy)
and Keras' TensorFlow trainer.

`engine` implements `tpukit.engines.keras.protocols.Engine`; beneath it: `strategy` (connecting), `cluster`
(multi-worker agreement), `loop` (tpukit's multi-step loop), `checkpoint` (`tf.train.Checkpoint`), `sparse`
(repeated embedding ids), `flops` (the FLOP count), `compat` (version checks) and `keras_private` (the private
Keras/TensorFlow internals only this engine touches). The trainer, callbacks and export are the shared ones
(`tpukit.engines.keras`); this package never imports the jax engine. Importing this package imports
nothing heavy, so `python -m tpukit.doctor` can read `compat` and `strategy` where TensorFlow is broken.
"""

from tpukit.environment import backend as _backend

# Before any module of this package imports TensorFlow: importing TensorFlow (2.21) already imports
# keras.src.backend.config, which fixes the Keras backend from KERAS_BACKEND or ~/.keras/keras.json right then.
_backend.use_default()
