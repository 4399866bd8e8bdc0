"""`tpukit check RECIPE --topology v5e-8`: the recipe's training step compiled by libtpu, the TPU compiler, on this
machine (no TPU needed), and what the compiler says of it per chip.

    tpukit check textfiles_char_lm --topology v5e-8 --set runtime.mesh.model=2 --json
    tpukit check cifar10_resnet --topology v6e-16 --price-per-chip-hour 2.7

The step is the jax engine's (`tpukit.engines.jax.tpu_compile`): the recipe's model, optimizer, loss and layouts,
the TPU precision default (`runtime.precision: auto` -> mixed_bfloat16), the global batch, on a `data` x `model`
mesh over the topology's chips. A recipe that trains on the tensorflow engine is compiled as the same Keras model on
the JAX path, and the report says so. The answer: whether it fits in HBM (libtpu's own out-of-memory figure when
not), bytes per chip, FLOPs and bytes accessed per step, the roofline bound at the chip's peak, the collectives.
When it does not fit, fixes that were each compiled and shown to fit: a smaller global batch, a larger model axis,
rematerialized decoder blocks (a KerasHub causal LM's `model.remat`), bfloat16 weights.

What a pass proves: the TPU compiler accepts the program and plans its memory per chip within the chip's HBM. Not
the speed on the chip, the input pipeline, host memory or the interconnect (docs/tpu.md).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.metadata
import logging
import math
from typing import Any

from tpukit.environment import presets, quiet
from tpukit.planner import hardware as performance
from tpukit.planner.topologies import Topology, topology
from tpukit.recipe import Recipe, RecipeError

logger = logging.getLogger("tpukit")

PROVES = (
    "Compiled by libtpu's TPU compiler on this machine, for abstract TPU devices: it proves the compiler accepts the "
    "step and plans its memory per chip as reported. It does not prove speed on the chip (the step time is a "
    "roofline bound), the input pipeline, host memory or the interconnect."
)
MAX_BATCH_COMPILES = 5  # compiles spent on the largest batch that fits
GIB = 2**30


@dataclasses.dataclass
class Attempt:
    """One configuration compiled: what was changed, the abstract step's facts and the compiler's answer."""

    changes: dict[str, Any]
    step: Any
    compiled: Any


def _variant(
    recipe: Recipe, batch: int | None = None, model: int | None = None, remat: bool = False
) -> Recipe:
    variant = copy.deepcopy(recipe)
    if batch is not None:
        variant.data.global_batch_size = batch
    if model is not None:
        variant.runtime.mesh = {"data": "auto", "model": model}
    if remat:
        variant.model.kwargs = {**variant.model.kwargs, "remat": True}
    return variant


def _can_remat(recipe: Recipe) -> bool:
    """A KerasHub causal LM whose decoder blocks are not rematerialized yet (`model.remat`)."""
    return recipe.model.name == "keras_hub_causal_lm" and not recipe.model.kwargs.get("remat")


def mesh_for(recipe: Recipe, chips: int) -> tuple[int, int]:
    """(data, model) over every chip: `runtime.mesh.model` must divide them; `data` is the rest."""
    model, asked = recipe.runtime.mesh["model"], recipe.runtime.mesh["data"]
    if asked != "auto" and asked * model != chips:
        raise RecipeError(
            f"{recipe.path}: runtime.mesh {{data: {asked}, model: {model}}} uses {asked * model} chips; the "
            f"topology has {chips}, and the check compiles for all of them. Fix: --set runtime.mesh.data=auto."
        )
    if chips % model:
        raise RecipeError(
            f"{recipe.path}: runtime.mesh.model={model} does not divide the topology's {chips} chips. Fix: --set "
            f"runtime.mesh.model to a divisor of {chips}."
        )
    data = chips // model
    if recipe.data.global_batch_size % data:
        good = max(data, recipe.data.global_batch_size // data * data)
        raise RecipeError(
            f"{recipe.path}: data.global_batch_size={recipe.data.global_batch_size} does not divide by the mesh's "
            f"data axis ({data} = {chips} chips / model {model}). Fix: --set data.global_batch_size={good}."
        )
    return data, model


def _tfds_missing(recipe: Recipe) -> str | None:
    """The TFDS dataset's name when the recipe reads one (`tfds`, `movielens`) that is not prepared here: the check
    must not download (a failed download retries for minutes)."""
    options = recipe.data.options
    if recipe.data.source == "tfds":
        name = options.get("name", "mnist")
    elif recipe.data.source == "movielens":  # TFDS' movielens/<variant> (tpukit.data.movielens)
        name = f"movielens/{options.get('variant', '100k-ratings')}"
    else:
        return None
    import tensorflow_datasets as tfds

    from tpukit.tools import offline

    try:
        # A half-downloaded folder's warning: the answer is "not prepared".
        with offline.quiet_tfds():
            prepared = tfds.builder(name, data_dir=options.get("data_dir")).is_prepared()
    except Exception:  # noqa: BLE001 - an unknown name: the source's own error comes later, with its fix
        return None
    return None if prepared else name


@contextlib.contextmanager
def _data_here(recipe: Recipe):
    """Yields a note when the data is not here and its shapes come from TFDS' feature spec instead
    (`tfds.testing.mock_data`, as `tpukit show` plans): the compiled step only needs the batch's shapes."""
    missing = _tfds_missing(recipe)
    if missing is None:
        yield None
        return
    import tensorflow_datasets as tfds

    from tpukit.tools import offline

    with offline.quiet_tfds(), tfds.testing.mock_data(num_examples=64):
        yield (
            f"tfds {missing!r} is not downloaded here: the batch's shapes and the labels' task come from its "
            "feature spec (tfds.testing.mock_data), the step count from the catalogue's split size"
        )


