"""Known environmental TPU errors, translated into their cause and the fix.

The failures TPU users report most in the TensorFlow, Keras, JAX and Colab trackers are not bugs in their model
but in their environment: the wrong TensorFlow build, the wrong way to find the TPU, files the TPU cannot see, a
program too big for the TPU's memory (or the GPU's, or the host's RAM). Each `KnownError` below matches one of them
by the text TensorFlow (or JAX) prints, and cites the public threads where it was reported and diagnosed.

    >>> explain(ValueError("Please provide a TPU Name to connect to."))
    'Cause: ... Fix: ...'

`explain` is used by `python -m tpukit.doctor`, by `tpukit.connect` (TPUConnectionError messages) and, through
`annotate`, by tpukit's entry points, which add the explanation to the error they re-raise.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from tpukit.environment import versions


@dataclasses.dataclass(frozen=True)
class KnownError:
    """One known error: how to recognise it, why it happens, what to do, and where it was reported."""

    name: str
    pattern: re.Pattern
    cause: str
    fix: str
    reports: tuple[str, ...]
    # What the error's own text and this machine tell (sizes, limits), added after the cause; None: nothing
    numbers: Callable[[str], str | None] | None = None

    def explanation(self, text: str) -> str:
        cause, fix = self.cause, self.fix
        numbers = self.numbers(text) if self.numbers else None
        if numbers:
            cause = f"{cause} {numbers}"
        if self.name == "hbm_out_of_memory":
            used = re.search(r"Used ([\d.]+\s*[KMGT]?i?B?) of ([\d.]+\s*[KMGT]?i?B?) hbm", text)
            if used:
                fix = (
                    f"the program needs {used.group(1)} of the {used.group(2)} HBM per TPU core. "
                    + fix
                )
        return f"Cause: {cause} Fix: {fix} (Reported in: {', '.join(self.reports)}.)"


def _tpu_install() -> str:
    combination = versions.pinned_tpu()
    return (
        f"`pip uninstall -y tensorflow` then `{combination.install_command()}` (or "
        f'`pip install "{versions.tpukit_requirement("tpu")}"`), then restart the runtime'
    )


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """This machine's memory and this process's address-space limit, in bytes (None: unknown or unlimited)."""

    total: int | None = None  # /proc/meminfo MemTotal
    available: int | None = None  # /proc/meminfo MemAvailable (when the error is explained)
    address_space_limit: int | None = None  # RLIMIT_AS (`ulimit -v`), soft limit


def host_memory(meminfo: str | None = None, rlimit_as: int | None = -1) -> HostMemory:
    """Reads /proc/meminfo and `resource.getrlimit(RLIMIT_AS)`; tests pass `meminfo` (its text) and `rlimit_as`
    (bytes; None or `resource.RLIM_INFINITY`: unlimited) instead."""
    if meminfo is None:
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                meminfo = f.read()
        except OSError:  # not Linux
            meminfo = ""
    kib = {
        key: int(value) * 1024
        for key, value in re.findall(r"^(MemTotal|MemAvailable):\s+(\d+) kB", meminfo, re.M)
    }
    if rlimit_as == -1:
        try:
            import resource

            rlimit_as = resource.getrlimit(resource.RLIMIT_AS)[0]
        except (ImportError, OSError, ValueError):  # no `resource` module (Windows)
            rlimit_as = None
    if rlimit_as is not None and rlimit_as < 0:  # resource.RLIM_INFINITY
        rlimit_as = None
    return HostMemory(kib.get("MemTotal"), kib.get("MemAvailable"), rlimit_as)


# Bytes per element of the dtype names TensorFlow's "OOM when allocating tensor ... and type T" uses (DataTypeString)
# and NumPy's "data type T".
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int8": 1, "uint8": 1, "bool": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "complex64": 8, "complex128": 16, "float8_e4m3fn": 1, "float8_e5m2": 1,
}  # fmt: skip

_OOM_TENSOR = (
    r"OOM when allocating tensor with shape\s*\[(?P<shape>[\d, ]*)\] and type (?P<dtype>\w+) on "
    r"\S*device:{device}:(?P<index>\d+)"
)
_HOST_OOM_TENSOR = re.compile(_OOM_TENSOR.format(device="CPU"))
_GPU_OOM_TENSOR = re.compile(_OOM_TENSOR.format(device="GPU"))
# NumPy: "Unable to allocate 5.00 GiB for an array with shape (256, 5000000) and data type float32"
_NUMPY_OOM = re.compile(
    r"Unable to allocate [\d.]+ \w+ for an array with shape \((?P<shape>[\d, ]*)\) and data type (?P<dtype>\w+)"
)


def _size(size: float) -> str:
    return f"{size / 2**30:,.2f} GiB" if size >= 2**30 else f"{size / 2**20:,.1f} MiB"


def _tensor(text: str, pattern: re.Pattern) -> tuple[str, int | None] | None:
    """("a float32 tensor of shape [256, 200000000]", its size in bytes or None) from the error's text, or None."""
    found = pattern.search(text) or _NUMPY_OOM.search(text)
    if not found:
        return None
    dims = [int(d) for d in re.findall(r"\d+", found.group("shape"))]
    dtype = found.group("dtype")
    element = _DTYPE_BYTES.get(dtype)
    size = None
    if element is not None:
        size = element
        for dim in dims:
            size *= dim
    name = {"float": "float32", "double": "float64", "half": "float16"}.get(dtype, dtype)
    return f"a {name} tensor of shape [{', '.join(map(str, dims))}]", size


