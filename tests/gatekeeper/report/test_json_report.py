from __future__ import annotations

import json

from gatekeeper.report import render_json
from gatekeeper.verdict import Verdict


def test_json_is_the_versioned_contract(verdict):
    data = json.loads(render_json(verdict))
    assert set(data) == {"schema_version", "verdict", "policy", "agent_assisted", "signals", "checks", "mode"}
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
