"""Evidence models and loaders: round trips, trust labels, and hostile files that must fail clearly."""

from __future__ import annotations

import json

import pytest

from gatekeeper.errors import InputError
from gatekeeper.evidence import (
    MAX_PERF_BYTES,
    Evidence,
    Origin,
    PerfEvidence,
    load_evidence,
    load_perf_evidence,
    parse_evidence,
    parse_perf_evidence,
)


def perf_doc(**row_overrides) -> dict:
    row = {"axes": {"tp": 8, "batch": 1}, "candidate": {"median": 10.0, "spread_pct": 1.0, "runs": 20},
           "baseline": {"median": 12.0, "spread_pct": 1.5, "runs": 20}}
    row.update(row_overrides)
    return {"commit": "a" * 40, "command": "python -m bench", "created": "2026-11-30T12:00:00Z",
            "hardware": {"gpu": "NVIDIA H200", "count": 1, "driver": "570.1", "arch": "sm_90"}, "rows": [row]}


def test_round_trip_keeps_every_part():
    text = json.dumps({
        "head": {"sha": "b" * 40, "ancestors": ["c" * 40]},
        "tests": [{"origin": {"trust": "trusted", "source": "collector"}, "label": "tests",
                   "tests": [{"id": "t.py::test_a", "outcome": "passed"}], "contexts": ["t.py::test_a"],
                   "files": [{"path": "pkg/a.py", "statements": [1, 2], "spans": [[2, 3]], "covered": {"2": [0]}}]}],
        "guard_probes": {"origin": {"trust": "trusted", "source": "collector"}, "guard": "m:f",
                         "results": [{"name": "p", "outcome": "raised", "exception_types": ["builtins.ValueError"], "message": "tp"}]},
        "support_axes": {"origin": {"trust": "trusted", "source": "collector"}, "source": "m:M", "axes": {"tp": [8, 16]}},
        "perf": [{"origin": {"trust": "trusted", "source": "CI artifact"}, "evidence": perf_doc()}],
    })
    evidence = parse_evidence(text, "e.json")
    assert evidence.tests[0].files[0].covered == {2: (0,)}
    assert evidence.perf[0].origin.trust == "trusted"
    assert parse_evidence(evidence.model_dump_json(), "again.json") == evidence


def test_bare_perf_evidence_is_labelled_self_reported():
    evidence = parse_evidence(json.dumps({"perf": [perf_doc()]}), "e.json")
    assert evidence.perf[0].origin.trust == "self_reported"
    built = Evidence(perf=(PerfEvidence.model_validate(perf_doc()),))
    assert built.perf[0].origin.trust == "self_reported"


@pytest.mark.parametrize(("document", "reason"), [
    ('{"perf": [' + json.dumps(perf_doc()).replace("10.0", "NaN") + "]}", "NaN is not a number"),
    (json.dumps({"perf": [perf_doc(candidate={"median": -3, "spread_pct": 1, "runs": 20})]}), "greater than 0"),
    (json.dumps({"perf": [perf_doc(candidate={"median": 3, "spread_pct": 1, "runs": "many"})]}), "valid integer"),
    (json.dumps({"perf": [perf_doc(candidate={"median": 3, "spread_pct": 1, "runs": 0})]}), "greater than or equal to 1"),
    (json.dumps({"tests": "all passed"}), "tests: Input should be a valid tuple"),
    (json.dumps({"surprise": 1}), "surprise: Extra inputs are not permitted"),
    ("[1, 2]", "must be a JSON object, not list"),
    (json.dumps({"tests": [{"origin": {"trust": "trusted", "source": "x"}, "label": "t", "contexts": [],
                            "files": [{"path": "a.py", "statements": [1], "covered": {"1": [5]}}]}]}), "unknown contexts [5]"),
    (json.dumps({"tests": [{"origin": {"trust": "trusted", "source": "x"}, "label": "t",
                            "files": [{"path": "a.py", "statements": [0]}]}]}), "line numbers start at 1"),
])
def test_hostile_evidence_is_refused_with_the_field(document, reason):
    with pytest.raises(InputError) as caught:
        parse_evidence(document, "evil.json")
    assert caught.value.source == "evil.json"
    assert reason in caught.value.reason


def test_invalid_json_names_the_line():
    with pytest.raises(InputError) as caught:
        parse_evidence('{\n "perf": [\n  oops\n]}', "broken.json")
    assert caught.value.line == 3
    assert "invalid JSON" in caught.value.reason


def test_duplicate_perf_rows_are_refused():
    doc = perf_doc()
    doc["rows"] = doc["rows"] * 2
    with pytest.raises(InputError, match="duplicate row"):
        parse_perf_evidence(json.dumps(doc), "dup.json")


def test_huge_files_are_refused_before_parsing(tmp_path):
    huge = tmp_path / "huge.json"
    huge.write_bytes(b" " * (MAX_PERF_BYTES + 1))
    with pytest.raises(InputError, match="byte limit"):
        load_perf_evidence(huge)
    with pytest.raises(InputError, match="byte limit"):
        parse_perf_evidence("x" * (MAX_PERF_BYTES + 1), "body")


def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(InputError, match="cannot read evidence"):
        load_evidence(tmp_path / "missing.json")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="not UTF-8|invalid JSON"):
        load_evidence(binary)


def test_deeply_nested_json_is_an_input_error():
    with pytest.raises(InputError):
        parse_evidence("[" * 100_000 + "]" * 100_000, "deep.json")


def test_origin_needs_a_known_trust_level():
    with pytest.raises(ValueError):
        Origin(trust="very trusted", source="me")


def test_demote_relabels_every_part_self_reported_with_the_reason():
    from gatekeeper.evidence import demote

    origin = {"trust": "trusted", "source": "collector"}
    evidence = parse_evidence(json.dumps({
        "tests": [{"origin": origin, "label": "tests", "tests": [], "contexts": [], "files": []}],
        "guard_probes": {"origin": origin, "guard": "m:f", "results": []},
        "support_axes": {"origin": origin, "source": "m:M", "axes": {"tp": [8]}},
        "perf": [{"origin": origin, "evidence": perf_doc()}],
    }), "e.json")
    demoted = demote(evidence, "the PR edits the workflow")
    origins = [demoted.tests[0].origin, demoted.guard_probes.origin, demoted.support_axes.origin,
               demoted.perf[0].origin]
    assert {o.trust for o in origins} == {"self_reported"}
    assert all(o.source == "collector (self-reported: the PR edits the workflow)" for o in origins)
    assert demote(parse_evidence("{}", "empty.json"), "x") == parse_evidence("{}", "empty.json")


def test_the_committed_perf_evidence_schema_is_the_models():
    """schemas/perf_evidence.v1.json is the contract benchmarks write to; it must not drift from the model."""
    from pathlib import Path

    from gatekeeper.evidence import perf_evidence_json_schema

    committed = json.loads((Path(__file__).parents[2] / "schemas" / "perf_evidence.v1.json").read_text())
    assert committed == json.loads(json.dumps(perf_evidence_json_schema()))
