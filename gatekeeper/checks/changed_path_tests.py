"""changed_path_tests: the changed executable lines of every changed owned Python file ran under tests that passed.

Judged per file, never averaged, so an untested file cannot hide behind a tested one. Coverage comes from the
collector's run (trusted) and from attached GPU reports (self-reported, for lines only a GPU executes).
"""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.changes import FileChange, FileStatus
from gatekeeper.checks import CheckContext
from gatekeeper.evidence import FileCoverage, TestRun
from gatekeeper.paths import matches_any
from gatekeeper.policy import ChangedPathTestsSettings
from gatekeeper.verdict import CheckResult, Finding, Severity, Status

CHECK_ID = "changed_path_tests"


@dataclass(frozen=True)
class FileVerdict:
    path: str
    changed: tuple[int, ...]     # changed executable statements (first lines)
    uncovered: tuple[int, ...]
    tests: tuple[str, ...]       # the tests that executed any of the changed statements
    sources: tuple[str, ...]     # the labels of the runs that covered something, with their trust
    excluded: tuple[int, ...]    # changed lines the coverage configuration excluded from measurement
    measured: bool               # False: no run measured this file at all
    # Per changed statement, the tests that executed it (empty: uncovered), for the details page's hover.
    line_tests: tuple[tuple[int, tuple[str, ...]], ...] = ()

    @property
    def ratio(self) -> float:
        return 1.0 if not self.changed else 1 - len(self.uncovered) / len(self.changed)


def run(ctx: CheckContext) -> CheckResult:
    settings = ctx.policy.policy.checks.changed_path_tests
    runs = ctx.evidence.tests if ctx.evidence is not None else ()
    ignored = ()
    if CHECK_ID in ctx.policy.policy.require_trusted:
        ignored = tuple(r for r in runs if r.origin.trust != "trusted")
        runs = tuple(r for r in runs if r.origin.trust == "trusted")
    if not runs:
        why = "no test results in the evidence (run `gatekeeper collect`)"
        if ignored:
            why = f"only self-reported test results ({', '.join(r.label for r in ignored)}); the policy requires trusted evidence"
        return CheckResult(id=CHECK_ID, status=Status.neutral, summary=f"Not decided: {why}.")

    findings = run_findings(runs)
    owned = ctx.policy.policy.owned_paths
    verdicts = [
        file_verdict(change, runs)
        for change in ctx.changes.files
        if _is_checked(change, owned, settings)
    ]
    for verdict in verdicts:
        findings += _file_findings(verdict, settings)
    errors = [f for f in findings if f.severity is Severity.error]
    details = {"files": [_file_row(v, settings) for v in verdicts]}
    if errors:
        summary = f"{len(errors)} problem(s): failing tests or changed lines not covered by tests."
        return CheckResult(id=CHECK_ID, status=Status.failed, summary=summary, findings=tuple(findings), details=details)
    changed = sum(len(v.changed) for v in verdicts)
    summary = f"{changed} changed executable line(s) in {len(verdicts)} file(s) ran under passing tests."
    return CheckResult(id=CHECK_ID, status=Status.passed, summary=summary, findings=tuple(findings), details=details)


def _is_checked(change: FileChange, owned: tuple[str, ...], settings: ChangedPathTestsSettings) -> bool:
    return (
        change.status is not FileStatus.removed
        and change.path.endswith(".py")
        and matches_any(change.path, owned)
        and not matches_any(change.path, settings.exclude_paths)
    )


def run_findings(runs: tuple[TestRun, ...]) -> list[Finding]:
    """A crashed or hung run, a run whose command failed without a failing test, and every failing test."""
    findings: list[Finding] = []
    for run_ in runs:
        where = f"{run_.label} ({run_.origin.trust.replace('_', '-')})"
        findings += [Finding(severity=Severity.warning, message=f"{where}: {note}") for note in run_.notes]
        if run_.error is not None:
            findings.append(Finding(message=f"test run {where} did not complete: {run_.error}"))
        failing = [t for t in run_.tests if t.outcome in ("failed", "error")]
        for test in failing:
            first_line = test.message.strip().splitlines()[0] if test.message.strip() else test.outcome
            findings.append(Finding(message=f"{test.id} {test.outcome} in {where}: {first_line[:300]}"))
        if run_.error is None and not failing and run_.exit_code not in (None, 0):
            findings.append(Finding(message=f"test run {where} exited with status {run_.exit_code} and no failing test"))
        if run_.error is None and not run_.tests:
            findings.append(Finding(message=f"test run {where} ran no tests"))
    return findings


