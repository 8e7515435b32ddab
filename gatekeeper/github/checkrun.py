"""What the check run says, computed from a verdict: pure, no GitHub calls.

GitHub's limits shape it: a summary of at most 65535 characters, at most 50 annotations per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from gatekeeper.github.records import Override
from gatekeeper.verdict import Severity, Status, Verdict

SUMMARY_LIMIT = 65535
ANNOTATIONS_PER_REQUEST = 50
NAME_PREFIX = "gatekeeper / "
NO_POLICY_NAME = NAME_PREFIX + "(no valid policy)"

# GitHub's branch protection and rulesets count `neutral` and `skipped` as passing a required check, so
# the App never concludes either: only `success` lets a PR merge. Undecided is `in_progress` while CI's
# evidence may still come, then `action_required`.
CONCLUSIONS = {"pass": "success", "fail": "failure"}
LEVELS = {Severity.error: "failure", Severity.warning: "warning", Severity.notice: "notice"}
# From weakest to strongest claim against merging; a published verdict is never replaced by a weaker one.
STRENGTH = {"success": 0, "in_progress": 1, "action_required": 2, "failure": 3}


@dataclass(frozen=True)
class CheckRunReport:
    conclusion: str | None  # success | failure | action_required; None: the run stays in progress
    title: str
    summary: str
    annotations: tuple[dict[str, Any], ...] = field(default=())
    details_url: str | None = None

    @property
    def status(self) -> str:
        return "in_progress" if self.conclusion is None else "completed"

    @property
    def outcome(self) -> str:
        """The conclusion, or `in_progress` for an open run: what the records and the audit log keep."""
        return self.conclusion or "in_progress"

    def annotation_batches(self) -> list[list[dict[str, Any]]]:
        items = list(self.annotations)
        return [items[i:i + ANNOTATIONS_PER_REQUEST] for i in range(0, len(items), ANNOTATIONS_PER_REQUEST)]


@dataclass(frozen=True)
class MissingEvidence:
    """What an undecided verdict lacks, where to read about it, and how to produce it."""

    awaited: str  # e.g. "the `gatekeeper-evidence` artifact of `.github/workflows/gatekeeper.yml`"
    command: str  # the exact command that produces the evidence
    details_url: str
    wait_until: float | None  # epoch seconds; None: nothing more is coming (concluded `action_required`)


def check_run_name(policy_name: str) -> str:
    return NAME_PREFIX + policy_name


def rule_run_name(check_name: str, rule: str) -> str:
    """A rule's own run (`app.check_runs: per_rule`): the policy's run name, then the rule. A policy name has no
    slash, so the rule runs of a check are exactly the runs named `<its name> / ...`."""
    return f"{check_name} / {rule}"


def rule_report(verdict: Verdict, rule: str, overall: CheckRunReport, summary_markdown: str,
                override: Override | None = None, details_url: str | None = None) -> CheckRunReport:
    """One rule's run, beside the overall one (`overall`, already computed from the same verdict). Like it, never
    neutral or skipped: a passed rule is `success`; a rule the mode does not require is `success` too, saying so
    (the policy decided it need not hold here, as the overall run does); an override makes the others `success`;
    a failed rule `failure`; an undecided one waits while the overall run waits, then `action_required`."""
    result = next(c for c in verdict.checks if c.id == rule)
    notes = tuple(a for a in annotations(verdict) if a["title"] == rule)
    summary, url = truncate(summary_markdown), details_url or overall.details_url
    first = result.summary.splitlines()[0] if result.summary else ""
    if result.status is Status.passed:
        return CheckRunReport("success", _short(f"Passed: {first}"), summary, notes, url)
    if result.status is Status.skipped:
        return CheckRunReport("success", _short(f"Not required: {first}"), summary, notes, url)
    was = CONCLUSIONS.get(result.status.value, "undecided")
    if override is not None and verdict.verdict != "pass":
        note = (f"> **Overridden** by @{override.actor} for head `{override.head_sha[:12]}`: {override.reason}\n>\n"
                f"> Without the override this rule's conclusion would be `{was}`.\n\n")
        return CheckRunReport("success", f"Overridden by @{override.actor} (was {was})", truncate(note + summary_markdown),
                              notes, url)
    if result.status is Status.failed:
        return CheckRunReport("failure", _short(f"Failed: {first}"), summary, notes, url)
    if overall.conclusion is None:  # the overall run waits for CI's evidence: so does this rule
        return CheckRunReport(None, f"Waiting for evidence: {rule}", summary, notes, url)
    return CheckRunReport("action_required", f"Undecided: {rule}", summary, notes, url)


def _short(title: str, limit: int = 120) -> str:
    return title if len(title) <= limit else title[: limit - 1] + "…"


def verdict_report(verdict: Verdict, summary_markdown: str, override: Override | None = None,
                   missing: MissingEvidence | None = None, page_url: str | None = None) -> CheckRunReport:
    """`missing` is required for a neutral verdict: an undecided check must say what would decide it.
    `page_url`: the evaluation's details page, the run's details_url (else, undecided, the evidence workflow's)."""
    notes = tuple(annotations(verdict))
    if override is not None and verdict.verdict != "pass":
        was = CONCLUSIONS.get(verdict.verdict, "undecided")
        summary = (f"> **Overridden** by @{override.actor} for head `{override.head_sha[:12]}`: {override.reason}\n>\n"
                   f"> Without the override the conclusion would be `{was}`.\n\n") + summary_markdown
        return CheckRunReport("success", f"Overridden by @{override.actor} (was {was})", truncate(summary), notes,
                              page_url)
    if verdict.verdict != "neutral":
        return CheckRunReport(CONCLUSIONS[verdict.verdict], _title(verdict), truncate(summary_markdown), notes,
                              page_url)
    if missing is None:
        raise ValueError("an undecided verdict needs the missing evidence described")
    undecided = ", ".join(r.id for r in verdict.checks if r.status is Status.neutral)
    how = (f"**Produce the missing evidence:** {missing.awaited}. It comes from\n\n```\n{missing.command}\n```\n\n"
           f"Details: {missing.details_url}\n\n")
    if missing.wait_until is not None:
        until = datetime.fromtimestamp(missing.wait_until, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        head = (f"**Waiting** for {missing.awaited} (undecided: {undecided}). The check stays in progress until "
                f"the evidence arrives or until {until}; then, still undecided, it concludes `action_required`.\n\n")
        return CheckRunReport(None, f"Waiting for evidence: {undecided}", truncate(head + how + summary_markdown),
                              notes, page_url or missing.details_url)
    head = f"**Undecided: {undecided}.** A required rule could not be decided, so this check does not pass.\n\n"
    return CheckRunReport("action_required", f"Undecided: {undecided}", truncate(head + how + summary_markdown),
                          notes, page_url or missing.details_url)


def error_report(reason: str, title: str = "Could not evaluate") -> CheckRunReport:
    """An error while judging fails the check: an unjudged change must not merge. Re-run once it is fixed."""
    return CheckRunReport("failure", title, truncate(
        f"**{title}.** The gatekeeper could not evaluate this pull request, so the check fails closed.\n\n"
        f"Reason: {reason}\n\nUse the **Re-run** button once the cause is fixed.\n"))


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
