"""`python -m tpukit.check RECIPE [--cores N] [--tpu-type v5e]`: will this recipe train on a TPU? Asked on a CPU.

    python -m tpukit.check mnist_cnn                         # 8 cores of a TPU v5e (the default target)
    python -m tpukit.check cifar10_resnet --cores 32 --tpu-type v4 --set data.global_batch_size=4096
    python -m tpukit.check digits_cnn --json                 # one JSON object, for machines

Before any TPU hour is spent, each rule below passes, warns or fails, and a failure says the fix:

* `static_shapes`: the training and eval batches the recipe's pipelines (`tpukit.task.input_fns`) give one core
  have fully defined shapes (a TPU compiles one program per shape).
* `batch`: the global batch divides by the cores; the per-core batch is a multiple of 8 (TPU arrays are tiled in
  8 x 128 chunks: "your batch size should be evenly divisible by 8 or 128", cloud.google.com/tpu/docs/
  performance-guide); a warning below 128 per core, where the matrix units (128 x 128) are not filled.
* `input_ops`: no `py_function` / `numpy_function` / `from_generator` in the input graphs (ops `PyFunc`,
  `EagerPyFunc`, `GeneratorDataset`): they hold Python's lock on the host and cannot run where the graph is
  shipped to another process (a remote TPU Node's host, the tf.data service).
* `input_paths`: when the input runs on other hosts (a slice larger than one TPU host, or a TPU given by name or
  `grpc://` address), every file the source reads is on `gs://`: other hosts cannot see this machine's disk
  ("File system scheme '[local]' not implemented").
* `xla_step`: one training step of the recipe's model, compiled with XLA (`jit_compile=True`) on the CPU.
* `precision_step`: one step in the precision the TPU would use (`runtime.precision: auto` -> `mixed_bfloat16`)
  gives a finite loss, computes in bfloat16 and keeps float32 variables and float32 logits (as Keras' mixed
  policy does). One XLA-compiled step in that precision answers both rules; only when it fails does a float32 step
  run, to tell XLA's failure (`xla_step` fails) from the precision's (`precision_step` fails).
* `mesh` (a recipe the jax engine trains on the TPU only, reported first: `runtime.engine: jax`, or `auto` where no
  TensorFlow TPU build is installed here, as on Colab and Kaggle): `runtime.mesh` fits the cores (`model`
  divides them; `data` x `model` is at most their number) and the global and eval batches divide by the `data`
  axis; `batch` then counts per `data` shard (each device of a shard sees its whole batch). `tpukit check` runs the
  other rules on Keras' JAX backend, as the jax engine trains (`check()` from Python: on the backend Keras loaded),
  and `memory` counts whole weights per core (an upper bound when `runtime.mesh.model` > 1 splits some).
* `embeddings` (a recipe whose model has `tables` only, reported after `mesh`): where keras-rs 0.4.0's
  `DistributedEmbedding` puts each table on this TPU type and engine, and why: SparseCore (TensorFlow's TPU
  embedding API V1/V2 by the embedding feature the generation reports), or HBM with the dense model (always on the
  jax engine, which does not run keras-rs' SparseCore preprocessing). Fails for `placement: sparsecore` where it
  cannot work; warns where tables would go to SparseCore (a path tpukit's tests have not run: no TPU) and for an
  HBM table above 1/4 of one core's HBM (`embeddings_rule`, `TF_EMBEDDING_FEATURE`).
* `memory`: the per-core training state (float32 weights, gradients and the optimizer's slot variables, counted
  from the built model and optimizer) fits one core's HBM (else fail), and so does the state plus an estimate of
  the activations (else warn): the operands and results of every matmul/convolution at the per-core batch
  (`memory_rule`, `_activation_bytes`). HBM per chip is from Google's Cloud TPU docs (`HBM_BYTES_PER_CHIP`).

XLA on the CPU is a proxy for XLA on the TPU (a few ops differ), the memory rule an estimate: not a TPU run.

Exit status: 0 when no rule fails (warnings allowed), 1 when one fails, 2 for a bad recipe or flags.

With `--topology NAME` (`v5e-8`, `v6e-16`, ...) no rule runs: the training step is compiled by libtpu, the TPU
compiler, for that slice (`tpukit.tools.tpu_check`); exit 0 when it fits, 1 when it does not.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from tpukit import engines
from tpukit.engines.keras import flops
from tpukit.engines.tensorflow import flops as tf_flops
from tpukit.engines.tensorflow import keras_private
from tpukit.environment import engine_choice
from tpukit.planner import check_batch_sizes, eval_batch_size
from tpukit.planner import hardware as performance
from tpukit.planner.rules import PATH_SUFFIXES, Rule, Target, input_paths_rule  # noqa: F401
from tpukit.recipe import Recipe, RecipeError, load_recipe, raw_recipe
from tpukit.recipe.loading import requested_engine
from tpukit.tools import offline, start_tool

RULES = (
    "static_shapes",
    "batch",
    "input_ops",
    "input_paths",
    "xla_step",
    "precision_step",
    "memory",
)
# Rules reported only for recipes they apply to, before the others: `embeddings` for a model with `tables` (run by
# default, and selectable with --rule). `mesh` (the jax engine) always runs and is not selectable.
RECIPE_RULES = ("embeddings",)
PROXY_NOTE = (
    "XLA on this CPU is a proxy for the TPU: a few ops compile on the CPU and have no TPU kernel, and memory is an "
    "estimate. A pass here is not a run on a TPU."
)

# HBM per chip, from Google's Cloud TPU docs (the "HBM capacity" row of each page):
#   v3: 32 GiB (cloud.google.com/tpu/docs/v3)     v4: 32 GiB (cloud.google.com/tpu/docs/v4)
#   v5e: 16 GB (cloud.google.com/tpu/docs/v5e)    v5p: 95 GB (cloud.google.com/tpu/docs/v5p)
#   v6e: 32 GB (cloud.google.com/tpu/docs/v6e)    tpu7x: 192 GiB (docs.cloud.google.com/tpu/docs/tpu7x)
#   v2: 16 GiB: no current Cloud TPU page has v2; Jouppi et al., "A Domain Specific Supercomputer for Training
#       Deep Neural Networks" (CACM 2020), give 16 GiB of HBM per TPUv2 chip.
# GB and GiB are as the pages print them. A chip's HBM is shared by its TensorFlow devices (two on v2/v3).
HBM_BYTES_PER_CHIP: dict[str, float] = {
    "v2": 16 * 2**30,
    "v3": 32 * 2**30,
    "v4": 32 * 2**30,
    "v5e": 16e9,
    "v5p": 95e9,
    "v6e": 32e9,
    "tpu7x": 192 * 2**30,
}
# Chips behind one TPU host, so a slice with more is multi-host (each host runs its own input pipeline):
#   v2-8 / v3-8: 4 chips on one host (8 cores); v4-8: 4 chips, 1 host (cloud.google.com/tpu/docs/v4);
#   v5e and v6e: "Chips per host: 8" (the v5e and v6e pages); v5p: topology 2x2x1 = 4 chips, 1 host
#   (cloud.google.com/tpu/docs/v5p); tpu7x: 4 chips per VM (docs.cloud.google.com/kubernetes-engine/docs/
#   concepts/tpu-ironwood). Cores per host = chips x `tpukit.engines.keras.flops.TF_DEVICES_PER_CHIP`.
CHIPS_PER_HOST: dict[str, int] = {
    "v2": 4,
    "v3": 4,
    "v4": 4,
    "v5e": 8,
    "v5p": 4,
    "v6e": 8,
    "tpu7x": 4,
}
DEFAULT_TPU_TYPE = (
    "v5e"  # the Colab and Kaggle TPU runtimes' newer chip; HBM-wise the tightest TF-era chip
)
MIN_CORE_BATCH = 8  # TPU arrays are tiled 8 x 128 (Cloud TPU performance guide)
MXU_CORE_BATCH = 128  # fills the 128 x 128 matrix unit
# Ops that run Python inside a tf.data graph: py_function (EagerPyFunc), numpy_function (PyFunc), from_generator.
PYTHON_OPS = ("PyFunc", "PyFuncStateless", "EagerPyFunc", "GeneratorDataset")
# Option names that hold a file, a directory or a glob (the built-in sources' and the usual names of others').


def target_for(
    recipe: Recipe, cores: int = 8, tpu_type: str = DEFAULT_TPU_TYPE, hbm_bytes: float | None = None
) -> Target:
    """The `Target` for `cores` TensorFlow devices of `tpu_type`; `hbm_bytes` overrides the HBM per chip."""
    if tpu_type not in HBM_BYTES_PER_CHIP:
        raise RecipeError(
            f"--tpu-type must be one of {', '.join(HBM_BYTES_PER_CHIP)}; received {tpu_type!r}. Fix: pick the "
            "generation you will train on (for another chip pass its HBM per chip with --hbm-gib)."
        )
    if not isinstance(cores, int) or isinstance(cores, bool) or cores < 1:
        raise RecipeError(
            f"--cores must be a positive integer (TPUStrategy replicas, e.g. 8 for a v3-8 or v5e-8); received "
            f"{cores!r}. Fix: pass --cores 8."
        )
    if hbm_bytes is not None and not (hbm_bytes > 0 and math.isfinite(hbm_bytes)):
        raise RecipeError(
            f"--hbm-gib must be a positive number; received {hbm_bytes / 2**30!r}. Fix: e.g. --hbm-gib 16."
        )
    per_chip = flops.TF_DEVICES_PER_CHIP[tpu_type]
    per_host = CHIPS_PER_HOST[tpu_type] * per_chip
    tpu = recipe.runtime.tpu
    return Target(
        tpu_type=tpu_type,
        cores=cores,
        hosts=math.ceil(cores / per_host),
        cores_per_host=per_host,
        hbm_bytes_per_core=(hbm_bytes or HBM_BYTES_PER_CHIP[tpu_type]) / per_chip,
        remote=bool(tpu) and tpu != "local",
    )


# ----------------------------------------------------------------------------------------------------------------
# Rules that need no model.


def batch_rule(recipe: Recipe, target: Target, train_examples: int | None) -> Rule:
    """The global batches divide by the cores; the per-core training batch is a multiple of 8 (>= 128 advised)."""
    cores = target.cores
    global_batch = recipe.data.global_batch_size
    try:
        # Unknown example count (the data could not be read; see static_shapes): divisibility alone.
        check_batch_sizes(recipe, cores, global_batch if train_examples is None else train_examples)
    except RecipeError as error:
        # A fix that passes this rule whole: a multiple of 8 per core, not just of the core count.
        step = MIN_CORE_BATCH * cores
        good = max(step, global_batch // step * step)
        return Rule(
            "batch",
            "fail",
            str(error),
            f"--set data.global_batch_size={good} (a multiple of {step})",
        )
    per_core = global_batch // cores
    eval_per_core = eval_batch_size(recipe) // cores
    shown = f"global batch {global_batch} = {cores} cores x {per_core} per core"
    if per_core % MIN_CORE_BATCH:
        good = max(MIN_CORE_BATCH, per_core // MIN_CORE_BATCH * MIN_CORE_BATCH) * cores
        return Rule(
            "batch",
            "fail",
            f"{shown}: {per_core} is not a multiple of {MIN_CORE_BATCH}, so XLA pads every batch to the next multiple "
            f"of {MIN_CORE_BATCH} on the TPU (TPU arrays are tiled 8 x 128; Cloud TPU performance guide) and "
            "computes on padding.",
            f"--set data.global_batch_size={good} (a multiple of {MIN_CORE_BATCH * cores})",
        )
    notes = []
    if eval_per_core % MIN_CORE_BATCH:
        notes.append(
            f"the eval batch per core ({eval_per_core}) is not a multiple of {MIN_CORE_BATCH} (padded by XLA)"
        )
    if per_core < MXU_CORE_BATCH:
        notes.append(
            f"{per_core} per core is below {MXU_CORE_BATCH}: the 128 x 128 matrix units are partly idle, so "
            "throughput is lower than the chip allows"
        )
    if notes:
        return Rule(
            "batch",
            "warn",
            f"{shown}; " + "; ".join(notes) + ".",
            f"if memory allows, --set data.global_batch_size={MXU_CORE_BATCH * cores} (and scale the learning "
            "rate, e.g. train.reference_batch_size)",
        )
    return Rule("batch", "pass", f"{shown}.")


def _graph_ops(dataset) -> set[str]:
    """Every op type in a dataset's graph, the bodies of its functions (map, flat_map, ...) included."""
    import tensorflow as tf

    serialized = keras_private.serialized_dataset_graph(dataset)
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialized.numpy())
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


