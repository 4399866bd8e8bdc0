"""Private Keras/TensorFlow internals stay in tpukit/engines/tensorflow/keras_private.py, and `tf.distribute`
stays in the engines (issue 17).

Read from the source with `ast`, so nothing here imports TensorFlow or depends on what a module happens to run.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "tpukit"
KERAS_PRIVATE = PACKAGE / "engines" / "tensorflow" / "keras_private.py"
# The engines' shared one (`tpukit.engines.keras.keras_private`): what both engines need, imported in a function.
SHARED_KERAS_PRIVATE = PACKAGE / "engines" / "keras" / "keras_private.py"
ENGINES = PACKAGE / "engines"

PRIVATE_MODULES = ("keras.src", "tensorflow.python")

# What code outside tpukit/engines/ may use of `tf.distribute`, and why. Everything else (strategies, ReduceOp,
# DistributedValues, cluster resolvers, ...) is the engine's.
DATA_SIDE_DISTRIBUTE = {
    # The argument `strategy.distribute_datasets_from_function` passes to an input function: the host's pipeline
    # id and per-replica batch size, which the data pipelines shard and batch by (and `check` builds one to run
    # a pipeline as a host of a pod would).
    "InputContext": "per-host sharding and per-replica batch size of an input function",
    # Options for distributing a dataset (prefetch to devices, replication); data-side by definition.
    "InputOptions": "options of a distributed dataset",
    # Type annotations of `tpukit.data.pipeline.distribute(strategy, dataset_fn)`, which only calls
    # `strategy.distribute_datasets_from_function(dataset_fn)` on the strategy the engine hands it.
    "Strategy": "annotation of data.distribute's argument (it calls distribute_datasets_from_function)",
    "DistributedDataset": "annotation of data.distribute's return value",
}


def _is_private(module: str | None) -> bool:
    return bool(module) and any(
        module == name or module.startswith(name + ".") for name in PRIVATE_MODULES
    )


def private_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) of every import of `keras.src` or `tensorflow.python` in `tree`, in any spelling:
    `import keras.src.tree`, `from keras.src import tree`, `from keras import src`,
    `importlib.import_module("tensorflow.python.x")`, `__import__("keras.src")`."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _is_private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if _is_private(node.module):
                found.append((node.lineno, node.module))
            found += [
                (node.lineno, f"{node.module}.{a.name}")
                for a in node.names
                if _is_private(f"{node.module}.{a.name}")
            ]
        elif isinstance(node, ast.Call) and node.args:
            function = node.func
            name = getattr(function, "attr", None) or getattr(function, "id", None)
            first = node.args[0]
            if (
                name in ("import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and _is_private(first.value)
            ):
                found.append((node.lineno, first.value))
    return found


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def distribute_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every use of `tf.distribute.<name>` in `tree` with `<name>` outside
    `DATA_SIDE_DISTRIBUTE`: through any name bound to the `tensorflow` module, or imported from
    `tensorflow.distribute`; a bare `tf.distribute` counts as a use of everything."""
    aliases = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "tensorflow":
                    aliases.add(a.asname or "tensorflow")
                elif a.name.startswith("tensorflow.distribute"):
                    found.append((node.lineno, a.name))
                elif a.name.startswith("tensorflow.") and a.asname is None:
                    aliases.add("tensorflow")  # `import tensorflow.x` binds `tensorflow`
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == "tensorflow":
                found += [(node.lineno, "distribute") for a in node.names if a.name == "distribute"]
            elif node.module and node.module.startswith("tensorflow.distribute"):
                found += [
                    (node.lineno, a.name)
                    for a in node.names
                    if node.module != "tensorflow.distribute" or a.name not in DATA_SIDE_DISTRIBUTE
                ]
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        dotted = _dotted(node)
        if dotted is None:
            continue
        head, _, rest = dotted.partition(".")
        if head not in aliases or not (rest == "distribute" or rest.startswith("distribute.")):
            continue
        if rest == "distribute":
            # Only the outermost attribute of a chain is reported: `tf.distribute.X.y` is one use of X.
            continue
        name = rest.split(".")[1]
        if name not in DATA_SIDE_DISTRIBUTE:
            found.append((node.lineno, name))
    # A bare `tf.distribute` (passed around, or `getattr(tf.distribute, ...)`): an attribute node whose parent is
    # not an attribute access on it.
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _dotted(node) in {f"{alias}.distribute" for alias in aliases}
            and not isinstance(parents.get(node), ast.Attribute)
        ):
            found.append((node.lineno, "distribute"))
    return sorted(set(found))


