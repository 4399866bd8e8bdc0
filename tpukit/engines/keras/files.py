"""`tpukit.rundir`'s file operations through TensorFlow's file systems, for `gs://` (and other `scheme://`) output
directories that Python's `os` cannot reach."""

from __future__ import annotations

import tensorflow as tf


class GFiles:
    """The `tpukit.rundir.LocalFiles` interface over `tf.io.gfile`."""

    remote = True

    def exists(self, path: str) -> bool:
        return tf.io.gfile.exists(path)

    def isdir(self, path: str) -> bool:
        return tf.io.gfile.isdir(path)

    def makedirs(self, path: str) -> None:
        tf.io.gfile.makedirs(path)

    def read_text(self, path: str) -> str:
        with tf.io.gfile.GFile(path, "r") as f:
            return f.read()

    def write_text(self, path: str, text: str) -> None:
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)

    def rename(self, source: str, target: str) -> None:
        tf.io.gfile.rename(source, target, overwrite=True)

    def remove(self, path: str) -> None:
        if tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)

    def rmtree(self, path: str) -> None:
        if tf.io.gfile.exists(path):
            tf.io.gfile.rmtree(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return [name.rstrip("/") for name in tf.io.gfile.listdir(path)]
        except tf.errors.NotFoundError:
            return []
