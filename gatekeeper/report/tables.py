"""The Markdown tables of the checks' `details`: probes, per-file coverage, the perf matrix. The checks return
the rows; the Markdown report shows these tables, the terminal draws them, and the JSON keeps them under
`details.markdown` (as schema_version 1 always had them). Cells are Markdown the report wrote itself: rendered
through `md_trusted`, which still shows hidden characters and breaks @mentions in quoted text."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gatekeeper.verdict import CheckResult

MAX_TESTS_LISTED = 5  # per file in the coverage table; the evidence file has them all


def details_table(check: CheckResult) -> str | None:
    """The table of the check's details; None for a check without one, or whose details hold no rows for it."""
    keys, render = _TABLES.get(check.id, ((), None))
    return render(check.details) if render is not None and all(k in check.details for k in keys) else None


def _probe_table(details: dict[str, Any]) -> str:
    lines = ["| probe | expect | got | ok |", "|---|---|---|---|"]
    for row in details["probes"]:
        got = row["got"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {row['probe']} | {row['expect']} | {got[:200]} | {'✅' if row['ok'] == 'yes' else '❌'} |")
    return "\n".join(lines)


def _coverage_table(details: dict[str, Any]) -> str:
    files = details["files"]
    if not files:
        return "_No changed owned Python files._"
    lines = ["| file | changed lines covered | uncovered | covering tests | from |", "|---|---|---|---|---|"]
    for f in files:
        covered = f"{f['covered_lines']}/{f['changed_lines']}" if f["measured"] else "not measured"
        tests = ", ".join(f"`{t}`" for t in f["tests"][:MAX_TESTS_LISTED])
        if len(f["tests"]) > MAX_TESTS_LISTED:
            tests += f" and {len(f['tests']) - MAX_TESTS_LISTED} more"
        mark = "✅" if f["ok"] else "❌"
        lines.append(f"| {mark} `{f['path']}` | {covered} | {f['uncovered'] or '–'} | {tests or '–'} "
                     f"| {', '.join(f['sources']) or '–'} |")
    return "\n".join(lines)


def _perf_table(details: dict[str, Any]) -> str:
    axis_names = list(details["axes"])
    rows = details["rows"]
    # A row's axes are the required ones, then any others it was measured with (a layer, say).
    more_names = sorted({name for row in rows for name in row["axes"] if name not in axis_names})
    header = [*axis_names, *more_names, "baseline", "candidate", "speedup", "floor", "runs", "spread", ""]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for d in rows:
        # A required axis is absent only where an axis exemption lets any of its values stand for the row.
        cells = [str(d["axes"].get(name, "any")) for name in axis_names] + [str(d["axes"].get(name, "–")) for name in more_names]
        if d["candidate"] is None:  # no evidence measured this row
            cells += ["–", "–", "–", "–", "–", "–", "❌ gap"]
        else:
            unit = d["unit"]
            cells += [
                f"{d['baseline']:.4g} {unit}" if d["baseline"] is not None else "none",
                f"{d['candidate']:.4g} {unit}",
                f"{d['speedup']:.2f}×" if d["speedup"] is not None else "–",
                f"{d['floor']:.4g} {unit}" if d["floor"] is not None else "–",
                str(d["runs"]),
                f"{d['spread_pct']:.1f}%" if d["spread_pct"] is not None else "–",
                "✅" if not d["problems"] else "❌ " + "; ".join(d["problems"]).replace("|", "/"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    for e in details.get("exemptions", ()):
        selected = "; ".join(f"{axis} {', '.join(map(str, values))}" for axis, values in e["where"].items())
        lines.append(f"\nRows with {selected}: one row at any {', '.join(e['ignore'])} stands for all ({e['reason']}).")
    return "\n".join(lines)


# Per check: the details keys its table is made of, and the table.
_TABLES: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], str]]] = {
    "startup_guard": (("probes",), _probe_table),
    "changed_path_tests": (("files",), _coverage_table),
    "perf_matrix": (("axes", "rows"), _perf_table),
}
