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
tried and the fix; only auto-detection falls through to the next step, with a warning.

`$TF_CONFIG`, when set, is validated first (`parse_tf_config`): a malformed one raises `TFConfigError` naming the
problem and the fix, whatever else is found. The two waits are bounded (`waiting.py` says why they are done in
Python, before TensorFlow is called): a TPU must answer within `tpu_timeout_seconds` (an address where nothing
listens fails at once), a cluster's workers must all be up within `workers_timeout_seconds`
(`ClusterUnreachableError`); both log what they wait for every 30 s and stop on SIGTERM/Ctrl-C
(`waiting.WaitInterrupted`).
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import json
import logging
import os
import time

from tpukit.engines.tensorflow import compat, keras_private, waiting
from tpukit.engines.tensorflow.waiting import WaitInterrupted
from tpukit.environment import diagnose, engine_choice, quiet, versions
from tpukit.logs import first_four, plural

logger = logging.getLogger("tpukit")

# One TPUStrategy per TPU address per process: initialize_tpu_system resets the TPU (and so every variable on it),
# so a second connect() in the same notebook must return the strategy it already built.
_TPU_STRATEGIES: dict[str, object] = {}
_TPU_TOPOLOGIES: dict[str, object] = {}


class TPUConnectionError(RuntimeError):
    """A TPU was asked for (argument, $TPU_NAME) but could not be reached. The message says what to do."""


class ClusterUnreachableError(RuntimeError):
    """The other workers of the $TF_CONFIG cluster were not all up within `workers_timeout_seconds`. The message
    names the missing ones and what to do."""


class TFConfigError(ValueError):
    """$TF_CONFIG is malformed. The message names TF_CONFIG, the problem, the value received and the fix."""


@dataclasses.dataclass(frozen=True)
class Choice:
    """What `connect` decided, before any device work: `kind` and the human `reason`."""

    kind: str  # "tpu", "multi_worker", "mirrored", "one_device", "default"
    reason: str
    tpu: str | None = None  # the TPUClusterResolver argument, for kind == "tpu"
    # True when the user asked for this TPU (errors are raised, not fallen through).
    explicit: bool = False
    # The validated $TF_CONFIG, for kind == "multi_worker" (whose workers `build` waits for).
    cluster: dict | None = dataclasses.field(default=None, compare=False)


# PCI vendor id of Google (the TPU chips' vendor), as Linux lists it in /sys/bus/pci/devices/*/vendor.
GOOGLE_PCI_VENDOR = quiet.GOOGLE_PCI_VENDOR


def google_pci_devices(root: str = "/sys/bus/pci/devices") -> list[str]:
    """PCI devices whose vendor is Google (TPU chips), e.g. ['0000:00:04.0']; [] when none or no sysfs
    (`tpukit.environment.quiet.google_pci_devices`, which the quiet start shares)."""
    return quiet.google_pci_devices(root)


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
    """The environment-variable half of `tpu_vm_present`: Colab's, Kaggle's and GKE's TPU variables
    (`tpukit.environment.engine_choice.tpu_environment`, which `runtime.engine: auto` shares)."""
    return engine_choice.tpu_environment(env)


def _gpu_count() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def training_tasks(cluster: dict) -> int:
    """Tasks that train in a TF_CONFIG-style cluster mapping: its workers plus its chief (not evaluators or ps)."""
    return len(cluster.get("worker", [])) + len(cluster.get("chief", []))


# The task types that train together in a MultiWorkerMirroredStrategy (and that its coordination service waits for:
# collective_all_reduce_strategy.py line 552, `coordinated_jobs = ["chief", "worker"]`).
TRAINING_TASK_TYPES = ("chief", "worker")
TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
)
_TF_CONFIG_FIX = (
    f"set TF_CONFIG on every process of the cluster to JSON like {TF_CONFIG_EXAMPLE} (the same cluster "
    "everywhere; each process's own task type and index), or unset TF_CONFIG to train on this machine alone"
)
_OWN_TASK_FIX = (
    'on each process set "task" to its own entry of the cluster, e.g. {"type": "worker", "index": 0} on '
    f"the first worker, 1 on the second ...; the whole variable looks like {TF_CONFIG_EXAMPLE}"
)