def _package_modules():
    return sorted(PACKAGE.rglob("*.py"))


def _parse(path: pathlib.Path) -> ast.AST:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def test_only_keras_private_imports_keras_src_or_tensorflow_python():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {module}"
        for path in _package_modules()
        if path not in (KERAS_PRIVATE, SHARED_KERAS_PRIVATE)
        for line, module in private_imports(_parse(path))
    ]
    assert not offenders, (
        "private Keras/TensorFlow modules imported outside tpukit/engines/{tensorflow,keras}/keras_private.py; add a "
        "named function there (with the upstream issue and the tested versions) and call it:\n"
        + "\n".join(offenders)
    )


def test_keras_private_is_where_the_private_imports_are():
    # Keeps the scan above honest: it finds the imports that are known to exist.
    modules = {module for _, module in private_imports(_parse(KERAS_PRIVATE))}
    assert {"keras.src", "tensorflow.python.profiler", "tensorflow.python.tpu"} <= modules


def test_only_the_engines_use_tf_distribute_beyond_the_data_side_types():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: tf.distribute.{name}"
        for path in _package_modules()
        if ENGINES not in path.parents
        for line, name in distribute_uses(_parse(path))
    ]
    assert not offenders, (
        "tf.distribute is the engine's (tpukit/engines/); outside it only "
        f"{sorted(DATA_SIDE_DISTRIBUTE)} are used:\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize(
    "source",
    [
        "import keras.src.tree",
        "from keras.src import tree",
        "from keras import src",
        "from tensorflow.python.util import deprecation",
        "import tensorflow.python as tfp",
        "import importlib\nimportlib.import_module('tensorflow.python.tpu')",
        "__import__('keras.src.trainers')",
    ],
)
def test_the_private_import_scan_sees_every_spelling(source):
    assert private_imports(ast.parse(source))


@pytest.mark.parametrize(
    "source",
    [
        "import tensorflow as tf\ntf.distribute.MirroredStrategy()",
        "import tensorflow as tf\nisinstance(x, tf.distribute.DistributedValues)",
        "import tensorflow as tf\ntf.distribute.ReduceOp.SUM",
        "import tensorflow\ntensorflow.distribute.get_strategy()",
        "import tensorflow as tf\ngetattr(tf.distribute, 'TPUStrategy')",
        "from tensorflow import distribute",
        "from tensorflow.distribute import MirroredStrategy",
        "from tensorflow.distribute.experimental import CommunicationOptions",
    ],
)
def test_the_distribute_scan_sees_engine_side_uses(source):
    assert distribute_uses(ast.parse(source))


@pytest.mark.parametrize(
    "source",
    [
        "import tensorflow as tf\ndef f(ctx: tf.distribute.InputContext): return ctx.input_pipeline_id",
        "import tensorflow as tf\ntf.distribute.InputOptions(experimental_fetch_to_device=False)",
        "from tensorflow.distribute import InputContext",
        "import numpy as np\nnp.distribute.MirroredStrategy",  # not TensorFlow
        "import tensorflow as tf\ntf.data.experimental.AutoShardPolicy.OFF",
    ],
)
def test_the_distribute_scan_allows_the_data_side(source):
    assert distribute_uses(ast.parse(source)) == []
