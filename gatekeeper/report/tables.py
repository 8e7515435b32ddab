"""The tables of the checks' `details`: probes, per-file coverage, the perf matrix. The checks return the rows;
these functions lay them out as a `DetailsTable` whose cells are Markdown the report wrote itself (rendered
through `md_trusted`, which still shows hidden characters and breaks @mentions in quoted text). The Markdown
report shows the table, the JSON keeps it under `details.markdown` (as schema_version 1 always had it), and the
terminal draws it, or lists its rows where it is wider than the terminal (a CI log is 80 columns)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len

from gatekeeper.verdict import CheckResult

MAX_TESTS_LISTED = 5  # per file in the coverage table; the evidence file has them all


@dataclass(frozen=True)
class DetailsTable:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()  # paragraphs after the table
    empty: str = ""  # what stands instead of a table without rows

    def markdown(self) -> str:
        if not self.rows and self.empty:
            return self.empty
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        return "\n".join(lines + [f"\n{note}" for note in self.notes])

    def markdown_list(self) -> str:
        """One bullet a row, each cell after its column's name; a cell without a name (a row's mark) first."""
        if not self.rows and self.empty:
            return self.empty
        lines = []
        for row in self.rows:
            named = [f"{name} {cell}" for name, cell in zip(self.header, row) if name]
            marks = [cell for name, cell in zip(self.header, row) if not name]
            lines.append("- " + " ".join(marks + [" · ".join(named)]))
        return "\n".join(lines + [f"\n{note}" for note in self.notes])

    def width(self) -> int:
        """Columns the Markdown table takes drawn (cells padded by one on each side, one rule between)."""
        widths = [max(cell_len(cell) for cell in column) for column in zip(self.header, *self.rows)]
        return sum(widths) + 3 * len(widths) + 1


def details_rows(check: CheckResult) -> DetailsTable | None:
    """The table of the check's details; None for a check without one, or whose details hold no rows for it."""
    keys, lay_out = _TABLES.get(check.id, ((), None))
    return lay_out(check.details) if lay_out is not None and all(k in check.details for k in keys) else None


def details_table(check: CheckResult) -> str | None:
    """details_rows as Markdown."""
    table = details_rows(check)
    return table.markdown() if table is not None else None


def _probe_table(details: dict[str, Any]) -> DetailsTable:
    rows = []
    for row in details["probes"]:
        got = row["got"].replace("|", "\\|").replace("\n", " ")
        rows.append((row["probe"], row["expect"], got[:200], "✅" if row["ok"] == "yes" else "❌"))
    return DetailsTable(("probe", "expect", "got", "ok"), tuple(rows))


def _coverage_table(details: dict[str, Any]) -> DetailsTable:
    rows = []
    for f in details["files"]:
        covered = f"{f['covered_lines']}/{f['changed_lines']}" if f["measured"] else "not measured"
        tests = ", ".join(f"`{t}`" for t in f["tests"][:MAX_TESTS_LISTED])
        if len(f["tests"]) > MAX_TESTS_LISTED:
            tests += f" and {len(f['tests']) - MAX_TESTS_LISTED} more"
        mark = "✅" if f["ok"] else "❌"
        rows.append((f"{mark} `{f['path']}`", covered, f["uncovered"] or "–", tests or "–",
                     ", ".join(f["sources"]) or "–"))
    return DetailsTable(("file", "changed lines covered", "uncovered", "covering tests", "from"), tuple(rows),
                        empty="_No changed owned Python files._")


def _perf_table(details: dict[str, Any]) -> DetailsTable:
    axis_names = list(details["axes"])
    # A row's axes are the required ones, then any others it was measured with (a layer, say).
    more_names = sorted({name for row in details["rows"] for name in row["axes"] if name not in axis_names})
    rows = []
    for d in details["rows"]:
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
        rows.append(tuple(cells))
    notes = []
    for e in details.get("exemptions", ()):
        selected = "; ".join(f"{axis} {', '.join(map(str, values))}" for axis, values in e["where"].items())
        notes.append(f"Rows with {selected}: one row at any {', '.join(e['ignore'])} stands for all ({e['reason']}).")
    header = (*axis_names, *more_names, "baseline", "candidate", "speedup", "floor", "runs", "spread", "")
    return DetailsTable(header, tuple(rows), tuple(notes))


# Per check: the details keys its table is made of, and the table.
_TABLES: dict[str, tuple[tuple[str, ...], Callable[[dict[str, Any]], DetailsTable]]] = {
    "startup_guard": (("probes",), _probe_table),
    "changed_path_tests": (("files",), _coverage_table),
    "perf_matrix": (("axes", "rows"), _perf_table),
}
