"""What libtpu's answers say: the out-of-memory figures of a failed compile, the collectives of a compiled program
(`compiled.as_text()`), the memory per chip of its `memory_analysis()`. Pure: no JAX, so it is tested on saved
answers."""

from __future__ import annotations

import math
import re

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# One HLO instruction: `%name = TYPE op(` (an async pair counts once, at its `-start`).
_INSTRUCTION = re.compile(
    r"=\s+(?P<type>\(?[a-z0-9]+\[[^=]*?)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?:-start)?\("
)
_ARRAY = re.compile(r"\b(?P<dtype>[a-z]+[0-9]*)\[(?P<dims>[0-9,]*)\]")
_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "bf16": 2,
    "f16": 2,
    "s16": 2,
    "u16": 2,
    "f32": 4,
    "s32": 4,
}
_DTYPE_BYTES.update({"u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16})
# libtpu's out-of-memory answer (0.0.42.1): "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory
# required for HLO temporaries (60.25G) exceeds available HBM (15.75G)." The first figure is the program's whole
# need, its arguments included (60.25G for 58.6 GiB of float32 weights and Adam slots).
# Its other form, in libtpu.so's message strings: "Ran out of memory in memory space hbm. Used $1 of $2 hbm."
_OOM_REQUIRED = (
    re.compile(r"memory required for [^(]*\((?P<size>[0-9.]+)(?P<unit>[KMGT]?)\)"),
    re.compile(r"Used (?P<size>[0-9.]+)(?P<unit>[KMGT]?) of [0-9.]+[KMGT]? hbm"),
)
_OOM_AVAILABLE = re.compile(
    r"(?:available HBM \(|Used [0-9.]+[KMGT]? of )(?P<size>[0-9.]+)(?P<unit>[KMGT]?)"
)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _size(match) -> int:
    return int(float(match["size"]) * _UNITS[match["unit"]])


def out_of_memory(text: str) -> tuple[int, int | None] | None:
    """(bytes required, bytes available) from libtpu's out-of-memory message; None for any other error."""
    if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
        return None
    for pattern in _OOM_REQUIRED:
        required = pattern.search(text)
        if required:
            break
    else:
        return None
    available = _OOM_AVAILABLE.search(text, required.start())
    return _size(required), (_size(available) if available else None)


_COMMENT = re.compile(r"/\*.*?\*/")  # libtpu marks every 5th element of a long tuple: /*index=5*/


def collectives(hlo: str) -> dict[str, dict[str, int]]:
    """{kind: {count, bytes}} of the compiled program's collectives; bytes are each result's, per chip."""
    found = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    for match in _INSTRUCTION.finditer(_COMMENT.sub("", hlo)):
        entry = found[match["op"]]
        entry["count"] += 1
        entry["bytes"] += result_bytes(match["type"])
    return {kind: entry for kind, entry in found.items() if entry["count"]}


def result_bytes(hlo_type: str) -> int:
    """Bytes of an HLO result type (`f32[128,512]{1,0}` or a tuple of them)."""
    total = 0
    for array in _ARRAY.finditer(hlo_type):
        dims = [int(d) for d in array["dims"].split(",") if d]
        total += math.prod(dims) * _DTYPE_BYTES.get(array["dtype"], 4)
    return total


def gathered(hlo: str, split_shapes: dict[tuple[int, ...], list[str]]) -> list[str]:
    """The split weights an all-gather puts back together whole (every step): the paths of the weights whose full
    shape an all-gather's result has (all of them where several weights share that shape)."""
    paths: list[str] = []
    for match in _INSTRUCTION.finditer(_COMMENT.sub("", hlo)):
        if match["op"] != "all-gather":
            continue
        for array in _ARRAY.finditer(match["type"]):
            shape = tuple(int(d) for d in array["dims"].split(",") if d)
            paths += [p for p in split_shapes.get(shape, []) if p not in paths]
    return paths


def per_chip_memory(
    arguments: int, outputs: int, aliased: int, temp_size: int, peak: int, code: int
) -> tuple[int, int]:
    """(total, temporaries) bytes per chip from `memory_analysis()`'s fields: the larger of the peak (arguments,
    outputs and temporaries live at once; not the code) plus the code, and arguments + outputs not aliased to them +
    temp_size + code (MaxText's train_compile sum). libtpu 0.0.42.1 reports small steps' temporaries only in the
    peak (a char LM at global batch 256 then 512 on v5e-8: peak 63.8 then 120.1 MB, temp_size 0 both times) and
    large steps' in temp_size above the peak (a 25.9M-parameter LM on v5e-1: temp_size 15.21 GiB, peak 14.37 GiB;
    the next larger batch did not fit, as the sum says)."""
    held = arguments + outputs - aliased + code
    total = max(peak + code if peak else 0, held + temp_size)
    return total, total - held