def _shown(value, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return repr(text[:limit]) + (f" ... ({len(text)} characters)" if len(text) > limit else "")


def task_index(task: dict) -> int:
    """The task's index as TensorFlow reads it (`int(task['index'])`): an int or a string of digits."""
    index = task.get("index")
    if isinstance(index, str) and index.isascii() and index.isdigit():
        return int(index)
    if isinstance(index, int) and not isinstance(index, bool):
        return index
    raise ValueError(index)


def _tf_config_error(text: str, problem: str, fix: str = _TF_CONFIG_FIX) -> TFConfigError:
    return TFConfigError(f"TF_CONFIG {problem}; received {_shown(text)}. Fix: {fix}.")


def parse_tf_config(text: str | None) -> dict | None:
    """$TF_CONFIG validated: the parsed object, or None when it is unset, empty or `{}` (no cluster).

    Raises `TFConfigError` (naming TF_CONFIG, the problem, the value received, at most 200 characters, and the
    fix with an example) when it is not JSON, not an object, has no `cluster` (or an empty one, or one whose task
    lists are not lists of "host:port", or one with no chief or worker), has no `task`, a task type that is not in
    the cluster, an index that is not a whole number or is out of range, or an address that does not parse
    (`host:port`, port 1-65535, an IPv6 address in brackets), or lists one address twice. TensorFlow itself would
    fail later with an AttributeError or KeyError for some of these, and train alone, unnoticed, without a task.
    """
    if text is None or not text.strip():
        return None
    config = _json_object(text)
    if not config:
        return None  # `{}`: no cluster, as TensorFlow reads it
    _check_cluster(text, config)
    _check_task(text, config)
    return config


def _json_object(text: str) -> dict:
    """TF_CONFIG parsed, refused unless it is a JSON object."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise _tf_config_error(text, f"is not valid JSON ({error})") from error
    if not isinstance(config, dict):
        kinds = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
        kind = kinds.get(type(config), "null")
        raise _tf_config_error(
            text, f"must be a JSON object with 'cluster' and 'task', not a JSON {kind}"
        )
    return config


def _check_cluster(text: str, config: dict) -> None:
    """`cluster`: a non-empty object of non-empty 'host:port' lists, no address twice, a chief or a worker."""
    if "cluster" not in config:
        raise _tf_config_error(text, "has no 'cluster' (the address of every task, by task type)")
    cluster = config["cluster"]
    if not isinstance(cluster, dict) or not cluster:
        raise _tf_config_error(
            text,
            "'cluster' must be a non-empty object mapping each task type to its list of 'host:port' addresses, "
            f"not {_shown(cluster, 80)}",
        )
    seen: dict[str, str] = {}
    for task_type, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses:
            raise _tf_config_error(
                text,
                f"cluster[{task_type!r}] must be a non-empty list of 'host:port' strings, not "
                f"{_shown(addresses, 80)}",
            )
        for index, address in enumerate(addresses):
            try:
                waiting.parse_address(address)
            except ValueError as error:
                raise _tf_config_error(
                    text, f"cluster[{task_type!r}][{index}] is not an address: {error}"
                ) from error
            if address in seen:
                raise _tf_config_error(
                    text,
                    f"lists {address!r} twice ({seen[address]} and {task_type} {index}): each task needs "
                    "its own host:port",
                )
            seen[address] = f"{task_type} {index}"
    if not any(cluster.get(task_type) for task_type in TRAINING_TASK_TYPES):
        raise _tf_config_error(
            text,
            f"'cluster' has no 'worker' or 'chief' task (it has {', '.join(map(repr, cluster))}): tpukit "
            "trains with MultiWorkerMirroredStrategy, whose tasks are workers and an optional chief",
        )


def _check_task(text: str, config: dict) -> None:
    """`task`: an object whose type is one of the cluster's and whose index is in that type's range."""
    cluster = config["cluster"]
    if "task" not in config:
        raise _tf_config_error(
            text,
            "has a 'cluster' but no 'task': every process must say which task of the cluster it is (without "
            "one, every worker would train alone, into the same output directory)",
            _OWN_TASK_FIX,
        )
    task = config["task"]
    if not isinstance(task, dict):
        raise _tf_config_error(
            text,
            f'\'task\' must be an object like {{"type": "worker", "index": 0}}, not {_shown(task, 80)}',
            _OWN_TASK_FIX,
        )
    task_type = task.get("type")
    if not isinstance(task_type, str) or task_type not in cluster:
        raise _tf_config_error(
            text,
            f"task type {task_type!r} is not one of the cluster's task types ({', '.join(map(repr, cluster))})",
            _OWN_TASK_FIX,
        )
    try:
        index = task_index(task)
    except ValueError as error:
        raise _tf_config_error(
            text, f"task index {task.get('index')!r} is not a whole number", _OWN_TASK_FIX
        ) from error
    count = len(cluster[task_type])
    if not 0 <= index < count:
        raise _tf_config_error(
            text,
            f"task index {index} is out of range: cluster[{task_type!r}] has {count} address(es), so the "
            f"index is 0 to {count - 1}",
            _OWN_TASK_FIX,
        )


def choose(
    tpu: str | None = None,
    env: dict[str, str] | None = None,
    tpu_vm: bool | None = None,
    gpus: int | None = None,
) -> Choice:
    """Decides which strategy to build. Pure apart from its defaults, so every branch is testable.

    A set $TF_CONFIG is validated first, whatever is chosen (`TFConfigError`): a broken one is a mistake that would
    otherwise surface on another machine, or never.
    """
    env = dict(os.environ) if env is None else env
    cluster = parse_tf_config(env.get("TF_CONFIG"))
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
    if cluster is not None:
        return Choice(
            "multi_worker",
            f"$TF_CONFIG describes a cluster of {training_tasks(cluster['cluster'])} worker(s)",
            cluster=cluster,
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


# Words for `waiting.probe`'s answers, in progress lines and errors.
_PROBE_WORDS = {
    "open": "answers",
    "silent": "accepts TCP connections but does not answer gRPC (yet)",
    "timeout": "does not answer TCP connections (a firewall, or the host is down or still starting)",
    "unreachable": "cannot be reached (no route to the host)",
    "refused": "refuses connections: nothing listens on that port",
    "unresolvable": "has a host name that does not resolve",
    "not_grpc": "answers, but not as a gRPC server (no HTTP/2 handshake)",
}
_TPU_LIMIT = ("tpu_timeout_seconds", "if it is still starting")
_WORKERS_LIMIT = ("workers_timeout_seconds", "when they start minutes apart")
# Known at the first probe: waiting would not change them (the TPU's gRPC server listens from its start).
_TPU_FATAL = ("refused", "unresolvable", "not_grpc")


def _tpu_addresses(tpu: str, resolver=None) -> list[str]:
    """The host:port addresses TensorFlow will connect to for `tpu`: the address of a grpc:// URL, else the
    'worker' tasks of a named TPU's resolved cluster; [] for 'local' (no network) or when they are not known."""
    if tpu.startswith("grpc://"):
        return [tpu[len("grpc://") :]]
    if resolver is None or tpu == "local":
        return []
    try:
        workers = resolver.cluster_spec().as_dict().get("worker")
    except Exception:  # noqa: BLE001 - best effort: TensorFlow reports it when it connects
        return []
    if isinstance(workers, dict):
        workers = list(workers.values())
    return [w for w in workers if isinstance(w, str)] if isinstance(workers, list) else []


def _timeout_fix(argument: str, when: str, value: float) -> str:
    """'raise runtime.X (CLI: --set runtime.X=N; Python: tpukit.connect(X=N)) WHEN'."""
    bigger = int(max(2 * value, 60))
    key = f"runtime.{argument}"
    return f"raise {key} (CLI: --set {key}={bigger}; Python: tpukit.connect({argument}={bigger})) {when}"


def _wait_for_tpu(choice: Choice, addresses: list[str], deadline: float, timeout: float) -> None:
    """Waits until every address of the TPU answers gRPC (see `waiting`), or raises `TPUConnectionError`: at once
    for an address that does not parse, refuses connections, does not resolve or is not gRPC; at the deadline for
    one that stays silent. SIGTERM/Ctrl-C raise `WaitInterrupted`."""
    try:
        parsed = {address: waiting.parse_address(address) for address in addresses}
    except ValueError as error:
        raise TPUConnectionError(
            f"could not connect to the TPU {choice.tpu!r} ({choice.reason}): {error}. Fix: pass the TPU's gRPC "
            "address as grpc://host:port (a TPU Node listens on port 8470), its name, or 'local'."
        ) from None

    def poll(left: float):
        seconds = min(waiting.PROBE_TIMEOUT_SECONDS, max(0.2, left))
        states = {a: waiting.probe(*parsed[a], timeout=seconds, handshake=True) for a in addresses}
        fatal = {a: s for a, s in states.items() if s in _TPU_FATAL}
        if fatal:
            address, state = next(iter(fatal.items()))
            raise TPUConnectionError(
                f"could not connect to the TPU: {address} {_PROBE_WORDS[state]} (tried because {choice.reason}). "
                f"Fix: check the address (a TPU Node's gRPC port is 8470; `gcloud compute tpus describe NAME` "
                f"lists its endpoints) and that the TPU is READY; {_tpu_fix_hint(choice)}."
            )
        pending = [a for a, s in states.items() if s != "open"]
        progress = "; ".join(f"{a} {_PROBE_WORDS[states[a]]}" for a in pending[:3]) + (
            f"; and {len(pending) - 3} more" if len(pending) > 3 else ""
        )
        return not pending, progress

    left = deadline - time.monotonic()
    shown = (
        addresses[0] if len(addresses) == 1 else f"{len(addresses)} TPU hosts ({addresses[0]}, ...)"
    )
    done, progress, elapsed = waiting.wait_until(
        poll, left, f"the TPU at {shown} to answer", "runtime.tpu_timeout_seconds"
    )
    if not done:
        raise TPUConnectionError(
            f"could not connect to the TPU: after {elapsed:.0f} s (runtime.tpu_timeout_seconds={timeout:g}), "
            f"{progress} (tried because {choice.reason}). Fix: check that the TPU is READY and that the address "
            f"is its gRPC endpoint (port 8470 on a TPU Node), "
            f"{_timeout_fix(*_TPU_LIMIT, timeout)}; "
            f"{_tpu_fix_hint(choice)}."
        )


def _connect_tpu(choice: Choice, timeout: float = 600.0):
    """Connects to and initializes the TPU of `choice` within `timeout` s (see `waiting` for how each step is
    bounded: its addresses are probed before TensorFlow connects, which it does without a timeout of its own
    while holding the GIL; the TPU system's initialization runs in a thread waited for in Python)."""
    import tensorflow as tf

    if choice.tpu in _TPU_STRATEGIES:
        return _TPU_STRATEGIES[choice.tpu]
    missing = tpu_api_client_missing() if _needs_tpu_api(choice.tpu) else []
    if missing:
        # TensorFlow would fail later with "Missing runtime dependency on the Google API client"; say it first.
        raise TPUConnectionError(
            f"could not connect to the TPU named {choice.tpu!r} ({choice.reason}): a named TPU is looked up "
            f"through the Cloud TPU API, whose client needs {' and '.join(missing)}, not installed. Fix: "
            f"`pip install {' '.join(missing)}` (or `pip install '{versions.tpukit_requirement('tpu,tpu-name')}'`), "
            "then restart the "
            "runtime; or, when the TPU is attached to this machine (Colab, Kaggle, single-host TPU VM), use "
            "tpu='local' (CLI: --tpu=local)."
        )
    deadline = time.monotonic() + timeout
    step = "looking up the TPU"
    try:
        if _needs_tpu_api(choice.tpu):
            # The Cloud TPU API lookup is Python HTTP (it releases the GIL): bounded like the initialization.
            resolver, addresses = waiting.call_bounded(
                lambda: _resolve_named_tpu(choice.tpu),
                timeout,
                f"the Cloud TPU API to find {choice.tpu!r}",
            )
        else:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=choice.tpu)
            addresses = _tpu_addresses(choice.tpu)
        if addresses:
            _wait_for_tpu(choice, addresses, deadline, timeout)
        if choice.tpu != "local":
            # A TPU Node (remote grpc:// workers) must be connected to; a TPU VM's chips are local. Not in a
            # thread: it enters the TPU host's device scope, which is per thread.
            step = "connecting to the TPU"
            tf.config.experimental_connect_to_cluster(resolver)
        if choice.tpu not in _initialized_tpu_systems():
            # A second initialization would wipe every variable already on the TPU.
            step = "initializing the TPU system"
            _TPU_TOPOLOGIES[choice.tpu] = waiting.call_bounded(
                lambda: tf.tpu.experimental.initialize_tpu_system(resolver),
                max(1.0, deadline - time.monotonic()),
                f"the TPU system {choice.tpu!r} to initialize (a v4/v5 slice takes 1-3 minutes)",
            )
    except (TPUConnectionError, WaitInterrupted):
        raise
    except waiting.BoundedCallTimeout as error:
        raise TPUConnectionError(
            f"could not connect to the TPU: {error} (runtime.tpu_timeout_seconds={timeout:g}; tried because "
            f"{choice.reason}). Fix: `python -m tpukit.doctor` checks the TPU and its software; "
            f"{_timeout_fix(*_TPU_LIMIT, timeout)}."
        ) from None
    except Exception as error:  # noqa: BLE001 - ValueError, URLError, RuntimeError, NotFoundError...
        explanation = diagnose.explain(error)
        fix = explanation if explanation else f"Fix: {_tpu_fix_hint(choice)}."
        raise TPUConnectionError(
            f"could not connect to the TPU: tried TPUClusterResolver(tpu={choice.tpu!r}) because {choice.reason}, "
            f"and {step} failed with {type(error).__name__}: {str(error)[:500]}. {fix}"
        ) from error
    strategy = tf.distribute.TPUStrategy(resolver)
    _TPU_STRATEGIES[choice.tpu] = strategy
    return strategy


