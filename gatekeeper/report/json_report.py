"""The JSON report: exactly the Verdict contract of gatekeeper/verdict.py (`schema_version` 1)."""

from __future__ import annotations

import json

from gatekeeper.report.tables import details_table
from gatekeeper.verdict import Verdict


def render_json(verdict: Verdict) -> str:
    data = verdict.model_dump(mode="json")
    for check, dumped in zip(verdict.checks, data["checks"]):
        # A check's table has been in its details since the first verdict of schema_version 1: kept there, last,
        # now that the report renders it from the check's rows.
        if (table := details_table(check)) is not None:
            dumped["details"]["markdown"] = table
    # ASCII-only: a hostile path's bidi characters stay escaped (as \u202e) even when a person reads the JSON.
    return json.dumps(data, indent=2) + "\n"
