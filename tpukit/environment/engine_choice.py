"""Which engine `runtime.engine: auto` (the default) trains with, decided without importing TensorFlow, Keras or
JAX: the Keras backend is fixed when Keras is first imported, so it is set from this choice before that.

The order, first match wins:

1. Keras is already imported in this process (a notebook that imported it, `tpukit.fit` on the user's model): the
   engine of the backend it loaded, when that backend is one of the engines'.
2. `$TF_CONFIG` describes a cluster, or `runtime.tpu` names a TPU to connect to (a name or grpc:// address, a TPU
   Node): tensorflow (`MultiWorkerMirroredStrategy`, `TPUStrategy`).
3. A TPU is attached (Colab's and Kaggle's TPU variables, GKE's, or the chips' device files): tensorflow when a
   TensorFlow TPU build (`tensorflow-tpu`) is installed, else jax, the only engine that runs on Colab's v5e-1,
   Kaggle's v5e-8 and TPU VMs with `jax[tpu]` (package metadata is read; nothing is imported).
4. Otherwise (GPUs, a CPU): tensorflow.

`resolve` is what every entry point calls: an explicit engine is kept, and the first `auto` decision of a process
is remembered, so that the lines printed after Keras loaded the chosen backend still give the first reason.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import sys
from collections.abc import Mapping

from tpukit.environment import quiet, versions

AUTO = "auto"
ENGINES = ("tensorflow", "jax")
# The distributions that make `import tensorflow` a TPU build (versions.COMBINATIONS' TPU rows).
TENSORFLOW_TPU_BUILDS = tuple(sorted({c.distribution for c in versions.COMBINATIONS if c.is_tpu}))
_LOOK = object()  # an argument of `choose` not given: read this process and machine


@dataclasses.dataclass(frozen=True)
class EngineChoice:
    """The engine a run trains with, and why in a few words (the plan's `engine` line)."""

    engine: str
    reason: str

    def describe(self) -> str:
        """E.g. `engine jax (auto: a TPU is attached and no TensorFlow TPU build is installed)`."""
        return f"engine {self.engine} ({self.reason})"


def tpu_environment(environ: Mapping[str, str]) -> bool:
    """Whether the environment variables say this is a TPU VM: Colab's TPU runtime sets COLAB_TPU_1VM=1 (its
    other runtimes set it to ""), Kaggle's ISTPUVM=1, both and GKE TPU_ACCELERATOR_TYPE / TPU_WORKER_ID."""
    if environ.get("COLAB_TPU_1VM") == "1" or environ.get("ISTPUVM") == "1":
        return True
    return bool(environ.get("TPU_ACCELERATOR_TYPE") or environ.get("TPU_WORKER_ID"))


def tpu_present(environ: Mapping[str, str] | None = None, root: str = "/") -> bool:
    """A TPU attached to this machine, judged without starting anything: its variables (`tpu_environment`) or its
    chips' device files (`quiet.tpu_attached`). `root`: where the file system is (tests)."""
    environ = os.environ if environ is None else environ
    return tpu_environment(environ) or quiet.tpu_attached(root)


def tensorflow_tpu_installed() -> bool:
    """Whether a TensorFlow TPU build is installed, from package metadata (TensorFlow is not imported)."""
    for name in TENSORFLOW_TPU_BUILDS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        return True
    return False


def keras_backend() -> str | None:
    """The backend of the Keras this process imported already, or None when Keras is not imported (nothing is
    imported to find out)."""
    keras = sys.modules.get("keras")
    config = getattr(keras, "config", None)
    if config is None or not hasattr(config, "backend"):
        return None
    return config.backend()


def tf_config_cluster(environ: Mapping[str, str]) -> bool:
    """Whether `$TF_CONFIG` names a cluster. A value that is not JSON counts too: the tensorflow engine validates
    it and says what is wrong with it."""
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return False
    try:
        config = json.loads(text)
    except ValueError:
        return True
    return not isinstance(config, dict) or bool(config.get("cluster"))


def on_tpu(tensorflow_tpu: bool | None = None, attached: bool = True) -> EngineChoice:
    """Rule 3 alone: the engine for a TPU, given whether a TensorFlow TPU build is installed (default: read it).
    `attached`: the TPU is this machine's (False: a TPU `tpukit check` asks about, from here)."""
    tensorflow_tpu = tensorflow_tpu_installed() if tensorflow_tpu is None else tensorflow_tpu
    where = "a TPU is attached and" if attached else "on a TPU, as"
    build = (
        "a TensorFlow TPU build is installed"
        if tensorflow_tpu
        else "no TensorFlow TPU build is installed"
    )
    if not attached:
        build += " here"
    return EngineChoice("tensorflow" if tensorflow_tpu else "jax", f"auto: {where} {build}")


def choose(
    environ: Mapping[str, str] | None = None,
    *,
    backend=_LOOK,
    tpu: bool | None = None,
    tensorflow_tpu: bool | None = None,
    tpu_address: str | None = None,
) -> EngineChoice:
    """The engine `auto` means here, in the module's order. Every argument defaults to this process and machine:
    `backend` the imported Keras' (None: not imported), `tpu` whether one is attached, `tensorflow_tpu` whether a
    TensorFlow TPU build is installed (tests pass fakes); `tpu_address`: the recipe's `runtime.tpu`."""
    environ = os.environ if environ is None else environ
    backend = keras_backend() if backend is _LOOK else backend
    if backend in ENGINES:
        return EngineChoice(
            backend, f"auto: Keras was imported already, with the {backend} backend"
        )
    if tf_config_cluster(environ):
        return EngineChoice("tensorflow", "auto: $TF_CONFIG describes a cluster")
    if remote_tpu(tpu_address):
        return EngineChoice(
            "tensorflow",
            f"auto: runtime.tpu={tpu_address!r} names a TPU that TPUStrategy connects to",
        )
    if tpu_present(environ) if tpu is None else tpu:
        return on_tpu(tensorflow_tpu)
    return EngineChoice("tensorflow", "auto: no TPU is attached (GPUs or a CPU)")


_chosen: EngineChoice | None = (
    None  # this process's first `auto` decision made before Keras was imported
)


def remote_tpu(tpu_address: str | None) -> bool:
    """Whether `runtime.tpu` names a TPU to connect to (a TPU name or grpc:// address), not this machine's."""
    return bool(tpu_address) and tpu_address != "local"


def resolve(
    requested: str, environ: Mapping[str, str] | None = None, tpu_address: str | None = None
) -> EngineChoice:
    """The engine for `runtime.engine=requested`: an explicit one as it is, `auto` by `choose`. Once Keras is
    imported with the backend an earlier `auto` decision chose, that decision (and its reason) is returned."""
    global _chosen
    if requested != AUTO:
        if requested not in ENGINES:
            raise ValueError(
                f"runtime.engine must be one of {AUTO}, {', '.join(ENGINES)}; received {requested!r}. Fix: pick "
                "one of those (auto chooses for this machine)."
            )
        return EngineChoice(requested, "the recipe's runtime.engine")
    backend = keras_backend()
    if backend is not None and _chosen is not None and _chosen.engine == backend:
        return _chosen
    choice = choose(environ, backend=backend, tpu_address=tpu_address)
    if backend is None:
        _chosen = choice
    return choice


def for_tpu(requested: str, tensorflow_tpu: bool | None = None) -> EngineChoice:
    """The engine for `runtime.engine=requested` on a TPU this machine is not (`tpukit check` asks for one): `auto`
    by rule 3, from what is installed here."""
    if requested != AUTO:
        return resolve(requested)
    return on_tpu(tensorflow_tpu, attached=False)
