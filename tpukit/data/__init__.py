"""tf.data sources and the distributed pipeline. Usable on their own, in any Keras code."""

from tpukit import compat as _compat  # noqa: F401  (sets the Keras backend before TensorFlow/Keras load)
from tpukit.data.pipeline import (
    distribute,
    eval_batches,
    per_replica_batch_size,
    shard,
    training_batches,
)
from tpukit.data.sources import arrays, digits, synthetic

# Sources a recipe's `data.source` may name. Each takes `split` and `input_context`, and its other keyword
# arguments are the recipe keys it accepts (validated against its signature by tpukit.recipe).
SOURCES = {
    "digits": digits,
    "synthetic": synthetic,
}
SOURCE_RESERVED_ARGS = ("split", "input_context")

__all__ = [
    "SOURCES",
    "arrays",
    "digits",
    "distribute",
    "eval_batches",
    "per_replica_batch_size",
    "shard",
    "synthetic",
    "training_batches",
]
