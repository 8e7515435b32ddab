"""Summarizes an A/B device run of tools/gpu-ab.sh: the per-layer bench's PerfEvidence JSON of each variant ("base",
the commit prepared into .ab/base, and "tree", the working tree) and round, into one table of the candidate's median
per row (the median over rounds of each round's median, and the rounds' range), its ratio to the floor, and
tree / base. Each variant ran in processes of its own, the two alternating, on one machine: the ratio is the number
to quote (medians from different machines or runs are not comparable).

    python3 tools/gpu_ab_summary.py ab-base-1.json ab-tree-1.json ab-base-2.json ...

A file that is not PerfEvidence, a variant missing a row the other has, or a row measured twice in one file is an
error naming the file: no row is compared silently against nothing.
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

NAME = re.compile(r"ab-(base|tree)-(\d+)\.json$")
AXES = ("layer", "tp", "batch", "context")


class SummaryError(ValueError):
    pass


def row_key(row: dict) -> tuple:
    return tuple(row["axes"].get(axis) for axis in AXES)


def collect(paths: list[Path]) -> dict[str, dict[tuple, list[tuple[float, float]]]]:
    """variant -> row key -> [(candidate median, floor)] over rounds."""
    found: dict[str, dict[tuple, list[tuple[float, float]]]] = {"base": {}, "tree": {}}
    for path in paths:
        match = NAME.search(path.name)
        if not match:
            raise SummaryError(f"{path}: not an A/B result (ab-base-<round>.json or ab-tree-<round>.json)")
        try:
            rows = json.loads(path.read_text())["rows"]
            seen = set()
            for row in rows:
                key = row_key(row)
                if key in seen:
                    raise SummaryError(f"{path}: row {key} appears twice")
                seen.add(key)
                found[match.group(1)].setdefault(key, []).append((float(row["candidate"]["median"]),
                                                                  float(row["floor"])))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise SummaryError(f"{path}: not PerfEvidence ({error})") from None
    if set(found["base"]) != set(found["tree"]):
        raise SummaryError(f"rows measured for one variant only: {sorted(set(found['base']) ^ set(found['tree']))}")
    if not found["base"]:
        raise SummaryError("no rows: give the ab-<variant>-<round>.json files of a run")
    return found


def summarize(found: dict[str, dict[tuple, list[tuple[float, float]]]]) -> list[str]:
    lines = [f"{'layer':8} {'tp':>3} {'M':>3} {'context':>7}  {'base us':>9} {'range':>13} {'tree us':>9} "
             f"{'range':>13}  {'floor us':>8} {'base/fl':>7} {'tree/fl':>7} {'tree/base':>9}"]
    for key in sorted(found["base"], key=lambda k: tuple((0, v, "") if isinstance(v, int) else (1, 0, str(v)) for v in k)):
        layer, tp, batch, context = key
        cells = {}
        for variant in ("base", "tree"):
            medians = [median for median, _ in found[variant][key]]
            cells[variant] = (statistics.median(medians), min(medians), max(medians))
        floor = found["base"][key][0][1]
        (base, blo, bhi), (tree, tlo, thi) = cells["base"], cells["tree"]
        lines.append(f"{layer:8} {tp:>3} {batch:>3} {context!s:>7}  {base:9.2f} {f'{blo:.2f}-{bhi:.2f}':>13} "
                     f"{tree:9.2f} {f'{tlo:.2f}-{thi:.2f}':>13}  {floor:8.1f} {base / floor:7.3f} {tree / floor:7.3f} "
                     f"{tree / base:9.3f}")
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
