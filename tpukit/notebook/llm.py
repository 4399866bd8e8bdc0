"""What notebooks/llm_lora.ipynb decides and shows around `tpukit.run`, as library code: the LoRA recipe with its
preset and mesh for this runtime, the generations the run logged, and the exports to reload.

    name, recipe = tpukit.notebook.llm.lora_recipe("gemma_lora", PRESET, small, engine=ENGINE)
    OUTPUT_DIR = tpukit.notebook.output_dir(OUTPUT_ROOT, name, engine=ENGINE)
    metrics = tpukit.run(recipe, OUTPUT_DIR, strategy=strategy)
    print(tpukit.notebook.llm.samples_text(metrics))
    merged = keras_hub.models.CausalLM.from_preset(tpukit.notebook.llm.exported(metrics, "preset"))

An empty preset stands for a tiny one made here (`tpukit.models.hub.tiny_preset`: random weights, a word
vocabulary), so the notebook runs offline; its run gets its own folder (`<recipe>_tiny`), never mixed with a
real preset's checkpoints.
"""

from __future__ import annotations

import json
import os

# The largest model axis the notebook asks for: the recipes' own (4 on a Kaggle v5e-8: 2 x 4).
MAX_MODEL_AXIS = 4
# Smoke-sized training when `small` (no accelerator): two passes over the built-in examples.
SMALL_OVERRIDES = ("train.epochs=2",)
TINY_SUFFIX = "_tiny"
# Where a Kaggle handle's credentials can come from (kagglehub reads them; the first two are Kaggle's API token).
KAGGLE_ENV = ("KAGGLE_USERNAME", "KAGGLE_KEY")
KAGGLE_FILES = ("~/.kaggle/kaggle.json", "~/.config/kaggle/kaggle.json")
CREDENTIALS_HOW = (
    "on Colab add the secrets KAGGLE_USERNAME and KAGGLE_KEY (the key icon on the left; an API token from "
    "kaggle.com -> Settings -> API) and grant this notebook access, or run `import kagglehub; kagglehub.login()`; "
    "accept the model's license on its Kaggle page first"
)


def model_axis(device_count: int, largest: int = MAX_MODEL_AXIS) -> int:
    """The largest divisor of `device_count` that is at most `largest`: 1 on a Colab v5e-1, 4 on a Kaggle v5e-8,
    3 on 6 (the data axis takes the rest, so the mesh always covers every device)."""
    if device_count < 1:
        raise ValueError(f"device_count must be >= 1; received {device_count}.")
    return max(d for d in range(1, min(largest, device_count) + 1) if device_count % d == 0)


def lora_overrides(preset_dir: str, small: bool, engine: str, device_count: int = 1) -> list[str]:
    """The `--set` overrides the notebook applies to a LoRA recipe: its preset, the engine, and a model axis this
    runtime has (the recipes say engine jax and model 4). The tensorflow engine (a CPU or GPU runtime) has no
    model axis: runtime.mesh.model=1 there."""
    if engine not in ("jax", "tensorflow"):
        raise ValueError(f"engine must be 'jax' or 'tensorflow'; received engine={engine!r}.")
    model = model_axis(device_count) if engine == "jax" else 1
    overrides = [
        f"model.preset={preset_dir}",
        f"runtime.engine={engine}",
        f"runtime.mesh.model={model}",
    ]
    return overrides + list(SMALL_OVERRIDES if small else ())


def tiny_family(default_preset: str) -> str:
    """The `tiny_preset` family standing in for a recipe's preset: "qwen" for a Qwen handle, else "gemma"."""
    return "qwen" if "qwen" in str(default_preset).lower() else "gemma"


def lora_recipe(
    name: str,
    preset: str = "",
    small: bool = False,
    engine: str = "jax",
    tiny_dir: str = "tiny_presets",
):
    """(run name, recipe): the LoRA recipe `name` (gemma_lora, qwen_lora) with `lora_overrides` applied.

    Args:
        name: a packaged recipe name or a recipe file.
        preset: a KerasHub preset (a Kaggle handle such as "gemma_2b_en", "hf://...", or a local directory); "":
            a tiny preset of the recipe's family written to `tiny_dir/<family>` (once; reused when it is there),
            and the run name gets `_tiny`, so its checkpoints never meet a real preset's.
        small: smoke-sized training (`SMALL_OVERRIDES`).
        engine: the notebook's ENGINE; with "jax" the model axis is `model_axis(jax.device_count())`.
        tiny_dir: a local folder for tiny presets (relative to the working folder).
    """
    from tpukit.recipe import load_recipe
    from tpukit.recipe.loading import raw_recipe

    _, raw = raw_recipe(name)
    model = raw.get("model") or {}
    run_name = os.path.splitext(os.path.basename(name))[0]
    if preset:
        print(credentials_line(preset))
    else:
        from tpukit.models.hub import tiny_preset

        family = tiny_family(model.get("preset", ""))
        preset = os.path.abspath(os.path.join(tiny_dir, family))
        if os.path.isfile(os.path.join(preset, "config.json")):
            print(
                f"preset: the tiny {family} preset in {preset} (made earlier; random weights, offline)"
            )
        else:
            import shutil

            partial = (
                preset + ".partial"
            )  # renamed when complete: an interrupted write is never reused
            shutil.rmtree(partial, ignore_errors=True)
            tiny_preset(partial, family, sequence_length=int(model.get("sequence_length", 64)))
            shutil.rmtree(preset, ignore_errors=True)
            os.replace(partial, preset)
            print(
                f"preset: a tiny {family} preset made in {preset} (random weights, a word vocabulary; offline)"
            )
        run_name += TINY_SUFFIX
    devices = 1
    if engine == "jax":
        import jax

        devices = jax.device_count()
    overrides = lora_overrides(preset, small, engine, devices)
    recipe = load_recipe(name, overrides)
    print(f"recipe: {name} {' '.join(overrides)}")
    return run_name, recipe


