"""Export a trained model twice: `model.keras` (to resume, fine-tune or inspect in Keras) and a TensorFlow
SavedModel with a `serve` endpoint (for TF Serving, Vertex AI, or `tf.saved_model.load` without tpukit or Keras).

The SavedModel's `serve` endpoint (also exported as the `serving_default` signature that TF Serving requires)
takes float32 inputs with any batch size and returns float32 outputs, whatever the training dtype policy: under
`mixed_bfloat16` the model computes in bfloat16 inside, and a serving client never sees a bfloat16 tensor.

Remote TPU Nodes (a `grpc://` TPU address, e.g. the legacy Colab TPU) run file operations on the TPU host, which
cannot see this machine's disk (`UnimplementedError: File system scheme '[local]' not implemented`). Pass
`io_device="/job:localhost"` (see `io_device_for`) to write and read SavedModels from this machine instead, as
`tf.saved_model.SaveOptions(experimental_io_device=...)` / `LoadOptions` do. `model.keras` needs no option: Keras 3
fetches the weights into this process and writes the zip file here.

Outputs never lie (docs/trainer.md, "Outputs"): a KerasHub task, trained as a plain `keras.Model` over its layers, is
saved as itself (`exported_model`); a model Keras cannot rebuild from a config (a subclassed model without
`get_config`) is found before training (`skipped_outputs`) and saved as `model.weights.h5`; and an output that
fails is reported (`OutputsMissing`), never passed over: the run then fails with its metrics written.

A KerasHub causal LM that generates text gets `preset/` (LoRA merged) and, where KerasHub exports its family,
Hugging Face `safetensors/` instead of the SavedModel (`hub_skipped`, `export_hub_outputs`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os

from tpukit import rundir

KERAS_FILENAME = "model.keras"
WEIGHTS_FILENAME = (
    "model" + rundir.WEIGHTS_SUFFIX
)  # instead of model.keras, for a model without a config
SAVED_MODEL_DIRNAME = "saved_model"
SAVED_MODEL_WHAT = "the SavedModel"
SERVING_ENDPOINT = (
    "serve"  # the name `keras.Model.export` gives it too (keras.src.export.saved_model)
)

# Why an output cannot take a write, by errno: (what it means, the fix). TensorFlow's and h5py's errors carry only
# the text (`os.strerror`), which names the errno as well.
OUTPUT_ERRNOS = {
    errno.ENOSPC: ("the disk is full", "free space on that disk"),
    errno.EDQUOT: ("the disk quota is used up", "free space within the quota or have it raised"),
    errno.EROFS: ("the file system is read-only", "make it writable"),
    errno.EACCES: ("this user may not write there", "make the directory writable for this user"),
    errno.EPERM: ("this user may not write there", "make the directory writable for this user"),
}


class ExportWriteError(OSError):
    """An export (`what`: "model.keras", "the SavedModel", "best.keras") that could not be written at `path`
    because the output takes no writes (`OUTPUT_ERRNOS`): a failure of the run, which the engines report with the
    checkpoint kept (`explained`) and the same command re-exports. An OSError with that errno and path."""

    def __init__(self, what: str, path: str, code: int, detail: str):
        super().__init__(code, os.strerror(code), path)
        self.what, self.path, self.code, self.detail = what, path, code, detail
        meaning, _ = OUTPUT_ERRNOS[code]
        self.message = (
            f"{what} could not be written to {path}: {os.strerror(code)} ({errno.errorcode[code]}: {meaning}; "
            f"{detail})"
        )

    def __str__(self) -> str:
        return self.message

    def explained(self, newest_step: int, checkpoint_dir: str) -> str:
        """The run's one-paragraph message: what failed and where, the checkpoint kept, the fix."""
        _, fix = OUTPUT_ERRNOS[self.code]
        kept = (
            f"The trained checkpoint is kept (step {newest_step} in {checkpoint_dir})"
            if newest_step
            else f"No checkpoint was lost ({checkpoint_dir})"
        )
        return (
            f"{self}. {kept}. Fix: {fix} (or pass another --output_dir holding a copy of the run), then run the "
            "same command: it goes on from that checkpoint, and a finished training is not repeated, only "
            "exported again."
        )

    def reason(self, earlier: str = "") -> str:
        """What failed and where, `earlier` (`earlier_output`), and the fix: an entry of `outputs_missing`."""
        _, fix = OUTPUT_ERRNOS[self.code]
        return (
            f"{self}{earlier}. Fix: {fix} (or pass another --output_dir holding a copy of the run)"
        )

    def to_line(self) -> str:
        """One short line that `from_line` reads back (the jax engine's exporting process prints it)."""
        return LINE_MARK + json.dumps([self.code, self.detail[:200]])

    @classmethod
    def from_line(cls, line: str, what: str, path: str) -> ExportWriteError | None:
        """The error of `what` at `path` that an exporting process's output `line` names: its `to_line`, or any
        text naming a failed write; None for another failure (a model that cannot be exported)."""
        _, marked, rest = line.partition(LINE_MARK)
        if marked:
            with contextlib.suppress(ValueError, TypeError, KeyError):
                code, detail = json.loads(rest)
                return cls(what, path, code, detail)
        code = _output_errno(None, line)
        return None if code is None else cls(what, path, code, " ".join(line.split())[:200])


