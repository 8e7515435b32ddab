"""evaluate(policy, changes, provenance, evidence) -> Verdict. Pure: no I/O, no clock, no network.

A policy with `packages` judges a change against every package it touches: confinement once over all their
paths, each evidence rule once per touched package (with that package's settings and evidence), the results
merged into one per rule. A rule in the policy's `shadow` list is reported but never decides the verdict.
"""

from __future__ import annotations

from dataclasses import replace

from gatekeeper.blast_radius import blast_radius, touched_packages
from gatekeeper.changes import ChangeSet
from gatekeeper.checks import CheckContext, changed_path_tests, confinement, perf_matrix, startup_guard
from gatekeeper.evidence import Evidence
from gatekeeper.policy import LoadedPolicy, Package
from gatekeeper.provenance import Provenance, PullRequestInfo
from gatekeeper.snapshot import Snapshot
from gatekeeper.verdict import CHECK_IDS, CheckResult, PolicyRef, Status, Verdict

RULES = {
    "confinement": confinement.run,
    "startup_guard": startup_guard.run,
    "changed_path_tests": changed_path_tests.run,
    "perf_matrix": perf_matrix.run,
}


def evaluate(
    policy: LoadedPolicy,
    changes: ChangeSet,
    provenance: Provenance,
    evidence: Evidence | None = None,
    *,
    snapshot: Snapshot | None = None,
    pull_request: PullRequestInfo | None = None,
) -> Verdict:
    detection = policy.policy.agent_detection
    mode = detection.on_signal if provenance.agent_assisted else detection.on_no_signal
    ctx = CheckContext(policy, changes, provenance, mode, evidence, snapshot, pull_request)
    required = policy.policy.required_checks(mode)
    touched = touched_packages(policy.policy, changes)
    results = []
    for check_id in CHECK_IDS:
        if check_id not in required:
            why = "disabled in the policy" if check_id not in policy.policy.checks.enabled() else f"not required in {mode.value} mode"
            results.append(CheckResult(id=check_id, status=Status.skipped, summary=why.capitalize() + "."))
            continue
        if check_id == "confinement" or not policy.policy.packages:
            result = RULES[check_id](ctx)
        else:
            result = _per_package(check_id, ctx, touched)
        if check_id in policy.policy.shadow:
            result = result.model_copy(update={"shadow": True})
        results.append(result)
    radii = (blast_radius(policy.policy, package, changes, evidence) for package in touched)
    return Verdict(
        verdict=_combine(results),
        policy=PolicyRef(name=policy.policy.name, sha256=policy.sha256),
        agent_assisted=provenance.agent_assisted,
        signals=provenance.signals,
        checks=tuple(results),
        mode=mode.value,
        blast_radius=tuple(r for r in radii if r is not None),
        packages=tuple(p.name for p in touched),
    )


def _per_package(check_id: str, ctx: CheckContext, touched: tuple[Package, ...]) -> CheckResult:
    """One rule run once per touched package, each with that package's settings and evidence, merged."""
    if not touched:
        return CheckResult(id=check_id, status=Status.skipped, summary="The change touches no owned package.")
    runs = []
    for package in touched:
        view = ctx.policy.model_copy(update={"policy": ctx.policy.policy.for_package(package)})
        evidence = ctx.evidence.for_package(package.name) if ctx.evidence is not None else None
        runs.append((package.name, RULES[check_id](replace(ctx, policy=view, evidence=evidence))))
    statuses = {r.status for _, r in runs}
    status = next((s for s in (Status.failed, Status.neutral, Status.passed) if s in statuses), Status.skipped)
    findings = tuple(f.model_copy(update={"message": f"[{name}] {f.message}"}) for name, r in runs for f in r.findings)
    return CheckResult(
        id=check_id, status=status, findings=findings,
        summary=" ".join(f"{name}: {r.summary}" for name, r in runs),
        details={"packages": [{"package": name, "status": r.status.value, "summary": r.summary, **r.details}
                              for name, r in runs]},
    )


def _combine(results: list[CheckResult]) -> str:
    """Any failure fails; otherwise anything undecided is neutral; only all-decided passes pass. Shadow rules
    never count."""
    statuses = {r.status for r in results if not r.shadow}
    if Status.failed in statuses:
        return "fail"
    if Status.neutral in statuses:
        return "neutral"
    return "pass"