def credentials_line(preset: str, environ=None, colab_userdata=None) -> str:
    """One line on how `preset` is downloaded. For a Kaggle handle without Kaggle credentials here, Colab's
    secrets KAGGLE_USERNAME / KAGGLE_KEY are copied into the environment (where kagglehub reads them) when the
    notebook may read them; else the line says how to provide them. Nothing is raised: the download says the rest.

    Args:
        preset: the PRESET setting (not empty).
        environ: the environment to read and set (default `os.environ`; tests pass a dict).
        colab_userdata: `google.colab.userdata` (tests pass a fake); default: imported when present.
    """
    environ = os.environ if environ is None else environ
    if os.path.isdir(os.path.expanduser(preset)):
        return f"preset: the local preset directory {preset}"
    if preset.startswith("hf://"):
        return (
            f"preset: {preset} from Hugging Face (a gated model, such as Gemma, needs its license accepted there "
            "and an HF_TOKEN: on Colab the secret HF_TOKEN)"
        )
    if all(environ.get(key) for key in KAGGLE_ENV) or environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return f"preset: {preset} from Kaggle (credentials found in the environment)"
    if any(os.path.isfile(os.path.expanduser(path)) for path in KAGGLE_FILES):
        return f"preset: {preset} from Kaggle (credentials found in kaggle.json)"
    if colab_userdata is None:
        try:
            from google.colab import userdata as colab_userdata
        except ImportError:
            colab_userdata = None
    if colab_userdata is not None:
        try:
            values = {key: colab_userdata.get(key) for key in KAGGLE_ENV}
        except Exception:  # noqa: BLE001 - a secret missing or not granted: say how below
            values = {}
        if all(values.get(key) for key in KAGGLE_ENV):
            environ.update(values)
            return f"preset: {preset} from Kaggle (credentials from Colab's secrets)"
    return f"preset: {preset} from Kaggle; no Kaggle credentials found here: {CREDENTIALS_HOW}"


def samples_text(metrics: dict) -> str:
    """The generations the run logged (`metrics["samples"]`: a list of {"prompt", "generation"}, with a "step"
    where given), one per line; where the run logged none, what `metrics.json` holds instead."""
    samples = metrics.get("samples")
    if samples is None:
        return (
            "metrics.json has no 'samples' (train.sample_prompts unset, or a tpukit that logs none); its keys: "
            + ", ".join(sorted(metrics))
        )
    if not isinstance(samples, list) or not all(
        isinstance(s, dict) and {"prompt", "generation"} <= set(s) for s in samples
    ):
        return "samples: " + json.dumps(samples, indent=1, default=str)
    lines = []
    for sample in samples:
        step = f"step {sample['step']}: " if "step" in sample else ""
        lines.append(f"{step}{sample['prompt']!r} -> {sample['generation']!r}")
    return "\n".join(lines)


def exported(metrics: dict, key: str) -> str:
    """The path of the run's export `key` ("preset": the KerasHub preset with LoRA merged, "safetensors",
    "keras"). Raises FileNotFoundError naming what the run did export, and why not this one where it said."""
    path = (metrics.get("exported") or {}).get(key)
    if path:
        return path
    why = (metrics.get("outputs_missing") or {}).get(key) or (
        metrics.get("outputs_skipped") or {}
    ).get(key)
    raise FileNotFoundError(
        f"the run exported no {key!r}{f' ({why})' if why else ''}; it exported: "
        f"{', '.join(sorted(metrics.get('exported') or {})) or 'nothing'}."
    )


def generations_text(prompts, generations, other=None, other_name: str = "") -> str:
    """Each prompt's generation, one per line; with `other` (the same prompts generated by another export), a last
    line saying whether the two generated the same text."""
    generations = [generations] if isinstance(generations, str) else list(generations)
    lines = [f"{p!r} -> {g!r}" for p, g in zip(prompts, generations, strict=True)]
    if other is not None:
        other = [other] if isinstance(other, str) else list(other)
        lines.append(f"same text as {other_name or 'the other export'}: {other == generations}")
    return "\n".join(lines)


def safetensors_text(metrics: dict) -> str:
    """The Hugging Face export (`metrics["exported"]["safetensors"]`): its files and sizes, and the vLLM command
    that serves it; or why there is none (a family KerasHub cannot export)."""
    try:
        path = exported(metrics, "safetensors")
    except FileNotFoundError as error:
        return str(error)
    import tensorflow as tf  # tf.io.gfile: a gs:// output as well

    names = sorted(name.rstrip("/") for name in tf.io.gfile.listdir(path))
    sizes = [
        f"{name}/"
        if tf.io.gfile.isdir(os.path.join(path, name))
        else f"{name} ({tf.io.gfile.stat(os.path.join(path, name)).length:,} bytes)"
        for name in names
    ]
    return (
        f"safetensors: {path}\n  " + "\n  ".join(sizes) + f"\nserve it with vLLM: vllm serve {path}"
    )
