"""The JSON report: exactly the Verdict contract of gatekeeper/verdict.py (`schema_version` 1)."""

from __future__ import annotations

import json

from gatekeeper.verdict import Verdict


def render_json(verdict: Verdict) -> str:
    # ASCII-only: a hostile path's bidi characters stay escaped (as \u202e) even when a person reads the JSON.
    return json.dumps(verdict.model_dump(mode="json"), indent=2) + "\n"
