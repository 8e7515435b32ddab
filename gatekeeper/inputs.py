"""The inputs of one evaluation, and the verdict they make. `gatekeeper check` reads them from files or git
(commands/check.py), the App from GitHub, pinned to one head (github/inputs.py); from here on both go the same
way, so the CLI's verdict for a change is the App's. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.changes import ChangeSet
from gatekeeper.evaluate import evaluate
from gatekeeper.evidence import Evidence, demote
from gatekeeper.policy import LoadedPolicy
from gatekeeper.provenance import Provenance, PullRequestInfo, detect
from gatekeeper.snapshot import DictSnapshot, Snapshot
from gatekeeper.verdict import Signal, Verdict


@dataclass(frozen=True)
class EvaluationInputs:
    policy: LoadedPolicy
    changes: ChangeSet
    pull_request: PullRequestInfo | None = None  # labels, body and author: provenance, and the perf check's blocks
    evidence: Evidence | None = None  # as loaded, before the trust rule below
    evidence_untrusted: str | None = None  # why the evidence counts as self-reported whatever it says; None: as loaded
    snapshot: Snapshot | None = None  # the repository at the head, where the source can show it
    declared: bool | None = None  # agent-assisted or not, overriding the signals (`gatekeeper check --agent-assisted`)


def verdict_for(inputs: EvaluationInputs) -> Verdict:
    detected = detect(inputs.policy.policy.agent_detection, inputs.changes.commits, inputs.pull_request)
    evidence = inputs.evidence
    if evidence is not None and inputs.evidence_untrusted is not None:
        evidence = demote(evidence, inputs.evidence_untrusted)
    return evaluate(inputs.policy, inputs.changes, _declared(detected, inputs.declared), evidence,
                    snapshot=inputs.snapshot or _recorded_sources(inputs, evidence), pull_request=inputs.pull_request)


def _recorded_sources(inputs: EvaluationInputs, evidence: Evidence | None) -> Snapshot | None:
    """The guard modules the collector recorded at the head, when the change's own source shows no files (GitHub
    PR files, a diff) and the evidence was collected at this very head."""
    if evidence is None or not evidence.head_sources or evidence.head is None:
        return None
    head = inputs.changes.head_sha or (inputs.pull_request.head_sha if inputs.pull_request is not None else None)
    if head is None or not evidence.head.sha.startswith(head):
        return None
    return DictSnapshot(evidence.head_sources)


def _declared(detected: Provenance, declared: bool | None) -> Provenance:
    if declared is None:
        return detected
    signals = detected.signals
    if declared:  # only the command line declares: its flag is the signal the report shows
        signals += (Signal(kind="declared", source="command line", detail="--agent-assisted"),)
    return Provenance(signals=signals, declared=declared)
