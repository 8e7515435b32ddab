"""evaluate(policy, changes, provenance, evidence) -> Verdict. Pure: no I/O, no clock, no network."""

from __future__ import annotations

from gatekeeper.changes import ChangeSet
from gatekeeper.checks import CheckContext, changed_path_tests, confinement, perf_matrix, startup_guard
from gatekeeper.evidence import Evidence
from gatekeeper.policy import LoadedPolicy
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
    results = []
    for check_id in CHECK_IDS:
        if check_id not in required:
            why = "disabled in the policy" if check_id not in policy.policy.checks.enabled() else f"not required in {mode.value} mode"
            results.append(CheckResult(id=check_id, status=Status.skipped, summary=why.capitalize() + "."))
            continue
        results.append(RULES[check_id](ctx))
    return Verdict(
        verdict=_combine(results),
        policy=PolicyRef(name=policy.policy.name, sha256=policy.sha256),
        agent_assisted=provenance.agent_assisted,
        signals=provenance.signals,
        checks=tuple(results),
        mode=mode.value,
    )


def _combine(results: list[CheckResult]) -> str:
    """Any failure fails; otherwise anything undecided is neutral; only all-decided passes pass."""
    statuses = {r.status for r in results}
    if Status.failed in statuses:
        return "fail"
    if Status.neutral in statuses:
        return "neutral"
    return "pass"