LINE_MARK = "tpukit: export write failed: "
# The line `main` prints when the `.keras` file it was given does not load: the file is what failed.
LOAD_MARK = "tpukit: model.keras does not load: "


# An output's key in `metrics.json` (`exported`, `outputs_missing`, `outputs_skipped`) -> what it is called in messages.
OUTPUT_NAMES = {
    "keras": KERAS_FILENAME,
    "weights": WEIGHTS_FILENAME,
    "saved_model": SAVED_MODEL_WHAT,
    "preset": "the KerasHub preset",
    "safetensors": "the safetensors export",
}


# An output's key -> its file (or directory) name in the output directory.
OUTPUT_FILES = {
    "keras": KERAS_FILENAME,
    "weights": WEIGHTS_FILENAME,
    "saved_model": SAVED_MODEL_DIRNAME,
    "preset": "preset",
    "safetensors": "safetensors",
}


def earlier_output(name: str, output_dir: str) -> str:
    """For an output this export could not write: that a file at its path is an earlier export's (outputs are
    written under a temporary name and renamed, so a failure leaves the earlier one intact), or ""."""
    import tensorflow as tf

    filename = OUTPUT_FILES.get(name)
    if filename is None:
        return ""
    try:
        there = tf.io.gfile.exists(os.path.join(output_dir, filename))
    except Exception:  # noqa: BLE001 - an output directory that cannot be read says nothing more
        return ""
    shown = filename + ("/" if name in ("saved_model", "preset", "safetensors") else "")
    return f"; the {shown} there is an earlier export's, not this run's" if there else ""


class BrokenOutput(RuntimeError):
    """An output written by this export that does not load (the jax engine's exporting process failed to load
    `model.keras`): the file at its path is this run's, not an earlier one."""


class OutputsMissing(Exception):
    """Outputs of an export that could not be written: `exported` (name -> path) are those that were, `missing`
    (name -> the error) those that were not. The engines record them on the session (`session.exporting`), and the
    run fails after writing its metrics (`tpukit.runner.ExportFailedError`)."""

    def __init__(self, exported: dict[str, str], missing: dict[str, BaseException]):
        super().__init__(", ".join(f"{name}: {error}" for name, error in missing.items()))
        self.exported, self.missing = exported, missing


def exported_model(model):
    """What `model.keras` holds for a model `tpukit.task.build_model` made: the KerasHub task (any model whose
    class overrides `fit` or `compile`) it trained as a plain `keras.Model` over the same layers and weights
    (`tpukit.task._plain`), so the file loads as that task (its `generate()`, its preprocessor); else `model`."""
    original = getattr(model, "_tpukit_original", None)
    return model if original is None else original.model


def unserializable(model) -> str | None:
    """Why `model.keras` cannot hold `model`, or None: Keras rebuilds a model from its config, and this one has
    none (a subclassed model whose `__init__` takes an argument Keras cannot serialize and that defines no
    `get_config`), or one that does not serialize, or one that does not rebuild (a layer whose `get_config` omits
    an argument its `__init__` requires: the file would be written, and would not load). Serializes the config as
    `model.save` does and rebuilds the model from it without its weights (`rebuild_failure`); nothing is written."""
    import keras

    try:
        config = keras.saving.serialize_keras_object(model)
        json.dumps(config)
    except NotImplementedError:
        return (
            f"model.keras cannot hold {type(model).__name__}: its __init__ takes arguments Keras cannot "
            "serialize and it defines no get_config, so Keras could not rebuild it (Fix: define get_config, and "
            "from_config if needed, on the model class)"
        )
    except (TypeError, ValueError) as error:
        return (
            f"model.keras cannot hold {type(model).__name__}: its config does not serialize "
            f"({type(error).__name__}: {' '.join(str(error).split())[:200]}; Fix: make get_config return "
            "plain values)"
        )
    failure = rebuild_failure(config, model_classes(model))
    if failure is not None:
        return (
            f"model.keras cannot hold {type(model).__name__}: Keras could not rebuild it from its config, so the "
            f"file would not load ({failure}; Fix: make each get_config return every argument its __init__ "
            "requires, or define from_config)"
        )
    return None


def model_classes(model) -> dict:
    """The classes of `model` and of every layer in it, by the name its config records: what loading its file in
    this process finds (registered, or passed as `custom_objects` by a script that defines them locally)."""
    import keras

    from tpukit.engines.keras import keras_private

    classes = keras_private.layer_classes(model) | {type(model)}
    return {keras.saving.get_registered_name(cls): cls for cls in classes}


