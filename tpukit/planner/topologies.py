"""TPU slices by Google's accelerator-type name, for compiling a train step ahead of time on a CPU.

A row holds what libtpu's deviceless compiler needs (the topology name, chip config and chips per
host of `jax.experimental.topologies.get_topology_desc`) and the per-chip numbers that a memory
check and a roofline need. Pure: no JAX, no Keras. Each row was checked with libtpu 0.0.42.1: the
topology has `chips` devices on `hosts` distinct `process_index`es, named `device_kind`, and
`x @ x` compiles on it.
"""

from __future__ import annotations

import dataclasses

from tpukit.recipe import RecipeError


@dataclasses.dataclass(frozen=True)
class _Chip:
    """Per-chip facts of one TPU generation."""

    device_kind: str
    hbm_bytes: float
    peak_bf16_flops: float
    hbm_bytes_per_second: float
    page: str


# From each generation's Cloud TPU page (its specification table). HBM is kept in the unit the
# page prints (GB = 1e9 bytes, GiB = 2**30 bytes). HBM and bf16 peak are the values of
# `HBM_BYTES_PER_CHIP` (tpukit/tools/check.py) and `PEAK_BF16_FLOPS_PER_CHIP`
# (tpukit/engines/keras/flops.py).
#   v4:  "275 teraflops (bf16 or int8)"; "HBM2 capacity and bandwidth: 32 GiB, 1200 GBps"
#   v5e: "197 TFLOPs"; "HBM2 capacity and bandwidth: 16 GB, 819 GBps". Another version of the page
#        prints "HBM bandwidth per chip: 800 GiBps" (859e9 B/s); the lower 819 GBps is kept.
#   v5p: "459 TFLOPs"; "HBM2e capacity and bandwidth: 95GB, 2765 GBps"
#   v6e: "918 TFLOPs"; "HBM capacity per chip: 32 GB"; "HBM bandwidth per chip: 1638 GBps"
# device_kind is what libtpu names the devices of a topology of that generation.
_CHIPS: dict[str, _Chip] = {
    "v4": _Chip("TPU v4", 32 * 2**30, 275e12, 1200e9, "cloud.google.com/tpu/docs/v4"),
    "v5e": _Chip("TPU v5 lite", 16e9, 197e12, 819e9, "cloud.google.com/tpu/docs/v5e"),
    "v5p": _Chip("TPU v5", 95e9, 459e12, 2765e9, "cloud.google.com/tpu/docs/v5p"),
    "v6e": _Chip("TPU v6 lite", 32e9, 918e12, 1638e9, "cloud.google.com/tpu/docs/v6e"),
}


@dataclasses.dataclass(frozen=True)
class Topology:
    """One TPU slice: how libtpu names it for an ahead-of-time compile, and its per-chip limits."""

    name: str  # Google's accelerator type, e.g. "v5e-8", "v4-8", "v5p-32"
    generation: str  # "v4" | "v5e" | "v5p" | "v6e"
    chips: int
    hosts: int
    topology_name: str  # get_topology_desc's topology_name, e.g. "v5e:2x4"
    chips_per_host_bounds: tuple[int, int, int]
    # get_topology_desc's chip_config_name. "megacore" makes a v4 chip's two TensorCores one
    # device, as on a v4 TPU VM; "default" gives a v4 chip two devices. A v5p chip is one device
    # with either.
    chip_config_name: str
    device_kind: str  # exactly as libtpu names its devices (device.device_kind)
    hbm_bytes_per_chip: float
    peak_bf16_flops_per_chip: float
    hbm_bytes_per_second_per_chip: float  # HBM bandwidth, for a roofline
    source: str  # the public page(s) the row's numbers come from


