"""The verdict and its versioned JSON contract (schema_version 1).

Tools rely on this shape: add fields only in a backwards-compatible way, and bump SCHEMA_VERSION otherwise.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

CheckId = Literal["confinement", "startup_guard", "changed_path_tests", "perf_matrix"]
CHECK_IDS: tuple[CheckId, ...] = ("confinement", "startup_guard", "changed_path_tests", "perf_matrix")


class Severity(str, Enum):
    error = "error"
    warning = "warning"
    notice = "notice"


class Status(str, Enum):
    passed = "pass"
    failed = "fail"
    neutral = "neutral"
    skipped = "skipped"


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str | None = None
    line: int | None = None
    severity: Severity = Severity.error
    message: str


class CheckResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: CheckId
    status: Status
    summary: str
    findings: tuple[Finding, ...] = ()
    # Structured data for the reports (a perf table, per-file coverage); not part of the pass/fail logic.
    details: dict[str, Any] = Field(default_factory=dict)
    # A rule on trial (the policy's `shadow`): its status is what it would have been, and it never decides the
    # verdict. Added within schema_version 1.
    shadow: bool = False


class Signal(BaseModel):
    """One piece of evidence that a change was agent-assisted, and where it was seen."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["trailer", "label", "disclosure", "bot_author", "declared"]
    source: str  # e.g. "commit 1a2b3c4", "pull request body", "label"
    detail: str  # e.g. "Co-authored-by: Claude <noreply@anthropic.com>"
    # What a trailer or disclosure says about the assistance, where it says it (added within schema_version 1):
    # `Assisted-by: claude-code:claude-opus-4 [rg]` -> agent claude-code, model claude-opus-4, tools (rg,).
    agent: str | None = None
    model: str | None = None
    tools: tuple[str, ...] = ()
    used_for: str | None = None  # `AI-used-for: tests, docs`


ChangeKind = Literal["widens", "narrows", "guard_changed", "kernel_only", "unknown"]


class BlastRadius(BaseModel):
    """Which deployments a change to one owned package can alter, from its guard's support matrix and probes."""

    model_config = ConfigDict(frozen=True)

    package: str
    model: str = ""
    statement: str  # "Kimi K3 on sm_90, TP 8 or 16, ...; prefill and every other model untouched"
    admitted: dict[str, tuple[Any, ...]] = Field(default_factory=dict)  # axis -> values the guard admits at the head
    # widens: the head admits a value (or a probed deployment) the base did not; narrows: the reverse;
    # guard_changed: the guard or matrix code changed, admitting the same; kernel_only: neither was touched;
    # unknown: no base run to compare with.
    change: ChangeKind = "unknown"
    widened: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    narrowed: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    newly_accepted_probes: tuple[str, ...] = ()
    newly_rejected_probes: tuple[str, ...] = ()
    untouched_packages: tuple[str, ...] = ()


class PolicyRef(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    sha256: str


class Verdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    verdict: Literal["pass", "fail", "neutral"]
    policy: PolicyRef
    agent_assisted: bool
    signals: tuple[Signal, ...] = ()
    checks: tuple[CheckResult, ...] = ()
    # The review mode the policy selected ("strict" or "default"); added within schema_version 1, so
    # readers must accept its absence (None) in verdicts written before it existed.
    mode: Literal["strict", "default"] | None = None
    # Per owned package the change touches: which deployments it can alter (added within schema_version 1).
    blast_radius: tuple[BlastRadius, ...] = ()
    packages: tuple[str, ...] = ()  # the owned packages the change touches (added within schema_version 1)
