"""`connect()`: find the accelerator this process has and return the `tf.distribute.Strategy` for it.

Resolution order (the first that applies wins; one log line says which and why):

1. TPU, when asked for or present: the `tpu=` argument (a Cloud TPU name, `grpc://host:port`, or `"local"`),
   else `$TPU_NAME`, else the legacy Colab `$COLAB_TPU_ADDR`, else `"local"` when this machine is a TPU VM
   (Colab's and Kaggle's TPU runtimes, Cloud TPU VMs). A remote TPU is connected to, the TPU system is initialized
   once per process (running a notebook cell twice returns the same strategy), and a `TPUStrategy` is built.
2. `$TF_CONFIG` describing a cluster: `MultiWorkerMirroredStrategy` (each worker uses its local GPUs or CPU).
3. Several GPUs: `MirroredStrategy`; one GPU: `OneDeviceStrategy`.
4. Otherwise the default strategy on the CPU.

An explicit TPU request (argument or `$TPU_NAME`) that cannot be met raises `TPUConnectionError` with what was
tried and the fix; only auto-detection falls through quietly to the next step.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import logging
import os

from tpukit.engines.tensorflow import compat, keras_private
from tpukit.environment import diagnose, versions

logger = logging.getLogger("tpukit")

# One TPUStrategy per TPU address per process: initialize_tpu_system resets the TPU (and so every variable on it),
# so a second connect() in the same notebook must return the strategy it already built.
_TPU_STRATEGIES: dict[str, object] = {}
_TPU_TOPOLOGIES: dict[str, object] = {}


class TPUConnectionError(RuntimeError):
    """A TPU was asked for (argument, $TPU_NAME) but could not be reached. The message says what to do."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `connect` decided, before any device work: `kind` and the human `reason`."""

    kind: str  # "tpu", "multi_worker", "mirrored", "one_device", "default"
    reason: str
    tpu: str | None = None  # the TPUClusterResolver argument, for kind == "tpu"
    # True when the user asked for this TPU (errors are raised, not fallen through).
    explicit: bool = False


# PCI vendor id of Google (the TPU chips' vendor), as Linux lists it in /sys/bus/pci/devices/*/vendor.
GOOGLE_PCI_VENDOR = "0x1ae0"


def google_pci_devices(root: str = "/sys/bus/pci/devices") -> list[str]:
    """PCI devices whose vendor is Google (TPU chips), e.g. ['0000:00:04.0']; [] when none or no sysfs."""
    found = []
    for path in sorted(glob.glob(os.path.join(root, "*", "vendor"))):
        try:
            with open(path, encoding="ascii") as f:
                if f.read().strip().lower() == GOOGLE_PCI_VENDOR:
                    found.append(os.path.basename(os.path.dirname(path)))
        except OSError:
            continue
    return found


def tpu_device_files() -> list[str]:
    """TPU chip device files: /dev/accel<n> (v2-v4), or /dev/vfio/<n> (v5e and later) when a Google PCI device
    backs them. /dev/vfio/<n> alone is not enough: any host that passes a PCI device through VFIO has one."""
    accel = sorted(glob.glob("/dev/accel[0-9]*"))
    vfio = sorted(glob.glob("/dev/vfio/[0-9]*"))
    return accel + (vfio if vfio and google_pci_devices() else [])


def tpu_vm_present(env: dict[str, str] | None = None) -> bool:
    """True on a TPU VM (Colab/Kaggle TPU runtimes, Cloud TPU VMs), judged without initializing anything.

    Colab's TPU runtime sets COLAB_TPU_1VM=1 (other Colab runtimes set it to ""), Kaggle's sets ISTPUVM=1, both
    and GKE set TPU_ACCELERATOR_TYPE / TPU_WORKER_ID; a plain Cloud TPU VM may set none of these, but its chips
    show up as /dev/accel* (v2-v4) or as /dev/vfio/<n> backed by a Google PCI device (v5e and later; see
    `tpu_device_files`). `list_logical_devices` is not used: it starts TensorFlow's runtime, after which a
    MultiWorkerMirroredStrategy can no longer be created.
    """
    env = dict(os.environ) if env is None else env
    return tpu_vm_environment(env) or bool(tpu_device_files())


