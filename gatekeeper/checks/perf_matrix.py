"""perf_matrix: performance evidence covers every deployment the support matrix admits, and shows no regression.

Required rows are the product of the support matrix axes (recorded by the collector) and the policy's
`extra_axes`, less the axes an `axis_exemptions` entry ignores in the rows it selects (one row at any value of
them). Evidence comes from the collector's artifact (trusted), files in the PR matching
`evidence_globs` and fenced blocks in the PR body (self-reported). For every required row the check demands a
baseline from the same run, enough runs, a bounded spread and no regression beyond the policy's threshold; the
evidence must be measured at the PR head or an ancestor within `commit_window`.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from gatekeeper.checks import CheckContext
from gatekeeper.errors import InputError
from gatekeeper.evidence import AxisValue, Origin, PerfRow, PerfSubmission, parse_perf_evidence
from gatekeeper.paths import matches_any
from gatekeeper.policy import AxisExemption, PerfMatrixSettings
from gatekeeper.verdict import CheckResult, Finding, Severity, Status

CHECK_ID = "perf_matrix"
MAX_EVIDENCE_FILES = 50  # more matching files than this is a mistake in the globs, not evidence


@dataclass(frozen=True)
class RowVerdict:
    axes: dict[str, AxisValue]   # the required axes
    more: dict[str, AxisValue]   # the row's other axes, which the policy does not require
    row: PerfRow | None          # None: no evidence measured this row
    source: PerfSubmission | None
    problems: tuple[str, ...]


def run(ctx: CheckContext) -> CheckResult:
    settings = ctx.policy.policy.checks.perf_matrix
    findings: list[Finding] = []
    submissions = gather_submissions(ctx, settings, findings)
    if CHECK_ID in ctx.policy.policy.require_trusted:
        for sub in submissions:
            if sub.origin.trust != "trusted":
                findings.append(Finding(severity=Severity.warning, message=(
                    f"ignored self-reported perf evidence ({sub.origin.source}): the policy requires trusted evidence"
                )))
        submissions = [s for s in submissions if s.origin.trust == "trusted"]
    axes, axes_problem = required_axes(ctx, settings)
    if axes_problem is not None:
        findings.append(Finding(message=axes_problem))
    exemptions = settings.axis_exemptions
    if axes is not None:
        findings += [Finding(message=problem) for problem in exemption_problems(axes, exemptions)]
    parse_errors = [f for f in findings if f.severity is Severity.error]
    if axes is None or not submissions:
        details = {}
        if axes is None:
            why = "the support matrix axes are unknown (not recorded by `gatekeeper collect`, and no extra_axes)"
        else:
            # Show the author every row to measure.
            gaps = [v for combo in required_rows(axes, exemptions) for v in row_verdicts(combo, [], settings)]
            details = {"axes": {n: list(vs) for n, vs in axes.items()}, "rows": [_row_detail(v) for v in gaps],
                       **_exemption_details(exemptions)}
            why = f"no performance evidence (collector artifact, PR file or PR body block) for the {len(gaps)} required row(s)"
        status = Status.failed if parse_errors else Status.neutral
        return _result(status, ("Failed" if parse_errors else "Not decided") + f": {why}.", findings, details)

    head = _head_sha(ctx)
    allowed = _allowed_commits(ctx, head, settings)
    used: set[int] = set()
    verdicts = []
    for combo in required_rows(axes, exemptions):
        for verdict in row_verdicts(combo, submissions, settings):
            if verdict.source is not None:
                used.add(id(verdict.source))
            verdicts.append(verdict)
    undecided = []
    for sub in submissions:
        if id(sub) not in used:
            continue
        if head is None:
            undecided.append("the PR head is unknown, so the evidence commit cannot be verified")
            continue
        age = next((age for sha, age in allowed.items() if sha.startswith(sub.evidence.commit)), None)
        if age is None:
            window = _window_words(settings) if settings.commit_window else ""
            findings.append(Finding(message=(
                f"perf evidence from {sub.origin.source} was measured at {sub.evidence.commit}, "
                f"not at the PR head {head[:12]}{window}"
            )))
        elif age:
            # Passing, but aging: say how much of the window is left before the evidence must be measured again.
            findings.append(Finding(severity=Severity.notice, message=(
                f"perf evidence from {sub.origin.source} was measured at {sub.evidence.commit[:12]}, "
                f"{_age_words(age, settings)} behind the PR head {head[:12]}; the policy allows "
                f"{settings.commit_window}, so it holds for {settings.commit_window - age} more"
            )))
    for verdict in verdicts:
        for problem in verdict.problems:
            findings.append(Finding(message=f"{_axes_label({**verdict.axes, **verdict.more})}: {problem}"))
    details = {
        "axes": {name: list(values) for name, values in axes.items()},
        "rows": [_row_detail(v) for v in verdicts],
        **_exemption_details(exemptions),
    }
    errors = [f for f in findings if f.severity is Severity.error]
    if errors:
        missing = sum(1 for v in verdicts if v.row is None)
        summary = f"{len(errors)} problem(s) in the perf matrix ({len(verdicts)} row(s) judged, {missing} missing)."
        return _result(Status.failed, summary, findings, details)
    if undecided:
        return _result(Status.neutral, "Not decided: " + "; ".join(sorted(set(undecided))) + ".", findings, details)
    trust = sorted({s.origin.trust.replace("_", "-") for s in submissions if id(s) in used})
    gpus = sorted({s.evidence.hardware.gpu for s in submissions if id(s) in used})
    summary = (f"All {len(verdicts)} row(s) covering the support matrix measured on {', '.join(gpus)}, no regression "
               f"({'/'.join(trust)} evidence).")
    return _result(Status.passed, summary, findings, details)


def _result(status: Status, summary: str, findings: list[Finding], details: dict | None = None) -> CheckResult:
    return CheckResult(id=CHECK_ID, status=status, summary=summary, findings=tuple(findings), details=details or {})


# --- evidence sources ---------------------------------------------------------------------------------


def gather_submissions(ctx: CheckContext, settings: PerfMatrixSettings, findings: list[Finding]) -> list[PerfSubmission]:
    """The collector's perf evidence, PR files matching `evidence_globs`, and fenced blocks of the PR body.
    An unreadable file or block becomes an error finding naming it."""
    submissions = list(ctx.evidence.perf) if ctx.evidence is not None else []
    if settings.evidence_globs and ctx.snapshot is not None:
        paths = [p for p in ctx.snapshot.paths() if matches_any(p, settings.evidence_globs)]
        if len(paths) > MAX_EVIDENCE_FILES:
            findings.append(Finding(message=f"{len(paths)} files match evidence_globs; at most {MAX_EVIDENCE_FILES} are read"))
            paths = paths[:MAX_EVIDENCE_FILES]
        for path in paths:
            text = ctx.snapshot.read(path)
            if text is None:
                findings.append(Finding(path=path, message="perf evidence file is not text"))
                continue
            _add(submissions, findings, text, Origin(trust="self_reported", source=f"PR file {path}"), path)
    body = ctx.pull_request.body if ctx.pull_request is not None else ""
    for index, (line, block) in enumerate(fenced_blocks(body, settings.body_fence), start=1):
        origin = Origin(trust="self_reported", source=f"PR body block {index}")
        _add(submissions, findings, block, origin, "pull request body", line_offset=line)
    return submissions


def _add(submissions: list[PerfSubmission], findings: list[Finding], text: str, origin: Origin, path: str,
         line_offset: int = 0) -> None:
    try:
        evidence = parse_perf_evidence(text, path)
    except InputError as exc:
        line = exc.line + line_offset if exc.line is not None else (line_offset or None)
        findings.append(Finding(path=path, line=line, message=f"unusable perf evidence: {exc.reason}"))
        return
    submissions.append(PerfSubmission(origin=origin, evidence=evidence))


def fenced_blocks(body: str, fence: str) -> list[tuple[int, str]]:
    """The contents of ```<fence> blocks in Markdown text, with the 1-based line of their opening fence."""
    blocks: list[tuple[int, str]] = []
    opening = re.compile(rf"^\s*(`{{3,}}|~{{3,}})\s*{re.escape(fence)}\s*$")
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        match = opening.match(lines[i])
        if match is None:
            i += 1
            continue
        marker, start = match.group(1), i
        i += 1
        content = []
        while i < len(lines) and lines[i].strip() != marker:
            content.append(lines[i])
            i += 1
        blocks.append((start + 1, "\n".join(content)))
        i += 1
    return blocks