def input_ops_rule(datasets: dict[str, Any]) -> Rule:
    """No Python (`py_function`, `numpy_function`, `from_generator`) in the input graphs."""
    found = {}
    for split, dataset in datasets.items():
        python = sorted(_graph_ops(dataset) & set(PYTHON_OPS))
        if python:
            found[split] = python
    if found:
        where = "; ".join(f"{split}: {', '.join(ops)}" for split, ops in found.items())
        return Rule(
            "input_ops",
            "fail",
            f"the input pipeline runs Python ({where}): tf.py_function / numpy_function / from_generator hold "
            "Python's lock on the host, which then cannot keep a TPU fed, and cannot run where the graph is shipped "
            "to another process (a remote TPU Node's host, the tf.data service).",
            "write the preprocessing with TensorFlow ops (tf.io, tf.image, tf.strings) in Dataset.map, or convert "
            "the data to TFRecord files once and read them with tf.data.TFRecordDataset",
        )
    return Rule(
        "input_ops",
        "pass",
        f"no Python ops in the {' and '.join(datasets)} input graph(s) (checked for {', '.join(PYTHON_OPS)}).",
    )


def memory_rule(
    state_bytes: float,
    activation_bytes: float,
    target: Target,
    params: int,
    per_core_batch: int,
    optimizer: str,
) -> Rule:
    """Fails when the training state alone exceeds one core's HBM; warns when state + activations might.

    `state_bytes` is counted from the built model and optimizer (float32 weights, float32 gradients and the
    optimizer's slot variables, all replicated on every core by TPUStrategy); `activation_bytes` is an estimate
    (`_activation_bytes`). No margin is reserved for XLA's scratch space or the runtime, so a warning means
    "measure it on the TPU", and a pass close to the limit can still run out of HBM.
    """
    hbm = target.hbm_bytes_per_core
    shown = (
        f"{params:,} parameters: state {_size(state_bytes)} (weights + gradients + {optimizer} slots, "
        f"float32) + activations ~{_size(activation_bytes)} at {per_core_batch} per core, vs "
        f"{_size(hbm)} HBM per {target.tpu_type} core"
    )
    if state_bytes > hbm:
        return Rule(
            "memory",
            "fail",
            f'{shown}: the state alone does not fit ("Ran out of memory in memory space hbm").',
            "use a chip with more HBM per core (--tpu-type), a smaller model, or an optimizer with fewer slots "
            "(sgd: one, adam/adamw/lamb: two); data parallelism replicates the whole state on every core",
        )
    if state_bytes + activation_bytes > hbm:
        return Rule(
            "memory",
            "warn",
            f"{shown}: state + the activation estimate exceed HBM, so it may not fit.",
            f"try it on the TPU, or lower the per-core batch (--set data.global_batch_size="
            f"{max(MIN_CORE_BATCH, per_core_batch // 2) * target.cores})",
        )
    return Rule("memory", "pass", f"{shown}: fits with room to spare.")


def _size(num_bytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes:.0f} B"


