"""The collector's readers: JUnit XML, coverage JSON from a GPU run, statement spans, the test command."""

from __future__ import annotations

import json
import sys

import pytest

from gatekeeper.collect.coverage_map import COLLECTION, ContextTable, from_coverage_json, statement_spans
from gatekeeper.collect.gpu_reports import load_gpu_reports
from gatekeeper.collect.junit import junit_key, parse_junit
from gatekeeper.collect.testrun import coverage_command
from gatekeeper.errors import InputError
from gatekeeper.snapshot import DictSnapshot

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
  <testcase classname="tests.tiny.test_gpu" name="test_kernel[8]" time="0.1"/>
  <testcase classname="tests.tiny.test_gpu.TestMore" name="test_fails"><failure message="assert 1 == 2">trace</failure></testcase>
  <testcase classname="tests.tiny.test_gpu" name="test_broken"><error message="fixture exploded"/></testcase>
  <testcase classname="tests.tiny.test_gpu" name="test_skipped"><skipped message="no GPU"/></testcase>
  <testcase classname="" name="tests.tiny.test_broken_module"><error message="collection failure"/></testcase>
</testsuite></testsuites>
"""

SOURCE = "def kernel(x):\n    y = (x +\n         1)\n    return y\n"


def test_junit_key_matches_what_pytest_writes():
    assert junit_key("tests/tiny/test_gpu.py::test_kernel[8]") == "tests.tiny.test_gpu::test_kernel[8]"
    assert junit_key("tests/tiny/test_gpu.py::TestMore::test_fails") == "tests.tiny.test_gpu.TestMore::test_fails"
    assert junit_key("t.py::test_x[a/b::c]") == "t::test_x[a/b::c]"


def test_parse_junit_outcomes_and_node_ids(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    cases = parse_junit(report, {"tests.tiny.test_gpu::test_kernel[8]": "tests/tiny/test_gpu.py::test_kernel[8]"})
    assert [(c.id, c.outcome) for c in cases] == [
        ("tests/tiny/test_gpu.py::test_kernel[8]", "passed"),
        ("tests.tiny.test_gpu.TestMore::test_fails", "failed"),
        ("tests.tiny.test_gpu::test_broken", "error"),
        ("tests.tiny.test_gpu::test_skipped", "skipped"),
        ("tests.tiny.test_broken_module", "error"),
    ]
    assert cases[1].message == "assert 1 == 2\ntrace"


@pytest.mark.parametrize(("text", "reason"), [
    ("<testsuites><testcase", "invalid JUnit XML"),
    ("<html><body/></html>", "not a JUnit report"),
    ("<testsuite><testcase classname='x'/></testsuite>", "has no name"),
    # A report committed in a PR is untrusted XML: entity expansion (billion laughs), external entities and
    # DTDs are refused, not expanded.
    ('<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">'
     '<!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]><testsuite><testcase name="&c;"/></testsuite>',
     "unsafe JUnit XML refused"),
    ('<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
     '<testsuite><testcase name="&x;"/></testsuite>', "unsafe JUnit XML refused"),
    ('<?xml version="1.0"?><!DOCTYPE testsuite><testsuite><testcase name="t"/></testsuite>',
     "unsafe JUnit XML refused"),
])
def test_bad_junit_is_an_input_error(tmp_path, text, reason):
    report = tmp_path / "junit.xml"
    report.write_text(text)
    with pytest.raises(InputError, match=reason):
        parse_junit(report)


def coverage_json(path="/gpu/box/checkout/tiny/ops.py", contexts=True) -> dict:
    return {"meta": {"show_contexts": contexts}, "files": {path: {
        "executed_lines": [1, 2, 4], "missing_lines": [], "excluded_lines": [],
        "contexts": {"1": [""], "2": ["tests/tiny/test_gpu.py::test_kernel[8]|run"], "4": ["tests/tiny/test_gpu.py::test_kernel[8]|run"]}}}}


def test_coverage_json_from_another_machine_maps_to_repository_paths(tmp_path):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny/ops.py").write_text(SOURCE)
    report = tmp_path / "cov.json"
    report.write_text(json.dumps(coverage_json()))
    table = ContextTable()
    (cov,) = from_coverage_json(report, tmp_path, ["tiny/ops.py"], table)
    assert cov.statements == (1, 2, 4) and cov.spans == ((2, 3),)
    assert table.names == (COLLECTION, "tests/tiny/test_gpu.py::test_kernel[8]")
    assert cov.covered == {1: (0,), 2: (1,), 4: (1,)}


@pytest.mark.parametrize(("document", "reason"), [
    ({"files": []}, "no 'files' object"),
    (coverage_json(contexts=False), "--show-contexts"),
    ({"meta": {"show_contexts": True}, "files": {"tiny/ops.py": {"executed_lines": "all"}}}, "malformed entry"),
])
def test_bad_coverage_json_is_an_input_error(tmp_path, document, reason):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny/ops.py").write_text(SOURCE)
    report = tmp_path / "cov.json"
    report.write_text(json.dumps(document))
    with pytest.raises(InputError, match=reason):
        from_coverage_json(report, tmp_path, ["tiny/ops.py"], ContextTable())


def test_gpu_reports_are_self_reported_runs_and_bad_ones_say_why(tmp_path):
    (tmp_path / "tiny/evidence/gpu").mkdir(parents=True)
    (tmp_path / "tiny/ops.py").write_text(SOURCE)
    (tmp_path / "tiny/evidence/gpu/junit.xml").write_text(JUNIT)
    (tmp_path / "tiny/evidence/gpu/coverage.json").write_text(json.dumps(coverage_json()))
    (tmp_path / "tiny/evidence/broken").mkdir()
    (tmp_path / "tiny/evidence/broken/junit.xml").write_text("<nope")
    head = DictSnapshot({p.relative_to(tmp_path).as_posix(): "" for p in tmp_path.rglob("*") if p.is_file()})
    good, broken = sorted(load_gpu_reports(tmp_path, head, "0" * 40, ("tiny/evidence/**",), ["tiny/ops.py"]), key=lambda r: r.label, reverse=True)
    assert good.origin.trust == "self_reported" and good.label == "tiny/evidence/gpu"
    assert good.files[0].covered[2] and good.tests[0].id == "tests/tiny/test_gpu.py::test_kernel[8]"
    assert broken.error.startswith("unusable GPU report") and broken.origin.trust == "self_reported"


def test_statement_spans_cover_multiline_statements_and_headers():
    source = "@decorate(\n    1)\ndef f(a,\n      b):\n    return (a +\n            b)\nx = 1\n"
    assert statement_spans(source) == ((1, 4), (5, 6))
    assert statement_spans("def broken(:\n") == ()


def test_coverage_command_wraps_pytest_only(tmp_path):
    rc, junit = tmp_path / "rc", tmp_path / "j.xml"
    argv = coverage_command(("pytest", "-q", "tests"), rc, junit)
    assert argv[:5] == [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}"] and argv[-2:] == ["-q", "tests"]
    assert coverage_command(("python", "-m", "pytest"), rc, junit)[0] == sys.executable
    assert coverage_command(("/opt/py/bin/python3.12", "-m", "pytest"), rc, junit)[0] == "/opt/py/bin/python3.12"
    with pytest.raises(InputError, match="must run pytest"):
        coverage_command(("make", "test"), rc, junit)