# Shapes. Topology names ("v5:..." for v5p) and chip configs are MaxText's
# (AI-Hypercomputer/maxtext src/MaxText/accelerator_to_spec_map.py).
# v4 and v5p accelerator types count TensorCores, 2 per chip: v4-8 and v5p-8 are 4 chips. A host
#   holds 4 chips, bounds (2, 2, 1) as in MaxText: v4-8 is one host (cloud.google.com/tpu/docs/v4);
#   the v5p page's slice table gives 2x2x1 = 1 host, 2x2x2 = 2 and 2x4x4 = 8.
# v5e and v6e accelerator types count chips. A Cloud TPU VM holds up to 8 ("Chips per host: 8" on
#   both pages); the v5e page's slice table gives 1x1, 2x2 and 2x4 = 1 host, 4x4 = 2, 4x8 = 4. So
#   slices of 8 chips and more take bounds (2, 4, 1). MaxText passes (2, 2, 1), 4-chip hosts (as in
#   GKE's multi-host node pools, and libtpu's default), which makes a v5e-8 2 hosts. The compiled
#   program and its memory_analysis are the same either way (checked for v5e/v6e-8, -16, -32).
_MAXTEXT = "github.com/AI-Hypercomputer/maxtext src/MaxText/accelerator_to_spec_map.py"
_HOSTS = {"v6e": "; cloud.google.com/tpu/docs/v5e (hosts of an 8-chip VM)"}


def _row(
    name: str,
    chips: int,
    hosts: int,
    topology_name: str,
    chips_per_host_bounds: tuple[int, int, int],
) -> Topology:
    generation = name.split("-")[0]
    chip = _CHIPS[generation]
    return Topology(
        name=name,
        generation=generation,
        chips=chips,
        hosts=hosts,
        topology_name=topology_name,
        chips_per_host_bounds=chips_per_host_bounds,
        chip_config_name="megacore" if generation in ("v4", "v5p") else "default",
        device_kind=chip.device_kind,
        hbm_bytes_per_chip=chip.hbm_bytes,
        peak_bf16_flops_per_chip=chip.peak_bf16_flops,
        hbm_bytes_per_second_per_chip=chip.hbm_bytes_per_second,
        source=f"{chip.page}; {_MAXTEXT} (topology name){_HOSTS.get(generation, '')}",
    )


_ROWS = (
    _row("v4-8", 4, 1, "v4:2x2x1", (2, 2, 1)),
    _row("v4-16", 8, 2, "v4:2x2x2", (2, 2, 1)),
    _row("v4-32", 16, 4, "v4:2x2x4", (2, 2, 1)),
    _row("v5e-1", 1, 1, "v5e:1x1", (1, 1, 1)),
    _row("v5e-4", 4, 1, "v5e:2x2", (2, 2, 1)),
    _row("v5e-8", 8, 1, "v5e:2x4", (2, 4, 1)),
    _row("v5e-16", 16, 2, "v5e:4x4", (2, 4, 1)),
    _row("v5e-32", 32, 4, "v5e:4x8", (2, 4, 1)),
    _row("v5p-8", 4, 1, "v5:2x2x1", (2, 2, 1)),
    _row("v5p-16", 8, 2, "v5:2x2x2", (2, 2, 1)),
    _row("v5p-32", 16, 4, "v5:2x2x4", (2, 2, 1)),
    _row("v6e-1", 1, 1, "v6e:1x1", (1, 1, 1)),
    _row("v6e-4", 4, 1, "v6e:2x2", (2, 2, 1)),
    _row("v6e-8", 8, 1, "v6e:2x4", (2, 4, 1)),
    _row("v6e-16", 16, 2, "v6e:4x4", (2, 4, 1)),
    _row("v6e-32", 32, 4, "v6e:4x8", (2, 4, 1)),
)
TOPOLOGIES: dict[str, Topology] = {row.name: row for row in _ROWS}


def topology(name: str) -> Topology:
    """The row for an accelerator type such as "v5e-8"; a RecipeError listing the valid ones."""
    try:
        return TOPOLOGIES[name]
    except (KeyError, TypeError):
        names = ", ".join(TOPOLOGIES)
        raise RecipeError(
            f"--topology must be one of {names}; received {name!r}. Fix: pass an accelerator "
            "type as Google names it (v4 and v5p count TensorCores, 2 per chip, so v4-8 is 4 "
            "chips; v5e and v6e count chips), e.g. --topology v5e-8."
        ) from None