def _resolve_named_tpu(tpu: str):
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    return resolver, _tpu_addresses(tpu, resolver)


def _peer_state(state: str) -> str:
    return {
        "refused": "not listening yet",
        "unresolvable": "host name does not resolve yet",
        "timeout": "no answer (a firewall, or the host is down)",
        "unreachable": "no route to the host",
    }.get(state, state)


def wait_for_workers(config: dict, timeout: float) -> None:
    """Waits until the port of every other chief/worker task of the TF_CONFIG `config` accepts TCP connections,
    listening on this task's own port meanwhile (`waiting.Placeholder`), so that MultiWorkerMirroredStrategy's
    start, which waits for them without a timeout, log or signal handling (see `waiting`), does not wait.

    Logs `waiting for ...: 1 of 2 other worker(s) reachable (worker 1 at 127.0.0.1:12345 not listening yet);
    30 s of 1800 s` at the start and every 30 s; raises `ClusterUnreachableError` after `timeout` s naming the
    missing workers and the fix, and `WaitInterrupted` on SIGTERM/Ctrl-C. An evaluator task (which does not
    join the collectives) and a one-task cluster do not wait.
    """
    cluster, task = config["cluster"], config["task"]
    own = (task["type"], task_index(task))
    if own[0] not in TRAINING_TASK_TYPES:
        return
    peers = {
        f"{task_type} {index}": address
        for task_type in TRAINING_TASK_TYPES
        for index, address in enumerate(cluster.get(task_type, []))
        if (task_type, index) != own
    }
    if not peers:
        return
    own_address = cluster[own[0]][own[1]]
    parsed = {name: waiting.parse_address(address) for name, address in peers.items()}
    total = len(peers) + 1
    with waiting.Placeholder(waiting.parse_address(own_address)[1]) as placeholder:

        def poll(left: float):
            placeholder.drain()
            seconds = min(1.0, max(0.2, left))
            states = {name: waiting.probe(*parsed[name], timeout=seconds) for name in peers}
            placeholder.drain()
            missing = [name for name, state in states.items() if state != "open"]
            shown = ", ".join(
                f"{name} at {peers[name]} {_peer_state(states[name])}" for name in missing[:3]
            ) + (f", and {len(missing) - 3} more" if len(missing) > 3 else "")
            progress = f"{len(peers) - len(missing)} of {len(peers)} other worker(s) reachable" + (
                f" ({shown})" if missing else ""
            )
            return not missing, progress

        done, progress, elapsed = waiting.wait_until(
            poll,
            timeout,
            f"the {total} workers of the TF_CONFIG cluster to start (this is {own[0]} {own[1]}, {own_address})",
            "runtime.workers_timeout_seconds",
        )
    if not done:
        raise ClusterUnreachableError(
            f"the workers of the TF_CONFIG cluster did not all start within {elapsed:.0f} s "
            f"(runtime.workers_timeout_seconds={timeout:g}): {progress}. This is {own[0]} {own[1]} "
            f"({own_address}); nothing was trained or written. Fix: run the same command on every host of "
            "TF_CONFIG's cluster, each with its own task index; check that each address is its worker's host "
            "and port and that the port is open between the hosts (a firewall); "
            f"{_timeout_fix(*_WORKERS_LIMIT, timeout)}. "
            "Then run the same command again."
        )
    logger.info("tpukit: all %d workers of the TF_CONFIG cluster are up (%.0f s)", total, elapsed)


