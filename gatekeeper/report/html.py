"""The details page: one self-contained HTML page per verdict, rendered with jinja2 (autoescaped).

The same `Verdict` the Markdown and terminal reports show, laid out for a browser: every rule's findings, the perf
matrix as an SVG heatmap (one cell per row of the support matrix, missing rows drawn as holes), the changed lines
coloured by whether a passing test ran them (the tests on hover), the provenance signals, and the blast radius when
the verdict carries one. Inline CSS and SVG only: no script, no network (the page's own Content-Security-Policy
forbids both), so `gatekeeper check --format html` writes a file that opens anywhere, and the App serves the same.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import jinja2

from gatekeeper.report.text import BLAST_CHANGE_TEXT, one_line, visible
from gatekeeper.verdict import CheckResult, Status, Verdict

# The page allows nothing but its own inline styles and a data: icon (which also stops the browser asking the
# server for /favicon.ico): whatever a PR manages to put into the page, no script runs and nothing is fetched.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

CELL_W, CELL_H, GAP = 92, 52, 4  # heatmap cell size and spacing, in SVG pixels
LABEL_CHAR_W = 7.2  # an estimate of the label font's average character width, to size the row-label column
MAX_TESTS_ON_HOVER = 12  # per run of changed lines: a title longer than a screen helps nobody
SPEEDUP_SPAN = 1.0  # log2 of the speed-up that gets the fullest colour (2x faster or slower)
FLOOR_SPAN = 2.0  # log2 of the distance to the floor that gets the palest colour (4x the floor)

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("gatekeeper.report", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=True,  # every value is escaped unless a template says otherwise (none does)
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters["v"] = lambda value: visible(str(value))  # hidden characters shown, never interpreted
_ENV.filters["line"] = lambda value: one_line(str(value))
_ENV.filters["json"] = lambda value: json.dumps(value, indent=2, sort_keys=True, default=str)
_ENV.globals.update(cell_w=CELL_W, cell_h=CELL_H, strip_h=16, blast_change_text=BLAST_CHANGE_TEXT)


@dataclass(frozen=True)
class Cell:
    """One heatmap cell: one row of the perf matrix's details."""

    index: int  # the row's position in details["rows"]
    x: float
    y: float
    row: dict[str, Any]
    speedup_fill: str
    floor_fill: str
    speedup_text: str
    floor_text: str
    title: str

    @property
    def missing(self) -> bool:
        return self.row["candidate"] is None

    @property
    def floor_ink(self) -> str:
        """The floor text's colour: white on the darker blues."""
        red = int(self.floor_fill[1:3], 16) if self.floor_fill.startswith("#") else 255
        return "#ffffff" if red < 128 else "#1f2328"


@dataclass(frozen=True)
class Heatmap:
    constant: dict[str, Any]  # axes with one value in every row: said once, above the map
    column_heads: list[tuple[float, str]]  # (x of the column's centre, "axis=value")
    row_heads: list[tuple[float, str]]  # (y of the label's baseline, the other axes' values)
    label_right: float  # where the row labels end
    cells: list[Cell]
    width: float
    height: float


def render_html(verdict: Verdict, *, subject: str | None = None, raw: dict[str, Any] | None = None) -> str:
    """The page. `subject` says what was judged ("owner/repo#12 at 1a2b3c4"); `raw` is the verdict as JSON data
    when it may carry fields this version does not model, each shown only when present: what the App adds (an
    `override` of the head, why CI's evidence counted as self-reported: `evidence_untrusted`)."""
    data = raw if raw is not None else verdict.model_dump(mode="json")
    checks = [_check_view(check) for check in verdict.checks]
    counts = {s.value: sum(1 for c in verdict.checks if c.status is s) for s in Status}
    return _ENV.get_template("details.html.j2").render(
        verdict=verdict,
        subject=subject,
        checks=checks,
        counts=counts,
        undecided=[c.id for c in verdict.checks if c.status is Status.neutral],
        overridden=bool(verdict.signals) and not verdict.agent_assisted,
        override=data.get("override"),
        evidence_untrusted=data.get("evidence_untrusted"),
        csp=CONTENT_SECURITY_POLICY,
    )


def _check_view(check: CheckResult) -> dict[str, Any]:
    details = check.details
    view: dict[str, Any] = {"result": check, "heatmap": None, "coverage": None, "probes": None,
                            "touchpoints": None, "other": {}}
    shown: set[str] = set()
    if check.id == "perf_matrix" and "rows" in details and "axes" in details:
        view["heatmap"], shown = heatmap(details), {"rows", "axes"}
    elif check.id == "changed_path_tests" and "files" in details:
        view["coverage"], shown = [_coverage_file(f) for f in details["files"]], {"files"}
    elif check.id == "startup_guard" and "probes" in details:
        view["probes"], shown = details["probes"], {"probes"}
    elif check.id == "confinement" and "touchpoints" in details:
        view["touchpoints"], shown = details["touchpoints"], {"touchpoints"}
    # `markdown`: the table a JSON report adds to the details (json_report.py); the page draws the rows itself.
    view["other"] = {k: v for k, v in details.items() if k not in shown | {"markdown"}}
    return view


# --- the perf matrix ------------------------------------------------------------------------------------