# ----------------------------------------------------------------------------------------------------------------
# Embedding tables: where keras-rs 0.4.0's `DistributedEmbedding` puts each of a recommender's `model.tables` on a
# given TPU (keras_rs/src/layers/embedding/ in the venv). `placement: auto` resolves per engine:
#   tensorflow (tensorflow/distributed_embedding.py, `_has_sparsecore` / `_sparsecore_init`): TPUStrategy's
#     `extended.tpu_hardware_feature.embedding_feature` V1 -> tf.tpu.experimental.embedding.TPUEmbedding, V2 ->
#     TPUEmbeddingV2 (both "sparsecore"), UNSUPPORTED -> "default_device"; an explicit `sparsecore` there raises
#     ValueError("Placement to sparsecore was requested, however, this TPU does not support it.").
#   jax (base_distributed_embedding.py, `_has_sparsecore`): SparseCore only when jax.devices("tpu")[0].device_kind
#     is "TPU v5" or "TPU v6 lite"; the SparseCore code needs the `jax-tpu-embedding` package
#     (distributed_embedding.py imports the jax implementation only when it is installed; without it,
#     `_sparsecore_init` raises ImportError "Please install jax-tpu-embedding ..."); an explicit `sparsecore`
#     elsewhere raises ValueError("Not sparse cores available, cannot use explicit sparsecore placement.")
#     (jax/distributed_embedding.py).
#
# TensorFlow: the embedding feature each generation reports. TensorFlow only copies it from the topology that the
# TPU runtime (libtpu, not open source) returns to initialize_tpu_system (tensorflow/python/tpu/
# tpu_hardware_feature.py; tensorflow/core/protobuf/tpu/topology.proto), so no public table lists it; each row is
# inferred from these sources, and only v5p and v6e are documented for keras-rs:
#   v5p, v6e: V2. keras-team/keras-io examples/keras_rs/distributed_embedding_tf.py ("It needs to be run on TPU v5p
#     or v6e", placement "sparsecore" under TPUStrategy); keras-team/keras-rs#147 made the TensorFlow SparseCore
#     path (the TPUEmbeddingV2 table layout, sharded mod the SparseCore count) "pass on V6e" by reading
#     `num_embedding_devices_per_chip` instead of a hard-coded 4 (v5p has 4 SparseCores per chip, v6e 2: jax-ml/jax
#     jax/_src/pallas/mosaic/tpu_info.py); keras-rs runs its TPU tests on v6e (.github/workflows/actions.yml).
#   v4: V1 (inferred). v4 chips have SparseCores (Jouppi et al., "TPU v4: An Optically Reconfigurable Supercomputer
#     for Machine Learning with Hardware Support for Embeddings", ISCA 2023, cited by cloud.google.com/tpu/docs/v4);
#     google-research/google-research graph_embedding/huge/model.py asserts embedding feature V1 and pipelines its
#     "SparseCore" lookups through TPUEmbedding, and V2 is v5p/v6e's.
#   v2, v3: V1 (inferred). No SparseCore; TPUEmbedding, the V1 API, shards tables over the TensorCores' HBM
#     ("up to 96 GB embedding tables for TPU v3-8": tensorflow/models official/recommendation/ranking/README.md),
#     and TPUEmbeddingV0 is the class for a TPU that "doesn't support any version of embedding feature"
#     (tensorflow/python/tpu/tpu_embedding_v1.py).
#   v5e: UNSUPPORTED (inferred). A v5e chip has one TensorCore and no SparseCore (cloud.google.com/tpu/docs/v5e;
#     jax tpu_info.py gives v5e no sparse_core), and keras-io's example names only v5p and v6e. Were it V1, `auto`
#     would use TPUEmbedding there; not verified on a v5e.
#   tpu7x: None. "TensorFlow is not supported" (docs.cloud.google.com/tpu/docs/tpu7x), though each chip has four
#     SparseCores (same page).
TF_EMBEDDING_FEATURE: dict[str, str | None] = {
    "v2": "V1",
    "v3": "V1",
    "v4": "V1",
    "v5e": "UNSUPPORTED",
    "v5p": "V2",
    "v6e": "V2",
    "tpu7x": None,
}
TF_EMBEDDING_FEATURE_DOCUMENTED = ("v5p", "v6e")  # the other rows are inferred (above)
TF_EMBEDDING_API = {
    "V1": "tf.tpu.experimental.embedding.TPUEmbedding",
    "V2": "tf.tpu.experimental.embedding.TPUEmbeddingV2",
}
# Chips with SparseCores: v4 (the ISCA 2023 paper above), v5p and v6e (jax tpu_info.py: 4 and 2 per chip), tpu7x
# ("four SparseCores", its Cloud TPU page). v2, v3 and v5e have none.
SPARSECORE_CHIPS = ("v4", "v5p", "v6e", "tpu7x")
# JAX's device_kind per generation (jax-ml/jax jax/_src/pallas/mosaic/tpu_info.py and tests/pallas/tpu_info_test.py:
# "TPU v5 lite" is v5e, "TPU v5" is v5p, "TPU v6 lite" is v6e).
JAX_DEVICE_KIND = {
    "v2": "TPU v2",
    "v3": "TPU v3",
    "v4": "TPU v4",
    "v5e": "TPU v5 lite",
    "v5p": "TPU v5",
    "v6e": "TPU v6 lite",
    "tpu7x": "TPU7x",
}
# The device kinds keras-rs 0.4.0 puts tables on SparseCore for under JAX (base_distributed_embedding.py,
# `_has_sparsecore`). v4's and tpu7x's SparseCores are not used: keras-team/keras-rs#183 ("Add support for
# DistributedEmbedding for Ironwood", after 0.4.0) replaced this list with jax-tpu-embedding's own count.
KERAS_RS_JAX_SPARSECORE_KINDS = ("TPU v5", "TPU v6 lite")
# The optimizers a table on SparseCore trains with: its TableConfig's, "Only SGD, Adagrad, Adam, and FTRL are
# supported", default Adam (keras-rs 0.4.0 distributed_embedding_config.py, TableConfig.optimizer).
KERAS_RS_TABLE_OPTIMIZERS = ("SGD", "Adagrad", "Adam", "Ftrl")
# An HBM table above 1/4 of one core's HBM is worth a warning: its gradient and the optimizer's slots come on top.
HUGE_TABLE_FRACTION = 4


def _sparsecore_types() -> str:
    """The TPU types where `auto` tables go to SparseCore (or the TPU embedding API): the tensorflow engine's only
    (the jax engine keeps every table in HBM, see `_sparsecore_on`), as a message lists them."""
    return " or ".join(
        t for t, feature in TF_EMBEDDING_FEATURE.items() if feature in TF_EMBEDDING_API
    )


def _sparsecore_on(tpu_type: str, engine: str) -> tuple[str | None, str, str]:
    """What keras-rs 0.4.0 does with a table of placement auto or sparsecore on `tpu_type` under `engine`:
    (where such a table goes, or None when auto keeps it in HBM; why; what placement sparsecore raises then)."""
    if engine == "jax":
        kind = JAX_DEVICE_KIND[tpu_type]
        if kind in KERAS_RS_JAX_SPARSECORE_KINDS:
            # keras-rs' SparseCore path under JAX needs DistributedEmbedding.preprocess on the host, outside the
            # compiled step (it raises under jit), which tpukit's jax engine does not run: tpukit.task keeps
            # `auto` tables on the default device there and refuses `sparsecore`.
            why = (
                f"keras-rs 0.4.0 would use SparseCore under JAX on device kind {kind!r} ({tpu_type}), but its "
                "inputs must first go through DistributedEmbedding.preprocess outside the compiled step, which "
                "tpukit's jax engine does not do yet: tables stay in HBM"
            )
            raises = (
                "tpukit's jax engine refuses placement: sparsecore before building (keras-rs' preprocess would "
                "raise inside the compiled step)"
            )
            return None, why, raises
        kinds = " and ".join(map(repr, KERAS_RS_JAX_SPARSECORE_KINDS))
        if tpu_type in SPARSECORE_CHIPS:
            why = (
                f"{tpu_type} has SparseCores, but keras-rs 0.4.0 does not enable SparseCore on {tpu_type} under JAX "
                f"(only on device kinds {kinds}, not {kind!r}"
                + (
                    "; Ironwood support came after 0.4.0, keras-team/keras-rs#183)"
                    if tpu_type == "tpu7x"
                    else ")"
                )
            )
        else:
            why = f"{tpu_type} has no SparseCore (keras-rs 0.4.0 uses SparseCore under JAX only on device kinds {kinds})"
        raises = (
            "tpukit's jax engine refuses placement: sparsecore before building (keras-rs 0.4.0 would raise "
            "ValueError('Not sparse cores available, cannot use explicit sparsecore placement.') here)"
        )
        return None, why, raises
    feature = TF_EMBEDDING_FEATURE[tpu_type]
    reports = (
        f"reports embedding feature {feature}"
        if tpu_type in TF_EMBEDDING_FEATURE_DOCUMENTED
        else f"is expected to report embedding feature {feature} (inferred from public sources, not verified on a "
        "TPU; see TF_EMBEDDING_FEATURE in tpukit/tools/check.py)"
    )
    if feature == "UNSUPPORTED":
        raises = (
            "keras-rs raises ValueError('Placement to sparsecore was requested, however, this TPU does not support "
            "it.') when the model is built"
        )
        return None, f"{tpu_type} has no SparseCore and {reports}", raises
    api = TF_EMBEDDING_API[feature]
    if tpu_type in SPARSECORE_CHIPS:
        return f"SparseCore via {api}", f"{tpu_type} {reports}", ""
    where = f"the TPU embedding API via {api}, which shards it over the TensorCores' HBM ({tpu_type} has no SparseCore)"
    return where, f"{tpu_type} {reports}", ""