def tpu_topology(tpu: str):
    """The `tf.tpu.experimental.Topology` this process initialized for `tpu` (mesh_shape, num_tasks,
    num_tpus_per_task), or None when it did not initialize it."""
    return _TPU_TOPOLOGIES.get(tpu)


def build(
    choice: Choice, *, tpu_timeout_seconds: float = 600.0, workers_timeout_seconds: float = 1800.0
):
    """Builds the strategy for a `Choice`. Auto-detected TPUs that fail fall back to the next option, with a
    warning. A TPU must answer within `tpu_timeout_seconds`, a cluster's workers be up within
    `workers_timeout_seconds` (see `connect`)."""
    import tensorflow as tf

    if choice.kind == "tpu":
        try:
            return _connect_tpu(choice, tpu_timeout_seconds)
        except TPUConnectionError as error:
            if choice.explicit:
                raise
            logger.warning("tpukit: TPU auto-detection failed, falling back: %s", error)
            fallback = choose(
                env={k: v for k, v in os.environ.items() if k != "COLAB_TPU_ADDR"}, tpu_vm=False
            )
            return build(
                fallback,
                tpu_timeout_seconds=tpu_timeout_seconds,
                workers_timeout_seconds=workers_timeout_seconds,
            )
    if choice.kind == "multi_worker":
        if choice.cluster is not None:
            wait_for_workers(choice.cluster, workers_timeout_seconds)
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


