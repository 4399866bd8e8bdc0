"""What the notebooks decide before training, as library code: run small or full, where outputs go, which recipe
this runtime can read, with which engine's hardware.

    ENGINE = tpukit.notebook.start("auto")                          # first, before anything imports Keras
    strategy = tpukit.notebook.connect(ENGINE)                      # None with the jax engine
    small = tpukit.notebook.choose_small(SMALL, strategy)           # None: small exactly when no TPU or GPU
    name, recipe = tpukit.notebook.first_available({"mnist_cnn": [...], "digits_cnn": [...]}, strategy, ENGINE)
    output_dir = tpukit.notebook.output_dir(OUTPUT_ROOT, name, engine=ENGINE)   # Drive / gs:// survive a disconnect

With the jax engine there is no strategy: `strategy` is None, and the engine finds its devices (and the mesh of
`runtime.mesh`) when it plans.
"""

from __future__ import annotations

import contextlib
import logging
import os

from tpukit.engines.tensorflow.checkpoint import newest_checkpoint_step
from tpukit.environment import engine_choice
from tpukit.recipe import Recipe, RecipeError, load_recipe
from tpukit.runner import make_plan as plan

logger = logging.getLogger("tpukit")

DRIVE_MOUNT = "/content/drive"


def connect(engine: str = "tensorflow"):
    """The strategy the notebook passes on: `tpukit.connect()` with the TensorFlow engine; None with the jax
    engine (it connects when it plans; connecting TensorFlow to the TPU would take it from JAX). "auto": the
    engine `runtime.engine: auto` resolves to (`tpukit.environment.engine_choice`)."""
    if engine == engine_choice.AUTO:
        engine = engine_choice.resolve(engine).engine
    if engine == "jax":
        import jax

        devices = jax.devices()
        print(
            f"jax engine: {len(devices)} {devices[0].platform.upper()} device(s) ({devices[0].device_kind})"
        )
        return None
    if engine != "tensorflow":
        raise ValueError(f"engine must be 'tensorflow' or 'jax'; received engine={engine!r}.")
    from tpukit.engines.tensorflow.strategy import connect as tensorflow_connect

    return tensorflow_connect()


def scope(strategy):
    """`strategy.scope()`, or (None: the jax engine) a scope that does nothing: Keras on JAX places variables
    without one."""
    return contextlib.nullcontext() if strategy is None else strategy.scope()


def has_accelerator(strategy) -> bool:
    """True when `strategy` trains on a TPU or this process sees a GPU; `strategy` None (the jax engine): when
    JAX's default backend is a TPU or a GPU."""
    if strategy is None:
        import jax

        return jax.default_backend() in ("tpu", "gpu")
    import tensorflow as tf

    from tpukit.engines.tensorflow.strategy import kind_of

    return kind_of(strategy) == "tpu" or bool(tf.config.list_logical_devices("GPU"))


def choose_small(small: bool | None, strategy) -> bool:
    """`small` as given, or (None) small exactly when `strategy` has no TPU and there is no GPU."""
    if small is None:
        small = not has_accelerator(strategy)
        why = "no TPU or GPU found" if small else "an accelerator was found"
        print(f"SMALL = {small} ({why}; set SMALL = True or False to choose)")
    elif not isinstance(small, bool):
        raise ValueError(f"SMALL must be True, False or None (auto); received SMALL={small!r}.")
    return small


def _newest_step(engine: str, checkpoint_dir: str) -> int:
    """The step of the newest checkpoint of `engine`'s format in `checkpoint_dir` (0: none)."""
    if engine == "jax":
        from tpukit.engines.jax.checkpoint import newest_checkpoint_step as newest_jax_step

        return newest_jax_step(checkpoint_dir)
    return newest_checkpoint_step(checkpoint_dir)


