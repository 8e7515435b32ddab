"""Markdown reports from jinja2 templates: the check-run summary the App posts, the PR comment, and the summary of
one rule's own check run (`rule_run`, with `only`: the App's `app.check_runs: per_rule`).

Each check may add a `details` section. Its `CheckResult.details` is rendered by the template
`details_<check id>.md.j2` when one exists; else, when the check's rows make a table of `tables.py` (a perf
table, a coverage table), by showing that; else generically (scalars, tables of flat rows, JSON).
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import jinja2

from gatekeeper.report.tables import details_table
from gatekeeper.report.text import BLAST_CHANGE_TEXT, md_code, md_text, md_trusted
from gatekeeper.verdict import CheckId, CheckResult, Status, Verdict

# GitHub rejects a check-run summary or a comment longer than this many characters.
GITHUB_TEXT_LIMIT = 65535
# How many findings per check, and signals, a report shows at each step of cutting it to size.
_LIMITS = ((None, None), (200, 100), (50, 20), (10, 5), (0, 0))

STATUS_ICONS = {"pass": "✅", "fail": "❌", "neutral": "⚪", "skipped": "⏭️"}
SEVERITY_ICONS = {"error": "❌", "warning": "⚠️", "notice": "ℹ️"}

Template = Literal["check_run", "pr_comment", "rule_run"]

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("gatekeeper.report", "templates"),
    undefined=jinja2.StrictUndefined,  # a typo in a template is an error, not an empty string
    autoescape=False,  # Markdown, not HTML: every untrusted value goes through md_text or md_code instead
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_ENV.filters["md"] = md_text
_ENV.filters["code"] = md_code
_ENV.filters["trusted"] = md_trusted
_ENV.filters["json"] = lambda value: json.dumps(value, indent=2, sort_keys=True, default=str)
_ENV.filters["table"] = lambda rows: md_table(rows)
_ENV.filters["fenced"] = lambda text, lang="": md_fenced(text, lang)
_ENV.globals.update(status_icon=STATUS_ICONS, severity_icon=SEVERITY_ICONS, is_table=lambda v: _is_table(v),
                    blast_change_text=BLAST_CHANGE_TEXT)


def render_markdown(
    verdict: Verdict,
    *,
    template: Template = "check_run",
    details_url: str | None = None,
    max_chars: int = GITHUB_TEXT_LIMIT,
    only: CheckId | None = None,
) -> str:
    """The verdict as Markdown of at most `max_chars` characters.

    When the full text is too long, findings are cut per check (200, 50, 10, then none) and signals too
    (100, 20, 5, none), and the report says how many are not shown; as a last resort the text is cut and
    says so. `only`: show that rule alone (the `rule_run` template).
    """
    jinja_template = _ENV.get_template(f"{template}.md.j2")
    text = ""
    for finding_limit, signal_limit in _LIMITS:
        context = _context(verdict, details_url, finding_limit, signal_limit)
        if only is not None:
            context["checks"] = [c for c in context["checks"] if c["result"].id == only]
        text = jinja_template.render(**context)
        if len(text) <= max_chars:
            return text
    note = "\n\n… report truncated to fit GitHub's limit; run `gatekeeper check --format json` for all of it.\n"
    return text[: max(max_chars - len(note), 0)] + note[: max_chars]


def _context(
    verdict: Verdict, details_url: str | None, finding_limit: int | None, signal_limit: int | None
) -> dict[str, Any]:
    checks = []
    for check in verdict.checks:
        shown = check.findings if finding_limit is None else check.findings[:finding_limit]
        table = details_table(check)
        checks.append({
            "result": check,
            "findings": shown,
            "hidden": len(check.findings) - len(shown),
            "table": table,
            "details_template": _details_template(check, table),
        })
    counts = {s.value: sum(1 for c in verdict.checks if c.status is s) for s in Status}
    undecided = [c.id for c in verdict.checks if c.status is Status.neutral]
    signals = verdict.signals if signal_limit is None else verdict.signals[:signal_limit]
    return {
        "verdict": verdict,
        "signals": signals,
        "signals_hidden": len(verdict.signals) - len(signals),
        "checks": checks,
        "counts": counts,
        "undecided": undecided,
        "details_url": details_url,
        "overridden": bool(verdict.signals) and not verdict.agent_assisted,
    }


def _details_template(check: CheckResult, table: str | None) -> str:
    specific = f"details_{check.id}.md.j2"
    if specific in _ENV.list_templates():
        return specific
    # The table shows the check's rows; its details are then only the data behind it, not shown again.
    return "details_table.md.j2" if table is not None else "details_generic.md.j2"


def md_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of flat rows; the columns are the union of the rows' keys, in first-seen order."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = ["| " + " | ".join(md_text(str(c)) for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(md_text(_cell(row.get(c))) for c in columns) + " |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def md_fenced(text: str, lang: str = "") -> str:
    """A fenced code block longer than any backtick run inside `text`, so the text cannot close it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def _is_table(value: Any) -> bool:
    """A non-empty list of flat dicts renders as a table; anything else as a JSON block."""
    return (
        isinstance(value, (list, tuple))
        and bool(value)
        and all(isinstance(row, dict) for row in value)
        and all(not isinstance(cell, (dict, list, tuple)) for row in value for cell in row.values())
    )