def tpu_vm_environment(env: dict[str, str]) -> bool:
    """The environment-variable half of `tpu_vm_present`: Colab's, Kaggle's and GKE's TPU variables."""
    if env.get("COLAB_TPU_1VM") == "1" or env.get("ISTPUVM") == "1":
        return True
    return bool(env.get("TPU_ACCELERATOR_TYPE") or env.get("TPU_WORKER_ID"))


def _gpu_count() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def training_tasks(cluster: dict) -> int:
    """Tasks that train in a TF_CONFIG-style cluster mapping: its workers plus its chief (not evaluators or ps)."""
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


def _tf_config_cluster(env: dict[str, str]) -> dict | None:
    text = env.get("TF_CONFIG")
    if not text:
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"TF_CONFIG is not valid JSON ({error}); received {text[:200]!r}. Fix: set TF_CONFIG to JSON like "
            '{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}.'
        ) from None
    return (
        config if training_tasks(config.get("cluster") or {}) >= 1 and config.get("task") else None
    )


def choose(
    tpu: str | None = None,
    env: dict[str, str] | None = None,
    tpu_vm: bool | None = None,
    gpus: int | None = None,
) -> Choice:
    """Decides which strategy to build. Pure apart from its defaults, so every branch is testable."""
    env = dict(os.environ) if env is None else env
    if tpu:
        return Choice("tpu", f"tpu={tpu!r} was requested", tpu=tpu, explicit=True)
    if env.get("TPU_NAME"):
        # Passed on explicitly: TPUClusterResolver(tpu=None) with TPU_NAME=local would query the GCE metadata
        # server instead of taking the local path.
        return Choice("tpu", f"$TPU_NAME={env['TPU_NAME']!r}", tpu=env["TPU_NAME"], explicit=True)
    if env.get("COLAB_TPU_ADDR"):
        address = f"grpc://{env['COLAB_TPU_ADDR']}"
        return Choice("tpu", f"$COLAB_TPU_ADDR (legacy Colab TPU) -> {address}", tpu=address)
    if tpu_vm_present(env) if tpu_vm is None else tpu_vm:
        return Choice(
            "tpu",
            "this machine is a TPU VM (TPU device files / $TPU_ACCELERATOR_TYPE)",
            tpu="local",
        )
    cluster = _tf_config_cluster(env)
    if cluster is not None:
        return Choice(
            "multi_worker",
            f"$TF_CONFIG describes a cluster of {training_tasks(cluster['cluster'])} worker(s)",
        )
    gpus = _gpu_count() if gpus is None else gpus
    if gpus > 1:
        return Choice("mirrored", f"{gpus} GPUs found")
    if gpus == 1:
        return Choice("one_device", "1 GPU found")
    return Choice("default", "no TPU, GPU or TF_CONFIG cluster found: CPU")


def tensorflow_has_tpu_support() -> bool:
    """Whether the imported TensorFlow is a TPU build, judged from TensorFlow itself.

    A TPU build (tensorflow-tpu, or Google's TPU VM images) loads libtpu at import and registers the TPU kernels,
    among them `TPUExecute`; the CPU/GPU `tensorflow` wheel registers none, so on a TPU VM it fails with "No
    OpKernel was registered to support Op 'ConfigureDistributedTPU'". Checked on this repository's CI machine:
    tensorflow-tpu 2.19.1 registers TPUExecute (even with no TPU attached), tensorflow 2.19.1-2.21 does not.
    Whether a `libtpu` module imports says nothing: Colab's TPU runtime has JAX's libtpu and no TensorFlow.
    """
    registered = keras_private.tpu_kernels_registered()
    if registered is not None:
        return registered
    # The private kernel registry moved: fall back to the distribution name.
    import importlib.metadata as metadata

    try:
        metadata.distribution("tensorflow-tpu")
        return True
    except metadata.PackageNotFoundError:
        return False


def tpu_api_client_missing() -> list[str]:
    """The packages TensorFlow's Cloud TPU API client imports that are not installed (named TPUs need them)."""
    return [
        package
        for module, package in (
            ("googleapiclient", "google-api-python-client"),
            ("oauth2client", "oauth2client"),
        )
        if importlib.util.find_spec(module) is None
    ]