def output_dir(root: str, name: str, colab=None, engine: str = "tensorflow") -> str:
    """`root/name`, with Google Drive mounted or Colab authenticated for a `gs://` bucket first.

    Args:
        root: "" for `runs/` on this runtime's disk (lost when a Colab runtime disconnects); a folder under
            /content/drive (Google Drive, mounted here when it is not) or a `gs://bucket/folder` (on Colab the
            user is authenticated first; a TPU VM uses its service account). With a persistent root, rerunning
            the notebook after a disconnect resumes from the newest checkpoint there.
        name: the run's folder name, e.g. the recipe name.
        colab: the `google.colab` module (tests pass a fake); default: imported when present.
        engine: whose checkpoint format the resume step is read from ("tensorflow" or "jax"; one engine cannot
            resume the other's checkpoints).
    """
    if not isinstance(root, str):
        raise ValueError(
            f"OUTPUT_ROOT must be a string; received OUTPUT_ROOT={root!r}. Fix: '' (this runtime's disk), "
            "'/content/drive/MyDrive/tpukit' (Google Drive) or 'gs://BUCKET/tpukit'."
        )
    if root.startswith(DRIVE_MOUNT) or root.startswith("gs://"):
        if colab is None:
            try:
                from google import colab
            except ImportError:
                colab = None
        if (
            colab is not None
            and root.startswith(DRIVE_MOUNT)
            and not os.path.isdir(os.path.join(DRIVE_MOUNT, "MyDrive"))
        ):
            colab.drive.mount(DRIVE_MOUNT)
        if colab is not None and root.startswith("gs://"):
            colab.auth.authenticate_user()
    path = root.rstrip("/") + "/" + name if root else os.path.join("runs", name)
    engine = engine_choice.resolve(engine).engine if engine == engine_choice.AUTO else engine
    step = _newest_step(engine, path.rstrip("/") + "/checkpoints")
    persistent = "persistent" if root.startswith((DRIVE_MOUNT, "gs://")) else "this runtime's disk"
    resume = f"; resumes from step {step}" if step else ""
    print(f"outputs: {path} ({persistent}{resume})")
    return path


# TFDS keeps its datasets' metadata and public copies (`try_gcs`) on Google Cloud Storage. Where this host does not
# answer, an unprepared TFDS dataset cannot be fetched, and TFDS's own retries (10, with backoff) take minutes to
# say so.
TFDS_HOST = "https://storage.googleapis.com"
NETWORK_TIMEOUT_S = 5


def cannot_download(recipe: Recipe) -> str | None:
    """Why `recipe`'s TFDS data cannot be read here, found in seconds: it is not prepared in its data_dir and
    `TFDS_HOST` does not answer (proxies as the environment sets them); None when it may be readable."""
    import urllib.error
    import urllib.request

    from tpukit.data.tfds import prepared_here

    name = recipe.data.options.get("name")
    if recipe.data.source != "tfds" or not name:
        return None
    if prepared_here(name, recipe.data.options.get("data_dir")):
        return None
    try:
        request = urllib.request.Request(TFDS_HOST, method="HEAD")
        urllib.request.urlopen(request, timeout=NETWORK_TIMEOUT_S).close()
    except urllib.error.HTTPError:
        return None  # it answered
    except (OSError, ValueError) as error:
        return (
            f"TFDS would download {name!r}, and {TFDS_HOST} did not answer in {NETWORK_TIMEOUT_S} s: "
            f"{type(error).__name__}: {error}"
        )
    return None


def first_available(
    candidates: dict[str, list[str]], strategy=None, engine: str | None = None
) -> tuple[str, Recipe]:
    """The first recipe, in order, whose data this runtime can read, with its overrides applied.

    Each candidate is planned with `tpukit.plan` (which counts its examples, so TFDS downloads or reads its data
    here). A `RecipeError` (a mistyped override, a batch that does not divide) is raised, not skipped: only data
    that cannot be read (`cannot_download`: a TFDS dataset not prepared here, in seconds where the network does not
    answer; any error while planning) moves on to the next candidate.

    Args:
        candidates: {recipe name or path: `--set`-style overrides}, in order of preference.
        strategy: passed to `tpukit.plan` (default: `tpukit.connect()`; None with the jax engine).
        engine: when given, `runtime.engine=ENGINE` is added to every candidate's overrides.
    """
    if not candidates:
        raise ValueError("first_available: no candidate recipes given.")
    failures = []
    for name, overrides in candidates.items():
        overrides = [*overrides, f"runtime.engine={engine}"] if engine else list(overrides)
        recipe = load_recipe(name, list(overrides))
        try:
            reason = cannot_download(recipe)
            if reason is None:
                plan(recipe, strategy)
        except RecipeError:
            raise
        except Exception as error:  # noqa: BLE001 - any data failure means "try the next recipe"
            reason = f"{type(error).__name__}: {str(error)[:300]}"
        if reason is not None:
            failures.append(f"{name}: {reason}")
            print(f"{name} cannot read its data here ({reason}); trying the next recipe.")
            continue
        print(f"recipe: {name} {' '.join(overrides)}".rstrip())
        return name, recipe
    raise RuntimeError("none of the recipes can read its data here: " + "; ".join(failures))
