"""Compiles every shipped recipe's training step for a few TPU topologies with libtpu (`tpukit check --topology`)
and writes the "compiled for" table: docs/compiled_for.md, and the reports as JSON.

    KERAS_BACKEND=jax python .ci/compiled_for.py --out docs/compiled_for.md --json /tmp/compiled_for.json

Run by .ci/run's TPU-compile tier (after `pip install -e ".[tpu-check]"`), which then fails when the page in the
clone differs from the one generated (libtpu is deterministic for one version): regenerate and commit it. A recipe
whose global batch does not divide by a topology's chips is compiled at the next multiple of the chips, and the
row says so. One process: the abstract devices and libtpu are loaded once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

TOPOLOGIES = ("v5e-1", "v5e-8", "v6e-8", "v5p-8", "v5e-16")


def _size(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**28 else f"{num_bytes / 2**20:.1f} MiB"


def _bound(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def compile_all(
    recipes: list[str], topologies: tuple[str, ...], json_path: str | None = None
) -> list[dict]:
    from tpukit.environment.backend import use_engine

    use_engine("jax")
    from tpukit.recipe import RecipeError, load_recipe
    from tpukit.tools.tpu_check import check_topology
    from tpukit.tools.tpu_check import topology as find_topology

    rows = []
    for name in recipes:
        for topology_name in topologies:
            chips = find_topology(topology_name).chips
            recipe = load_recipe(name)
            batch = recipe.data.global_batch_size
            raised = -(-batch // chips) * chips
            overrides = [f"data.global_batch_size={raised}"] if raised != batch else []
            started = time.perf_counter()
            try:
                report = check_topology(load_recipe(name, overrides), topology_name, fixes=False)
            except RecipeError as error:
                report = {"recipe": name, "topology": topology_name, "error": str(error)}
            except Exception as error:  # noqa: BLE001 - one row's failure is its row, the table goes on
                message = (str(error).strip().splitlines() or [""])[0][:300]
                report = {
                    "recipe": name,
                    "topology": topology_name,
                    "error": f"{type(error).__name__}: {message}",
                }
            report.update(name=name, batch_raised_from=batch if overrides else None)
            report["seconds"] = round(time.perf_counter() - started, 1)
            print(
                f"{name} {topology_name}: {'fits' if report.get('fits') else report.get('error', 'does not fit')[:200]}"
                f" ({report['seconds']} s)",
                file=sys.stderr,
                flush=True,
            )
            rows.append(report)
            if json_path:  # after every row: a crash or a kill keeps what was compiled
                with open(json_path, "w") as file:
                    json.dump(rows, file, indent=1)
    return rows


def markdown(rows: list[dict]) -> str:
    from importlib.metadata import version

    lines = [
        "# Compiled for TPUs (libtpu, no TPU)",
        "",
        "Every shipped recipe's training step (the jax engine's: its model, optimizer, loss, layouts, the TPU "
        "precision default mixed_bfloat16, its global batch on a data x model mesh over the chips) compiled by "
        f"libtpu {version('libtpu')} (jax {version('jax')}) on a 2-core x86 CPU with no TPU, by "
        "`.ci/compiled_for.py` in CI's TPU-compile tier (`tpukit check RECIPE --topology NAME` gives one row).",
        "",
        "What a row proves: the TPU compiler accepts the step and plans its memory per chip as shown (HBM per chip: "
        "the larger of libtpu's peak and arguments + outputs not aliased to them + temporaries, plus the program's "
        "code; [how](tpu.md#compiled-for-a-tpu-on-a-cpu)). The step time is a "
        "roofline bound at the chip's peak bf16 FLOP/s and HBM bandwidth, from the compiler's FLOPs and bytes "
        "accessed: no TPU ran it, and the input pipeline, host memory and the interconnect are not part of it. "
        "Real TPU runs: none yet ([TPU notes](tpu.md)).",
        "",
        "| recipe | topology | mesh | global batch | fits | HBM per chip | bound | step time bound | MFU at most |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        name, topology = row["name"], row["topology"]
        if "error" in row:
            # without the recipe's path (the clone's folder) and the fix: the same text in any clone
            reason = row["error"].split(". Fix:")[0].split(".yaml: ", 1)[-1].replace("|", "\\|")
            lines.append(f"| {name} | {topology} | | | not compiled: {reason} | | | | |")
            continue
        mesh = f"{row['mesh']['data']} x {row['mesh']['model']}"
        batch = str(row["global_batch_size"])
        if row.get("batch_raised_from"):
            batch += f" (recipe: {row['batch_raised_from']})"
        total = row["per_chip_bytes"]["total"]
        if not row["fits"]:
            lines.append(
                f"| {name} | {topology} | {mesh} | {batch} | **no** | {_size(total)} | | | |"
            )
            continue
        lines.append(
            f"| {name} | {topology} | {mesh} | {batch} | yes | {_size(total)} | {row.get('bound') or ''} | "
            f"{_bound(row['step_seconds_bound']) if row.get('step_seconds_bound') else ''} | "
            f"{row['mfu_upper_bound']:.0%} |"
            if row.get("mfu_upper_bound") is not None
            else f"| {name} | {topology} | {mesh} | {batch} | yes | {_size(total)} | | | |"
        )
    notes = sorted({row["data"] for row in rows if row.get("data")})
    if notes:
        lines += ["", "Data not downloaded where this ran:", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _rows(page: str) -> dict[tuple[str, str], str]:
    with open(page) as file:
        cells = [
            line.split("|")
            for line in file
            if line.startswith("| ") and not line.startswith("| recipe")
        ]
    return {(c[1].strip(), c[2].strip()): "|".join(c) for c in cells if len(c) > 3}


def compare(committed: str, generated: str) -> int:
    """0 when every row generated now is in the committed page as it is; 1, listing the others."""
    have, now = _rows(committed), _rows(generated)
    changed = [key for key, row in now.items() if have.get(key) != row]
    for key in changed:
        print(
            f"{committed}: {key[0]} on {key[1]}:\n  committed: {have.get(key)}  now:       {now[key]}"
        )
    if changed:
        print(
            f"{len(changed)} row(s) changed. Fix: python .ci/compiled_for.py (the whole table) and commit it."
        )
    return 1 if changed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/compiled_for.md")
    parser.add_argument("--json", default=None, help="also write every report here")
    parser.add_argument(
        "--recipe", action="append", default=[], help="only these recipes (repeatable)"
    )
    parser.add_argument("--topology", action="append", default=[], help="only these topologies")
    parser.add_argument(
        "--render",
        nargs="+",
        default=None,
        metavar="JSON",
        help="compile nothing: write the page from the rows in these --json files (runs split over processes)",
    )
    parser.add_argument(
        "--check",
        default=None,
        metavar="PAGE",
        help="compare the rows compiled now with PAGE's rows for the same recipe and topology (exit 1 on a change)",
    )
    args = parser.parse_args()
    os.environ.setdefault("KERAS_BACKEND", "jax")
    from tpukit.logs import enable_logging
    from tpukit.recipe.loading import packaged_recipes

    enable_logging()
    recipes = args.recipe or sorted(packaged_recipes())
    topologies = tuple(args.topology) or TOPOLOGIES
    if args.render:
        rows = []
        for path in args.render:
            with open(path) as file:
                rows += json.load(file)
        order = {key: i for i, key in enumerate((r, t) for r in recipes for t in topologies)}
        latest = {(row["name"], row["topology"]): row for row in rows}  # a later file's row wins
        rows = [latest[key] for key in sorted(set(latest) & set(order), key=order.get)]
    else:
        rows = compile_all(recipes, topologies, args.json)
    with open(args.out, "w") as file:
        file.write(markdown(rows))
    if args.check:
        return compare(args.check, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
