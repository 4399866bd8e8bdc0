"""Known environmental TPU errors, translated into their cause and the fix.

The failures TPU users report most in the TensorFlow, Keras, JAX and Colab trackers are not bugs in their model
but in their environment: the wrong TensorFlow build, the wrong way to find the TPU, files the TPU cannot see, a
program too big for the TPU's memory. Each `KnownError` below matches one of them by the text TensorFlow (or JAX)
prints, and cites the public threads where it was reported and diagnosed.

    >>> explain(ValueError("Please provide a TPU Name to connect to."))
    'Cause: ... Fix: ...'

`explain` is used by `python -m tpukit.doctor`, by `tpukit.connect` (TPUConnectionError messages) and, through
`annotate`, by tpukit's entry points, which add the explanation to the error they re-raise.
"""

from __future__ import annotations

import dataclasses
import re

from tpukit.environment import versions


@dataclasses.dataclass(frozen=True)
class KnownError:
    """One known error: how to recognise it, why it happens, what to do, and where it was reported."""

    name: str
    pattern: re.Pattern
    cause: str
    fix: str
    reports: tuple[str, ...]

    def explanation(self, text: str) -> str:
        fix = self.fix
        if self.name == "hbm_out_of_memory":
            used = re.search(r"Used ([\d.]+\s*[KMGT]?i?B?) of ([\d.]+\s*[KMGT]?i?B?) hbm", text)
            if used:
                fix = (
                    f"the program needs {used.group(1)} of the {used.group(2)} HBM per TPU core. "
                    + fix
                )
        return f"Cause: {self.cause} Fix: {fix} (Reported in: {', '.join(self.reports)}.)"


def _tpu_install() -> str:
    combination = versions.pinned_tpu()
    return (
        f"`pip uninstall -y tensorflow` then `{combination.install_command()}` (or "
        '`pip install "tpukit[tpu] @ git+<tpukit repository URL>"`), then restart the runtime'
    )


KNOWN_ERRORS: tuple[KnownError, ...] = (
    KnownError(
        name="cpu_tensorflow_on_tpu",
        pattern=re.compile(
            r"No OpKernel was registered to support Op '(ConfigureDistributedTPU|TPU\w*)'"
        ),
        cause=(
            "the installed TensorFlow is the CPU/GPU wheel (`tensorflow`), which has no TPU kernels, so it cannot "
            "initialize or run the TPU (its 'Registered devices' list has no TPU)."
        ),
        fix=f"install the TPU build of TensorFlow: {_tpu_install()}.",
        reports=(
            "github.com/tensorflow/tensorflow/issues/52149",
            "github.com/tensorflow/tensorflow/issues/28395",
            "github.com/google-research/google-research/issues/651",
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
            "slice needs its TPU name instead (and `pip install 'tpukit[tpu-name]'`)."
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
        pattern=re.compile(r"Ran out of memory in memory space hbm"),
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
        ),
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
            "`pip install google-api-python-client oauth2client` (or `pip install 'tpukit[tpu,tpu-name]'`), or, "
            "when the TPU is attached to this machine, connect with tpu='local'."
        ),
        reports=(
            "github.com/tensorflow/tensorflow/blob/v2.19.1/tensorflow/python/tpu/client/client.py",
        ),
    ),
    KnownError(
        name="worker_lost",
        pattern=re.compile(
            r"tasks are unhealthy \(stopped sending heartbeats\)|Collective ops is aborted by"
        ),
        cause=(
            "another worker of this multi-worker cluster stopped (crashed, was killed, or its host was preempted "
            "or lost): TensorFlow's coordination service saw its heartbeats stop (measured here: about 10 s after a "
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
