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


class Signal(BaseModel):
    """One piece of evidence that a change was agent-assisted, and where it was seen."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["trailer", "label", "disclosure", "bot_author", "declared"]
    source: str  # e.g. "commit 1a2b3c4", "pull request body", "label"
    detail: str  # e.g. "Co-authored-by: Claude <noreply@anthropic.com>"


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