def rebuild_failure(config: dict, classes: dict | None = None) -> str | None:
    """Why Keras cannot rebuild a model from its serialized `config` (`keras.saving.serialize_keras_object`), as
    loading `model.keras` does, or None. Rebuilt without weights (its variables hold no values:
    `keras_private.variables_left_unmade`) and with no distribution, the classes of the config found where this
    process has them (`classes`, name -> class: `model_classes`; and `own_classes`). Its compile config is left
    out, as `load_model(compile=False)` does. A model
    whose rebuild makes a variable from a value (a KerasHub task's own optimizer) is not judged here (None): on the
    jax engine the exporting process's load of the file judges it (`LOAD_MARK`)."""
    import keras

    from tpukit.engines.keras import keras_private

    config = {key: value for key, value in config.items() if key != "compile_config"}
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        with (
            keras.saving.custom_object_scope({**own_classes(config), **(classes or {})}),
            keras_private.variables_left_unmade(),
        ):
            keras.saving.deserialize_keras_object(config)
    except Exception as error:  # noqa: BLE001 - whatever stops the rebuild stops loading the file
        text = innermost(error)
        if keras_private.STATELESS_VARIABLE in text:
            # A variable made from a value, not an initializer (a KerasHub task compiles itself in `__init__`,
            # and its optimizer's step counter is one): it cannot be left unmade, so the rebuild says nothing.
            return None
        return text[:300]
    finally:
        keras.distribution.set_distribution(distribution)
    return None


