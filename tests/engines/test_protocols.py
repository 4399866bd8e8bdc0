"""Each engine implements the `Engine` and `Checkpointer` protocols (`tpukit.engines.keras.protocols`), and loads
with the other engine's package made unimportable: neither engine needs the other."""

import inspect
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import REPO

from tpukit.engines import ENGINES

# Run in a child: Keras' backend is fixed at its first import, and each engine needs its own.
CHILD = textwrap.dedent(
    """
    import importlib.abc, inspect, sys, tempfile

    blocked = sys.argv[2]

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == blocked or name.startswith(blocked + "."):
                raise ImportError(f"blocked by the test: {name}")
            return None

    sys.meta_path.insert(0, Block())
    import tpukit.engines
    from tpukit.engines.keras.protocols import Checkpointer, Engine

    engine = tpukit.engines.get(sys.argv[1])
    assert isinstance(engine, Engine), sys.argv[1]
    for name, member in vars(Engine).items():
        if callable(member) and not name.startswith("_"):
            wanted = list(inspect.signature(member).parameters)[1:]
            got = list(inspect.signature(getattr(engine, name)).parameters)
            assert got == wanted, (name, got, wanted)
    assert engine.NAME == sys.argv[1]
    checkpoint = importlib.import_module(engine.__name__.rsplit(".", 1)[0] + ".checkpoint")

    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    model.optimizer.build(model.trainable_variables)
    checkpointer = checkpoint.Checkpointer(tempfile.mkdtemp(), model, model.optimizer)
    assert isinstance(checkpointer, Checkpointer), type(checkpointer)
    loaded = sorted(m for m in sys.modules if m.startswith(blocked))
    assert not loaded, loaded
    print("ok", engine.__name__)
    """
).replace("import importlib.abc,", "import importlib, importlib.abc,")


@pytest.mark.parametrize("name", sorted(ENGINES))
@pytest.mark.integration
def test_each_engine_implements_the_protocols_with_the_other_engine_unimportable(name):
    other = next(n for n in ENGINES if n != name)
    env = dict(os.environ, KERAS_BACKEND=name, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", CHILD, name, f"tpukit.engines.{other}"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"ok tpukit.engines.{name}.engine" in result.stdout


def test_the_protocol_lists_what_the_runner_calls():
    from tpukit import runner
    from tpukit.engines.keras.protocols import Engine

    called = set()
    source = inspect.getsource(runner)
    for name in vars(Engine):
        if not name.startswith("_") and f"engine.{name}" in source:
            called.add(name)
    # every engine function the runner calls is in the protocol (and so checked on both engines above)
    import re

    used = set(re.findall(r"\bengine\.([a-z_]+)\(", source))
    assert used <= called | {"NAME"}, used - called
