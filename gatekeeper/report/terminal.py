"""The terminal view of a Verdict, with rich. Untrusted text goes in as `Text`, never as rich markup."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from gatekeeper.report.tables import DetailsTable, details_rows
from gatekeeper.report.text import BLAST_CHANGE_TEXT, md_trusted, one_line
from gatekeeper.verdict import CheckResult, Status, Verdict

_STATUS_STYLES = {"pass": "bold green", "fail": "bold red", "neutral": "bold yellow", "skipped": "dim"}
_SEVERITY_STYLES = {"error": "red", "warning": "yellow", "notice": "cyan"}
_MODE_TEXT = {"strict": "strict bounded review", "default": "default review", None: "unknown"}

# Per-check renderers of `CheckResult.details`; a check without one gets its table (tables.py), or the generic
# key/value view.
DetailsRenderer = Callable[[dict[str, Any]], RenderableType | None]
DETAILS_RENDERERS: dict[str, DetailsRenderer] = {}


def render_terminal(verdict: Verdict, console: Console) -> None:
    console.print(_header(verdict))
    console.print(_signals(verdict))
    if verdict.blast_radius:
        console.print(_blast_radius(verdict))
    console.print(_checks_table(verdict))
    for check in verdict.checks:
        if check.status is not Status.skipped and (section := _check_section(check)) is not None:
            console.print(section)
    undecided = [c.id for c in verdict.checks if c.status is Status.neutral]
    if undecided:
        console.print(Text(f"UNDECIDED: {', '.join(undecided)} — an undecided check is never a pass.", style="bold yellow"))


def _header(verdict: Verdict) -> Panel:
    title = Text("gatekeeper: ")
    title.append(verdict.verdict.upper(), style=_STATUS_STYLES[verdict.verdict])
    body = Text()
    body.append(f"policy {one_line(verdict.policy.name)} (sha256 {verdict.policy.sha256[:12]})\n")
    body.append(f"mode: {_MODE_TEXT.get(verdict.mode, 'unknown')}")
    return Panel(body, title=title, title_align="left", expand=False)


def _signals(verdict: Verdict) -> Text:
    text = Text()
    if not verdict.signals:
        text.append("No signal of agent assistance found")
        text.append(" (declared agent-assisted)." if verdict.agent_assisted else " (absence is not proof of absence).")
        return text
    if not verdict.agent_assisted:
        text.append("Declared NOT agent-assisted, overriding these signals:\n", style="bold")
    else:
        text.append("Agent-assisted, signals:\n", style="bold")
    for signal in verdict.signals:
        text.append(f"  {signal.kind}", style="magenta")
        text.append(f" in {one_line(signal.source)}: {one_line(signal.detail)}")
        # A co-author's agent is already in its detail ("(agent: Claude)").
        named = signal.agent and f"(agent: {signal.agent})" not in signal.detail
        said = [f"agent {signal.agent}" if named else "", f"model {signal.model}" if signal.model else "",
                f"tools {', '.join(signal.tools)}" if signal.tools else "",
                f"used for {signal.used_for}" if signal.used_for else ""]
        text.append(f" ({one_line('; '.join(p for p in said if p))})\n" if any(said) else "\n")
    return text




def _blast_radius(verdict: Verdict) -> Text:
    text = Text("Blast radius:\n", style="bold")
    for radius in verdict.blast_radius:
        text.append(f"  {one_line(radius.package)}: ", style="magenta")
        text.append(one_line(radius.statement) + "\n")
        text.append(f"    change: {BLAST_CHANGE_TEXT[radius.change]}\n", style="bold red" if radius.change == "widens" else "")
        for axis, values in radius.widened.items():
            text.append(f"    newly admitted {one_line(axis)}: {one_line(', '.join(map(str, values)))}\n", style="red")
        if radius.newly_accepted_probes:
            text.append(f"    probes rejected at the base, accepted now: {one_line(', '.join(radius.newly_accepted_probes))}\n",
                        style="red")
    return text


def _checks_table(verdict: Verdict) -> Table:
    table = Table(show_header=True, header_style="bold", expand=False)
    table.add_column("Check")
    table.add_column("Status")
    table.add_column("Summary", overflow="fold")
    for check in verdict.checks:
        status = check.status.value
        label = Text(status, style=_STATUS_STYLES[status])
        if check.shadow:
            label.append(" (shadow: would have failed; never blocks)" if status == "fail" else " (shadow)", style="dim")
        table.add_row(check.id, label, Text(one_line(check.summary)))
    return table


def _check_section(check: CheckResult) -> RenderableType | None:
    parts: list[RenderableType] = []
    for finding in check.findings:
        line = Text("  ")
        line.append(f"{finding.severity.value:<8}", style=_SEVERITY_STYLES[finding.severity.value])
        if finding.path is not None:
            location = finding.path + (f":{finding.line}" if finding.line is not None else "")
            line.append(one_line(location), style="bold")
            line.append("  ")
        line.append(one_line(finding.message))
        parts.append(line)
    if check.details and (rendered := _details(check)) is not None:
        parts.append(rendered)
    if not parts:
        return None
    title = Text(check.id, style=_STATUS_STYLES[check.status.value])
    return Panel(Group(*parts), title=title, title_align="left")


def _details(check: CheckResult) -> RenderableType | None:
    renderer = DETAILS_RENDERERS.get(check.id)
    if renderer is not None:
        return renderer(check.details)
    table = details_rows(check)
    return _FittedTable(table) if table is not None else _generic_details(check.details)


class _FittedTable:
    """The check's table (gatekeeper.report.tables) drawn as a table where it fits the width it is given, and as
    a list of its rows where it does not: squeezed, rich cuts every cell to a few characters and an ellipsis, and
    the numbers are lost."""

    def __init__(self, table: DetailsTable):
        self.table = table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Imported here: rich.markdown pulls in markdown-it, a tenth of a second, for reports that rarely need it.
        from rich.markdown import Markdown

        fits = self.table.width() <= options.max_width
        yield Markdown(md_trusted(self.table.markdown() if fits else self.table.markdown_list()))


def _generic_details(details: dict[str, Any]) -> RenderableType:
    table = Table(show_header=False, box=None, padding=(0, 1))
    table.add_column(style="dim")
    table.add_column(overflow="fold")
    for key, value in details.items():
        table.add_row(Text(one_line(str(key))), Text(one_line(_compact(value))))
    return table


def _confinement_details(details: dict[str, Any]) -> RenderableType | None:
    budgets = details.get("touchpoints") or []
    if not budgets:
        return None
    table = Table(title="touchpoint budgets", title_justify="left", header_style="bold")
    for column in ("touchpoint", "added / budget", "removed / budget"):
        table.add_column(column)
    for b in budgets:
        table.add_row(Text(one_line(b["path"])), f"{b['added']} / {b['max_added']}", f"{b['removed']} / {b['max_removed']}")
    return table


DETAILS_RENDERERS["confinement"] = _confinement_details


def _compact(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:297] + "..."