def _tpu_fix_hint(choice: Choice) -> str:
    hints = []
    if choice.tpu != "local":
        hints.append(
            "on Colab's TPU runtime, Kaggle and single-host Cloud TPU VMs the TPU is attached to this machine: "
            "use tpukit.connect(tpu='local') (CLI: --tpu=local); a multi-host pod slice needs its TPU name"
        )
    if not tensorflow_has_tpu_support():
        import tensorflow as tf

        hints.append(
            f"the installed TensorFlow ({tf.__version__}) is not a TPU build: `pip uninstall -y tensorflow` then "
            f"`{versions.pinned_tpu().install_command()}`, then restart the runtime"
        )
    hints.append(
        "to train without a TPU, call tpukit.connect() with no tpu argument and unset $TPU_NAME"
    )
    return "; ".join(hints)


def _initialized_tpu_systems() -> dict:
    """TensorFlow's own record of the TPU systems this process initialized (keyed like the resolver's tpu)."""
    # Private API: {} where a build lacks it, so this relies on our cache alone.
    return keras_private.initialized_tpu_systems()


def _needs_tpu_api(tpu: str | None) -> bool:
    """A TPU given by name (not 'local', not grpc://host:port) is looked up through the Cloud TPU API."""
    return bool(tpu) and tpu != "local" and not tpu.startswith("grpc://")


def _connect_tpu(choice: Choice):
    import tensorflow as tf

    if choice.tpu in _TPU_STRATEGIES:
        return _TPU_STRATEGIES[choice.tpu]
    missing = tpu_api_client_missing() if _needs_tpu_api(choice.tpu) else []
    if missing:
        # TensorFlow would fail later with "Missing runtime dependency on the Google API client"; say it first.
        raise TPUConnectionError(
            f"could not connect to the TPU named {choice.tpu!r} ({choice.reason}): a named TPU is looked up "
            f"through the Cloud TPU API, whose client needs {' and '.join(missing)}, not installed. Fix: "
            f"`pip install {' '.join(missing)}` (or `pip install 'tpukit[tpu,tpu-name]'`), then restart the "
            "runtime; or, when the TPU is attached to this machine (Colab, Kaggle, single-host TPU VM), use "
            "tpu='local' (CLI: --tpu=local)."
        )
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=choice.tpu)
        if choice.tpu != "local":
            # A TPU Node (remote grpc:// workers) must be connected to; a TPU VM's chips are local.
            tf.config.experimental_connect_to_cluster(resolver)
        if choice.tpu not in _initialized_tpu_systems():
            # A second initialization would wipe every variable already on the TPU.
            _TPU_TOPOLOGIES[choice.tpu] = tf.tpu.experimental.initialize_tpu_system(resolver)
    except Exception as error:  # noqa: BLE001 - ValueError, URLError, RuntimeError, NotFoundError...
        explanation = diagnose.explain(error)
        fix = explanation if explanation else f"Fix: {_tpu_fix_hint(choice)}."
        raise TPUConnectionError(
            f"could not connect to the TPU: tried TPUClusterResolver(tpu={choice.tpu!r}) because {choice.reason}, "
            f"and it failed with {type(error).__name__}: {str(error)[:500]}. {fix}"
        ) from error
    strategy = tf.distribute.TPUStrategy(resolver)
    _TPU_STRATEGIES[choice.tpu] = strategy
    return strategy


def tpu_topology(tpu: str):
    """The `tf.tpu.experimental.Topology` this process initialized for `tpu` (mesh_shape, num_tasks,
    num_tpus_per_task), or None when it did not initialize it."""
    return _TPU_TOPOLOGIES.get(tpu)


def build(choice: Choice):
    """Builds the strategy for a `Choice`. Auto-detected TPUs that fail fall back to the next option."""
    import tensorflow as tf

    if choice.kind == "tpu":
        try:
            return _connect_tpu(choice)
        except TPUConnectionError as error:
            if choice.explicit:
                raise
            logger.warning("tpukit: TPU auto-detection failed, falling back: %s", error)
            fallback = choose(
                env={k: v for k, v in os.environ.items() if k != "COLAB_TPU_ADDR"}, tpu_vm=False
            )
            return build(fallback)
    if choice.kind == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if choice.kind == "mirrored":
        return tf.distribute.MirroredStrategy()
    if choice.kind == "one_device":
        return tf.distribute.OneDeviceStrategy("/gpu:0")
    return tf.distribute.get_strategy()


