"""Summarizes an A/B device run of tools/gpu-ab.sh: the PerfEvidence JSON of each variant ("base", the reference;
"tree", the working tree; any other commit prepared under a name of its own) and round, into one table: per row and
variant the candidate's median (the median over rounds of each round's median), the rounds' range, its ratio to the
floor, and variant / base. Each variant ran in processes of its own, the variants alternating, on one machine: the
ratios are the numbers to quote (medians from different machines or runs are not comparable).

    python3 tools/gpu_ab_summary.py ab-base-1.json ab-tree-1.json ab-base-2.json ...

A file that is not PerfEvidence, a run without a base, a variant missing a row another has, or a row measured twice
in one file is an error naming the file: no row is compared silently against nothing.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

NAME = re.compile(r"ab-([a-z0-9_]+)-(\d+)\.json$")
AXES = ("layer", "tp", "batch", "context")
REFERENCE = "base"


class SummaryError(ValueError):
    pass


def row_key(row: dict) -> tuple:
    return tuple(row["axes"].get(axis) for axis in AXES)


def collect(paths: list[Path]) -> dict[str, dict[tuple, list[tuple[float, float]]]]:
    """variant -> row key -> [(candidate median, floor)] over rounds."""
    found: dict[str, dict[tuple, list[tuple[float, float]]]] = {}
    for path in paths:
        match = NAME.search(path.name)
        if not match:
            raise SummaryError(f"{path}: not an A/B result (ab-<variant>-<round>.json)")
        rows_of_variant = found.setdefault(match.group(1), {})
        try:
            rows = json.loads(path.read_text())["rows"]
            seen = set()
            for row in rows:
                key = row_key(row)
                if key in seen:
                    raise SummaryError(f"{path}: row {key} appears twice")
                seen.add(key)
                rows_of_variant.setdefault(key, []).append((float(row["candidate"]["median"]), float(row["floor"])))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise SummaryError(f"{path}: not PerfEvidence ({error})") from None
    if not any(found.values()):
        raise SummaryError("no rows: give the ab-<variant>-<round>.json files of a run")
    if REFERENCE not in found:
        raise SummaryError(f"no {REFERENCE} variant among {sorted(found)}: the ratios need one")
    for variant, rows in found.items():
        if set(rows) != set(found[REFERENCE]):
            raise SummaryError(f"rows measured for one of {REFERENCE} and {variant} only: "
                               f"{sorted(set(rows) ^ set(found[REFERENCE]), key=sort_key)}")
    return found


def sort_key(key: tuple) -> tuple:
    """Rows in axis order, numbers numerically (TP 8 before 16), None and strings after."""
    return tuple((0, v, "") if isinstance(v, int) else (1, 0, str(v)) for v in key)


def variant_order(variants) -> list[str]:
    """base first, then the tree, then the other variants by name."""
    return sorted(variants, key=lambda v: (v != REFERENCE, v != "tree", v))


def summarize(found: dict[str, dict[tuple, list[tuple[float, float]]]]) -> list[str]:
    lines = [f"{'layer':8} {'tp':>3} {'M':>3} {'context':>7}  {'variant':10} {'us':>9} {'range':>15}  {'floor us':>8} "
             f"{'x floor':>7} {'x base':>7}"]
    for key in sorted(found[REFERENCE], key=sort_key):
        layer, tp, batch, context = key
        base = statistics.median(median for median, _ in found[REFERENCE][key])
        for variant in variant_order(found):
            medians = [median for median, _ in found[variant][key]]
            value, floor = statistics.median(medians), found[variant][key][0][1]
            lines.append(f"{layer!s:8} {tp!s:>3} {batch!s:>3} {context!s:>7}  {variant:10} {value:9.2f} "
                         f"{f'{min(medians):.2f}-{max(medians):.2f}':>15}  {floor:8.1f} {value / floor:7.3f} "
                         f"{value / base:7.3f}")
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
