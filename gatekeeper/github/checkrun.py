"""What the check run says, computed from a verdict: pure, no GitHub calls.

GitHub's limits shape it: a summary of at most 65535 characters, at most 50 annotations per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gatekeeper.github.store import Override
from gatekeeper.verdict import Severity, Status, Verdict

SUMMARY_LIMIT = 65535
ANNOTATIONS_PER_REQUEST = 50
NAME_PREFIX = "gatekeeper / "
NO_POLICY_NAME = NAME_PREFIX + "(no valid policy)"

CONCLUSIONS = {"pass": "success", "fail": "failure", "neutral": "neutral"}
LEVELS = {Severity.error: "failure", Severity.warning: "warning", Severity.notice: "notice"}


@dataclass(frozen=True)
class CheckRunReport:
    conclusion: str  # success | failure | neutral
    title: str
    summary: str
    annotations: tuple[dict[str, Any], ...] = field(default=())

    def annotation_batches(self) -> list[list[dict[str, Any]]]:
        items = list(self.annotations)
        return [items[i:i + ANNOTATIONS_PER_REQUEST] for i in range(0, len(items), ANNOTATIONS_PER_REQUEST)]


def check_run_name(policy_name: str) -> str:
    return NAME_PREFIX + policy_name


def verdict_report(verdict: Verdict, summary_markdown: str, override: Override | None = None) -> CheckRunReport:
    conclusion = CONCLUSIONS[verdict.verdict]
    title = _title(verdict)
    summary = summary_markdown
    if override is not None and conclusion != "success":
        summary = (f"> **Overridden** by @{override.actor}: {override.reason}\n>\n"
                   f"> Without the override the conclusion would be `{conclusion}`.\n\n") + summary
        title = f"Overridden by @{override.actor} (was {conclusion})"
        conclusion = "neutral"
    return CheckRunReport(conclusion, title, truncate(summary), tuple(annotations(verdict)))


def undecided_report(reason: str, title: str = "Gatekeeper could not decide") -> CheckRunReport:
    """Neutral with the reason: what the App reports whenever it cannot reach a verdict."""
    return CheckRunReport("neutral", title, truncate(f"**{title}.**\n\n{reason}\n"))


def too_many_files_report(count: int, limit: int) -> CheckRunReport:
    # Fail closed: a change too large to list completely cannot be shown to stay confined.
    return CheckRunReport(
        "failure",
        f"Too many files to judge ({count} > {limit})",
        truncate(f"This pull request changes {count} files; the policy judges at most {limit} "
                 f"(GitHub lists at most 3000). A change that cannot be listed completely cannot be shown "
                 f"to stay confined, so the check fails closed. Split the pull request.\n"),
    )


def _title(verdict: Verdict) -> str:
    by_status: dict[Status, list[str]] = {}
    for result in verdict.checks:
        by_status.setdefault(result.status, []).append(result.id)
    if verdict.verdict == "fail":
        return "Failed: " + ", ".join(by_status[Status.failed])
    if verdict.verdict == "neutral":
        return "Undecided: " + ", ".join(by_status.get(Status.neutral, []))
    passed = by_status.get(Status.passed, [])
    return f"Passed: {len(passed)} check{'s' if len(passed) != 1 else ''}" + (
        f", {len(by_status[Status.skipped])} skipped" if by_status.get(Status.skipped) else "")


def annotations(verdict: Verdict) -> list[dict[str, Any]]:
    """One annotation per finding that names a file; findings without a path stay in the summary."""
    out = []
    for result in verdict.checks:
        for finding in result.findings:
            if not finding.path:
                continue
            line = finding.line if finding.line and finding.line > 0 else 1
            out.append({
                "path": finding.path,
                "start_line": line,
                "end_line": line,
                "annotation_level": LEVELS[finding.severity],
                "title": result.id,
                "message": finding.message[:60000],
            })
    return out


def truncate(text: str, limit: int = SUMMARY_LIMIT) -> str:
    if len(text) <= limit:
        return text
    note = "\n\n---\n*Summary truncated to fit GitHub's 65535-character limit; the annotations list every finding.*\n"
    return text[: limit - len(note)] + note