def _padded_rows(recipe: Recipe, name: str, split: int) -> int:
    """A table's rows as the jax engine builds them: padded to `model.vocabulary_multiple`, else to the model
    axis (`tpukit.task.builder_kwargs`)."""
    rows = recipe.model.kwargs["tables"][name]["vocabulary_size"]
    multiple = recipe.model.kwargs.get("vocabulary_multiple", split)
    return (
        math.ceil(rows / multiple) * multiple
        if isinstance(multiple, int) and multiple > 0
        else rows
    )


def embeddings_rule(recipe: Recipe, target: Target) -> Rule | None:
    """Where keras-rs 0.4.0's `DistributedEmbedding` puts each of `model.tables` on `target.tpu_type` under
    `runtime.engine`, and why; None when the model has no `tables` mapping (the rule is then not reported).

    Pure: decided from the tables above (`TF_EMBEDDING_FEATURE`, `KERAS_RS_JAX_SPARSECORE_KINDS`), with no
    TensorFlow, Keras, JAX or TPU. Reads `recipe.model.kwargs["tables"]` ({name: {vocabulary_size, embedding_dim,
    placement}}), `recipe.runtime.engine`, `recipe.runtime.mesh` (jax) and `recipe.train.optimizer`. Fails for a
    placement that cannot work; warns for what a run should know (tables on SparseCore, a path no tpukit test has
    run; an HBM table above 1/4 of one core's HBM).
    """
    tables = recipe.model.kwargs.get("tables")
    if not isinstance(tables, Mapping):
        return None
    engine, tpu = recipe.runtime.engine, target.tpu_type
    malformed = _malformed_table(tables)
    if malformed is not None:
        return malformed
    sized = [_sized_table(name, table) for name, table in tables.items()]
    if engine == "tensorflow" and TF_EMBEDDING_FEATURE[tpu] is None:
        return Rule(
            "embeddings",
            "fail",
            f'TensorFlow does not run on {tpu} ("TensorFlow is not supported", Cloud TPU docs), so none of '
            f"{', '.join(table.shown for table in sized)} can be placed.",
            f"--set runtime.engine=jax, or another --tpu-type (where keras-rs 0.4.0 takes tables off HBM under "
            f"tensorflow: {_sparsecore_types()})",
        )
    where, why, raises = _sparsecore_on(tpu, engine)
    onto = (where or "").partition(" via ")[0]  # "SparseCore" or "the TPU embedding API"
    split = _model_split(recipe, engine)
    placed = _place_tables(recipe, target, sized, where is not None, onto, split)
    lead = (
        f"{why}, so placement auto and sparsecore put a table on {where}"
        if where is not None
        else f"{why}, so placement auto keeps a table in HBM and placement sparsecore fails: {raises}"
    )
    message = (
        f"keras-rs 0.4.0 DistributedEmbedding on {tpu} under the {engine} engine: {lead}. "
        + "; ".join(placed.verdicts)
        + "."
    )
    notes, fixes = _embeddings_notes(recipe, target, placed, onto)
    if notes:
        message += " " + ". ".join(notes) + "."
    return _embeddings_verdict(message, placed, fixes, engine, split)


@dataclasses.dataclass(frozen=True)
class _SizedTable:
    """One of `model.tables`: its name, how the report shows it, its float32 bytes and its placement."""

    name: str
    shown: str
    nbytes: int
    placement: Any


@dataclasses.dataclass
class _Placement:
    """Where `_place_tables` put the tables: one verdict per table, and the names (or notes) of each outcome."""

    verdicts: list[str] = dataclasses.field(default_factory=list)
    failed: list[str] = dataclasses.field(default_factory=list)
    on_sparsecore: list[str] = dataclasses.field(default_factory=list)
    huge: list[str] = dataclasses.field(default_factory=list)
    undivided: list[str] = dataclasses.field(default_factory=list)


def _malformed_table(tables: Mapping) -> Rule | None:
    """The skip for the first table that is not {vocabulary_size, embedding_dim} with positive integers."""
    for name, table in tables.items():
        rows = table.get("vocabulary_size") if isinstance(table, Mapping) else None
        dim = table.get("embedding_dim") if isinstance(table, Mapping) else None
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in (rows, dim)):
            return Rule(
                "embeddings",
                "skip",
                f"model.tables.{name} is not {{vocabulary_size, embedding_dim}} with positive integers (received "
                f"{table!r}), so no table was placed.",
            )
    return None


def _sized_table(name: str, table: Mapping) -> _SizedTable:
    rows, dim = table["vocabulary_size"], table["embedding_dim"]
    shown = f"{name} ({rows:,} x {dim}, {_size(rows * dim * 4)})"  # float32
    return _SizedTable(name, shown, rows * dim * 4, table.get("placement", "auto"))


def _model_split(recipe: Recipe, engine: str) -> int:
    """The devices an HBM table is split over by rows: the jax engine's default layout splits a recommender's
    tables over the mesh's model axis (tpukit.models.layouts); TPUStrategy replicates them on every core (1)."""
    mesh = getattr(recipe.runtime, "mesh", None)
    split = mesh.get("model", 1) if engine == "jax" and isinstance(mesh, Mapping) else 1
    return split if isinstance(split, int) and split > 0 else 1


def _place_tables(
    recipe: Recipe,
    target: Target,
    sized: list[_SizedTable],
    sparsecore: bool,
    onto: str,
    split: int,
) -> _Placement:
    """Each table's verdict: fails (an unknown placement, sparsecore with no SparseCore, rows that do not split),
    goes to `onto` (SparseCore here, placement not default_device), or stays in HBM (huge above 1/4 of a core)."""
    kept = (
        f"stays in HBM with the dense model, split by rows over runtime.mesh.model={split}"
        if split > 1
        else "stays in HBM with the dense model, replicated on every core"
    )
    placed = _Placement()
    for table in sized:
        name, shown, placement = table.name, table.shown, table.placement
        if placement not in ("auto", "sparsecore", "default_device"):
            placed.failed.append(name)
            placed.verdicts.append(
                f"{shown}: fails: placement {placement!r} is not auto, sparsecore or default_device (keras-rs "
                "raises ValueError)"
            )
        elif placement != "default_device" and sparsecore:
            placed.on_sparsecore.append(name)
            placed.verdicts.append(f"{shown}: {onto} (placement {placement})")
        elif placement == "sparsecore":
            placed.failed.append(name)
            placed.verdicts.append(f"{shown}: fails at build (placement sparsecore)")
        elif split > 1 and _padded_rows(recipe, name, split) % split:
            # `vocabulary_multiple` set in the recipe (tpukit sets it to the model axis otherwise).
            placed.undivided.append(name)
            rows = _padded_rows(recipe, name, split)
            placed.verdicts.append(
                f"{shown}: fails: {rows:,} rows (model.vocabulary_multiple="
                f"{recipe.model.kwargs['vocabulary_multiple']}) do not split over runtime.mesh.model={split}"
            )
        else:
            placed.verdicts.append(f"{shown}: {kept} (placement {placement})")
            if table.nbytes / split > target.hbm_bytes_per_core / HUGE_TABLE_FRACTION:
                placed.huge.append(f"{name} ({_size(table.nbytes / split)} per core)")
    return placed


def _embeddings_notes(
    recipe: Recipe, target: Target, placed: _Placement, onto: str
) -> tuple[list[str], list[str]]:
    """What a run should know about tables on SparseCore and tables large for HBM, with a fix for each."""
    engine, tpu = recipe.runtime.engine, target.tpu_type
    notes, fixes = [], []
    if placed.on_sparsecore:
        notes.append(
            f"On {onto} each table trains with its own keras-rs TableConfig optimizer (only "
            f"{', '.join(KERAS_RS_TABLE_OPTIMIZERS)} are supported there; TableConfig's default is Adam), not "
            f"train.optimizer={recipe.train.optimizer!r}; the memory rule, built on this CPU where every table stays "
            "in HBM, counts those tables as replicated weights (an upper bound)"
        )
        notes.append(
            f"Not run by tpukit: its tests have no TPU, so placing tables on {onto} is untried (dcn_ranking leaves "
            "each FeatureConfig's batch dimension open, which keras-rs' TPU path may want fixed)"
        )
        fixes.append(
            f"to train as tested, keep the tables in HBM: --set model.tables.{placed.on_sparsecore[0]}.placement="
            "default_device (for each table)"
        )
    if placed.huge:
        notes.append(
            f"Large for HBM, over 1/{HUGE_TABLE_FRACTION} of one {tpu} core's {_size(target.hbm_bytes_per_core)} "
            f"before their gradients and train.optimizer's slots (the memory rule counts those): "
            f"{', '.join(placed.huge)}"
        )
        fixes.append(
            "split them by rows with runtime.mesh.model > 1"
            if engine == "jax"
            else "let keras-rs shard large tables: placement auto on --tpu-type "
            f"{_sparsecore_types()}, or the jax engine with runtime.mesh.model > 1 to split "
            "them by rows"
        )
    return notes, fixes


