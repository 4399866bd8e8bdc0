"""Checkpoints of the model, optimizer and step with `tf.train.Checkpoint` + `CheckpointManager`.

The optimizer's step counter (`optimizer.iterations`) is the step: restoring it is what lets a re-run of the
same command resume where the last one stopped.
"""

from __future__ import annotations

import logging

import tensorflow as tf

logger = logging.getLogger("tpukit")


class CheckpointMismatchError(ValueError):
    """The checkpoint in the output directory does not fit the model the recipe builds."""


class Checkpointer:
    def __init__(self, directory: str, model, optimizer, max_to_keep: int = 3):
        self.model = model
        self.optimizer = optimizer
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=max_to_keep)

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def restore_latest(self) -> int:
        """Restores the newest checkpoint, if any, and returns its step (0 when starting fresh)."""
        path = self.manager.latest_checkpoint
        if not path:
            return 0
        # Keras creates optimizer slots lazily; build them so the restore can fill them instead of deferring.
        self.optimizer.build(self.model.trainable_variables)
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.InvalidArgumentError) as error:
            raise CheckpointMismatchError(
                f"the checkpoint {path} does not match the model this recipe builds ({type(error).__name__}: "
                f"{str(error)[:300]}). Fix: use a new --output_dir for a changed model, or delete that directory "
                "to start over."
            ) from None
        logger.info("tpukit: resumed from %s at step %d", path, self.step)
        return self.step

    def save(self) -> str:
        path = self.manager.save(checkpoint_number=self.step)
        logger.info("tpukit: saved checkpoint %s", path)
        return path