# --- required rows ------------------------------------------------------------------------------------


def required_axes(ctx: CheckContext, settings: PerfMatrixSettings) -> tuple[dict[str, tuple[Any, ...]] | None, str | None]:
    """The axes every combination of which needs a row, and a problem to report (or None)."""
    recorded = ctx.evidence.support_axes if ctx.evidence is not None else None
    extra = {name: tuple(values) for name, values in settings.extra_axes.items()}
    if recorded is not None and recorded.error is not None:
        return None, f"the support matrix axes could not be read from {recorded.source}: {recorded.error}"
    if recorded is not None and recorded.axes is not None:
        clash = set(recorded.axes) & set(extra)
        if clash:
            return None, f"extra_axes {sorted(clash)} repeat axes of the support matrix"
        return {**recorded.axes, **extra}, None
    if ctx.policy.policy.checks.startup_guard.support_matrix is not None:
        # The policy declares a support matrix: extra_axes alone would demand far fewer rows than it admits.
        return None, None
    return (extra or None), None


def required_rows(axes: dict[str, tuple[Any, ...]], exemptions: tuple[AxisExemption, ...] = ()) -> list[dict[str, Any]]:
    """Every combination of the axes' values, less the axes the first exemption selecting it ignores (the
    combinations that then coincide are one row)."""
    names = list(axes)
    rows: list[dict[str, Any]] = []
    for values in itertools.product(*(axes[n] for n in names)):
        combo = dict(zip(names, values))
        exemption = next((e for e in exemptions if _selects(e, combo)), None)
        if exemption is not None:
            combo = {name: value for name, value in combo.items() if name not in exemption.ignore}
        if combo not in rows:
            rows.append(combo)
    return rows


