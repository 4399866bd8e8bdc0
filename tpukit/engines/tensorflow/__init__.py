"""The TensorFlow engine: tf.distribute strategies (TPUStrategy, MirroredStrategy, MultiWorkerMirroredStrategy)
and Keras' TensorFlow trainer.

`engine` is what `tpukit.runner` calls (hardware, build, train, evaluate, export, report). Beneath it: `strategy`
(connecting), `cluster` (multi-worker agreement), `loop` (tpukit's multi-step loop), `trainer` (fit with recovery),
`checkpoint`, `callbacks`, `export`, `flops`, `compat` (version checks) and `keras_private` (every private
Keras/TensorFlow internal tpukit touches, with its upstream issue and tested range). Importing this package imports
nothing heavy, so `python -m tpukit.doctor` can read `compat` and `strategy` where TensorFlow is broken.
"""