def _embeddings_verdict(
    message: str, placed: _Placement, fixes: list[str], engine: str, split: int
) -> Rule:
    """Fail for rows that do not split, then for tables that cannot be placed; warn with the fixes; else pass."""
    if placed.undivided:
        return Rule(
            "embeddings",
            "fail",
            message,
            f"remove model.vocabulary_multiple (tpukit then pads every table to a multiple of runtime.mesh.model="
            f"{split}), or set it to a multiple of {split}",
        )
    if placed.failed:
        engine_fix = (
            "the tensorflow engine (--set runtime.engine=tensorflow) on " if engine == "jax" else ""
        )
        elsewhere = f"{engine_fix}--tpu-type {_sparsecore_types()}"
        fix = (
            f"placement auto (or default_device) for {', '.join(placed.failed)}, e.g. --set "
            f"model.tables.{placed.failed[0]}.placement=auto; or the TPU embedding API (SparseCore on v4, v5p, v6e) "
            f"with {elsewhere}"
        )
        return Rule("embeddings", "fail", message, fix)
    if fixes:
        return Rule("embeddings", "warn", message, "; ".join(fixes))
    return Rule("embeddings", "pass", message)


# ----------------------------------------------------------------------------------------------------------------
# The check.


# How long `check` waits for a remote path the recipe's data names to answer (a metadata call, under a second with
# the network) before it says so, instead of waiting out TensorFlow's file-system retries.
DATA_WAIT_SECONDS = 10.0


class _Context:
    """What several rules share: the target, the example counts, one core's batches and the built models.

    `check` downloads nothing: a TFDS (or movielens) dataset that is not here is checked on examples generated from
    its feature spec, counted with the sizes its catalogue publishes (`note` says so), as `tpukit show` plans."""

    def __init__(self, recipe: Recipe, target: Target):
        self.recipe, _ = offline.without_downloads(recipe)
        self.target = target
        self.counts: dict[str, int] = {}
        self.data_error: str | None = None
        self.note: str | None = None  # the data is not here: what stands in for it
        self.generated = 0  # examples per split generated in its place
        self._datasets: dict[tuple[str, str], Any] = {}

    def input_context(self):
        import tensorflow as tf

        return tf.distribute.InputContext(
            num_input_pipelines=self.target.hosts,
            input_pipeline_id=0,
            num_replicas_in_sync=self.target.cores,
        )

    def count(self, stack: contextlib.ExitStack) -> None:
        """The example counts; where the data is not here, the catalogue's (entered on `stack`, so that the
        rules after read generated examples), else `data_error`."""
        from tpukit.task import count_examples

        config = self.recipe.data
        try:
            _remote_data_answers(config)
            # TFDS' warnings about a half-downloaded folder say nothing the error does not.
            with offline.quiet_tfds():
                self.counts["train"] = count_examples(self.recipe, config.train_split)
                if config.eval_split:
                    self.counts["eval"] = count_examples(self.recipe, config.eval_split)
        except Exception as error:  # noqa: BLE001 - reported by the rules, never raised
            self.counts = {}
            if offline.published_sizes(config) is None or not (
                offline.not_downloaded(error) or isinstance(error, offline.Unanswered)
            ):
                self.data_error = _first_line(error)
                return
            self._from_catalogue(stack, error)

    def _from_catalogue(self, stack: contextlib.ExitStack, error: BaseException) -> None:
        config = self.recipe.data
        if isinstance(
            error, offline.Unanswered
        ):  # generated examples need no data_dir, which does not answer
            options = {**config.options, "data_dir": None}
            self.recipe = dataclasses.replace(
                self.recipe, data=dataclasses.replace(config, options=options)
            )
            config = self.recipe.data
        # One whole batch per core of each split, at least.
        per_core = -(
            -max(config.global_batch_size, eval_batch_size(self.recipe)) // self.target.cores
        )
        self.generated = max(64, per_core)
        published = stack.enter_context(offline.catalogue_data(config, self.generated))
        splits = {"train": config.train_split, "eval": config.eval_split}
        for key, split in splits.items():
            size = published.size(split, **config.options) if split else None
            if size is not None:
                self.counts[key] = size
        known = ", ".join(f"{s} {self.counts[k]:,}" for k, s in splits.items() if k in self.counts)
        why = (
            "did not answer" if isinstance(error, offline.Unanswered) else "is not downloaded here"
        )
        self.note = (
            f"{published.name!r} {why} and `tpukit check` downloads nothing: checked on examples generated from its "
            f"feature spec (tfds.testing.mock_data), counted with "
            + (
                f"the split sizes its catalogue publishes ({known})"
                if known
                else "no split size (unpublished)"
            )
        )

    def datasets(self, policy: str) -> dict[str, Any]:
        """{"train": ..., "eval": ...} as one core's pipeline gives them under dtype policy `policy`."""
        from tpukit import task
        from tpukit.engines.keras.session import dtype_policy

        found = {}
        for split in ("train", "eval"):
            key = (split, policy)
            if key not in self._datasets:
                if split == "eval" and not self.recipe.data.eval_split:
                    continue
                with dtype_policy(policy):
                    # The pipelines read the global policy for the feature dtype (bfloat16 infeed).
                    # Generated examples: the pipelines count what they read.
                    eval_examples = self.generated or self.counts.get("eval", 0)
                    train_fn, eval_fn = task.input_fns(
                        self.recipe, eval_examples, self.recipe.train.steps_per_epoch
                    )
                    context = self.input_context()
                    self._datasets[key] = (
                        train_fn(context) if split == "train" else eval_fn(context)
                    )
            found[split] = self._datasets[key]
        return found


def _remote_data_answers(config) -> None:
    """Raises `offline.Unanswered` when a remote path the data section names (`gs://...`) does not answer within
    `DATA_WAIT_SECONDS`: with no network, TensorFlow's file system retries each read for minutes."""
    import re

    import tensorflow as tf

    for key, value in sorted(config.options.items()):
        if not (isinstance(value, str) and "://" in value):
            continue
        # The fixed part of a pattern: gs://bucket/imagenet/{split}-* -> gs://bucket/imagenet
        fixed = re.split(r"[*?\[{]", value, maxsplit=1)[0].rsplit("/", 1)[0]
        try:
            offline.within(
                DATA_WAIT_SECONDS, lambda p=fixed: tf.io.gfile.exists(p), f"data.{key}={value!r}"
            )
        except offline.Unanswered as error:
            raise offline.Unanswered(
                f"{error} (no network, or no access; TensorFlow's file system would retry for minutes)"
            ) from None
        except Exception:  # noqa: BLE001 - it answered (with an error): the source reports it with its fix
            continue


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {(text[0] if text else '')[:400]}"


def static_shapes_rule(context: _Context) -> Rule:
    if context.data_error:
        return Rule(
            "static_shapes",
            "fail",
            f"the data could not be read, so nothing about it was checked: {context.data_error}",
            "make data.* point at data this machine can read (a small local copy is enough to check shapes)",
        )
    try:
        datasets = context.datasets("float32")
    except Exception as error:  # noqa: BLE001 - the check reports any failure as its rule's finding
        return Rule(
            "static_shapes", "fail", f"building the input pipeline failed: {_first_line(error)}"
        )
    dynamic = []
    shapes = []
    import keras

    for split, dataset in datasets.items():
        features = dataset.element_spec[0]
        named = isinstance(features, dict) and len(features) > 1
        for path, spec in keras.tree.flatten_with_path(dataset.element_spec):
            # A model of several named inputs: each feature's shape by its name ((0, "movie_id") -> movie_id).
            where = f"{split} {path[1]}" if named and path[0] == 0 and len(path) > 1 else split
            shapes.append(f"{where} {spec.shape}")
            if not spec.shape.is_fully_defined():
                dynamic.append(f"{where} {spec.shape}")
    if dynamic:
        return Rule(
            "static_shapes",
            "fail",
            f"dynamic dimensions in one core's batches: {', '.join(dynamic)}; a TPU compiles one program per shape "
            "and needs every dimension known.",
            "batch with drop_remainder=True and pad or crop features to fixed sizes in the source "
            "(tpukit.data.training_batches / eval_batches do the batching)",
        )
    note = f" ({context.note}.)" if context.note else ""
    return Rule(
        "static_shapes", "pass", f"one core's batches are static: {', '.join(shapes)}.{note}"
    )


