"""One module per rule. Each exposes `run(ctx: CheckContext) -> CheckResult` and does no I/O of its own."""

from __future__ import annotations

from dataclasses import dataclass

from gatekeeper.changes import ChangeSet
from gatekeeper.evidence import Evidence
from gatekeeper.policy import LoadedPolicy, Mode
from gatekeeper.provenance import Provenance, PullRequestInfo
from gatekeeper.snapshot import Snapshot


@dataclass(frozen=True)
class CheckContext:
    policy: LoadedPolicy
    changes: ChangeSet
    provenance: Provenance
    mode: Mode
    evidence: Evidence | None = None      # None: no evidence was handed over (the check reports neutral)
    snapshot: Snapshot | None = None      # the repository at the head, where the caller can provide it
    pull_request: PullRequestInfo | None = None