def _selects(exemption: AxisExemption, combo: dict[str, Any]) -> bool:
    return all(str(combo.get(axis)) in {str(v) for v in values} for axis, values in exemption.where.items())


def exemption_problems(axes: dict[str, tuple[Any, ...]], exemptions: tuple[AxisExemption, ...]) -> list[str]:
    """What in `axis_exemptions` cannot apply to these axes: an exemption naming an axis or a value the required
    rows do not have would silently exempt nothing (a typo), so each is an error."""
    problems = []
    for index, exemption in enumerate(exemptions):
        where = f"axis_exemptions[{index}]"
        for axis in [*exemption.where, *exemption.ignore]:
            if axis not in axes:
                problems.append(f"{where} names the axis {axis!r}, which the required rows do not have "
                                f"(they have {', '.join(axes)})")
        for axis, values in exemption.where.items():
            known = {str(v) for v in axes.get(axis, ())}
            if axis in axes and (unknown := [v for v in values if str(v) not in known]):
                problems.append(f"{where} selects {axis} {unknown}, which no required row has "
                                f"({axis}: {', '.join(map(str, axes[axis]))})")
    return problems


def _exemption_details(exemptions: tuple[AxisExemption, ...]) -> dict[str, Any]:
    if not exemptions:
        return {}
    return {"exemptions": [{"where": {a: list(vs) for a, vs in e.where.items()}, "ignore": list(e.ignore),
                            "reason": e.reason} for e in exemptions]}


def row_verdicts(combo: dict[str, Any], submissions: list[PerfSubmission], settings: PerfMatrixSettings) -> list[RowVerdict]:
    """The verdicts of one required row: from the best submission measuring it (trusted first, then the
    newest run), every row matching it is judged; rows splitting it by axes the policy does not require
    (say, one per layer) must each pass."""
    candidates = [
        sub for sub in submissions
        if any(row.metric == settings.metric and _matches(row.axes, combo) for row in sub.evidence.rows)
    ]
    if not candidates:
        return [RowVerdict(combo, {}, None, None, ("missing: no evidence measured this row",))]
    sub = max(candidates, key=lambda s: (s.origin.trust == "trusted", s.evidence.created))
    return [
        RowVerdict(combo, {k: v for k, v in row.axes.items() if k not in combo}, row, sub, tuple(row_problems(row, sub, settings)))
        for row in sub.evidence.rows
        if row.metric == settings.metric and _matches(row.axes, combo)
    ]


