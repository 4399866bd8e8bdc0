"""The TensorFlow engine: tf.distribute strategies (TPUStrategy, MirroredStrategy, MultiWorkerMirroredStrategy)
and Keras' TensorFlow trainer.

`engine` is what `tpukit.runner` calls (hardware, build, train, evaluate, export, report). Beneath it: `strategy`
(connecting), `cluster` (multi-worker agreement), `loop` (tpukit's multi-step loop), `trainer` (fit with recovery),
`checkpoint`, `callbacks`, `export`, `flops`, `compat` (version checks) and `keras_private` (every private
Keras/TensorFlow internal tpukit touches, with its upstream issue and tested range). Importing this package imports
nothing heavy, so `python -m tpukit.doctor` can read `compat` and `strategy` where TensorFlow is broken.
"""

from tpukit.environment import backend as _backend

# Before any module of this package imports TensorFlow: importing TensorFlow (2.21) already imports
# keras.src.backend.config, which fixes the Keras backend from KERAS_BACKEND or ~/.keras/keras.json right then.
_backend.use_default()
