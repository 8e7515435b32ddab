"""changed_path_tests: per-file changed-line coverage and test outcomes, judged from recorded evidence."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gatekeeper.changes import ChangeSet, FileChange, FileStatus
from gatekeeper.checks import CheckContext
from gatekeeper.checks.changed_path_tests import changed_statements, line_ranges, run
from gatekeeper.evidence import Evidence, FileCoverage, Origin, TestCase, TestRun
from gatekeeper.policy import Mode, load_policy_text
from gatekeeper.provenance import Provenance
from gatekeeper.report.tables import details_table
from gatekeeper.verdict import Severity, Status

POLICY = """
version: 1
name: tiny
owned_paths: ["tiny/**", "tests/tiny/**"]
require_trusted: {trusted}
checks:
  changed_path_tests: {{enabled: true, min_file_coverage: {minimum}{extra}}}
"""
TRUSTED = Origin(trust="trusted", source="collector")
GPU = Origin(trust="self_reported", source="GPU report")
PASSING = (TestCase(id="tests/tiny/test_ops.py::test_add", outcome="passed"),)
CONTEXTS = ("(collection)", "tests/tiny/test_ops.py::test_add")


def change(path="tiny/ops.py", added=(1, 2, 3, 4), status=FileStatus.added):
    return FileChange(path=path, status=status, added_lines=added)


def coverage(path="tiny/ops.py", statements=(1, 2, 3, 4), covered=None, spans=(), excluded=()):
    covered = {1: (0,), 2: (1,), 3: (1,), 4: (1,)} if covered is None else covered
    return FileCoverage(path=path, statements=statements, covered=covered, spans=spans, excluded=excluded)


def test_run(files=(), tests=PASSING, origin=TRUSTED, **extra):
    return TestRun(origin=origin, label="tests", tests=tests, contexts=CONTEXTS, files=files, exit_code=0, **extra)


test_run.__test__ = False  # a builder, not a test


def check(changes, runs, minimum=1.0, trusted="[]", extra=""):
    policy = load_policy_text(POLICY.format(trusted=trusted, minimum=minimum, extra=extra), "policy.yaml")
    ctx = CheckContext(policy, ChangeSet(source="git", files=tuple(changes)), Provenance(), Mode.strict,
                       Evidence(tests=tuple(runs)) if runs is not None else None)
    return run(ctx)


def errors(result):
    return [f"{f.path}:{f.line}: {f.message}" for f in result.findings if f.severity is Severity.error]


def test_fully_covered_change_passes_and_lists_covering_tests():
    result = check([change()], [test_run([coverage()])])
    assert result.status is Status.passed, errors(result)
    row = result.details["files"][0]
    assert row["covered_lines"] == 4 and row["tests"] == ["(collection)", "tests/tiny/test_ops.py::test_add"]
    assert "`tests/tiny/test_ops.py::test_add`" in details_table(result)


def test_new_function_without_a_test_fails_with_the_uncovered_ranges():
    result = check([change(added=(1, 2, 3, 4, 5, 6, 8))], [test_run([coverage(statements=(1, 2, 3, 4, 5, 6, 8), covered={1: (0,), 2: (1,)})])])
    assert result.status is Status.failed
    assert errors(result) == [
        "tiny/ops.py:3: 5 of 7 changed executable line(s) never ran under a test (lines 3-6, 8); "
        "the policy requires 100% per file"
    ]
    assert "3-6, 8" in details_table(result)


def test_the_details_say_which_tests_ran_which_changed_statements():
    """For the details page: statements grouped by the tests that ran them, as runs of consecutive lines; the
    statements of both runs (trusted and GPU) merged per line."""
    gpu_contexts = ("tests/tiny/test_gpu.py::test_kernel",)
    gpu = TestRun(origin=GPU, label="gpu", tests=(TestCase(id=gpu_contexts[0], outcome="passed"),),
                  contexts=gpu_contexts, files=(coverage(statements=(1, 2, 3, 4, 5, 6, 8), covered={5: (0,), 2: (0,)}),),
                  exit_code=0)
    cpu = test_run([coverage(statements=(1, 2, 3, 4, 5, 6, 8), covered={1: (1,), 2: (1,), 3: (1,)})])
    result = check([change(added=(1, 2, 3, 4, 5, 6, 8), path="tiny/ops.py")], [cpu, gpu], minimum=0.5)
    row = result.details["files"][0]
    assert row["tests"] == ["tests/tiny/test_ops.py::test_add", "tests/tiny/test_gpu.py::test_kernel"]
    assert row["statements"] == [
        {"lines": [[1, 1], [3, 3]], "tests": [0]},
        {"lines": [[2, 2]], "tests": [0, 1]},
        {"lines": [[4, 4], [6, 6], [8, 8]], "tests": []},
        {"lines": [[5, 5]], "tests": [1]},
    ]


def test_one_untested_file_cannot_hide_behind_a_tested_one():
    big = coverage(path="tiny/big.py", statements=tuple(range(1, 101)), covered={n: (1,) for n in range(1, 101)})
    small = coverage(path="tiny/small.py", statements=(1, 2), covered={})
    result = check([change("tiny/big.py", tuple(range(1, 101))), change("tiny/small.py", (1, 2))],
                   [test_run([big, small])], minimum=0.9)
    assert result.status is Status.failed
    assert [e.split(":")[0] for e in errors(result)] == ["tiny/small.py"]


def test_threshold_and_uncovered_budget():
    partial = [test_run([coverage(covered={1: (0,), 2: (1,), 3: (1,)})])]
    assert check([change()], partial, minimum=0.75).status is Status.passed
    assert check([change()], partial, minimum=0.8).status is Status.failed
    result = check([change()], partial, minimum=0.5, extra=", max_uncovered_lines_per_file: 0")
    assert "and at most 0 uncovered" in errors(result)[0]


def test_failing_test_fails_the_rule_with_its_message():
    failing = (TestCase(id="tests/tiny/test_ops.py::test_add", outcome="failed", message="assert 3 == 4\nmore"),)
    result = check([change()], [test_run([coverage()], tests=failing)])
    assert result.status is Status.failed
    assert errors(result) == ["None:None: tests/tiny/test_ops.py::test_add failed in tests (trusted): assert 3 == 4"]


def test_crashed_or_hung_run_fails_the_rule():
    result = check([change()], [test_run(tests=(), error="timed out after 30 s")])
    assert result.status is Status.failed
    assert "test run tests (trusted) did not complete: timed out after 30 s" in errors(result)[0]
    nothing_ran = check([change()], [test_run([coverage()], tests=())])
    assert "ran no tests" in " ".join(errors(nothing_ran))


def test_nonzero_exit_without_failures_is_reported():
    result = check([change()], [TestRun(origin=TRUSTED, label="tests", tests=PASSING, contexts=CONTEXTS,
                                        files=(coverage(),), exit_code=3)])
    assert "exited with status 3 and no failing test" in errors(result)[0]


def test_unmeasured_file_fails():
    result = check([change()], [test_run([])])
    assert errors(result) == ["tiny/ops.py:None: no test run measured this file: none of its lines ran under tests"]


def test_gpu_report_covers_gpu_only_lines_and_is_labelled_self_reported():
    cpu = test_run([coverage(covered={1: (0,), 2: (1,)})])
    gpu = TestRun(origin=GPU, label="reports/gpu", tests=(TestCase(id="tests/tiny/test_gpu.py::test_kernel", outcome="passed"),),
                  contexts=("tests/tiny/test_gpu.py::test_kernel",), files=(coverage(covered={3: (0,), 4: (0,)}),))
    result = check([change()], [cpu, gpu])
    assert result.status is Status.passed, errors(result)
    assert result.details["files"][0]["sources"] == ["tests (trusted)", "reports/gpu (self-reported)"]
    assert check([change()], [cpu, gpu], trusted="[changed_path_tests]").status is Status.failed


def test_tests_non_python_and_removed_files_are_not_judged():
    untested_test_helper = change("tests/tiny/helpers.py", (1,))
    result = check([untested_test_helper, change("tiny/README.md", (1,)), change(status=FileStatus.removed, added=())],
                   [test_run([])])
    assert result.status is Status.passed
    assert result.details["files"] == []


def test_no_evidence_is_neutral():
    result = check([change()], None)
    assert result.status is Status.neutral and "gatekeeper collect" in result.summary
    only_gpu = check([change()], [test_run([coverage()], origin=GPU)], trusted="[changed_path_tests]")
    assert only_gpu.status is Status.neutral and "requires trusted" in only_gpu.summary


def test_pragma_excluded_changed_lines_are_warned_about():
    cov = coverage(statements=(1, 2), covered={1: (0,), 2: (1,)}, excluded=(3, 4))
    result = check([change()], [test_run([cov])])
    assert result.status is Status.passed
    assert [f.message for f in result.findings if f.severity is Severity.warning] == [
        "changed line(s) 3-4 are excluded from coverage measurement (e.g. `pragma: no cover`)"]


def test_a_changed_line_inside_a_multiline_statement_changes_that_statement():
    cov = coverage(statements=(1, 5), spans=((1, 3),), covered={})
    assert changed_statements((2, 4), cov) == (1,)
    assert changed_statements((3, 5, 9), cov) == (1, 5)


def test_line_ranges():
    assert line_ranges([7, 1, 2, 3, 9, 10]) == "1-3, 7, 9-10"
    assert line_ranges([]) == ""


@given(st.sets(st.integers(min_value=1, max_value=200)))
def test_line_ranges_lists_exactly_the_lines(lines):
    listed = set()
    for part in filter(None, line_ranges(sorted(lines)).split(", ")):
        first, _, last = part.partition("-")
        assert not last or int(last) > int(first)
        listed.update(range(int(first), int(last or first) + 1))
    assert listed == lines