def _first_batch(dataset):
    """The first (features, labels) of `dataset`; as NumPy arrays on Keras' JAX backend, which takes no tf.Tensor."""
    batch = next(iter(dataset))
    if engine_choice.keras_backend() == "jax":
        import tensorflow as tf

        batch = tf.nest.map_structure(lambda t: t.numpy(), batch)
    return batch[0], batch[1]


def _shapes(x) -> str:
    """A batch's shape, or each named input's ("{'movie_id': (128,), ...}") for a model of several inputs."""
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k!r}: {tuple(v.shape)}" for k, v in x.items()) + "}"
    if isinstance(x, (tuple, list)):
        return "(" + ", ".join(str(tuple(v.shape)) for v in x) + ")"
    return str(tuple(x.shape))


def _dtypes(x) -> str:
    import tensorflow as tf

    return ", ".join(sorted({t.dtype.name for t in tf.nest.flatten(x)}))


@dataclasses.dataclass
class _Step:
    """One `jit_compile=True` train step of the recipe's model under dtype policy `policy`: the batch it took, the
    model, its loss and its outputs' dtypes; or `error`, what it raised (`batch_error`: no batch to take)."""

    policy: str
    x: Any = None
    model: Any = None
    loss: float = float("nan")
    outputs: tuple[str, ...] = ()
    error: BaseException | None = None
    batch_error: BaseException | None = None


def _train_step(context: _Context, policy: str) -> _Step:
    """Builds the model under `policy` and runs one XLA-compiled step on one core's first batch. The outputs' dtypes
    are traced (`compute_output_spec`), not computed: an eager call runs op by op (hundreds of small compiles on
    Keras' JAX backend)."""
    import keras

    from tpukit import task
    from tpukit.engines.keras.session import dtype_policy

    try:
        x, y = _first_batch(context.datasets(policy)["train"])
    except Exception as error:  # noqa: BLE001 - the check reports any failure as its rule's finding
        return _Step(policy, batch_error=error)
    try:
        with dtype_policy(policy):
            model = task.build_model(context.recipe, 10, True, 1)
            logs = model.train_on_batch(x, y, return_dict=True)
            specs = keras.tree.map_structure(lambda t: keras.KerasTensor(t.shape, t.dtype), x)
            outputs = keras.tree.flatten(model.compute_output_spec(specs))
    except Exception as error:  # noqa: BLE001 - the failure is the finding
        return _Step(policy, x=x, error=error)
    dtypes = tuple(sorted({keras.backend.standardize_dtype(t.dtype) for t in outputs}))
    return _Step(policy, x, model, float(logs["loss"]), dtypes)


def step_rules(context: _Context) -> tuple[Rule, Rule, Any, str]:
    """`xla_step` and `precision_step` from one XLA-compiled step in the TPU's precision; returns both rules, the
    model (for `memory`; None when the step failed) and the policy.

    Only when that step fails or gives a non-finite loss does a float32 step run, to tell "XLA cannot compile it"
    (both fail: `xla_step` fails, `precision_step` is skipped) from "it fails in the TPU's precision" (the float32
    step passes `xla_step`, `precision_step` fails)."""
    import numpy as np

    policy = performance.choose_precision(context.recipe.runtime.precision, "tpu").value
    step = _train_step(context, policy)
    plain = step
    if policy != "float32" and step.batch_error is None:
        if step.error is not None or not np.isfinite(step.loss):
            plain = _train_step(context, "float32")
    return _xla_rule(plain), _precision_rule(step, plain), step.model, policy


def _xla_rule(step: _Step) -> Rule:
    """`xla_step` from `step`, the first XLA-compiled step that ran (the TPU's precision, or float32)."""
    import numpy as np

    if step.batch_error is not None:
        return Rule(
            "xla_step", "skip", f"no training batch to compile for: {_first_line(step.batch_error)}"
        )
    if step.error is not None:
        return Rule(
            "xla_step",
            "fail",
            f"the train step does not compile with XLA on the CPU: {_first_line(step.error)}",
            "replace the op XLA names (often a string, py_function or data-dependent-shape op in the model) "
            "with one XLA supports (tensorflow.org/xla/operation_semantics)",
        )
    if not np.isfinite(step.loss):
        return Rule(
            "xla_step", "fail", f"the XLA-compiled step gave loss {step.loss} in {step.policy}."
        )
    return Rule(
        "xla_step",
        "pass",
        f"one jit_compile=True step at the per-core batch {_shapes(step.x)} compiled and ran on the CPU in "
        f"{step.policy} (loss {step.loss:.4f}).",
    )