def row_problems(row: PerfRow, sub: PerfSubmission, settings: PerfMatrixSettings) -> list[str]:
    if row.baseline is None:
        return ["no baseline measured in the same run"]
    problems = []
    runs = min(row.candidate.runs, row.baseline.runs)
    if runs < settings.min_runs:
        problems.append(f"only {runs} run(s); the policy requires {settings.min_runs}")
    spread = max(row.candidate.spread_pct, row.baseline.spread_pct)
    if spread > settings.max_spread_pct:
        problems.append(f"spread {spread:.1f}% is above the policy's {settings.max_spread_pct:g}%")
    slowdown = (1 / row.speedup - 1) * 100
    if slowdown > settings.max_regression_pct:
        problems.append(f"regression: the candidate is {slowdown:.1f}% slower than the baseline (allowed {settings.max_regression_pct:g}%)")
    measured_arch = sub.evidence.hardware.arch
    if "arch" in row.axes and measured_arch is not None and str(row.axes["arch"]) != measured_arch:
        problems.append(f"the row claims arch {row.axes['arch']} but was measured on {measured_arch}")
    gpu = sub.evidence.hardware.gpu
    if settings.gpus and not any(name.lower() in gpu.lower() for name in settings.gpus):
        problems.append(f"measured on {gpu}; the policy takes evidence from {', '.join(settings.gpus)} only")
    return problems


def _matches(row_axes: dict[str, AxisValue], combo: dict[str, Any]) -> bool:
    # Compared as text, so `8` in YAML and `"8"` in a hand-written block name the same row.
    return all(name in row_axes and str(row_axes[name]) == str(value) for name, value in combo.items())


# --- commits ------------------------------------------------------------------------------------------


def _head_sha(ctx: CheckContext) -> str | None:
    if ctx.changes.head_sha:
        return ctx.changes.head_sha
    return ctx.pull_request.head_sha if ctx.pull_request is not None else None


def _allowed_commits(ctx: CheckContext, head: str | None, settings: PerfMatrixSettings) -> dict[str, int]:
    """The head and, where the collector recorded the head's ancestry, the ancestors within the commit window, each
    with its age in the window's unit (the head's is 0): the `commit_window` nearest ones, aged by position, or
    (commit_window_counts: owned) those with at most `commit_window` commits changing the owned paths after them
    (the head included), aged by that count."""
    if head is None:
        return {}
    recorded = ctx.evidence.head if ctx.evidence is not None else None
    if recorded is None or not recorded.sha.startswith(head):
        return {head: 0}
    if settings.commit_window_counts == "all":
        return {head: 0, **{sha: i for i, sha in enumerate(recorded.ancestors[: settings.commit_window], start=1)}}
    if recorded.owned_changes is None:
        return {head: 0}  # the collector did not record which commits changed the owned paths
    owned, changes, allowed = set(recorded.owned_changes), 0, {}
    for sha in (recorded.sha, *recorded.ancestors):
        if changes > settings.commit_window:
            break
        allowed[sha] = changes
        changes += sha in owned
    return allowed


def _window_words(settings: PerfMatrixSettings) -> str:
    if settings.commit_window_counts == "owned":
        return f" or an ancestor at most {_changes(settings.commit_window, settings)} behind it"
    return f" or one of its {settings.commit_window} nearest ancestors"


def _age_words(age: int, settings: PerfMatrixSettings) -> str:
    return _changes(age, settings) if settings.commit_window_counts == "owned" else f"{age} commit(s)"


def _changes(count: int, settings: PerfMatrixSettings) -> str:
    if settings.commit_window_paths:
        return f"{count} change(s) to the commit window's paths ({', '.join(settings.commit_window_paths)})"
    return f"{count} owned-path change(s)"


# --- details ------------------------------------------------------------------------------------------


def _axes_label(axes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in axes.items())


def _row_detail(v: RowVerdict) -> dict[str, Any]:
    row = v.row
    return {
        "axes": {**v.axes, **v.more},
        "unit": row.unit if row else None,
        "baseline": row.baseline.median if row and row.baseline else None,
        "candidate": row.candidate.median if row else None,
        "speedup": row.speedup if row else None,
        "floor": row.floor if row else None,
        "runs": min(row.candidate.runs, row.baseline.runs) if row and row.baseline else (row.candidate.runs if row else None),
        "spread_pct": max(row.candidate.spread_pct, row.baseline.spread_pct) if row and row.baseline else None,
        "source": f"{v.source.origin.source} ({v.source.origin.trust})" if v.source else None,
        "problems": list(v.problems),
    }
