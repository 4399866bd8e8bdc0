"""What both engines share, written against Keras' public trainer API (as Keras keeps `trainers/trainer.py` beside
one trainer per backend): `session` (the session, fit and evaluate over it, the report, errors explained),
`trainer` (fit with recovery: checkpoints every N steps, SIGTERM/Ctrl-C, NaN rollback, mid-epoch resume),
`checkpoint` (the `Checkpointer` protocol the trainer drives), `callbacks`, `flops` (peaks and MFU), `export`
(`model.keras` and the SavedModel), `files` (gs:// output directories), `compat` (the Keras check) and
`keras_private` (the private Keras internals these touch). `protocols` writes down the `Engine` interface.

Nothing here imports an engine (`tpukit.engines.tensorflow`, `tpukit.engines.jax`): an import-linter contract in
setup.cfg.
"""

from tpukit.environment import backend as _backend

# Before any module of this package imports Keras or TensorFlow: Keras fixes its backend at its first import, and
# unless the user (or `tpukit.use_engine`) chose one, it is the engine `auto` chooses here.
_backend.use_default()