def heatmap(details: dict[str, Any]) -> Heatmap:
    """A grid with one cell per row of the perf matrix's details. The axis with the most values runs across;
    the other axes that vary make the row labels; axes with one value are said once."""
    rows = details["rows"]
    names = list(details["axes"]) + sorted({n for r in rows for n in r["axes"] if n not in details["axes"]})
    values: dict[str, list[Any]] = {}
    for name in names:
        seen = list(details["axes"].get(name, ()))
        for row in rows:
            if name in row["axes"] and row["axes"][name] not in seen:
                seen.append(row["axes"][name])
        values[name] = seen
    varying = [n for n in names if len(values[n]) > 1 or any(n not in r["axes"] for r in rows)]
    constant = {n: values[n][0] for n in names if n not in varying and values[n]}
    column_axis = max(reversed(varying), key=lambda n: len(values[n])) if varying else None
    columns = values[column_axis] if column_axis is not None else [None]
    labels: list[str] = []
    for row in rows:
        label = _row_label(row, varying, column_axis)
        if label not in labels:
            labels.append(label)
    label_width = round(max((len(label) for label in labels), default=0) * LABEL_CHAR_W + 12, 1)
    top = 22 if column_axis is not None else 0
    cells = []
    for index, row in enumerate(rows):
        col = columns.index(row["axes"].get(column_axis)) if column_axis is not None else 0
        x = label_width + col * (CELL_W + GAP)
        y = top + labels.index(_row_label(row, varying, column_axis)) * (CELL_H + GAP)
        cells.append(_cell(index, x, y, row))
    column_heads = [] if column_axis is None else [
        (label_width + i * (CELL_W + GAP) + CELL_W / 2, f"{column_axis}={value}") for i, value in enumerate(columns)]
    row_heads = [(top + i * (CELL_H + GAP) + CELL_H / 2 + 4, label) for i, label in enumerate(labels)]
    width = label_width + len(columns) * (CELL_W + GAP)
    height = top + max(len(labels), 1) * (CELL_H + GAP)
    return Heatmap(constant, column_heads, row_heads, label_width - 8, cells, width, height)


def _row_label(row: dict[str, Any], varying: list[str], column_axis: str | None) -> str:
    parts = [f"{n}={row['axes'][n]}" for n in varying if n != column_axis and n in row["axes"]]
    return ", ".join(parts) or "all"


def _cell(index: int, x: float, y: float, row: dict[str, Any]) -> Cell:
    axes = ", ".join(f"{k}={v}" for k, v in row["axes"].items())
    if row["candidate"] is None:
        return Cell(index, x, y, row, "none", "none", "missing", "no evidence",
                    f"{axes}\nmissing: no evidence measured this row")
    unit, speedup, floor = row["unit"], row["speedup"], floor_distance(row)
    lines = [axes,
             f"candidate {row['candidate']:.4g} {unit}, baseline "
             + (f"{row['baseline']:.4g} {unit}" if row["baseline"] is not None else "none"),
             f"speed-up {speedup:.3g}×" if speedup is not None else "speed-up: no baseline",
             f"byte floor {row['floor']:.4g} {unit}: {floor:.3g}× away" if floor is not None else "byte floor: unknown",
             f"{row['runs']} runs, spread {row['spread_pct']:.1f}%" if row["spread_pct"] is not None else f"{row['runs']} runs",
             f"from {row['source']}" if row.get("source") else ""]
    lines += [f"problem: {p}" for p in row["problems"]]
    return Cell(index, x, y, row, speedup_colour(speedup), floor_colour(floor),
                f"{speedup:.2f}×" if speedup is not None else "no baseline",
                f"{floor:.2f}× floor" if floor is not None else "floor ?",
                "\n".join(line for line in lines if line))


def floor_distance(row: dict[str, Any]) -> float | None:
    """How far the candidate is from the byte floor, as a factor ≥ 1 when the floor holds (1: at the floor):
    time over floor for times, floor over rate for rates."""
    if row.get("floor") is None or row.get("candidate") is None:
        return None
    if row["unit"] == "tokens/s":
        return row["floor"] / row["candidate"]
    return row["candidate"] / row["floor"]


def speedup_colour(speedup: float | None) -> str:
    """Green for faster than the baseline, red for slower, white at 1×; grey without a baseline."""
    if speedup is None:
        return "#d0d0d0"
    t = max(-1.0, min(1.0, math.log2(speedup) / SPEEDUP_SPAN))
    towards = (46, 160, 67) if t >= 0 else (214, 39, 40)
    return _mix((255, 255, 255), towards, abs(t))


def floor_colour(distance: float | None) -> str:
    """Dark blue at the floor, paler the further from it; grey when the floor is unknown."""
    if distance is None:
        return "#d0d0d0"
    t = max(0.0, min(1.0, math.log2(max(distance, 1.0)) / FLOOR_SPAN))
    return _mix((33, 102, 172), (222, 235, 247), t)


def _mix(a: tuple[int, int, int], b: tuple[int, int, int], t: float) -> str:
    return "#" + "".join(f"{round(x + (y - x) * t):02x}" for x, y in zip(a, b))


# --- changed lines --------------------------------------------------------------------------------------


def _coverage_file(row: dict[str, Any]) -> dict[str, Any]:
    """A changed file's statements as chips in line order, one per run of consecutive statements that the same
    tests ran, each with those tests (from the check's `statements`; a verdict from before they were recorded has
    only the uncovered ranges, and the page says so)."""
    tests = row.get("tests", [])
    chips = []
    for group in row.get("statements", []):
        names = [tests[i] for i in group["tests"] if 0 <= i < len(tests)]
        shown = names[:MAX_TESTS_ON_HOVER]
        if len(names) > len(shown):
            shown.append(f"… and {len(names) - len(shown)} more (gatekeeper check --format json lists them all)")
        for first, last in group["lines"]:
            chips.append({"first": first, "last": last, "count": len(names), "tests": shown})
    chips.sort(key=lambda chip: chip["first"])
    return {**row, "chips": chips, "has_lines": "statements" in row}
