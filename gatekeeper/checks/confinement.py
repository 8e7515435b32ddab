"""Confinement: every changed path lies in the owned paths, or in a declared touchpoint within its budget.

Anything the check cannot judge fails closed: hostile paths, renames that delete a file outside the owned
paths, symlinks whose target is unknown or leaves the owned paths, submodules and binaries (unless the
policy allows them, and then only inside the owned paths), touchpoint edits without a patch (their budget
is unverifiable), and change sets larger than the policy's `max_files`.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from gatekeeper.changes import SYMLINK_MODE, FileChange, FileStatus
from gatekeeper.checks import CheckContext
from gatekeeper.paths import matches, matches_any, path_problem
from gatekeeper.policy import ConfinementSettings, Policy, Touchpoint
from gatekeeper.verdict import CheckResult, Finding, Severity, Status


@dataclass
class _Budget:
    """Lines a touchpoint has used so far, in file order, so the first line over budget can be named."""

    touchpoint: Touchpoint
    added: int = 0
    removed: int = 0


@dataclass
class _Problems:
    """What is wrong with one file. It becomes one finding: the worst severity, every reason, first line."""

    items: list[tuple[Severity, str, int | None]] = field(default_factory=list)

    def add(self, severity: Severity, message: str, line: int | None = None) -> None:
        self.items.append((severity, message, line))

    def finding(self, path: str) -> Finding | None:
        if not self.items:
            return None
        order = [Severity.error, Severity.warning, Severity.notice]
        severity = min((s for s, _, _ in self.items), key=order.index)
        line = next((ln for s, _, ln in self.items if s is severity and ln is not None), None)
        message = "; ".join(m for s, m, _ in self.items if s is severity)
        return Finding(path=path, line=line, severity=severity, message=message)


def run(ctx: CheckContext) -> CheckResult:
    policy = ctx.policy.policy
    files = ctx.changes.files
    if len(files) > policy.max_files:
        reason = (
            f"{len(files)} files changed, more than the policy's max_files ({policy.max_files}): failing closed, "
            "because a change this large cannot be reviewed file by file (GitHub also lists at most 3000 files)."
        )
        return CheckResult(
            id="confinement", status=Status.failed, summary=reason, findings=(Finding(message=reason),),
            details={"files": len(files), "max_files": policy.max_files},
        )

    budgets = [_Budget(tp) for tp in policy.touchpoints]
    counts = {"owned": 0, "touchpoint": 0, "outside": 0, "hostile": 0}
    findings: list[Finding] = []
    for change in files:
        problems = _Problems()
        counts[_judge(change, policy, budgets, problems)] += 1
        finding = problems.finding(change.path)
        if finding is not None:
            findings.append(finding)

    offending = sum(1 for f in findings if f.severity is Severity.error)
    notices = len(findings) - offending
    summary = (
        f"{len(files)} file{'s' if len(files) != 1 else ''} changed: {counts['owned']} in owned paths, "
        f"{counts['touchpoint']} in touchpoints, {counts['outside']} outside, {counts['hostile']} hostile; "
        f"{offending} offending."
    )
    if notices:
        summary += f" {notices} notice{'s' if notices != 1 else ''}."
    details = {
        "files": len(files),
        **counts,
        "offending": offending,
        "touchpoints": [
            {"path": b.touchpoint.path, "added": b.added, "max_added": b.touchpoint.max_added,
             "removed": b.removed, "max_removed": b.touchpoint.max_removed}
            for b in budgets
        ],
    }
    status = Status.failed if offending else Status.passed
    return CheckResult(id="confinement", status=status, summary=summary, findings=tuple(findings), details=details)


def _judge(change: FileChange, policy: Policy, budgets: list[_Budget], problems: _Problems) -> str:
    """Record what is wrong with one changed file and say where it lies: owned, touchpoint, outside, hostile."""
    hostile = [(p, why) for p in change.paths if (why := path_problem(p)) is not None]
    if hostile:
        for path, why in hostile:
            problems.add(Severity.error, f"hostile path {path!r}: {why}")
        return "hostile"  # no glob is consulted for a path that may not mean what it shows

    settings = policy.checks.confinement
    if change.status is FileStatus.renamed and not matches_any(change.old_path, policy.owned_paths):
        problems.add(Severity.error, f"renamed from {change.old_path}, outside the owned paths (the rename deletes it)")

    if matches_any(change.path, policy.owned_paths):
        _judge_owned(change, settings, policy.owned_paths, problems)
        return "owned"
    budget = next((b for b in budgets if matches(change.path, b.touchpoint.path)), None)
    if budget is not None:
        _judge_touchpoint(change, settings, budget, problems)
        return "touchpoint"
    problems.add(
        Severity.error,
        "outside the owned paths and not a declared touchpoint",
        change.added_lines[0] if change.added_lines else None,
    )
    return "outside"


def _judge_owned(change: FileChange, settings: ConfinementSettings, owned: tuple[str, ...], problems: _Problems) -> None:
    if change.is_submodule and not settings.allow_submodules:
        problems.add(Severity.error, "submodule change (the policy does not allow submodules)")
    if change.new_mode == SYMLINK_MODE and change.status is not FileStatus.removed:
        _judge_symlink(change, settings, owned, problems)
    if change.binary and not settings.allow_binary:
        problems.add(Severity.error, "binary file (the policy does not allow binaries; its content cannot be reviewed)")
    if change.mode_changed and not settings.allow_mode_changes:
        problems.add(Severity.error, f"mode change {change.old_mode} -> {change.new_mode} (not allowed by the policy)")
    if not change.has_patch and not change.binary and not change.is_submodule:
        problems.add(Severity.notice, "no patch text in the source: its changed lines could not be listed")


def _judge_symlink(change: FileChange, settings: ConfinementSettings, owned: tuple[str, ...], problems: _Problems) -> None:
    if not settings.allow_symlinks:
        problems.add(Severity.error, "symlink (the policy does not allow symlinks)")
        return
    target = change.symlink_target
    if target is None:
        problems.add(Severity.error, "symlink with an unknown target (the source did not show it)")
        return
    if (why := _target_problem(target)) is not None:
        problems.add(Severity.error, f"symlink target {target!r}: {why}")
        return
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(change.path), target))
    if resolved == ".." or resolved.startswith("../"):
        problems.add(Severity.error, f"symlink to {target!r} points outside the repository")
    elif not matches_any(resolved, owned):
        problems.add(Severity.error, f"symlink to {target!r} resolves to {resolved}, outside the owned paths")


def _target_problem(target: str) -> str | None:
    # A target is relative to its link, so '..' and '.' are legitimate here; everything else path_problem
    # rejects (absolute paths, control characters, backslashes) still disqualifies it.
    if target.startswith("/"):
        return "absolute target"
    canonical = "/".join(s for s in target.split("/") if s not in (".", "..")) or "x"
    return path_problem(canonical)


def _judge_touchpoint(change: FileChange, settings: ConfinementSettings, budget: _Budget, problems: _Problems) -> None:
    where = f"touchpoint {budget.touchpoint.path}"
    if change.is_submodule:
        problems.add(Severity.error, f"submodule change in {where} (a line budget cannot cover it)")
    if change.is_symlink:
        problems.add(Severity.error, f"symlink in {where} (a line budget cannot cover it)")
    if change.binary:
        problems.add(Severity.error, f"binary file in {where} (a line budget cannot cover it)")
    if change.mode_changed and not settings.allow_mode_changes:
        problems.add(Severity.error, f"mode change {change.old_mode} -> {change.new_mode} (not allowed by the policy)")
    if not change.has_patch and not change.binary:
        problems.add(Severity.error, f"no patch text in the source, so the line budget of {where} cannot be verified")
        return
    _charge(change, budget, problems)


def _charge(change: FileChange, budget: _Budget, problems: _Problems) -> None:
    """Spend this file's lines from the touchpoint's budget; name the first line beyond it."""
    tp = budget.touchpoint
    added, removed = sorted(change.added_lines), sorted(change.removed_lines)
    added_room, removed_room = tp.max_added - budget.added, tp.max_removed - budget.removed
    budget.added += len(added)
    budget.removed += len(removed)
    over = []
    first_line = None
    if len(added) > max(added_room, 0):
        first_line = added[max(added_room, 0)]
        over.append(f"{budget.added} added lines (budget {tp.max_added}; line {first_line} is the first beyond it)")
    if len(removed) > max(removed_room, 0):
        old_line = removed[max(removed_room, 0)]
        over.append(f"{budget.removed} removed lines (budget {tp.max_removed}; old line {old_line} is the first beyond it)")
    if over:
        problems.add(Severity.error, f"touchpoint {tp.path} over budget: " + ", ".join(over), first_line)
