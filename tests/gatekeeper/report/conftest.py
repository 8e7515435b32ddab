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


HOSTILE = '<script>alert("x")</script>\u202e"><img src=x onerror=alert(1)>'


@pytest.fixture
def page_verdict() -> Verdict:
    """A verdict for the details page: the perf matrix of the committed H200 evidence with two rows
    missing and one regressed, changed lines covered and not, a hostile path, signal and finding."""
    import json
    from pathlib import Path

    perf = json.loads((Path(__file__).parents[3] / "kimi_k3_path/evidence/perf/h200.json").read_text())
    rows = []
    for i, r in enumerate(perf["rows"]):
        base, cand = r["baseline"], r["candidate"]
        row = {"axes": r["axes"], "unit": r["unit"], "baseline": base["median"], "candidate": cand["median"],
               "speedup": base["median"] / cand["median"], "floor": r.get("floor"),
               "runs": min(base["runs"], cand["runs"]), "spread_pct": max(base["spread_pct"], cand["spread_pct"]),
               "source": "gatekeeper collect (trusted)", "problems": []}
        if i in (5, 30):  # no evidence for these rows: holes in the heatmap
            row.update(unit=None, baseline=None, candidate=None, speedup=None, floor=None, runs=None,
                       spread_pct=None, source=None, problems=["missing: no evidence measured this row"])
        if i == 12:
            row.update(candidate=base["median"] * 1.2, speedup=1 / 1.2,
                       problems=["regression: the candidate is 20.0% slower than the baseline (allowed 5%)"])
        rows.append(row)
    axes = {"arch": ["sm_90"], "tp": [8, 16], "dcp": [1], "batch": [1, 2, 4, 8, 16, 32, 64], "spec": ["none"]}
    tests = ["tests/kimi_k3_path/test_moe.py::test_decode[tp8]", "tests/kimi_k3_path/test_moe.py::test_router",
             f"tests/kimi_k3_path/test_x.py::test_{HOSTILE}"]
    files = [
        {"path": "kimi_k3_path/kernels/moe.py", "measured": True, "changed_lines": 6, "covered_lines": 5,
         "uncovered": "44", "tests": tests, "sources": ["tests (trusted)"], "ok": False,
         "statements": [{"lines": [[40, 40]], "tests": [0, 1]}, {"lines": [[41, 41], [43, 43]], "tests": [0]},
                        {"lines": [[42, 42]], "tests": [1, 2]}, {"lines": [[44, 44]], "tests": []},
                        {"lines": [[45, 46]], "tests": [2]}],
         "excluded": [47]},
        {"path": f"kimi_k3_path/{HOSTILE}.py", "measured": False, "changed_lines": 0, "covered_lines": 0,
         "uncovered": "", "tests": [], "sources": [], "ok": False, "statements": [], "excluded": []},
    ]
    return Verdict(
        verdict="fail",
        policy=PolicyRef(name="kimi-k3-latency-specialized", sha256="cd" * 32),
        agent_assisted=True,
        mode="strict",
        signals=(Signal(kind="trailer", source="commit 9f1c2e4b7a3d", detail="Co-authored-by: Claude <noreply@anthropic.com>"),
                 Signal(kind="label", source="pull request labels", detail=HOSTILE)),
        checks=(
            CheckResult(id="confinement", status=Status.passed, summary="12 files changed: 12 in owned paths.",
                        findings=(Finding(path=f"kimi_k3_path/{HOSTILE}", severity=Severity.notice,
                                          message=f"no patch text: {HOSTILE}"),),
                        details={"files": 12, "owned": 12, "touchpoints": [
                            {"path": "vllm/model_executor/models/registry.py", "added": 2, "max_added": 3,
                             "removed": 0, "max_removed": 0}]}),
            CheckResult(id="startup_guard", status=Status.passed, summary="The guard rejects 3 probes.",
                        details={"probes": [{"probe": "tp=4", "expect": "reject", "got": "raised ValueError", "ok": "yes"}]}),
            CheckResult(id="changed_path_tests", status=Status.failed, summary="2 problem(s).",
                        findings=(Finding(path="kimi_k3_path/kernels/moe.py", line=44,
                                          message="1 of 6 changed executable line(s) never ran under a test"),),
                        details={"files": files}),
            CheckResult(id="perf_matrix", status=Status.failed, summary="3 problem(s) in the perf matrix.",
                        findings=tuple(Finding(message=p) for r in rows for p in r["problems"]),
                        details={"axes": axes, "rows": rows}),
        ),
    )
