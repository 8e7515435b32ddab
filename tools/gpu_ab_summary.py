"""Summarizes an A/B device run of tools/gpu-ab.sh: the PerfEvidence JSON of each variant ("base", the reference;
"tree", the working tree; any other commit prepared under a name of its own) and round, into one table: per row and
variant the candidate's median (the median over rounds of each round's median), the rounds' range, its ratio to the
floor, and variant / base. Each variant ran in processes of its own, the variants alternating, on one machine: the
ratios are the numbers to quote (medians from different machines or runs are not comparable). The MoE bench's
launches alone (bench_moe --kernels-out, files ab-<variant>-<round>.launches.json) get a second table alike.

    python3 tools/gpu_ab_summary.py ab-base-1.json ab-tree-1.json ab-base-2.json ... [ab-base-1.launches.json ...]

A file that is not PerfEvidence (or the launches' list), a run without a base, a variant missing a row another has,
or a row measured twice in one file is an error naming the file: no row is compared silently against nothing.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

NAME = re.compile(r"ab-([a-z0-9_]+)-(\d+)(\.launches)?\.json$")
AXES = ("layer", "tp", "batch", "context")
REFERENCE = "base"
LAYERS, LAUNCHES = "layers", "launches"  # the two tables: PerfEvidence rows, and the MoE bench's launches alone

Found = dict[str, dict[str, dict[tuple, list[tuple[float, float]]]]]  # table -> variant -> key -> [(median, floor)]


class SummaryError(ValueError):
    pass


def row_key(row: dict) -> tuple:
    return tuple(row["axes"].get(axis) for axis in AXES)


def read_rows(path: Path, table: str) -> list[tuple[tuple, float, float]]:
    """(key, median us, floor us) of each row of one file: PerfEvidence's rows (layer, tp, batch, context), or
    bench_moe --kernels-out's list (launch, tp, batch)."""
    data = json.loads(path.read_text())
    if table == LAUNCHES:
        return [((r["kernel"], r["tp"], r["batch"]), float(r["median_us"]), float(r["floor_us"])) for r in data]
    return [(row_key(r), float(r["candidate"]["median"]), float(r["floor"])) for r in data["rows"]]


def collect(paths: list[Path]) -> Found:
    """table -> variant -> row key -> [(median, floor)] over rounds."""
    found: Found = {}
    for path in paths:
        match = NAME.search(path.name)
        if not match:
            raise SummaryError(f"{path}: not an A/B result (ab-<variant>-<round>.json or .launches.json)")
        table = LAUNCHES if match.group(3) else LAYERS
        rows_of_variant = found.setdefault(table, {}).setdefault(match.group(1), {})
        try:
            seen = set()
            for key, median, floor in read_rows(path, table):
                if key in seen:
                    raise SummaryError(f"{path}: row {key} appears twice")
                seen.add(key)
                rows_of_variant.setdefault(key, []).append((median, floor))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            what = "the MoE bench's launches" if table == LAUNCHES else "PerfEvidence"
            raise SummaryError(f"{path}: not {what} ({error})") from None
    if not any(rows for variants in found.values() for rows in variants.values()):
        raise SummaryError("no rows: give the ab-<variant>-<round>.json files of a run")
    for variants in found.values():
        if REFERENCE not in variants:
            raise SummaryError(f"no {REFERENCE} variant among {sorted(variants)}: the ratios need one")
        for variant, rows in variants.items():
            if set(rows) != set(variants[REFERENCE]):
                raise SummaryError(f"rows measured for one of {REFERENCE} and {variant} only: "
                                   f"{sorted(set(rows) ^ set(variants[REFERENCE]), key=sort_key)}")
    return found


def sort_key(key: tuple) -> tuple:
    """Rows in axis order, numbers numerically (TP 8 before 16), None and strings after."""
    return tuple((0, v, "") if isinstance(v, int) else (1, 0, str(v)) for v in key)


def variant_order(variants) -> list[str]:
    """base first, then the tree, then the other variants by name."""
    return sorted(variants, key=lambda v: (v != REFERENCE, v != "tree", v))


def summarize(found: Found) -> list[str]:
    """The layers' table, then (when given) a blank line and the launches' table."""
    lines = []
    if LAYERS in found:
        lines += table(found[LAYERS], f"{'layer':8} {'tp':>3} {'M':>3} {'context':>7}",
                       lambda layer, tp, batch, context: f"{layer!s:8} {tp!s:>3} {batch!s:>3} {context!s:>7}",
                       sort_key)
    if LAUNCHES in found:
        # per (TP, M) in the block's order, as the base's first file lists them (a stable sort)
        lines += [""] * bool(lines) + table(found[LAUNCHES], f"{'launch alone':44} {'tp':>3} {'M':>3}",
                                            lambda launch, tp, batch: f"{launch:44} {tp!s:>3} {batch!s:>3}",
                                            lambda key: key[1:])
    return lines


def table(variants: dict[str, dict[tuple, list[tuple[float, float]]]], header: str, label, order) -> list[str]:
    lines = [f"{header}  {'variant':10} {'us':>9} {'range':>15}  {'floor us':>8} {'x floor':>7} {'x base':>7}"]
    for key in sorted(variants[REFERENCE], key=order):
        base = statistics.median(median for median, _ in variants[REFERENCE][key])
        for variant in variant_order(variants):
            medians = [median for median, _ in variants[variant][key]]
            value, floor = statistics.median(medians), variants[variant][key][0][1]
            lines.append(f"{label(*key)}  {variant:10} {value:9.2f} {f'{min(medians):.2f}-{max(medians):.2f}':>15}  "
                         f"{floor:8.1f} {value / floor:7.3f} {value / base:7.3f}")
    return lines


def main(argv: list[str]) -> int:
    try:
        print("\n".join(summarize(collect([Path(a) for a in argv]))))
    except SummaryError as error:
        print(f"gpu_ab_summary: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