def _precision_rule(step: _Step, plain: _Step) -> Rule:
    """`precision_step` from `step` in the TPU's precision: finite loss, the compute dtype, float32 variables and
    logits. `plain`: the float32 step run when `step` failed (`step` itself in float32)."""
    import numpy as np

    policy = step.policy
    if step.batch_error is not None:
        return Rule("precision_step", "skip", f"no training batch: {_first_line(step.batch_error)}")
    if step.error is not None:
        if plain.error is not None or plain.batch_error is not None:
            return Rule(
                "precision_step",
                "skip",
                f"the {policy} step did not compile with XLA either, as xla_step says: its precision is not "
                "checked.",
            )
        return Rule(
            "precision_step",
            "fail",
            f"a {policy} train step failed (in float32 it compiled and ran): {_first_line(step.error)}",
        )
    model = step.model
    compute = model.dtype_policy.compute_dtype
    expected_compute = {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(
        policy, "float32"
    )
    problems = []
    if not np.isfinite(step.loss):
        problems.append(f"loss {step.loss}")
    if compute != expected_compute:
        problems.append(f"the model computes in {compute}, not {expected_compute}")
    variables = sorted(
        {str(v.dtype) for v in model.weights} | {str(v.dtype) for v in model.optimizer.variables}
    )
    # The optimizer's step counter is an integer (int64 on TensorFlow, int32 on JAX): not a weight.
    if not set(variables) <= {"float32", "int64", "int32"}:
        problems.append(f"variables in {', '.join(variables)} (Keras keeps them float32)")
    if step.outputs != ("float32",):
        problems.append(
            f"logits in {', '.join(step.outputs)}: a softmax in {step.outputs[0]} loses precision; end the "
            "model with a layer of dtype='float32'"
        )
    if problems:
        return Rule(
            "precision_step",
            "fail",
            f"one {policy} step: " + "; ".join(problems) + ".",
            "build the model so Keras' mixed policy applies (no hard-coded dtypes in layers) and give the last "
            "layer dtype='float32'",
        )
    return Rule(
        "precision_step",
        "pass",
        f"one {policy} step (the TPU's precision), compiled with XLA: loss {step.loss:.4f}, computes in "
        f"{compute}, float32 variables and logits, inputs in {_dtypes(step.x)}.",
    )


def _activation_bytes(model, per_core_batch: int) -> float:
    """Estimated activation bytes of one core's training step: the non-weight operands and the results of every
    matrix op (matmul, convolution, einsum) of the forward pass at `per_core_batch`, each tensor once.

    These are what the backward pass of those ops reads (inputs for the weight gradients, results for the
    normalization/activation gradients that follow them); elementwise ops are assumed fused into them by XLA, as
    on a TPU. Traced, not run: nothing is allocated. ResNet-50 at 128 per core in bfloat16 gives 4.8 GiB.
    """
    import tensorflow as tf

    specs = [
        tf.TensorSpec((per_core_batch, *s.shape[1:]), s.dtype)
        for s in tf_flops._input_signature(model)
    ]
    from tpukit.engines.keras.export import keyed_inputs

    if keyed_inputs(
        model
    ):  # named inputs (a recommender's ids): called with the dict it was built on
        names = [t.name for t in model.inputs]
        function = tf.function(lambda *xs: model(dict(zip(names, xs, strict=True)), training=True))
    else:
        function = tf.function(
            lambda *xs: model(xs[0] if len(xs) == 1 else list(xs), training=True)
        )
    graph = function.get_concrete_function(*specs).graph

    def weight(tensor) -> bool:
        op = tensor.op
        while op.type in ("Cast", "Identity") and op.inputs:
            op = op.inputs[0].op
        return op.type in ("ReadVariableOp", "Const")

    sizes = {}
    for op in graph.get_operations():
        if op.type not in (*tf_flops._MATRIX_OP_TYPES, "Einsum"):
            continue
        for tensor in (*op.inputs, *op.outputs):
            if tensor.dtype.is_floating and tensor.shape.is_fully_defined() and not weight(tensor):
                sizes[tensor.name] = tensor.shape.num_elements() * tensor.dtype.size
    return float(sum(sizes.values()))


def _activations(model, per_core_batch: int) -> float:
    """`_activation_bytes`, or the jax engine's trace of the same estimate on Keras' JAX backend."""
    if engine_choice.keras_backend() == "jax":
        from tpukit.engines.jax.activations import activation_bytes

        return activation_bytes(model, per_core_batch)
    return _activation_bytes(model, per_core_batch)


def memory_check(context: _Context, model, policy: str) -> Rule:

    from tpukit import task
    from tpukit.engines.keras.session import dtype_policy

    recipe = context.recipe
    try:
        with dtype_policy(policy):
            if model is None:
                model = task.build_model(recipe, 10, False, 1)
            model.optimizer.build(model.trainable_variables)
            per_core = max(1, recipe.data.global_batch_size // context.target.cores)
            activations = _activations(model, per_core)
    except Exception as error:  # noqa: BLE001 - the check reports any failure as its rule's finding
        return Rule(
            "memory", "skip", f"the model could not be built or traced: {_first_line(error)}"
        )
    weights = sum(_nbytes(v) for v in model.weights)
    gradients = sum(_nbytes(v) for v in model.trainable_weights)  # float32, like the variables
    slots = sum(_nbytes(v) for v in model.optimizer.variables if len(v.shape) > 0)
    return memory_rule(
        weights + gradients + slots,
        activations,
        context.target,
        int(sum(math.prod(v.shape) for v in model.weights)),
        per_core,
        recipe.train.optimizer,
    )


def _backend_note() -> str:
    if engine_choice.keras_backend() == "jax":
        return (
            "The rules below run on Keras' JAX backend, as the jax engine trains (XLA on this CPU)"
        )
    return (
        "The rules below run on the TensorFlow backend as a proxy for Keras on JAX (the same model)"
    )


def mesh_rule(recipe: Recipe, target: Target) -> tuple[Rule, int | None]:
    """The jax engine's `runtime.mesh` on `target.cores` devices: the rule, and the `data` axis's size (None when
    the mesh does not fit)."""
    mesh, cores = recipe.runtime.mesh, target.cores
    model = mesh["model"]
    if cores % model:
        divisors = [d for d in range(1, cores + 1) if cores % d == 0]
        return Rule(
            "mesh",
            "fail",
            f"runtime.mesh.model={model} does not divide the {cores} cores.",
            f"--set runtime.mesh.model=N with N one of {divisors}",
        ), None
    data = cores // model if mesh["data"] == "auto" else mesh["data"]
    if data * model > cores:
        return Rule(
            "mesh",
            "fail",
            f"runtime.mesh {{data: {data}, model: {model}}} needs {data * model} cores; the target has {cores}.",
            "--set runtime.mesh.data=auto",
        ), None
    batches = {
        "data.global_batch_size": recipe.data.global_batch_size,
        "the eval batch": eval_batch_size(recipe),
    }
    for name, batch in batches.items():
        if batch % data:
            return Rule(
                "mesh",
                "fail",
                f"{name} {batch} does not divide by the mesh's data axis ({data}): every data shard takes an "
                "equal part of the batch.",
                f"a multiple of {MIN_CORE_BATCH * data} (--set data.global_batch_size=... / "
                "data.eval_global_batch_size=...)",
            ), None
    shown = (
        f"mesh data {data} x model {model} on {cores} core(s): global batch {recipe.data.global_batch_size} = "
        f"{data} data shard(s) x {recipe.data.global_batch_size // data}. {_backend_note()}; memory counts whole "
        "weights per core"
        + (f" (an upper bound: mesh.model={model} splits some)." if model > 1 else ".")
    )
    if data * model < cores:
        return Rule(
            "mesh",
            "warn",
            f"{shown} Only {data * model} of the {cores} cores train.",
            "--set runtime.mesh.data=auto",
        ), data
    return Rule("mesh", "pass", shown), data


def _nbytes(variable) -> int:
    import tensorflow as tf

    return math.prod(variable.shape) * tf.as_dtype(variable.dtype).size


@contextlib.contextmanager
def _each_line_once() -> Iterator[None]:
    """tpukit's log lines said once each: the check builds the input pipelines under two precisions (float32 for
    the data rules, the TPU's for the step) and the model again where the step failed or memory needs it, and each
    build logs the same lines ("caching training examples in memory", the output's task), which a second time say
    nothing new."""
    logger = logging.getLogger("tpukit")  # every tpukit module logs to this one logger
    said: set[str] = set()

    def first_time(record: logging.LogRecord) -> bool:
        message = record.getMessage()
        new = message not in said
        said.add(message)
        return new

    logger.addFilter(first_time)
    try:
        yield
    finally:
        logger.removeFilter(first_time)


def check(
    recipe: Recipe,
    cores: int = 8,
    tpu_type: str = DEFAULT_TPU_TYPE,
    rules: tuple[str, ...] | list[str] | None = None,
    hbm_bytes: float | None = None,
) -> list[Rule]:
    """Runs the rules (default: all of `RULES` and `RECIPE_RULES`) for `cores` cores of `tpu_type`; returns one
    `Rule` each (`mesh` and `embeddings` only for recipes they apply to).

    Raises:
        RecipeError: the recipe is invalid, or an argument is (unknown rule, TPU type, cores).
    """
    _rules_engine()
    recipe.validate()
    # The engine a run on the TPU would train with (`auto`: as it resolves there).
    recipe = recipe.with_engine(engine_choice.for_tpu(recipe.runtime.engine).engine)
    known = (*RULES, *RECIPE_RULES)
    wanted = tuple(rules or known)
    unknown = [r for r in wanted if r not in known]
    if unknown:
        raise RecipeError(
            f"unknown rule(s) {', '.join(map(repr, unknown))}; the rules are {', '.join(known)}. Fix: --rule NAME "
            "with one of those."
        )
    target = target_for(recipe, cores, tpu_type, hbm_bytes)
    with _each_line_once():
        return _check(recipe, target, wanted)


def _check(recipe: Recipe, target: Target, wanted: tuple[str, ...]) -> list[Rule]:
    """`check` once its arguments are valid: the `wanted` rules for `target`, in the report's order."""
    with contextlib.ExitStack() as stack:
        context = _Context(recipe, target)
        needs_data = set(wanted) & {
            "static_shapes",
            "batch",
            "input_ops",
            "xla_step",
            "precision_step",
        }
        if needs_data:
            context.count(stack)
        return _rules(recipe, context, wanted)


def _rules(recipe: Recipe, context: _Context, wanted: tuple[str, ...]) -> list[Rule]:
    """The `wanted` rules on `context` (its data counted), in the report's order."""
    target = context.target
    results: dict[str, Rule] = {}
    model, policy = None, "float32"
    batch_target = target
    if recipe.runtime.engine == "jax":
        results["mesh"], data = mesh_rule(recipe, target)
        if data is not None:  # each device of a data shard sees the shard's whole batch
            batch_target = dataclasses.replace(target, cores=data)
    if "embeddings" in wanted:
        embeddings = embeddings_rule(recipe, target)
        if embeddings is not None:  # a model without `tables` has no embeddings rule
            results["embeddings"] = embeddings
    if "static_shapes" in wanted:
        results["static_shapes"] = static_shapes_rule(context)
    if "batch" in wanted:
        results["batch"] = batch_rule(recipe, batch_target, context.counts.get("train"))
    if "input_ops" in wanted:
        if context.data_error:
            results["input_ops"] = Rule(
                "input_ops", "skip", f"the data could not be read: {context.data_error}"
            )
        elif (
            context.note
        ):  # TFDS' generated examples come from a from_generator: not the real pipeline's ops
            results["input_ops"] = Rule(
                "input_ops", "skip", "the data is not here: its generated stand-in has other ops."
            )
        else:
            try:
                results["input_ops"] = input_ops_rule(context.datasets("float32"))
            except Exception as error:  # noqa: BLE001 - the check reports any failure as its rule's finding
                results["input_ops"] = Rule(
                    "input_ops", "skip", f"no input pipeline: {_first_line(error)}"
                )
    if "input_paths" in wanted:
        results["input_paths"] = input_paths_rule(recipe, target)
    # One step answers both rules (and builds the model memory counts).
    if {"xla_step", "precision_step"} & set(wanted):
        xla, precision, model, policy = step_rules(context)
        results.update((r.name, r) for r in (xla, precision) if r.name in wanted)
    if "memory" in wanted:
        if model is None:
            policy = performance.choose_precision(recipe.runtime.precision, "tpu").value
        results["memory"] = memory_check(context, model, policy)
    return [results[name] for name in ("mesh", *RECIPE_RULES, *RULES) if name in results]


def passed(rules: list[Rule]) -> bool:
    """True when no rule failed (warnings and skips allowed)."""
    return not any(r.status == "fail" for r in rules)


def header(recipe: Recipe, target: Target) -> str:
    engine = engine_choice.for_tpu(recipe.runtime.engine)
    chosen = f", {engine.describe()}" if recipe.runtime.engine == engine_choice.AUTO else ""
    return f"tpukit check: {recipe.path} for {target.describe()}{chosen}"


def format_report(
    recipe: Recipe, target: Target, rules: list[Rule], with_header: bool = True
) -> str:
    lines = [header(recipe, target)] if with_header else []
    for rule in rules:
        lines.append(f"[{rule.status.upper():4}] {rule.name}: {rule.message}")
        if rule.fix and rule.status in ("fail", "warn"):
            lines.append(f"       fix: {rule.fix}")
    lines.append(PROXY_NOTE)
    failed = [r.name for r in rules if r.status == "fail"]
    warned = sum(r.status == "warn" for r in rules)
    lines.append(
        f"NOT OK: {len(failed)} rule(s) failed ({', '.join(failed)})."
        if failed
        else f"OK: no rule failed ({warned} warning(s))."
    )
    return "\n".join(lines)


def to_json(recipe: Recipe, target: Target, rules: list[Rule]) -> dict:
    return {
        "ok": passed(rules),
        "recipe": recipe.path,
        "target": dataclasses.asdict(target),
        "rules": [dataclasses.asdict(r) for r in rules],
        "note": PROXY_NOTE,
    }


def main(argv: list[str] | None = None, prog: str = "python -m tpukit.check") -> int:
    args = _parser(prog).parse_args(argv)
    try:  # the quick refusals (no such recipe, bad YAML, a malformed --set) before TensorFlow loads
        raw_recipe(args.recipe, args.set)
    except RecipeError as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 2
    if args.topology is not None:
        return _topology_main(args)
    return _rules_main(args)


def _parser(prog: str) -> argparse.ArgumentParser:
    """The command line of `python -m tpukit.check` (and `tpukit check`)."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", help="a recipe YAML file or the name of a packaged recipe")
    parser.add_argument(
        "--cores", type=int, default=None, help="TPU cores (TPUStrategy replicas); default 8"
    )
    parser.add_argument(
        "--tpu-type",
        default=None,
        help=f"TPU generation: {', '.join(HBM_BYTES_PER_CHIP)} (default {DEFAULT_TPU_TYPE})",
    )
    parser.add_argument(
        "--hbm-gib", type=float, default=None, help="HBM per chip in GiB (another chip)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe key (repeatable)",
    )
    parser.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="NAME",
        help=f"run only these rules (repeatable): {', '.join((*RULES, *RECIPE_RULES))}",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--topology",
        default=None,
        metavar="NAME",
        help="compile the training step with libtpu, the TPU compiler, for this TPU slice (v5e-8, v6e-16, "
        "v5p-32, ...) instead of running the rules: fits in HBM? bytes per chip, roofline step time "
        "(tpukit.tools.tpu_check; needs tpukit[tpu-check])",
    )
    parser.add_argument(
        "--price-per-chip-hour",
        type=float,
        default=None,
        metavar="PRICE",
        help="with --topology: the price of one chip-hour, to cost the recipe's steps at the roofline bound",
    )
    parser.add_argument(
        "--no-fixes",
        action="store_true",
        help="with --topology: when the step does not fit, do not compile the configurations that might",
    )
    parser.add_argument(
        "--largest-batch",
        action="store_true",
        help="with --topology: when the step fits, also compile larger global batches (at most 5) and report the "
        "largest found to fit",
    )
    return parser


def _rules_engine() -> str:
    """The engine whose Keras backend the rules run on: the backend Keras loaded (or will load), after that engine's
    checks (EngineUnavailableError, an ImportError, names the fix)."""
    backend = engine_choice.keras_backend() or os.environ.get("KERAS_BACKEND", "tensorflow")
    name = "jax" if backend == "jax" else "tensorflow"
    engines.get(name)
    return name


def _rules_main(args) -> int:
    """The rules for `--cores` of `--tpu-type`: the report (or `--json`), exit 1 when one fails."""
    # None: not given (so that --topology can refuse them when they are)
    args.cores = 8 if args.cores is None else args.cores
    args.tpu_type = args.tpu_type or DEFAULT_TPU_TYPE
    if args.price_per_chip_hour is not None or args.no_fixes or args.largest_batch:
        print(
            "tpukit: error: --price-per-chip-hour, --no-fixes and --largest-batch go with --topology. Fix: add "
            "--topology NAME (e.g. --topology v5e-8).",
            file=sys.stderr,
        )
        return 2
    # The rules run on the Keras backend of the engine the recipe trains with on the TPU; where Keras is loaded
    # already (`main` called from Python), on the backend it loaded.
    loaded = engine_choice.keras_backend()
    if loaded is None:
        from tpukit.environment.backend import use_engine

        engine = use_engine(engine_choice.for_tpu(requested_engine(args.recipe, args.set)).engine)
    else:
        engine = "jax" if loaded == "jax" else "tensorflow"
    problem = start_tool(engine)
    if problem:
        print(f"tpukit: error: {problem}", file=sys.stderr)
        return 1
    try:
        recipe = load_recipe(args.recipe, args.set)
        hbm = args.hbm_gib * 2**30 if args.hbm_gib is not None else None
        target = target_for(recipe, args.cores, args.tpu_type, hbm)
        if not args.json:  # the first line: what is checked, before the rules build anything
            print(header(recipe, target), flush=True)
        rules = check(recipe, args.cores, args.tpu_type, args.rule or None, hbm)
    except RecipeError as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_json(recipe, target, rules), indent=2))
    else:
        print(format_report(recipe, target, rules, with_header=False))
    return 0 if passed(rules) else 1


def _topology_main(args) -> int:
    """`--topology`: the training step compiled by libtpu (`tpukit.tools.tpu_check`), in a JAX-backend process."""
    from tpukit.environment.backend import use_engine
    from tpukit.planner.topologies import topology

    given = [
        f"--{name.replace('_', '-')}"
        for name in ("cores", "tpu_type", "hbm_gib", "rule")
        if getattr(args, name) not in (None, [])
    ]
    if given:
        print(
            f"tpukit: error: {given[0]} is for the rules, not for --topology (the topology names the chips). "
            f"Fix: drop {given[0]}, or drop --topology.",
            file=sys.stderr,
        )
        return 2
    try:
        topology(args.topology)
        use_engine("jax")
    except (RecipeError, ImportError) as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 2
    problem = start_tool("jax")
    if problem:
        print(f"tpukit: error: {problem}", file=sys.stderr)
        return 1
    from tpukit.engines.jax.tpu_compile import TPUCompilerUnavailable
    from tpukit.tools import tpu_check

    try:
        recipe = load_recipe(args.recipe, args.set)
        recipe = recipe.with_engine(engine_choice.for_tpu(recipe.runtime.engine).engine)
        result = tpu_check.check_topology(
            recipe,
            args.topology,
            price_per_chip_hour=args.price_per_chip_hour,
            fixes=not args.no_fixes,
            largest_batch=args.largest_batch,
        )
    except RecipeError as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 2
    except TPUCompilerUnavailable as error:
        print(f"tpukit: error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else tpu_check.format_text(result))
    return 0 if result["fits"] else 1


if __name__ == "__main__":
    sys.exit(main())
