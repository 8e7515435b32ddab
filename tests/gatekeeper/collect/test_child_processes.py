"""Code that tests run in child Python processes is measured, and attributed to the test that started them.

One collector run on a fixture repository whose functions run ONLY in children and grandchildren of its
tests, with a foreign coverage configuration lying around (a `.coveragerc`, COVERAGE_* variables) that must
change nothing.
"""

from __future__ import annotations

import textwrap

import pytest
from coverage import CoverageData

from gatekeeper.collect.coverage_map import COLLECTION
from gatekeeper.collect.coverage_setup import DATA_FILE, measured_env, merge_process_data, write_rcfiles
from gatekeeper.collect.testrun import run_tests
from gatekeeper.evidence import Origin, TestRun

WORK = '''
def in_child(x):
    doubled = x * 2
    return doubled


def in_grandchild(x):
    tripled = x * 3
    return tripled


def at_collection():
    started = "while pytest collected"
    return started


def before_crashing():
    reached = True
    raise RuntimeError("the child crashes on purpose")


def in_parent():
    here = "the pytest process"
    return here
'''

RELAY = '''
import subprocess
import sys

# A child that only starts a grandchild: the grandchild's lines belong to the same test.
subprocess.run([sys.executable, "-c", "from tiny.work import in_grandchild; in_grandchild(2)"], check=True)
'''

TESTS = '''
import os
import subprocess
import sys

from tiny.work import in_parent

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def env():
    # Copied when the child starts: the copy carries the running test's context.
    return {**os.environ, "PYTHONPATH": REPO}


def python(code, **kwargs):
    return subprocess.run([sys.executable, "-c", code], env=env(), **kwargs)


python("from tiny.work import at_collection; at_collection()", check=True)


def test_child():
    # Run from elsewhere: the child's file names must still map to the repository.
    python("from tiny.work import in_child; in_child(1)", check=True, cwd="/")


def test_grandchild():
    subprocess.run([sys.executable, "-m", "tiny.relay"], env=env(), check=True, cwd=REPO + "/tiny")


def test_crashing_children_do_not_break_the_run():
    crashed = python("from tiny.work import before_crashing; before_crashing()", capture_output=True)
    assert crashed.returncode == 1
    killed = python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert killed.returncode == -9


def test_spawns_nothing():
    assert in_parent() == "the pytest process"
'''

# A user's own configuration that would hide the fixture's code or move the data if it were read.
FOREIGN_RC = "[run]\nomit = tiny/*\ndata_file = /nonexistent/elsewhere\ncontext = foreign\n"

FUNCTION_LINES = {  # the body lines of each function in WORK
    "in_child": (2, 3), "in_grandchild": (7, 8), "at_collection": (12, 13), "before_crashing": (17, 18),
    "in_parent": (22, 23),
}
NODE = "tests/tiny/test_spawning.py::"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> TestRun:
    repo = tmp_path_factory.mktemp("spawning")
    for path, text in {"tiny/__init__.py": "", "tiny/work.py": WORK, "tiny/relay.py": RELAY,
                       "tests/tiny/test_spawning.py": TESTS, ".coveragerc": FOREIGN_RC}.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    work = tmp_path_factory.mktemp("work")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COVERAGE_PROCESS_START", str(repo / ".coveragerc"))
        patch.setenv("COVERAGE_FILE", str(repo / "foreign.coverage"))
        patch.setenv("COVERAGE_RCFILE", str(repo / ".coveragerc"))
        patch.setenv("GATEKEEPER_TEST_CONTEXT", "a stale context")
        return run_tests(("python", "-m", "pytest", "tests/tiny", "-q", "-p", "no:cacheprovider"), repo, work,
                         ["tiny/work.py", "tiny/relay.py"], 60, Origin(trust="trusted", source="test"))


def ran(run: TestRun, path: str, function: str) -> dict[int, set[str]]:
    """line -> the tests that ran it, for the body of `function`."""
    file = next(f for f in run.files if f.path == path)
    return {line: set(run.context_names(file.covered[line])) for line in FUNCTION_LINES[function] if line in file.covered}


def test_the_run_completed(run):
    assert run.error is None
    assert {t.id: t.outcome for t in run.tests} == {
        NODE + "test_child": "passed", NODE + "test_grandchild": "passed",
        NODE + "test_crashing_children_do_not_break_the_run": "passed", NODE + "test_spawns_nothing": "passed"}
    assert run.notes == ()


def test_a_childs_lines_belong_to_the_test_that_started_it(run):
    assert ran(run, "tiny/work.py", "in_child") == {2: {NODE + "test_child"}, 3: {NODE + "test_child"}}


def test_a_grandchilds_lines_belong_to_the_test_too(run):
    assert ran(run, "tiny/work.py", "in_grandchild") == {7: {NODE + "test_grandchild"}, 8: {NODE + "test_grandchild"}}
    relay = next(f for f in run.files if f.path == "tiny/relay.py")
    assert {name for indexes in relay.covered.values() for name in run.context_names(indexes)} == {NODE + "test_grandchild"}


def test_a_test_that_spawns_nothing_claims_no_child_lines(run):
    claimed = {line for line, indexes in next(f for f in run.files if f.path == "tiny/work.py").covered.items()
               if NODE + "test_spawns_nothing" in run.context_names(indexes)}
    assert claimed == set(FUNCTION_LINES["in_parent"])


def test_a_child_started_while_collecting_counts_as_collection(run):
    assert ran(run, "tiny/work.py", "at_collection") == {12: {COLLECTION}, 13: {COLLECTION}}


def test_a_crashing_child_still_records_what_it_ran(run):
    # An exception still ends the interpreter normally, so coverage saves; a SIGKILLed child records nothing.
    test = NODE + "test_crashing_children_do_not_break_the_run"
    assert ran(run, "tiny/work.py", "before_crashing") == {17: {test}, 18: {test}}


def test_the_child_config_reads_the_context_from_the_environment(tmp_path):
    parent, child = write_rcfiles(tmp_path, ["a$b/x.py"], tmp_path)
    assert "context = ${GATEKEEPER_TEST_CONTEXT-}" in child.read_text()
    assert "context" not in parent.read_text() and "relative_files = true" in parent.read_text()
    assert "a$$b/x.py" in parent.read_text()  # a literal dollar, not a variable


def test_foreign_coverage_variables_are_dropped(tmp_path):
    env = measured_env({"PATH": "/bin", "COVERAGE_PROCESS_START": "x", "COVERAGE_CORE": "sysmon",
                        "GATEKEEPER_TEST_CONTEXT": "stale"}, tmp_path / "rc")
    assert env == {"PATH": "/bin", "GATEKEEPER_CHILD_RCFILE": str(tmp_path / "rc")}


def test_an_unreadable_process_data_file_is_left_out_with_a_note(tmp_path):
    good = CoverageData(str(tmp_path / f"{DATA_FILE}.host.1.a"))
    good.set_context("tests/t.py::test_a")
    good.add_lines({"/repo/x.py": [1, 2]})
    good.write()
    (tmp_path / f"{DATA_FILE}.host.2.b").write_bytes(b"half a sqlite file")
    into = CoverageData(str(tmp_path / DATA_FILE))
    notes = merge_process_data(tmp_path, into, lambda name: name.removeprefix("/repo/"))
    assert into.measured_files() == {"x.py"} and into.contexts_by_lineno("x.py") == {1: ["tests/t.py::test_a"], 2: ["tests/t.py::test_a"]}
    assert len(notes) == 1 and f"{DATA_FILE}.host.2.b" in notes[0]
