from __future__ import annotations

import pytest

from gatekeeper.verdict import CheckResult, Finding, PolicyRef, Severity, Signal, Status, Verdict


@pytest.fixture
def verdict() -> Verdict:
    """A verdict with every status, a signal, findings with and without lines, and details of every shape."""
    return Verdict(
        verdict="fail",
        policy=PolicyRef(name="kimi-k3-latency-specialized", sha256="ab" * 32),
        agent_assisted=True,
        mode="strict",
        signals=(
            Signal(kind="trailer", source="commit 1a2b3c4d5e6f", detail="Co-authored-by: Claude <noreply@anthropic.com>"),
        ),
        checks=(
            CheckResult(
                id="confinement", status=Status.failed, summary="2 files changed: 1 in owned paths; 1 offending.",
                findings=(
                    Finding(path="vllm/engine/llm_engine.py", line=40, message="outside the owned paths"),
                    Finding(path="kimi_k3_path/big.py", severity=Severity.notice, message="no patch text"),
                ),
                details={"touchpoints": [{"path": "README.md", "added": 3, "max_added": 2, "removed": 0, "max_removed": 0}]},
            ),
            CheckResult(id="startup_guard", status=Status.passed, summary="The guard rejects 12 probes."),
            CheckResult(
                id="changed_path_tests", status=Status.neutral, summary="No test evidence was given.",
            ),
            CheckResult(
                id="perf_matrix", status=Status.skipped, summary="Not required in default mode.",
            ),
        ),
    )


@pytest.fixture
def details_check() -> CheckResult:
    return CheckResult(
        id="perf_matrix", status=Status.passed, summary="12 rows.",
        details={
            "rows": [{"tp": 8, "batch": 1, "speedup": 1.23456}, {"tp": 16, "batch": 64, "speedup": None}],
            "hardware": {"gpu": "NVIDIA H200", "count": 8},
            "commit": "0123abc",
        },
    )
