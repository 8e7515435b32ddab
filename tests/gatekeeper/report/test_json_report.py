from __future__ import annotations

import json

from gatekeeper.report import render_json
from gatekeeper.verdict import CheckResult, Status, Verdict


def test_json_is_the_versioned_contract(verdict):
    data = json.loads(render_json(verdict))
    assert set(data) == {"schema_version", "verdict", "policy", "agent_assisted", "signals", "checks", "mode",
                         "blast_radius", "packages"}  # the last two added within version 1
    assert data["schema_version"] == 1
    assert data["policy"] == {"name": "kimi-k3-latency-specialized", "sha256": "ab" * 32}
    assert [c["status"] for c in data["checks"]] == ["fail", "pass", "neutral", "skipped"]
    assert data["checks"][0]["findings"][0] == {
        "path": "vllm/engine/llm_engine.py", "line": 40, "severity": "error", "message": "outside the owned paths",
    }
    assert Verdict.model_validate(data) == verdict


def test_json_escapes_non_ascii(verdict):
    signal = verdict.signals[0].model_copy(update={"detail": "evil\u202e"})
    text = render_json(verdict.model_copy(update={"signals": (signal,)}))
    assert "\u202e" not in text and "\\u202e" in text


def test_a_checks_table_stays_in_its_details_as_it_always_was(verdict):
    """The checks return rows and the report renders their table; the JSON of schema_version 1 still carries
    it, last in `details`, as it did when the checks wrote it."""
    probe = {"probe": "tp4", "expect": "reject", "got": "raised ValueError: tp | 4", "ok": "yes"}
    check = CheckResult(id="startup_guard", status=Status.passed, summary="ok", details={"probes": [probe]})
    data = json.loads(render_json(verdict.model_copy(update={"checks": (check,)})))
    assert list(data["checks"][0]["details"]) == ["probes", "markdown"]
    assert data["checks"][0]["details"]["markdown"] == (
        "| probe | expect | got | ok |\n|---|---|---|---|\n| tp4 | reject | raised ValueError: tp \\| 4 | ✅ |")
    assert check.details == {"probes": [probe]}  # rendering adds nothing to the verdict itself
