"""Rules that judge a recipe against a TPU it may not be attached to: the `Target` (cores, hosts, HBM), a rule's
verdict (`Rule`), and the input-paths rule, which the planner enforces on a multi-host or remote TPU and
`python -m tpukit.check` reports for any TPU type."""

from __future__ import annotations

import dataclasses

from tpukit.recipe import Recipe

PATH_SUFFIXES = ("_dir", "_path", "_pattern", "_file", "_files", "_glob")


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule's verdict: `status` is "pass", "warn" (trains, but read this), "fail" or "skip" (could not run)."""

    name: str
    status: str
    message: str
    fix: str | None = None


@dataclasses.dataclass(frozen=True)
class Target:
    """The TPU the recipe is checked for."""

    tpu_type: str
    cores: int  # TensorFlow TPU devices = TPUStrategy replicas
    hosts: int
    cores_per_host: int
    hbm_bytes_per_core: float
    remote: (
        bool  # runtime.tpu names a TPU or a grpc:// address: the input runs on the TPU's host(s)
    )

    @property
    def input_elsewhere(self) -> bool:
        return self.hosts > 1 or self.remote

    def describe(self) -> str:
        return (
            f"{self.cores} core(s) of TPU {self.tpu_type} ({self.hosts} host(s), {self.cores_per_host} cores per "
            f"host, {self.hbm_bytes_per_core / 2**30:.1f} GiB HBM per core)"
        )


def _is_path_option(key: str) -> bool:
    return key in ("path", "paths", "file_pattern", "data_dir") or key.endswith(PATH_SUFFIXES)


def input_paths_rule(recipe: Recipe, target: Target) -> Rule:
    """When the input runs on other hosts, every file the source reads must be on gs://."""
    if not target.input_elsewhere:
        return Rule(
            "input_paths",
            "pass",
            f"the input runs on this host only ({target.cores} core(s) of {target.tpu_type} fit on one host of "
            f"{target.cores_per_host} cores, and runtime.tpu is {recipe.runtime.tpu or 'auto-detected'}): local "
            "files are fine.",
        )
    why = (
        f"{target.cores} cores of {target.tpu_type} span {target.hosts} hosts of {target.cores_per_host} cores, "
        "each running its own input pipeline"
        if target.hosts > 1
        else f"runtime.tpu={recipe.runtime.tpu!r} is a remote TPU, whose host runs the input graph"
    )
    options = recipe.data.options
    local = [
        f"data.{key}={value!r}"
        for key, value in sorted(options.items())
        if _is_path_option(key) and isinstance(value, str) and not value.startswith("gs://")
    ]
    notes = []
    if recipe.data.source == "tfds" and not options.get("data_dir"):
        if options.get("try_gcs"):
            notes.append(
                "tfds with try_gcs reads TFDS's public gs:// copy when it has one, else prepares the data in each "
                "host's ~/tensorflow_datasets"
            )
        else:
            local.append("data.data_dir=null (TFDS's default, ~/tensorflow_datasets on each host)")
    if recipe.data.source == "text_files" and not options.get("file_pattern"):
        notes.append(
            "text_files' default corpus is the Python standard library, read in Python on every host"
        )
    if local:
        return Rule(
            "input_paths",
            "fail",
            f"{why}, and these paths are not on gs://: {', '.join(local)}. Other hosts cannot see this machine's "
            "disk (\"File system scheme '[local]' not implemented\", or each host reads a different copy).",
            "copy the data to a Cloud Storage bucket the TPU's service account can read and set the path to "
            "gs://BUCKET/..., e.g. --set data.file_pattern=gs://BUCKET/data/{split}-* or data.data_dir=gs://BUCKET/tfds",
        )
    if notes:
        return Rule("input_paths", "warn", f"{why}; " + "; ".join(notes) + ".")
    return Rule("input_paths", "pass", f"{why}; every path option of the source is on gs://.")