def innermost(error: BaseException) -> str:
    """ "Type: text" of the error at the root of `error`'s chain, on one line: Keras' deserializing wrapper hides
    the layer's own error ("missing 1 required positional argument: 'factor'")."""
    while (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def own_classes(config) -> dict:
    """The classes `config` names outside Keras' packages (the user's own, registered or not), from the modules
    this process has imported: what loading the file finds by registration, or by `custom_objects`, or in the jax
    engine's exporting process by importing their module (`tpukit.engines.jax.saved_model`)."""
    import sys

    found: dict = {}

    def walk(node) -> None:
        if isinstance(node, dict):
            module, name = node.get("module"), node.get("class_name")
            if (
                isinstance(module, str)
                and isinstance(name, str)
                and module.split(".")[0] != "keras"
                and module in sys.modules
            ):
                value = getattr(sys.modules[module], name, None)
                if isinstance(value, type):
                    found[node.get("registered_name") or name] = value
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(config)
    return found


def script_classes(model) -> list[str]:
    """The classes in `model`'s config defined in the script that runs (module `__main__`, or none recorded):
    another process that loads `model.keras` cannot import them."""
    import keras

    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            name = node.get("class_name")
            if isinstance(name, str) and "module" in node and node["module"] in (None, "__main__"):
                found.append(name)
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(keras.saving.serialize_keras_object(model))
    return sorted(set(found))


def skipped_outputs(model, *, saved_model_from_keras: bool = False) -> dict[str, str]:
    """The outputs `model` (the trained model; its `exported_model` is saved) cannot have, known before training:
    name ("keras", "saved_model") -> why, with the fix. A model without a config gets `model.weights.h5` instead of
    `model.keras` (and no `best.keras`). `saved_model_from_keras`: the SavedModel is exported by another process
    from `model.keras` (the jax engine), so it also needs the file and every class importable there."""
    skipped = dict(hub_skipped(model))
    target = exported_model(model)
    why = unserializable(target)
    if why is not None:
        skipped["keras"] = f"{why}; its weights are saved as {WEIGHTS_FILENAME} instead"
        if saved_model_from_keras:
            skipped["saved_model"] = (
                "the SavedModel is exported from model.keras by a TensorFlow-backend process, and there is none "
                "(Fix: the one model.keras names, or train with runtime.engine=tensorflow, which exports the "
                "SavedModel in the training process)"
            )
        return skipped
    script = script_classes(target) if saved_model_from_keras else []
    if script:
        skipped["saved_model"] = (
            f"the SavedModel is exported from model.keras by a TensorFlow-backend process, which cannot import "
            f"{', '.join(script)} defined in the script that runs (Fix: define the model's own layers in a module "
            "of yours that the script imports, or train with runtime.engine=tensorflow, which exports in the "
            "training process)"
        )
    return skipped


def output_write_error(error: BaseException, what: str, path: str) -> ExportWriteError | None:
    """`error` as an ExportWriteError when it means the output takes no writes (an errno of `OUTPUT_ERRNOS`, or
    its text in a TensorFlow or Keras error), else None."""
    if isinstance(error, ExportWriteError):
        return error
    text = " ".join(str(error).split())
    code = _output_errno(getattr(error, "errno", None), text)
    if code is None:
        return None
    return ExportWriteError(what, path, code, f"{type(error).__name__}: {text[:200]}")


def _output_errno(code: int | None, text: str) -> int | None:
    if code in OUTPUT_ERRNOS:
        return code
    return next((c for c in OUTPUT_ERRNOS if os.strerror(c) in text), None)


@contextlib.contextmanager
def writing(what: str, path: str):
    """Raises an ExportWriteError for an error inside that means the output takes no writes."""
    try:
        yield
    except Exception as error:
        failure = output_write_error(error, what, path)
        if failure is None or failure is error:
            raise
        raise failure from error


def io_device_for(strategy, directory: str | None = None) -> str | None:
    """ "/job:localhost" for a TPUStrategy on a remote TPU Node (grpc:// master), else None (local IO works).

    `tpukit.runner` asks once and passes the answer to checkpoints (`checkpoint.io_options`), exports and logs.

    Args:
        strategy: any `tf.distribute.Strategy`.
        directory: where the export goes; a `gs://` directory needs no routing (the TPU host reaches GCS).
    """
    if directory is not None and directory.startswith("gs://"):
        return None
    resolver = getattr(strategy, "cluster_resolver", None)
    master = getattr(resolver, "master", None)
    if not callable(master):
        return None
    try:
        address = master()
    except Exception:  # noqa: BLE001 - a resolver that cannot say is treated as local
        return None
    address = address.decode() if isinstance(address, bytes) else (address or "")
    return "/job:localhost" if address.startswith("grpc://") else None


def _serving_signature(model, features=None):
    import tensorflow as tf

    inputs = getattr(model, "inputs", None)
    if not inputs and features is not None:
        # A subclassed model declares no inputs: the data's features (batch dimension left open) are what it takes.
        return [features]
    if not inputs:
        raise ValueError(
            f"export_model: model {getattr(model, 'name', model)!r} has no symbolic inputs, so its serving "
            "signature is unknown. Fix: build it as a functional model (keras.Input -> ... -> keras.Model)."
        )
    specs = [
        tf.TensorSpec((None, *tensor.shape[1:]), tensor.dtype, name=_input_name(tensor, i))
        for i, tensor in enumerate(inputs)
    ]
    # The endpoint takes one positional argument: the input tensor, a dict of inputs by name for a model built on
    # a dict of keras.Inputs, or else the list of inputs in `model.inputs` order.
    if keyed_inputs(model):
        return [{spec.name: spec for spec in specs}]
    return [specs[0]] if len(specs) == 1 else [specs]


def keyed_inputs(model) -> bool:
    """True for a functional model built on a dict of `keras.Input`s (it is called with a dict by input name)."""
    try:
        return isinstance(model.input, dict)
    except (AttributeError, ValueError):  # a Sequential model never called: one input
        return False


def _input_name(tensor, index: int) -> str:
    name = getattr(tensor, "name", None) or f"input_{index}"
    return name.split(":")[0].replace("/", "_")


def export_model(
    model, output_dir: str, *, io_device: str | None = None, features=None
) -> dict[str, str]:
    """Writes `output_dir/model.keras` (`model.weights.h5` for a model without a config) and the SavedModel
    `output_dir/saved_model/`; returns their paths. Stops at the first failure (`export_outputs` tries each).

    Args:
        model: a functional `keras.Model` (trained; any dtype policy; built under any strategy). Its
            `exported_model` is what the `.keras` file holds; the SavedModel serves `model` itself.
        output_dir: the directory to write into (created if missing). A `gs://` path works for the SavedModel
            from anywhere, and for `model.keras` where TensorFlow's file system can write it.
        io_device: where SavedModel file operations run, e.g. "/job:localhost" on a remote TPU Node to write to
            this machine's disk (`io_device_for(strategy)` picks it). None: the default device.
        features: `tf.TensorSpec`s (a structure, batch dimension None) of what the model takes: the serving
            signature of a subclassed model, which declares no inputs (`tpukit.task.spec_of(model).features`).

    Returns:
        {"keras": path of model.keras (or "weights": path of model.weights.h5), "saved_model": its directory}.

    Raises:
        ValueError: the model has no symbolic inputs (a subclassed model never called on a `keras.Input`).
        ExportWriteError: an output takes no writes (a full disk, a read-only or quota-exceeded directory).
    """
    signature = _serving_signature(model, features)  # fails before anything is written
    try:
        return export_outputs(
            model, output_dir, io_device=io_device, signature=signature, each=False
        )
    except OutputsMissing as incomplete:
        raise next(iter(incomplete.missing.values())) from None


def export_outputs(
    model,
    output_dir: str,
    *,
    io_device: str | None = None,
    features=None,
    signature=None,
    each: bool = True,
) -> dict[str, str]:
    """`export_model`'s outputs, each tried whatever became of the other (`each=False`: up to the first failure):
    the run's export. Raises OutputsMissing naming each output not written and its error (an ExportWriteError for
    an output that takes no writes; a ValueError for a model with no symbolic inputs and no `features`), with the
    paths of those that were."""
    target = exported_model(model)
    exported: dict[str, str] = {}
    missing: dict[str, BaseException] = {}

    def attempt(name: str, write) -> None:
        if missing and not each:
            return
        try:
            exported[name] = write()
        except Exception as error:  # noqa: BLE001 - reported as a missing output, the others still written
            missing[name] = error

    if unserializable(target) is None:
        attempt("keras", lambda: save_keras(target, output_dir))
    else:
        attempt("weights", lambda: save_weights(target, output_dir))
    skipped = hub_skipped(model)
    if "saved_model" not in skipped:
        attempt(
            "saved_model",
            lambda: export_saved_model(
                model, output_dir, io_device=io_device, features=features, signature=signature
            ),
        )
    if text_causal_lm(model) is not None and not (missing and not each):
        written, failed = export_hub_outputs(model, output_dir, skipped)
        exported.update(written)
        missing.update(failed)
    if missing:
        raise OutputsMissing(exported, missing)
    return exported


def save_weights(model, output_dir: str) -> str:
    """Writes `output_dir/model.weights.h5` whole (`model.save_weights`; `model.load_weights` reads it into the
    same model built by the user's code) and returns its path: the output of a model without a config."""
    import tensorflow as tf

    path = os.path.join(output_dir, WEIGHTS_FILENAME)
    temporary = rundir.temporary_name(path)
    with writing(WEIGHTS_FILENAME, path), _removed_on_failure(temporary):
        tf.io.gfile.makedirs(output_dir)
        model.save_weights(temporary)
        _renamed(temporary, path)
    return path


def save_keras(model, output_dir: str) -> str:
    """Writes `output_dir/model.keras` whole and returns its path. Raises ExportWriteError when the output takes
    no writes (a full disk, a read-only or quota-exceeded directory)."""
    import tensorflow as tf

    keras_path = os.path.join(output_dir, KERAS_FILENAME)
    # Each output is written whole under a temporary name, then renamed into place: a SIGKILL or a full disk during
    # an export leaves the previous export (or none), never a truncated model.keras or a half-written SavedModel.
    temporary = rundir.temporary_name(keras_path)
    with writing(KERAS_FILENAME, keras_path), _removed_on_failure(temporary):
        tf.io.gfile.makedirs(output_dir)  # local paths and gs:// alike
        _save_keras_file(model, temporary)
        _renamed(temporary, keras_path)
    return keras_path


def _renamed(source: str, target: str) -> None:
    """Renames `source` (a temporary) over `target`. A failure names `target`, the output the user looks for,
    not the temporary, which `_removed_on_failure` then deletes (TensorFlow's error names the source only)."""
    import tensorflow as tf

    try:
        tf.io.gfile.rename(source, target, overwrite=True)
    except Exception as error:  # noqa: BLE001 - raised again, naming the output
        text = " ".join(str(error).split()).replace(source, target)
        failure = OSError(f"could not be put in place at {target}: {text}")
        failure.errno = getattr(error, "errno", None)
        raise failure from error


def _save_keras_file(model, path: str) -> None:
    model.save(path)


def export_saved_model(
    model, output_dir: str, *, io_device: str | None = None, features=None, signature=None
) -> str:
    """Writes the SavedModel `output_dir/saved_model/` (whole: a temporary name, then a rename); returns its path."""
    import keras
    import tensorflow as tf

    if signature is None:
        signature = _serving_signature(model, features)
    saved_model_path = os.path.join(output_dir, SAVED_MODEL_DIRNAME)

    def serve(inputs):
        outputs = model(inputs, training=False)
        # float32 out under any policy: serving clients (TF Serving's JSON API, numpy) expect float32.
        return tf.nest.map_structure(
            lambda t: (
                tf.cast(t, tf.float32) if t.dtype.is_floating and t.dtype != tf.float32 else t
            ),
            outputs,
        )

    options = tf.saved_model.SaveOptions(experimental_io_device=io_device) if io_device else None
    temporary = rundir.temporary_name(saved_model_path)
    with writing(SAVED_MODEL_WHAT, saved_model_path), _removed_on_failure(temporary):
        tf.io.gfile.makedirs(output_dir)
        try:
            _write_serving_module(model, serve, signature, temporary, options)
        except (AssertionError, ValueError) as error:
            if "untracked" not in str(error).lower():
                raise
            # The model uses a resource outside its variables (a lookup table): Keras' ExportArchive tracks
            # every resource its layers hold.
            if tf.io.gfile.exists(temporary):
                tf.io.gfile.rmtree(temporary)
            archive = keras.export.ExportArchive()
            archive.track(model)
            archive.add_endpoint(SERVING_ENDPOINT, serve, input_signature=signature)
            archive.write_out(temporary, options=options, verbose=False)
        _replace_directory(temporary, saved_model_path)
    return saved_model_path


def _write_serving_module(model, serve, signature, path: str, options) -> None:
    """The SavedModel of a root object holding the model's variables (`variables`, `trainable_variables`,
    `non_trainable_variables`) and the `serve` endpoint (also the `serving_default` signature), as
    `keras.export.ExportArchive` writes it, without saving the tree of Keras layers, which is several times
    slower to write (docs/performance.md). Raises AssertionError/ValueError naming an untracked resource when the model
    captures one that is not a variable."""
    import tensorflow as tf

    from tpukit.engines.keras import keras_private

    # The attributes ExportArchive's root has: `tf.saved_model.load(path).trainable_variables` works as before.
    module = keras_private.saved_model_root()
    module.variables = list(model.variables)
    module.trainable_variables = list(model.trainable_variables)
    module.non_trainable_variables = list(model.non_trainable_variables)
    module.serve = tf.function(serve, input_signature=signature, autograph=False)
    signatures = {SERVING_ENDPOINT: module.serve, "serving_default": module.serve}
    tf.saved_model.save(module, path, signatures=signatures, options=options)


@contextlib.contextmanager
def _removed_on_failure(temporary: str):
    """A write that fails (a full disk, an error in the model's code) leaves no temporary behind."""
    import tensorflow as tf

    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            if tf.io.gfile.isdir(temporary):
                tf.io.gfile.rmtree(temporary)
            elif tf.io.gfile.exists(temporary):
                tf.io.gfile.remove(temporary)
        raise


def _replace_directory(source: str, target: str) -> None:
    """Puts directory `source` in place of `target`. A directory cannot be renamed over a non-empty one, so the old
    one is first moved aside (under a temporary name, which the next run in the directory clears if this process is
    killed between the two renames), then removed once the new one is in place."""
    import tensorflow as tf

    aside = None
    if tf.io.gfile.exists(target):
        aside = rundir.temporary_name(target) + "-old"
        tf.io.gfile.rename(target, aside)
    try:
        _renamed(source, target)
    except OSError:
        if aside is not None:
            with contextlib.suppress(Exception):
                tf.io.gfile.rename(aside, target)  # the earlier one back in place
        raise
    if aside is not None:
        tf.io.gfile.rmtree(aside)


def load_serving(path: str, *, io_device: str | None = None, endpoint: str = SERVING_ENDPOINT):
    """Loads an exported SavedModel and returns its serving function: `outputs = serve(inputs)`.

    Needs neither tpukit nor the model's Python code: only TensorFlow.

    Args:
        path: the SavedModel directory (`export_model(...)["saved_model"]`).
        io_device: where file operations run, e.g. "/job:localhost" on a remote TPU Node. None: the default.
        endpoint: the endpoint to return; `export_model` writes "serve".

    Raises:
        ValueError: the SavedModel has no such endpoint; the message lists the ones it has.
    """
    import tensorflow as tf

    options = tf.saved_model.LoadOptions(experimental_io_device=io_device) if io_device else None
    loaded = tf.saved_model.load(path, options=options)
    function = getattr(loaded, endpoint, None)
    if function is None:
        available = sorted(loaded.signatures.keys())
        raise ValueError(
            f"load_serving: the SavedModel at {path!r} has no endpoint {endpoint!r}; received endpoint={endpoint!r}, "
            f"its signatures are {available}. Fix: pass one of those, or re-export with tpukit.engines.keras.export.export_model."
        )

    def serve(*args, **kwargs):
        # Closing over `loaded` keeps it alive: the function's variables are owned by it and would be freed
        # with it.
        return function(*args, **kwargs)

    serve.loaded = loaded  # the whole restored object, for its other endpoints and variables
    return serve


# -- A KerasHub causal LM: its preset and its Hugging Face safetensors -------------------------------------------------

PRESET_DIRNAME = "preset"
SAFETENSORS_DIRNAME = "safetensors"

# `architectures` of a Hugging Face config.json, by its `model_type`: vLLM and KerasHub's own Hugging Face loader
# pick the model class from it, and KerasHub 0.32's exporter does not write it.
HF_ARCHITECTURES = {
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
}


def text_causal_lm(model):
    """The KerasHub `CausalLM` task (with its preprocessor: it generates text) that `model` is or was made from
    (`exported_model`), or None. Its outputs: `model.keras`, a preset and, where KerasHub exports the family, a
    Hugging Face safetensors directory; not the SavedModel (`hub_skipped`)."""
    import sys

    if "keras_hub" not in sys.modules:
        return None  # nothing imported KerasHub: no model of it
    import keras_hub

    target = exported_model(model)
    if isinstance(target, keras_hub.models.CausalLM) and target.preprocessor is not None:
        return target
    return None


def hf_export_unsupported(task) -> str | None:
    """Why KerasHub cannot export `task` to Hugging Face safetensors (its family has no exporter), or None.
    Reads KerasHub's exporter tables (`keras_hub.src.utils.transformers.export.hf_exporter`, 0.32: the backbone and
    tokenizer class names it knows), the check `CausalLM.export_to_transformers` makes only once it writes."""
    try:
        from keras_hub.src.utils.transformers.export import hf_exporter
    except ImportError as error:
        return f"this KerasHub has no Hugging Face exporter ({error})"
    backbone = type(task.backbone).__name__
    tokenizer = type(task.preprocessor.tokenizer).__name__
    if backbone not in hf_exporter.MODEL_EXPORTERS or backbone not in hf_exporter.MODEL_CONFIGS:
        known = ", ".join(sorted(hf_exporter.MODEL_EXPORTERS))
        return f"KerasHub exports no {backbone} to Hugging Face safetensors (it exports {known})"
    if tokenizer not in hf_exporter.MODEL_TOKENIZER_CONFIGS:
        return f"KerasHub exports no {tokenizer} to Hugging Face format"
    return None


def hub_skipped(model) -> dict[str, str]:
    """The outputs a text-generating KerasHub causal LM (`text_causal_lm`) does not get, known before training:
    the SavedModel (a logits function of token ids: it does not generate, what the model is served for, and writing
    it takes another copy of the weights on the host), and safetensors where KerasHub has no exporter."""
    task = text_causal_lm(model)
    if task is None:
        return {}
    skipped = {
        "saved_model": (
            f"a KerasHub {type(task).__name__} is served by generating text, which a SavedModel of its logits "
            "does not do: serve preset/ (keras_hub.models.CausalLM.from_preset) or safetensors/ (vLLM, "
            "Hugging Face) instead"
        )
    }
    unsupported = hf_export_unsupported(task)
    if unsupported is not None:
        skipped["safetensors"] = (
            f"{unsupported}; preset/ and model.keras hold the trained model (Fix: a family KerasHub exports, "
            "or convert preset/ yourself)"
        )
    return skipped


def export_hub_outputs(model, output_dir: str, skipped: dict | None = None):
    """Writes the preset (`output_dir/preset/`: `save_to_preset`, LoRA merged into the kernels, as Keras' Dense and
    EinsumDense `save_own_variables` write them) and, unless `skipped` names it, the Hugging Face safetensors
    (`output_dir/safetensors/`, made from the preset reloaded on the CPU: the live model, its LoRA and its layout
    are left as they are). Each is written whole (a temporary name, then a rename). Returns (exported: name ->
    path, missing: name -> error)."""
    task = text_causal_lm(model)
    exported: dict[str, str] = {}
    missing: dict[str, BaseException] = {}
    try:
        exported["preset"] = save_preset(task, output_dir)
    except Exception as error:  # noqa: BLE001 - a missing output: the run fails after its report
        missing["preset"] = error
    if "safetensors" not in (skipped or {}):
        if "preset" in missing:
            missing["safetensors"] = RuntimeError("it is made from preset/, which is missing")
        else:
            try:
                exported["safetensors"] = save_safetensors(exported["preset"], output_dir)
            except Exception as error:  # noqa: BLE001 - a missing output: the run fails after its report
                missing["safetensors"] = error
    return exported, missing


def save_preset(task, output_dir: str) -> str:
    """`output_dir/preset/`: the task's `save_to_preset` (loads with `keras_hub.models.CausalLM.from_preset`);
    LoRA is merged into the kernels it saves and the reloaded model has none. Returns its path."""
    import tensorflow as tf

    path = os.path.join(output_dir, PRESET_DIRNAME)
    temporary = rundir.temporary_name(path)
    with writing(OUTPUT_NAMES["preset"], path), _removed_on_failure(temporary):
        tf.io.gfile.makedirs(temporary)
        task.save_to_preset(temporary)
        _replace_directory(temporary, path)
    return path


def save_safetensors(preset: str, output_dir: str) -> str:
    """`output_dir/safetensors/`: the Hugging Face Transformers layout (config.json with its `architectures`,
    model.safetensors, the tokenizer) that KerasHub's `export_to_transformers` writes for the model in `preset`,
    reloaded here on the CPU with no distribution; `from_preset` of the directory (KerasHub's Hugging Face loader)
    and vLLM read it. Returns its path."""
    import keras
    import keras_hub

    path = os.path.join(output_dir, SAFETENSORS_DIRNAME)
    temporary = rundir.temporary_name(path)
    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        with keras.device("cpu:0"):
            task = keras_hub.models.CausalLM.from_preset(preset)
        with writing(OUTPUT_NAMES["safetensors"], path), _removed_on_failure(temporary):
            task.export_to_transformers(temporary)
            _fixed_key_value_heads(task.backbone, temporary)
            config_path = os.path.join(temporary, "config.json")
            with open(config_path) as file:
                config = json.load(file)
            if config.get("model_type") == "qwen2":
                # Qwen 2's split rules only: GPT-2's vocab.json and merges.txt (also exported) split text another way.
                _qwen_tokenizer_json(task.preprocessor.tokenizer, temporary)
            completed = _completed_config(task.backbone, config)
            if completed != config:
                with open(config_path, "w") as file:
                    json.dump(completed, file, indent=2)
            _replace_directory(temporary, path)
    finally:
        keras.distribution.set_distribution(distribution)
    return path


def _completed_config(backbone, config: dict) -> dict:
    """config.json with what KerasHub 0.32's exporter leaves out: `architectures` (vLLM and KerasHub's own Hugging
    Face loader pick the model class by it) and, for Qwen 2, `use_sliding_window` and `sliding_window`, which
    KerasHub's loader reads (`convert_qwen.py`: a KeyError without them) and Transformers defaults."""
    completed = dict(config)
    architecture = HF_ARCHITECTURES.get(config.get("model_type"))
    if architecture and not config.get("architectures"):
        completed["architectures"] = [architecture]
    if config.get("model_type") == "qwen2":
        completed.setdefault("use_sliding_window", bool(backbone.use_sliding_window_attention))
        completed.setdefault("sliding_window", int(backbone.sliding_window_size))
    return completed


# The pre-tokenizer pattern of Qwen 2's tokenizer.json (Transformers' `Qwen2Converter`, convert_slow_tokenizer.py).
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def _qwen_tokenizer_json(tokenizer, directory: str) -> None:
    """tokenizer.json beside the vocab.json and merges.txt that KerasHub 0.32 exports for Qwen 2's byte-level BPE:
    KerasHub's own Hugging Face loader reads only tokenizer.json (`convert_qwen.convert_tokenizer`), vLLM and
    Transformers prefer it. Written as Transformers' `Qwen2Converter` writes it, with the `tokenizers` library (a
    KerasHub dependency)."""
    if os.path.isfile(os.path.join(directory, "tokenizer.json")):
        return
    import tokenizers
    from tokenizers import decoders, normalizers, pre_tokenizers, processors

    with open(os.path.join(directory, "vocab.json"), encoding="utf-8") as file:
        vocabulary = json.load(file)
    with open(os.path.join(directory, "merges.txt"), encoding="utf-8") as file:
        lines = [line.rstrip("\n") for line in file]
    merges = [tuple(line.split(" ")) for line in lines if line and not line.startswith("#version")]
    built = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab=vocabulary,
            merges=merges,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    built.normalizer = normalizers.NFC()
    built.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(tokenizers.Regex(QWEN_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    built.decoder = decoders.ByteLevel()
    built.post_processor = processors.ByteLevel(trim_offsets=False)
    # Every token KerasHub keeps whole (`unsplittable_tokens`: its loader makes them of tokenizer.json's
    # added_tokens, e.g. Qwen 2.5's <|im_start|> and <|im_end|>), not only the end token.
    special = sorted(
        set(getattr(tokenizer, "special_tokens", None) or [])
        | set(getattr(tokenizer, "unsplittable_tokens", None) or [])
    )
    built.add_special_tokens(
        [tokenizers.AddedToken(t, normalized=False, special=True) for t in special]
    )
    built.save(os.path.join(directory, "tokenizer.json"))


def _fixed_key_value_heads(backbone, directory: str) -> None:
    """KerasHub 0.32's Gemma exporter writes only the first key/value head (`key_dense.weights[0][0]`: right for
    Gemma 2B's one head, wrong for more, e.g. Gemma 7B's 16; flagged in review of keras-hub#2335, unfixed in 0.32):
    every head is written here, as its Hugging Face loader reads them back (`convert_gemma.py`: (heads * head_dim,
    hidden))."""
    if type(backbone).__name__ != "GemmaBackbone" or backbone.num_key_value_heads == 1:
        return
    import numpy as np
    from safetensors.numpy import load_file, save_file

    weights_path = os.path.join(directory, "model.safetensors")
    tensors = load_file(weights_path)
    for i in range(backbone.num_layers):
        attention = backbone.get_layer(f"decoder_block_{i}").attention
        for name, layer in (("k_proj", attention.key_dense), ("v_proj", attention.value_dense)):
            kernel = np.asarray(layer.kernel)  # (heads, hidden, head_dim)
            tensors[f"model.layers.{i}.self_attn.{name}.weight"] = np.ascontiguousarray(
                kernel.transpose(0, 2, 1).reshape(-1, kernel.shape[1])
            )
    save_file(tensors, weights_path, metadata={"format": "pt"})


def main(argv: list[str]) -> int:
    """`python -m tpukit.engines.keras.export MODEL.keras OUTPUT_DIR`: the SavedModel of a `.keras` file in
    OUTPUT_DIR/saved_model (`model.keras` there is left as it is). The jax engine runs it in a TensorFlow-backend
    process to export what it trained (TF 2.21 cannot load SavedModels that jax >= 0.11 exports through jax2tf)."""
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras

    import tpukit.models  # noqa: F401 - registers tpukit's layers for loading

    keras_path, output_dir = argv
    try:
        model = keras.saving.load_model(keras_path, compile=False)
    except Exception as error:  # noqa: BLE001 - the file itself is broken: the run names model.keras
        if "Could not locate class" in str(error):
            raise  # the file is sound, this process lacks a class (the run names the SavedModel, and the fix)
        # The last line, which the run reads back (`LOAD_MARK`).
        print(f"{LOAD_MARK}{innermost(error)[:300]}")
        return 1
    try:
        export_saved_model(model, output_dir)
    except ExportWriteError as error:
        # The last line, which the run reads back (`ExportWriteError.from_line`).
        print(error.to_line())
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