# The start line's words for a strategy kind (`kind_of`), and for a TensorFlow device type.
STRATEGY_WORDS = {
    "tpu": "TPU strategy",
    "multi_worker": "multi-worker mirrored strategy",
    "mirrored": "mirrored strategy",
    "one_device": "one-device strategy",
    "default": "default strategy",
}
DEVICE_WORDS = {"CPU": "CPU", "GPU": "GPU", "TPU": "TPU core"}
_LOCAL = "/job:localhost/replica:0/task:0"  # the prefix of every device name of a single-process strategy


def devices_in_words(names: list[str]) -> str:
    """`1 CPU (/device:CPU:0)`, `8 TPU cores (/job:worker/replica:0/task:0/device:TPU:0, ... (8 in all))`: how
    many devices of each type, then their names (the first four)."""
    if not names:
        return "no devices"
    counts: dict[str, int] = {}
    for name in names:
        kind = name.rsplit("device:", 1)[-1].split(":")[0].upper()
        counts[kind] = counts.get(kind, 0) + 1
    kinds = " and ".join(
        plural(n, DEVICE_WORDS.get(kind, f"{kind} device")) for kind, n in counts.items()
    )
    return f"{kinds} ({first_four([name.removeprefix(_LOCAL) for name in names])})"


def describe(strategy, reason: str = "") -> str:
    """tpukit's first line: the engine, the replicas and the devices in plain words, the strategy (and its class,
    for those who know tf.distribute), why it was chosen, and the TensorFlow and Keras versions. On this CPU:

        tpukit: engine tensorflow, 1 replica on 1 CPU (/device:CPU:0), default strategy (_DefaultDistributionStrategy)
        because no TPU, GPU or TF_CONFIG cluster found: CPU; TensorFlow 2.21.0, Keras 3.15.1
    """
    import keras
    import tensorflow as tf

    try:
        devices = list(strategy.extended.worker_devices)
    except RuntimeError:
        # The default strategy has no worker_devices: it runs on the first local device.
        devices = [d.name for d in tf.config.list_logical_devices()[:1]]
    kind = kind_of(strategy)
    where = devices_in_words(devices)
    if kind == "multi_worker":
        where += " on this worker"  # worker_devices are this worker's; the replicas, the cluster's
    why = f" because {reason}" if reason else ""
    return (
        f"tpukit: engine tensorflow, {plural(strategy.num_replicas_in_sync, 'replica')} on {where}, "
        f"{STRATEGY_WORDS[kind]} ({type(strategy).__name__}){why}; TensorFlow {tf.__version__}, "
        f"Keras {keras.__version__}"
    )