def _host_oom_numbers(text: str) -> str | None:
    tensor = _tensor(text, _HOST_OOM_TENSOR)
    memory = host_memory()
    parts = []
    if tensor:
        what, size = tensor
        parts.append(f"the allocation refused: {what}" + (f" ({_size(size)})" if size else ""))
    if memory.total:
        parts.append(
            f"this machine's RAM: {_size(memory.total)}"
            + (f" ({_size(memory.available)} available now)" if memory.available else "")
        )
    if memory.address_space_limit:
        parts.append(
            f"this process's address-space limit (`ulimit -v`): {_size(memory.address_space_limit)}, "
            "TensorFlow's own libraries and threads included"
        )
    if not parts:
        return None
    sentence = "; ".join(parts)
    return sentence[0].upper() + sentence[1:] + "."


def _gpu_oom_numbers(text: str) -> str | None:
    found = _GPU_OOM_TENSOR.search(text)
    tensor = _tensor(text, _GPU_OOM_TENSOR)
    if not found or not tensor:
        return None
    what, size = tensor
    return (
        f"The allocation refused on GPU {found.group('index')}: {what}"
        + (f" ({_size(size)})" if size else "")
        + "."
    )


KNOWN_ERRORS: tuple[KnownError, ...] = (
    KnownError(
        name="cpu_tensorflow_on_tpu",
        pattern=re.compile(
            r"No OpKernel was registered to support Op '(ConfigureDistributedTPU|TPU\w*)'|"
            r"TPUs not found in the cluster"
        ),
        cause=(
            "the installed TensorFlow is the CPU/GPU wheel (`tensorflow` or `tensorflow-cpu`), which has no TPU "
            "kernels, so it cannot initialize or run the TPU (its 'Registered devices' list has no TPU). Colab's "
            "and Kaggle's TPU runtimes ship JAX and that wheel, no TensorFlow TPU build."
        ),
        fix=(
            "train with the jax engine, which uses the runtime's JAX: "
            f'`pip install "{versions.tpukit_requirement("jax-tpu")}"`, then `--set runtime.engine=jax` (the only way '
            f"on Python 3.13). Or install the TPU build of TensorFlow (Python 3.11-3.12): {_tpu_install()}."
        ),
        reports=(
            "github.com/tensorflow/tensorflow/issues/52149",
            "github.com/tensorflow/tensorflow/issues/28395",
            "github.com/google-research/google-research/issues/651",
            "github.com/googlecolab/colabtools/issues/5203",
            "github.com/tensorflow/tensorflow/issues/96203",
        ),
    ),
    KnownError(
        name="tpu_name_required",
        pattern=re.compile(r"Please provide a TPU Name to connect to"),
        cause=(
            "TPUClusterResolver() without a name looks for a remote TPU Node in the Cloud metadata; Colab's TPU "
            "runtimes (since 2024), Kaggle and single-host Cloud TPU VMs have the TPU attached to this machine "
            "instead, and there is no TPU name to find."
        ),
        fix=(
            "connect to the local TPU: `tpukit.connect(tpu='local')`, CLI `--tpu=local`, or plain TensorFlow "
            "`TPUClusterResolver(tpu='local')`; unset $TPU_NAME if it is set to something else. A multi-host pod "
            f"slice needs its TPU name instead (and `pip install '{versions.tpukit_requirement('tpu-name')}'`)."
        ),
        reports=(
            "github.com/googlecolab/colabtools/issues/4637",
            "github.com/googlecolab/colabtools/issues/5194",
            "github.com/tensorflow/tensorflow/issues/70827",
        ),
    ),
    KnownError(
        name="xla_function_on_host",
        pattern=re.compile(r"could not find registered transfer manager for platform Host"),
        cause=(
            "a function compiled with XLA (`jit_compile=True`) was placed on the host CPU, and the TPU build of "
            "TensorFlow has no XLA:CPU backend. With Keras 3 it happens when `fit`'s compiled train function runs "
            "outside the TPU: a model or optimizer created outside `strategy.scope()`, or an explicit "
            "`jit_compile=True` on a step or layer that runs on the CPU."
        ),
        fix=(
            "create the model, optimizer and metrics and call `compile` inside `strategy.scope()` (tpukit.run "
            "does), and leave `jit_compile` off for TPU runs (`model.compile(jit_compile=False)`; recipes: "
            "`runtime.jit_compile: auto`, since TPUStrategy compiles the step with XLA itself)."
        ),
        reports=(
            "github.com/tensorflow/tensorflow/issues/88960",
            "github.com/tensorflow/tensorflow/issues/61976",
            "github.com/googlecolab/colabtools/issues/5124",
        ),
    ),
    KnownError(
        name="local_files_on_remote_tpu",
        pattern=re.compile(r"File system scheme '\[local\]' not implemented"),
        cause=(
            "the file is read by a TPU worker that cannot see this machine's disk: a remote TPU Node "
            "(grpc://...) or another host of a pod slice reads the input pipeline and writes checkpoints there."
        ),
        fix=(
            "put the data, and the output directory, in a Cloud Storage bucket the TPU can read (`gs://bucket/...`, "
            "with the TPU's service account granted access), or load small data into memory before distributing "
            "it; on a single-host TPU VM (Colab, Kaggle) local files work with tpu='local'."
        ),
        reports=(
            "github.com/tensorflow/tensorflow/issues/49177",
            "github.com/tensorflow/tensorflow/issues/64117",
            "github.com/keras-team/keras-tuner/issues/921",
        ),
    ),
    KnownError(
        name="hbm_out_of_memory",
        pattern=re.compile(
            r"Ran out of memory in memory space hbm|"
            r"Attempting to reserve \S+ at the bottom of memory\. That was not possible"
        ),
        cause=(
            "the compiled training step (weights, optimizer state, activations of the per-core batch) does not "
            "fit in the TPU's high-bandwidth memory (HBM)."
        ),
        fix=(
            "lower `data.global_batch_size` (keep the per-core batch a multiple of 8), train in "
            "`runtime.precision: mixed_bfloat16` (half the activation memory), or shrink the model or sequence "
            "length; a TPU with more HBM per core (v3: 16 GiB, v4: 32 GiB per chip) is the last resort."
        ),
        reports=(
            "github.com/tensorflow/tpu/issues/385",
            "github.com/google-research/albert/issues/168",
            "github.com/tensorflow/tensor2tensor/issues/1382",
            "github.com/pytorch/xla/issues/1735",
        ),
    ),
    KnownError(
        name="host_out_of_memory",
        pattern=re.compile(
            _HOST_OOM_TENSOR.pattern
            + r"|Unable to allocate [\d.]+ \w+ for an array with shape|\b(?:_Array)?MemoryError\b"
        ),
        cause=(
            "the run ran out of host memory: this machine's RAM (or the share of it this process may use), not "
            "an accelerator's. TensorFlow holds on the CPU whatever no accelerator holds (the weights, optimizer "
            "state and a batch's activations when training on the CPU, data kept in memory) and refused an "
            "allocation that did not fit."
        ),
        fix=(
            "lower `data.global_batch_size`, or make the model smaller (its widths and depths in the recipe's "
            "`model` section); or run on a machine with more memory. Under an address-space limit (`ulimit -v`, "
            "a job scheduler's memory limit) raise it. The checkpoints written before stay as they were."
        ),
        reports=(
            "github.com/thtrieu/darkflow/issues/873",
            "github.com/isseu/emotion-recognition-neural-networks/issues/48",
            "github.com/santi-pdp/segan/issues/42",
        ),
        numbers=_host_oom_numbers,
    ),
    KnownError(
        name="gpu_out_of_memory",
        pattern=_GPU_OOM_TENSOR,
        cause=(
            "the run ran out of GPU memory: the weights, optimizer state and a batch's activations of the step "
            "(or another process using the same GPU) do not fit in the GPU's own memory."
        ),
        fix=(
            "lower `data.global_batch_size`, train in `runtime.precision: mixed_float16` (`mixed_bfloat16` on "
            "Ampere and newer; half the activation memory), or make the model smaller; check with `nvidia-smi` "
            "that no other process holds the GPU's memory; a GPU with more memory is the last resort."
        ),
        reports=(
            "github.com/tensorflow/tensorflow/issues/136",
            "github.com/tensorflow/tensorflow/issues/16768",
            "github.com/ikhlestov/vision_networks/issues/25",
        ),
        numbers=_gpu_oom_numbers,
    ),
    KnownError(
        name="tensorflow_libtpu_breaks_jax",
        pattern=re.compile(
            r"cloud_tpu_init failed|module 'libtpu' has no attribute|"
            r"TPU may be present on this machine, but either a TPU-enabled jaxlib or libtpu is not installed"
        ),
        cause=(
            "installing tensorflow-tpu replaced the libtpu that the runtime's preinstalled JAX uses with the "
            "(older) one TensorFlow needs, so JAX no longer finds the TPU and falls back to the CPU. Colab's TPU "
            "runtimes ship JAX, not TensorFlow, and say no tensorflow-tpu is compatible with current JAX."
        ),
        fix=(
            "TensorFlow (and so tpukit) still trains on the TPU: ignore the JAX warning in this runtime. To use "
            "JAX on the TPU, use a separate fresh runtime without tensorflow-tpu (`pip install -U 'jax[tpu]'`); "
            "do not mix both in one runtime."
        ),
        reports=(
            "github.com/jax-ml/jax/issues/29989",
            "github.com/googlecolab/colabtools/issues/5174",
            "github.com/googlecolab/colabtools/issues/5164",
        ),
    ),
    KnownError(
        name="tpu_api_client_missing",
        pattern=re.compile(r"Missing runtime dependency on the Google API client"),
        cause=(
            "a TPU given by name is looked up through the Cloud TPU API, whose client TensorFlow imports from "
            "google-api-python-client and oauth2client, which are not installed."
        ),
        fix=(
            "`pip install google-api-python-client oauth2client` (or "
            f"`pip install '{versions.tpukit_requirement('tpu,tpu-name')}'`), or, "
            "when the TPU is attached to this machine, connect with tpu='local'."
        ),
        reports=(
            "github.com/tensorflow/tensorflow/blob/v2.19.1/tensorflow/python/tpu/client/client.py",
        ),
    ),
    KnownError(
        name="jax_coordinator_port",
        pattern=re.compile(r"CoordinationService/RegisterTask"),
        cause=(
            "this process could not register with the cluster's coordinator (process 0, or the chief) before the "
            "deadline. With the jax engine on a Cloud TPU multi-host or multislice slice and JAX 0.8.1 or newer, "
            "the usual reason is the port: JAX's default "
            "coordinator port became 8482 (it was 8476), and the firewall rule Google Cloud creates for a TPU "
            "slice opens 8476, not 8482. Otherwise process 0 is not running, or is on another address."
        ),
        fix=(
            "set `JAX_COORDINATOR_PORT=8476` on every host before starting the same command on each (or open "
            "TCP 8482 between the hosts); check that process 0 runs and that every host names the same "
            "coordinator."
        ),
        reports=("github.com/jax-ml/jax/issues/35905",),
    ),
    KnownError(
        name="jax_array_abstractification",
        pattern=re.compile(r"Triggering `?__jax_array__\(\)`? during abstractification"),
        cause=(
            "JAX 0.8 and newer no longer convert objects with `__jax_array__` (a Keras variable, say) when they "
            "are passed to a jitted function; Keras before 3.12, and code that hands Keras or KerasHub objects "
            "to `jax.jit` directly, fail this way after a JAX upgrade."
        ),
        fix=(
            f'`{versions.keras_install_command()} "keras-hub>=0.32"` (KerasHub releases from 0.30 require '
            "Keras 3.15), then restart the runtime; in your own code, pass `jax.numpy.asarray(x)` (or the "
            "variable's `.value`) instead of the object. If KerasHub's own `generate()` raises it, the bug is "
            "open upstream (keras-hub#2479)."
        ),
        reports=(
            "github.com/keras-team/keras-hub/issues/2479",
            "github.com/keras-team/keras/pull/21719",
        ),
    ),
    KnownError(
        name="profile_plugin_on_colab",
        pattern=re.compile(r"No profile data was found"),
        cause=(
            "TensorBoard's Profile tab comes from a plugin; the old `tensorboard-plugin-profile` no longer works "
            "on current Colab runtimes, and the profile plugin is now the `xprof` package."
        ),
        fix=(
            "`pip install -U xprof` (`pip uninstall -y tensorboard-plugin-profile` first if it is installed), "
            "restart the runtime, then `%load_ext tensorboard` and `%tensorboard --logdir OUTPUT_DIR/logs`; "
            "tpukit writes a trace only for the steps `runtime.profile_steps` names."
        ),
        reports=(
            "github.com/jax-ml/scaling-book/pull/114",
            "github.com/openxla/xprof/issues/839",
        ),
    ),
    KnownError(
        name="worker_lost",
        pattern=re.compile(
            r"tasks are unhealthy \(stopped sending heartbeats\)|Collective ops is aborted by"
        ),
        cause=(
            "another worker of this multi-worker cluster stopped (crashed, was killed, or its host was preempted "
            "or lost): TensorFlow's coordination service saw its heartbeats stop (about 10 s after a "
            "SIGKILL) and aborted the collectives this worker was waiting in."
        ),
        fix=(
            "start the same command on every worker again (all of them, with the same recipe): they agree on the "
            "newest checkpoint every worker has and resume from it. Check the stopped worker's log for its cause."
        ),
        reports=(
            "github.com/tensorflow/docs/blob/master/site/en/tutorials/distribute/multi_worker_with_keras.ipynb",
            "github.com/tensorflow/tensorflow/blob/v2.21.0/tensorflow/core/protobuf/coordination_config.proto",
        ),
    ),
)