def total_steps(recipe: Recipe, examples: int | None) -> int | None:
    """The recipe's training steps (epochs x steps per epoch, from `train.steps_per_epoch` or the training split's
    `examples`), None when neither is known."""
    if recipe.train.steps_per_epoch:
        return recipe.train.epochs * recipe.train.steps_per_epoch
    if examples is None:
        return None
    return recipe.train.epochs * max(1, examples // recipe.data.global_batch_size)


def training_examples(recipe: Recipe, mocked: bool = False) -> int | None:
    """The training split's examples, None when they cannot be counted here (`mocked`: the catalogue's count of a
    TFDS dataset that is not downloaded)."""
    from tpukit import task

    try:
        if mocked:
            from tpukit.data.tfds import published_split_size

            return published_split_size(
                recipe.data.options.get("name", "mnist"), recipe.data.train_split
            )
        return task.count_examples(recipe, recipe.data.train_split)
    except Exception as error:  # noqa: BLE001 - the time estimate is a report: it must not stop the check
        if not isinstance(error, presets.PresetError):  # else the build says it, once
            logger.info("tpukit: the training examples could not be counted (%s)", error)
        return None


class _Compiler:
    """Compiles variants of one recipe for one topology, keeping the abstract devices and the policy."""

    def __init__(self, recipe: Recipe, tpu: Topology, steps: int | None):
        from tpukit.engines.jax import tpu_compile

        self.lib = tpu_compile
        self.recipe = recipe
        self.tpu = tpu
        self.steps = steps
        with quiet.start_up():  # libtpu's start-up lines, where JAX's backends did not start yet
            self.devices = tpu_compile.topology_devices(tpu)
        self.policy = performance.choose_precision(recipe.runtime.precision, "jax_tpu").value

    def step(self, recipe: Recipe, policy: str | None = None):
        data, model = mesh_for(recipe, self.tpu.chips)
        return self.lib.abstract_step(
            recipe, self.devices, data, model, policy or self.policy, self.steps or 1000
        )

    def attempt(self, changes: dict, recipe: Recipe, policy=None) -> Attempt:
        step = self.step(recipe, policy)
        logger.info(
            "tpukit: compiling for %s: %s",
            self.tpu.name,
            ", ".join(f"{k}={v}" for k, v in changes.items()) or "as is",
        )
        return Attempt(changes, step, self.lib.compile_step(step))


def _changes_text(changes: dict) -> str:
    """The `--set` flags of the recipe keys changed (keys without a dot are notes, not recipe keys)."""
    return " ".join(f"--set {k}={v}" for k, v in changes.items() if "." in k and " " not in k)


def _state_bytes(step) -> int:
    return step.weight_bytes + step.optimizer_bytes


def _headroom_guess(compiler: _Compiler, first: Attempt, data: int) -> int:
    """The global batch that 90% of the HBM left beyond the state would hold if what the step needs beyond its state
    (activations) grew in proportion to the batch; a multiple of the data axis (possibly 0)."""
    batch, state = compiler.recipe.data.global_batch_size, _state_bytes(first.step)
    beyond = max(first.compiled.total_bytes - state, 1)
    return int(batch * 0.9 * (_usable(compiler, first) - state) / beyond) // data * data


def _between(low: int, high: int, data: int) -> int | None:
    """The next batch to compile between `low` (fits) and `high` (does not): their geometric mean (the batches that
    fit can span orders of magnitude), a multiple of the data axis; None once they are within 1/8 of each other (or
    of the data axis) or no multiple lies between."""
    middle = int(math.sqrt(low * high)) // data * data
    if middle <= low or (high - low) <= max(data, low // 8):
        return None
    return middle


def _largest_batch(compiler: _Compiler, first: Attempt, data: int) -> Attempt | None:
    """The largest global batch (a multiple of the data axis) that compiles and fits, or None. The first guess
    scales the batch by what is left of HBM after the state over what the step needed beyond it (activations grow
    with the batch); then a geometric bisection between the largest batch that fit and the smallest that did not,
    until they are within 1/8 of each other. At most MAX_BATCH_COMPILES compiles."""
    recipe, hbm = compiler.recipe, _usable(compiler, first)
    batch, state = recipe.data.global_batch_size, _state_bytes(first.step)
    if state >= hbm or batch <= data:
        return None

    def attempt(size: int) -> Attempt:
        return compiler.attempt({"data.global_batch_size": size}, _variant(recipe, batch=size))

    guess = min(max(_headroom_guess(compiler, first, data), data), batch - data)
    best, low, high = None, 0, batch
    tried = attempt(guess)
    if tried.compiled.fits:
        best, low = tried, guess
    else:
        high = guess
        if guess > data:
            tried = attempt(data)
            if not tried.compiled.fits:
                return None
            best, low = tried, data
    compiles = 2 if low == data and high == guess else 1
    for _ in range(MAX_BATCH_COMPILES - compiles):
        middle = _between(low, high, data)
        if middle is None:
            break
        tried = attempt(middle)
        if tried.compiled.fits:
            best, low = tried, middle
        else:
            high = middle
    if best is not None:
        best.changes["smallest that did not fit"] = high
    return best


def largest_batch_above(
    compiler: _Compiler, first: Attempt, data: int, examples: int | None = None
) -> dict:
    """When the recipe's step fits: the largest global batch (a multiple of the data axis, at most the training
    split's `examples` where they are known: a larger batch is refused by the plan) found to compile and fit,
    searched upward. The first guess scales the batch by what is left of HBM over what the step needs beyond its
    state (activations grow with the batch); a guess that fits is doubled, one that does not bisected (geometric),
    until the two are within 1/8 of each other or MAX_BATCH_COMPILES compiles are spent. Returns the batch, its bytes
    per chip, the smallest batch found not to fit (None: none was; `limit` then says what stopped the search) and
    the compiles spent."""
    recipe = compiler.recipe
    batch = recipe.data.global_batch_size
    ceiling = examples // data * data if examples else None
    low, high, best, compiles, limit = batch, None, first, 0, None
    size = max(_headroom_guess(compiler, first, data), batch + data)
    while compiles < MAX_BATCH_COMPILES:
        if ceiling is not None and size >= ceiling:
            if low >= ceiling:
                limit = f"the training split's {examples} examples"
                break
            size = ceiling
        try:  # (compiler.attempt logs the compile)
            tried = compiler.attempt({"data.global_batch_size": size}, _variant(recipe, batch=size))
        except Exception as error:  # noqa: BLE001 - a batch that cannot be compiled is not offered
            logger.info("tpukit: data.global_batch_size=%d: %s", size, _first_line(error))
            high = size
            break
        compiles += 1
        if tried.compiled.fits:
            best, low = tried, size
        else:
            high = size
        size = low * 2 if high is None else _between(low, high, data)
        if size is None:
            break
    if high is None and limit is None:
        limit = f"{compiles} compiles"
    return {
        "global_batch_size": low,
        "per_chip_bytes": best.compiled.total_bytes,
        "smallest_that_did_not_fit": high,
        "limit": limit,
        "compiles": compiles,
    }


def _usable(compiler: _Compiler, first: Attempt) -> float:
    """HBM a step may use per chip: libtpu's own figure when it ran out of memory (15.75 GiB on v5e, whose docs say
    16 GB), else the chip's from the topology table."""
    return first.compiled.available_bytes or compiler.tpu.hbm_bytes_per_chip


def find_fixes(compiler: _Compiler, first: Attempt, trains_on_jax: bool = True) -> list[dict]:
    """Configurations near the recipe's that were compiled and fit: the largest global batch, the smallest larger
    model axis, rematerialized decoder blocks (a KerasHub causal LM; with `runtime.engine=jax` where the recipe
    would train on TensorFlow, which refuses remat), bfloat16 weights. Each is tried only where the state it keeps
    per chip can fit at all (checked from the shapes before compiling)."""
    recipe, hbm = compiler.recipe, _usable(compiler, first)
    fixes: list[dict] = []

    def record(attempt: Attempt, how: str) -> None:
        fixes.append(
            {
                "set": {k: v for k, v in attempt.changes.items() if "." in k and " " not in k},
                "how": how,
                "per_chip_bytes": attempt.compiled.total_bytes,
                "fits": attempt.compiled.fits,
            }
        )

    data, model = mesh_for(recipe, compiler.tpu.chips)
    try:
        best = _largest_batch(compiler, first, data)
    except Exception as error:  # noqa: BLE001 - a fix that cannot be compiled is not offered
        logger.info("tpukit: no batch fix (%s: %s)", type(error).__name__, _first_line(error))
        best = None
    if best is not None:
        record(
            best,
            f"the largest global batch found to fit (compiled); "
            f"{best.changes['smallest that did not fit']} did not",
        )
    for larger in range(model + 1, compiler.tpu.chips + 1):
        if compiler.tpu.chips % larger or larger % model:
            continue
        variant = _variant(recipe, model=larger)
        try:
            step = compiler.step(variant)
        except Exception as error:  # noqa: BLE001 - e.g. a layout that does not divide by this axis
            logger.info("tpukit: runtime.mesh.model=%d: %s", larger, _first_line(error))
            continue
        if _state_bytes(step) >= min(hbm, _state_bytes(first.step)):
            continue  # cannot fit, or nothing more is split on this axis (no layout for these weights)
        logger.info(
            "tpukit: compiling for %s: --set runtime.mesh.model=%d", compiler.tpu.name, larger
        )
        tried = Attempt({"runtime.mesh.model": larger}, step, compiler.lib.compile_step(step))
        if tried.compiled.fits:
            record(tried, "the smallest model axis that fits (weights split over more chips)")
            break
    # Rematerialized decoder blocks keep the state and drop most activations: tried where the state fits.
    if _can_remat(recipe) and _state_bytes(first.step) < hbm:
        changes = {"model.remat": "true", **({} if trains_on_jax else {"runtime.engine": "jax"})}
        try:
            tried = compiler.attempt(changes, _variant(recipe, remat=True))
        except Exception as error:  # noqa: BLE001 - a fix that cannot be built is not offered
            logger.info("tpukit: no remat fix (%s: %s)", type(error).__name__, _first_line(error))
            tried = None
        if tried is not None and tried.compiled.fits:
            record(
                tried,
                "rematerialized decoder blocks: the backward pass recomputes each block's activations (about "
                "one more forward pass of compute; the same losses)",
            )
    # bfloat16 weights halve the state (weights and optimizer slots), not the activations: tried where that can fit.
    halved = first.compiled.total_bytes - _state_bytes(first.step) / 2
    if compiler.policy != "bfloat16" and _state_bytes(first.step) / 2 < hbm and halved < hbm:
        tried = compiler.attempt({"dtype policy": "bfloat16"}, recipe, policy="bfloat16")
        if tried.compiled.fits:
            record(
                tried,
                "bfloat16 weights: build the model under keras.config.set_dtype_policy('bfloat16') (variables, "
                "optimizer slots and math in bfloat16; updates lose precision against float32 weights). A recipe "
                "has no setting for it: runtime.precision keeps float32 variables",
            )
    return fixes


def _is_data_error(error: BaseException) -> bool:
    """TensorFlow's file-system and I/O errors (a gs:// path with no network, a missing file), which the input
    pipeline raises while the batch's shapes are read."""
    import tensorflow as tf

    return isinstance(
        error,
        (
            OSError,
            tf.errors.NotFoundError,
            tf.errors.FailedPreconditionError,
            tf.errors.PermissionDeniedError,
            tf.errors.UnavailableError,
        ),
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines() or [type(error).__name__])[0][:300]


def _libtpu_version() -> str | None:
    try:
        return importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return None


# What only a step that compiled has (null in the report of one that did not fit).
_COMPILED_KEYS = (
    "flops_per_step",
    "bytes_accessed_per_step",
    "step_seconds_bound",
    "bound",
    "mfu_upper_bound",
    "collectives",
    "gathered_weights",
)


def report(
    recipe: Recipe,
    tpu: Topology,
    first: Attempt,
    steps: int | None,
    engine_note: str,
    price_per_chip_hour: float | None,
    device_kind: str,
) -> dict:
    """The report's keys (README of `tpukit check --topology`): per chip, from libtpu's answer."""
    compiled, step = first.compiled, first.step
    data, model = mesh_for(recipe, tpu.chips)
    result: dict[str, Any] = {
        "recipe": recipe.path,
        "topology": tpu.name,
        "device_kind": device_kind,
        "chips": tpu.chips,
        "hosts": tpu.hosts,
        "mesh": {"data": data, "model": model},
        "global_batch_size": recipe.data.global_batch_size,
        "precision": step.policy,
        "parameters": step.parameters,
        "variables_split": step.variables_split,
        "unaligned_weights": getattr(step, "unaligned", []),
        "fits": compiled.fits,
        "hbm_bytes_per_chip": tpu.hbm_bytes_per_chip,
        "per_chip_bytes": {
            "weights": step.weight_bytes,
            "optimizer": step.optimizer_bytes,
            "temporaries": compiled.temporary_bytes if compiled.fits else None,
            # what the compiler holds as the step's inputs: the state and the batch, as laid out per chip
            "arguments": compiled.argument_bytes if compiled.fits else None,
            "total": compiled.total_bytes,
        },
        "compiler": {"libtpu": _libtpu_version(), "seconds": round(compiled.seconds, 2)},
        "engine": engine_note,
        "note": PROVES,
    }
    if not compiled.fits:
        result["out_of_memory"] = compiled.error
        result["compiler"]["available_bytes"] = compiled.available_bytes
        result.update(
            dict.fromkeys(_COMPILED_KEYS), steps=steps
        )  # the same keys: nothing compiled to read
        return result
    flops, accessed = compiled.flops, compiled.bytes_accessed
    compute = flops / tpu.peak_bf16_flops_per_chip if flops else None
    memory = accessed / tpu.hbm_bytes_per_second_per_chip if accessed else None
    bound_seconds = (
        max(t for t in (compute, memory) if t is not None) if (compute or memory) else None
    )
    result.update(
        flops_per_step=flops,
        bytes_accessed_per_step=accessed,
        step_seconds_bound=bound_seconds,
        bound=None
        if bound_seconds is None
        else ("compute" if (compute or 0) >= (memory or 0) else "memory"),
        mfu_upper_bound=None if not (compute and bound_seconds) else compute / bound_seconds,
        collectives=compiled.collectives,
        gathered_weights=compiled.gathered_weights,
        steps=steps,
    )
    if steps and bound_seconds:
        hours = steps * bound_seconds / 3600
        result["hours_bound"] = hours
        result["chip_hours_bound"] = hours * tpu.chips
        if price_per_chip_hour is not None:
            result["cost_bound"] = hours * tpu.chips * price_per_chip_hour
    return result


def _without_weight_reads(recipe: Recipe) -> tuple[Recipe, str | None]:
    """The recipe with `model.load_weights: false` where its builder reads pretrained weights (a KerasHub preset):
    the compiled step needs the shapes alone, and reading a 7B preset's weights would allocate them on the host."""
    import inspect

    from tpukit.models import MODELS

    builder = MODELS.get(recipe.model.name)
    if builder is None or "load_weights" not in inspect.signature(builder).parameters:
        return recipe, None
    if recipe.model.kwargs.get("load_weights") is False:
        return (
            recipe,
            "weights: not read (model.load_weights is false); shapes from the preset's config",
        )
    recipe = copy.deepcopy(recipe)
    recipe.model.kwargs["load_weights"] = False
    return recipe, "weights: not read (shapes from the preset's config.json; the step is the same)"


def _engine_note(requested: str) -> str:
    """ "jax", or why a recipe another engine trains is compiled on the jax engine's path (`auto`: the engine a run
    on that TPU would take, from what is installed here)."""
    from tpukit.environment import engine_choice

    if engine_choice.for_tpu(requested).engine == "jax":
        return "jax"
    return (
        f"the recipe trains on runtime.engine={requested}; compiled as the same Keras model on the jax engine's "
        "path, the one JAX-only TPU runtimes (Colab, Kaggle) train on"
    )


def check_topology(
    recipe: Recipe,
    topology_name: str,
    *,
    price_per_chip_hour: float | None = None,
    fixes: bool = True,
    largest_batch: bool = False,
) -> dict:
    """Compiles `recipe`'s training step for `topology_name` (e.g. "v5e-8") with libtpu and returns the report
    (`fits`, bytes per chip, FLOPs, roofline bound, collectives; `fixes` when it does not fit; with `largest_batch`,
    `largest_batch` when it fits: the largest global batch found to fit, `largest_batch_above`).

    Needs Keras' JAX backend (`tpukit.use_engine("jax")` before Keras is imported; the command line sets it) and
    libtpu (`pip install "tpukit[tpu-check]"`).

    Raises:
        RecipeError: an unknown topology, a mesh or batch that does not fit the topology's chips, a bad recipe.
    """
    from tpukit import engines

    tpu = topology(topology_name)
    if price_per_chip_hour is not None and not (
        price_per_chip_hour >= 0 and math.isfinite(price_per_chip_hour)
    ):
        raise RecipeError(
            f"--price-per-chip-hour must be a number >= 0; received {price_per_chip_hour!r}. Fix: e.g. 1.2."
        )
    engines.get("jax")  # the jax engine's checks (versions, the Keras backend), as a run makes them
    recipe.validate()
    engine_note = _engine_note(recipe.runtime.engine)
    if recipe.runtime.engine != "jax":
        recipe = copy.deepcopy(recipe)
        recipe.runtime.engine = "jax"
    mesh_for(recipe, tpu.chips)  # refuse before anything is built
    recipe, weights_note = _without_weight_reads(recipe)
    with _data_here(recipe) as data_note:
        # Counted once, for the step count and the largest batch (a pass over the data where it is not mocked).
        counting = largest_batch or not recipe.train.steps_per_epoch
        examples = training_examples(recipe, data_note is not None) if counting else None
        steps = total_steps(recipe, examples)
        compiler = _Compiler(recipe, tpu, steps)
        first = _first_attempt(compiler, recipe, tpu)
        result = report(
            recipe,
            tpu,
            first,
            steps,
            engine_note,
            price_per_chip_hour,
            compiler.devices[0].device_kind,
        )
        if data_note:
            result["data"] = data_note
        if weights_note:
            result["weights"] = weights_note
        if not first.compiled.fits and fixes:
            result["fixes"] = find_fixes(compiler, first, trains_on_jax=engine_note == "jax")
        if first.compiled.fits and largest_batch:
            result["largest_batch"] = largest_batch_above(
                compiler, first, mesh_for(recipe, tpu.chips)[0], examples
            )
    return result


def _first_attempt(compiler: _Compiler, recipe: Recipe, tpu: Topology) -> Attempt:
    """The recipe's own step compiled; what stops it becomes a RecipeError naming its cause: the model's preset,
    the data, or the model's code on the JAX path."""
    try:
        return compiler.attempt({}, recipe)
    except RecipeError:
        raise
    except presets.PresetError as error:  # the model's preset, not the data or the compiler
        raise RecipeError(f"{recipe.path}: {error}") from None
    except Exception as error:  # noqa: BLE001 - every failure becomes a message (exit 2), no traceback
        if not _is_data_error(error):
            raise RecipeError(
                f"{recipe.path}: the training step could not be built or compiled for {tpu.name} on the jax "
                f"engine's path ({type(error).__name__}: {_first_line(error)}). A model that calls TensorFlow "
                "ops (tf.* in a Lambda or a layer's call) cannot be compiled this way. Fix: write those ops "
                "with keras.ops, or train it with runtime.engine=tensorflow (not checked by --topology); "
                "set TPUKIT_VERBOSE=1 and JAX_TRACEBACK_FILTERING=off to see where it failed."
            ) from error
        raise RecipeError(
            f"{recipe.path}: the data could not be read here ({_first_line(error)}); the check needs the "
            "shapes of one batch. Fix: run it where the data is, or point the data settings at a local copy "
            "with the same shapes (e.g. a few files)."
        ) from None


# ---- text -------------------------------------------------------------------------------------------------------


def size(num_bytes: float | None) -> str:
    if num_bytes is None:
        return "?"
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"


def _count(value: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g}{unit}"
    return str(value)


def _seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _largest_batch_line(largest: dict) -> str:
    above = largest["smallest_that_did_not_fit"]
    stop = (
        f"{above} did not fit"
        if above
        else f"no larger batch was tried (the limit: {largest['limit']})"
    )
    return (
        f"  largest global batch found to fit (compiled): --set data.global_batch_size="
        f"{largest['global_batch_size']}, {size(largest['per_chip_bytes'])} per chip; {stop}."
    )


def format_text(result: dict) -> str:
    per_chip, hbm = result["per_chip_bytes"], result["hbm_bytes_per_chip"]
    mesh = result["mesh"]
    lines = [
        f"tpukit check: {result['recipe']} on {result['topology']} ({result['chips']} chip(s) of "
        f"{result['device_kind']}, {result['hosts']} host(s), {size(hbm)} HBM each), compiled by libtpu "
        f"{result['compiler']['libtpu']} in {result['compiler']['seconds']:.1f} s",
        f"  mesh data {mesh['data']} x model {mesh['model']}, global batch {result['global_batch_size']} "
        f"({result['global_batch_size'] // mesh['data']} per data shard), {result['precision']}, "
        f"{_count(result['parameters'])} parameters, {result['variables_split']} variable(s) split on the "
        "model axis",
    ]
    if result["engine"] != "jax":
        lines.append(f"  note: {result['engine']}")
    if result.get("data"):
        lines.append(f"  note: {result['data']}")
    if result.get("weights"):
        lines.append(f"  note: {result['weights']}")
    lines.append(
        f"  per chip: weights {size(per_chip['weights'])}, optimizer {size(per_chip['optimizer'])}, temporaries "
        f"{size(per_chip['temporaries'])}, total {size(per_chip['total'])} of {size(hbm)} "
        f"({per_chip['total'] / hbm:.0%})"
    )
    if result["fits"]:
        flops, accessed = result.get("flops_per_step"), result.get("bytes_accessed_per_step")
        if result.get("step_seconds_bound") and flops and accessed:
            lines.append(
                f"  per step per chip: {flops / 1e9:,.3g} GFLOP, {size(accessed)} accessed; at least "
                f"{_seconds(result['step_seconds_bound'])} at the chip's peak ({result['bound']}-bound), MFU at "
                f"most {result['mfu_upper_bound']:.0%}"
            )
        if result.get("collectives"):
            lines.append(
                "  collectives per step: "
                + ", ".join(
                    f"{kind} {c['count']} ({size(c['bytes'])})"
                    for kind, c in result["collectives"].items()
                )
            )
        if result.get("hours_bound") is not None:
            cost = (
                f", {result['cost_bound']:,.2f} at the price given"
                if "cost_bound" in result
                else ""
            )
            lines.append(
                f"  {result['steps']:,} steps: at least {_seconds(result['hours_bound'] * 3600)}, "
                f"{result['chip_hours_bound']:.3g} chip-hours{cost}"
            )
        unaligned = result.get("unaligned_weights") or []
        if unaligned:
            lines.append(
                f"  [note] {len(unaligned)} weight(s) with dimensions that are not multiples of 128 (e.g. "
                f"{', '.join(unaligned[:3])}): the 128 x 128 matrix units are padded, part of each matmul wasted"
            )
        for path in result.get("gathered_weights", [])[:5]:
            lines.append(
                f"  [warn] {path} is split over the model axis, and XLA gathers it whole every step (an all-gather "
                "of its full shape): the layout saves memory but not traffic. Fix: split it on the dimension its "
                "matmul contracts or keeps (runtime.layout)."
            )
        lines.append(f"FITS: {size(per_chip['total'])} per chip of {size(hbm)}.")
        if result.get("largest_batch"):
            lines.append(_largest_batch_line(result["largest_batch"]))
    else:
        lines.extend(_does_not_fit_lines(result))
    lines.append(result["note"])
    return "\n".join(lines)


def _does_not_fit_lines(result: dict) -> list[str]:
    """libtpu's out-of-memory line, the verdict and the fixes that were compiled and fit."""
    per_chip, hbm = result["per_chip_bytes"], result["hbm_bytes_per_chip"]
    lines = [
        f"  libtpu: {result['out_of_memory']}",
        f"DOES NOT FIT: needs {size(per_chip['total'])} per chip; libtpu has "
        f"{size(result['compiler'].get('available_bytes'))} for the program on a {result['device_kind']} "
        f"chip (Google's docs: {size(hbm)} of HBM).",
    ]
    fixes = result.get("fixes")
    if fixes:
        lines.append("  each of these was compiled and fits:")
        for fix in fixes:
            flags = _changes_text(fix["set"]) or "(in your model code)"
            lines.append(f"    {flags}: {size(fix['per_chip_bytes'])} per chip; {fix['how']}")
    elif fixes is not None:
        lines.append(
            "  nothing near this configuration fits (a smaller batch, a larger model axis, bfloat16 "
            "weights): a larger topology, or a smaller model."
        )
    return lines


__all__ = [
    "check_topology",
    "find_fixes",
    "format_text",
    "largest_batch_above",
    "mesh_for",
    "report",
]