def connect(
    tpu: str | None = None,
    *,
    tpu_timeout_seconds: float = 600.0,
    workers_timeout_seconds: float = 1800.0,
):
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
        tpu_timeout_seconds: how long a TPU may take to answer and initialize (a v4/v5 slice takes 1-3 minutes).
            An address where nothing listens fails at once. The recipe key `runtime.tpu_timeout_seconds`.
        workers_timeout_seconds: how long the other workers of a $TF_CONFIG cluster may take to start (pod hosts
            and schedulers start them minutes apart). The recipe key `runtime.workers_timeout_seconds`.

    Both waits log what they wait for every 30 s, and SIGTERM or Ctrl-C stops them (`WaitInterrupted`).

    Raises:
        TPUConnectionError: a TPU was requested (argument or $TPU_NAME) and could not be reached in time.
        ClusterUnreachableError: the other workers of the $TF_CONFIG cluster were not all up in time.
        TFConfigError: $TF_CONFIG is malformed (a ValueError).
        WaitInterrupted: SIGTERM or SIGINT arrived during one of the waits (its `signum` says which).
    """
    compat.check_tensorflow()
    choice = choose(tpu)
    strategy = build(
        choice,
        tpu_timeout_seconds=tpu_timeout_seconds,
        workers_timeout_seconds=workers_timeout_seconds,
    )
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