def kind_of(strategy) -> str:
    """'tpu', 'multi_worker', 'mirrored', 'one_device' or 'default' for any tf.distribute strategy."""
    import tensorflow as tf

    if isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)):
        return "tpu"
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    if isinstance(strategy, tf.distribute.OneDeviceStrategy):
        return "one_device"
    return "default"


def num_input_pipelines(strategy) -> int:
    """How many input pipelines `distribute_datasets_from_function` makes: one per host (TPU pods, multi-worker)."""
    kind = kind_of(strategy)
    if kind == "tpu":
        return int(strategy.extended.num_hosts)
    if kind == "multi_worker":
        return max(1, training_tasks(strategy.cluster_resolver.cluster_spec().as_dict()))
    return 1


def worker_subdir(strategy) -> str | None:
    """None on the chief (and on single-host strategies); `worker<N>` on the other multi-worker tasks.

    Every MultiWorkerMirroredStrategy worker must take part in checkpoint saves, so the non-chief ones write
    beside the chief's files rather than over them (as TensorFlow's multi-worker Keras guide recommends).
    """
    if kind_of(strategy) != "multi_worker":
        return None
    resolver = strategy.cluster_resolver
    has_chief = bool(resolver.cluster_spec().as_dict().get("chief"))
    chief = resolver.task_type == "chief" or (
        not has_chief and resolver.task_type == "worker" and resolver.task_id == 0
    )
    return None if chief else f"{resolver.task_type}{resolver.task_id}"


def describe(strategy, reason: str = "") -> str:
    """One line: the strategy class, replicas, devices, why it was chosen, and the TF/Keras versions."""
    import keras
    import tensorflow as tf

    try:
        devices = list(strategy.extended.worker_devices)
    except RuntimeError:
        # The default strategy has no worker_devices: it runs on the first local device.
        devices = [d.name for d in tf.config.list_logical_devices()[:1]]
    shown = ", ".join(devices[:4]) + (f", ... ({len(devices)} in all)" if len(devices) > 4 else "")
    why = f" because {reason}" if reason else ""
    return (
        f"tpukit: using {type(strategy).__name__} ({kind_of(strategy)}) with {strategy.num_replicas_in_sync} "
        f"replica(s) on [{shown}]{why}; TensorFlow {tf.__version__}, Keras {keras.__version__}"
    )


def connect(tpu: str | None = None):
    """Returns the `tf.distribute.Strategy` for this machine (see the module docstring for the order).

    Use it as the TensorFlow TPU guides do::

        strategy = tpukit.connect()
        with strategy.scope():
            model = ...
            model.compile(...)
        model.fit(...)

    Args:
        tpu: a Cloud TPU name, `grpc://host:port`, or `"local"` (Colab/Kaggle TPU runtimes, Cloud TPU VMs).
            None auto-detects.

    Raises:
        TPUConnectionError: a TPU was requested (argument or $TPU_NAME) and could not be reached.
    """
    compat.check_tensorflow()
    choice = choose(tpu)
    strategy = build(choice)
    reason = (
        choice.reason
        if kind_of(strategy) == choice.kind
        else "the TPU fallback (see the warning above)"
    )
    logger.info(describe(strategy, reason))
    return strategy


def cpu_mirrored_strategy(num_devices: int):
    """A MirroredStrategy over `num_devices` virtual CPU devices: multi-replica behaviour on a laptop or CI.

    Must run before TensorFlow initializes its devices (before any tensor is created) in this process.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(num_devices)]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) != num_devices:
        try:
            tf.config.set_logical_device_configuration(cpu, wanted)
        except RuntimeError:
            have = len(tf.config.list_logical_devices("CPU"))
            if have < num_devices:
                raise RuntimeError(
                    f"asked for {num_devices} virtual CPU devices, but TensorFlow is already initialized with "
                    f"{have}. Fix: call this before any TensorFlow op runs (in a notebook: restart the runtime "
                    "and call it first)."
                ) from None
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(num_devices)])