def _texts(error_or_text) -> list[str]:
    """The text of an error and of every error it was raised from (cause/context chain), or the text itself."""
    if isinstance(error_or_text, str):
        return [error_or_text]
    texts, seen, error = [], set(), error_or_text
    while isinstance(error, BaseException) and id(error) not in seen:
        seen.add(id(error))
        texts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return texts


def match(error_or_text) -> KnownError | None:
    """The `KnownError` an exception (or its chain) or a log text shows, or None."""
    for text in _texts(error_or_text):
        for known in KNOWN_ERRORS:
            if known.pattern.search(text):
                return known
    return None


def explain(error_or_text) -> str | None:
    """Cause and fix for a known environmental error, or None when the error is not one of `KNOWN_ERRORS`.

    Args:
        error_or_text: an exception (its `__cause__`/`__context__` chain is searched too) or text such as a log.
    """
    for text in _texts(error_or_text):
        for known in KNOWN_ERRORS:
            if known.pattern.search(text):
                return known.explanation(text)
    return None


def annotate(error: BaseException) -> str | None:
    """Adds the explanation to `error` as a note (shown under its traceback) and returns it; None if unknown.

    For entry points that re-raise: `except Exception as error: diagnose.annotate(error); raise`.
    """
    explanation = explain(error)
    note = f"tpukit: {explanation}"
    if explanation and hasattr(error, "add_note") and note not in getattr(error, "__notes__", ()):
        error.add_note(
            note
        )  # Python 3.11+; on 3.10 the caller's own message must carry the explanation
    return explanation