def file_verdict(change: FileChange, runs: tuple[TestRun, ...]) -> FileVerdict:
    coverages = [(run_, cov) for run_ in runs for cov in run_.files if cov.path == change.path]
    if not coverages:
        return FileVerdict(change.path, (), (), (), (), (), measured=False)
    # Statements come from the source at the head; prefer a trusted run's analysis of it.
    reference = min(coverages, key=lambda rc: rc[0].origin.trust != "trusted")[1]
    changed = changed_statements(change.added_lines, reference)
    tests: dict[str, None] = {}
    sources: dict[str, None] = {}
    uncovered = []
    line_tests = []
    for line in changed:
        ran: dict[str, None] = {}
        for run_, cov in coverages:
            names = run_.context_names(cov.covered.get(line, ()))
            if names:
                sources[f"{run_.label} ({run_.origin.trust.replace('_', '-')})"] = None
                ran.update(dict.fromkeys(names))
        if not ran:
            uncovered.append(line)
        tests.update(ran)
        line_tests.append((line, tuple(ran)))
    excluded = tuple(sorted(set(change.added_lines) & set(reference.excluded)))
    return FileVerdict(change.path, changed, tuple(uncovered), tuple(tests), tuple(sources), excluded, measured=True,
                       line_tests=tuple(line_tests))


def changed_statements(added_lines: tuple[int, ...], coverage: FileCoverage) -> tuple[int, ...]:
    """The executable statements an added line belongs to: a line inside a multi-line statement counts as a
    change of that statement (coverage reports it at its first line)."""
    statements = set(coverage.statements)
    first_of = {line: first for first, last in coverage.spans for line in range(first, last + 1)}
    return tuple(sorted({first_of.get(line, line) for line in added_lines} & statements))


def _file_findings(verdict: FileVerdict, settings: ChangedPathTestsSettings) -> list[Finding]:
    findings: list[Finding] = []
    if not verdict.measured:
        return [Finding(path=verdict.path, message="no test run measured this file: none of its lines ran under tests")]
    too_many = settings.max_uncovered_lines_per_file is not None and len(verdict.uncovered) > settings.max_uncovered_lines_per_file
    if verdict.uncovered and (verdict.ratio < settings.min_file_coverage or too_many):
        findings.append(Finding(
            path=verdict.path,
            line=verdict.uncovered[0],
            message=(
                f"{len(verdict.uncovered)} of {len(verdict.changed)} changed executable line(s) never ran under a test "
                f"(lines {line_ranges(verdict.uncovered)}); the policy requires {settings.min_file_coverage:.0%} per file"
                + (f" and at most {settings.max_uncovered_lines_per_file} uncovered" if settings.max_uncovered_lines_per_file is not None else "")
            ),
        ))
    if verdict.excluded:
        findings.append(Finding(
            path=verdict.path,
            line=verdict.excluded[0],
            severity=Severity.warning,
            message=f"changed line(s) {line_ranges(verdict.excluded)} are excluded from coverage measurement (e.g. `pragma: no cover`)",
        ))
    return findings


def line_ranges(lines: tuple[int, ...] | list[int]) -> str:
    """1, 2, 3, 7, 9, 10 -> "1-3, 7, 9-10"."""
    parts: list[str] = []
    ordered = sorted(lines)
    start = prev = None
    for line in ordered + [None]:
        if start is not None and (line is None or line != prev + 1):
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if line is not None and start is None:
            start = line
        prev = line
    return ", ".join(parts)


def _file_row(verdict: FileVerdict, settings: ChangedPathTestsSettings) -> dict:
    index = {test: i for i, test in enumerate(verdict.tests)}
    return {
        "path": verdict.path,
        "measured": verdict.measured,
        "changed_lines": len(verdict.changed),
        "covered_lines": len(verdict.changed) - len(verdict.uncovered),
        "uncovered": line_ranges(verdict.uncovered),
        "tests": list(verdict.tests),
        "sources": list(verdict.sources),
        "ok": not _file_findings_errors(verdict, settings),
        # Which tests ran which changed statements, for the details page: the statements grouped by the set of
        # tests that ran them (as indices into `tests`; an empty set: uncovered), each group's lines as [first,
        # last] runs of consecutive statements. A PR's thousands of statements make a few hundred groups.
        "statements": _statement_groups(verdict.line_tests, index),
        "excluded": list(verdict.excluded),  # changed lines the coverage configuration left out
    }


def _statement_groups(line_tests: tuple[tuple[int, tuple[str, ...]], ...], index: dict[str, int]) -> list[dict]:
    groups: dict[tuple[int, ...], list[list[int]]] = {}
    for line, ran in line_tests:
        runs = groups.setdefault(tuple(index[t] for t in ran), [])
        if runs and runs[-1][1] == line - 1:
            runs[-1][1] = line
        else:
            runs.append([line, line])
    return [{"lines": runs, "tests": list(tests)} for tests, runs in groups.items()]


def _file_findings_errors(verdict: FileVerdict, settings: ChangedPathTestsSettings) -> bool:
    return any(f.severity is Severity.error for f in _file_findings(verdict, settings))
