"""Run the policy's test command under coverage.py with one dynamic context per test, and JUnit XML.

A run that crashes, hangs past its time limit or leaves no report is recorded as a failed run, never raised:
the changed_path_tests rule then fails with the reason, instead of the collector dying without evidence.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import coverage

from gatekeeper.collect.coverage_map import ContextTable, from_coverage_data, repository_path
from gatekeeper.collect.coverage_setup import measured_env, merge_process_data, write_rcfiles
from gatekeeper.collect.junit import junit_key, parse_junit
from gatekeeper.collect.process import run_limited
from gatekeeper.errors import InputError
from gatekeeper.evidence import Origin, TestRun, clip

PLUGIN_MODULE = "gatekeeper_pytest_contexts"
_PYTEST_NAMES = ("pytest", "py.test")
_BARE_PYTHONS = ("python", "python3")


def coverage_command(command: tuple[str, ...], rcfile: Path, junit: Path, policy_source: str = "policy") -> list[str]:
    """`pytest ARGS` or `PYTHON -m pytest ARGS` -> the same tests under `coverage run`, with our context plugin
    and a JUnit report. Any other command cannot be measured per test: InputError."""
    if command and Path(command[0]).name in _PYTEST_NAMES:
        python, args = sys.executable, list(command[1:])
    elif len(command) >= 3 and command[1:3] == ("-m", "pytest"):
        # A bare `python` means the interpreter running the collector (the CI's environment), not PATH's.
        python = sys.executable if command[0] in _BARE_PYTHONS else command[0]
        args = list(command[3:])
    else:
        raise InputError(policy_source, f"checks.changed_path_tests.command must run pytest, got {shlex.join(command)!r}")
    return [python, "-m", "coverage", "run", f"--rcfile={rcfile}", "-m", "pytest", "-p", PLUGIN_MODULE,
            f"--junitxml={junit}", "-o", "junit_family=xunit1", *args]


def run_tests(command: tuple[str, ...], repo: Path, work: Path, paths: list[str], timeout_s: float,
              origin: Origin, policy_source: str = "policy") -> TestRun:
    """Run the tests in `repo`, and record outcomes and per-test coverage of `paths`, including what the
    Python processes the tests start execute."""
    rcfile, child_rcfile = write_rcfiles(work, paths, repo)
    junit, nodeid_list, plugin_notes = work / "junit.xml", work / "nodeids.txt", work / "plugin-notes.txt"
    argv = coverage_command(command, rcfile, junit, policy_source)
    plugin_dir = Path(__file__).parent / "plugin"
    env = measured_env(dict(os.environ), child_rcfile)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(plugin_dir), str(repo), env.get("PYTHONPATH")) if p)
    env["GATEKEEPER_NODEIDS"] = str(nodeid_list)
    env["GATEKEEPER_NOTES"] = str(plugin_notes)
    run = run_limited(argv, cwd=repo, env=env, timeout_s=timeout_s, log=work / "tests.log")
    record = {"origin": origin, "label": "tests", "command": " ".join(command), "exit_code": run.returncode}
    if run.timed_out:
        return TestRun(**record, error=clip(f"timed out after {timeout_s:g} s; last output:\n{run.tail}"))
    if not junit.exists():
        return TestRun(**record, error=clip(f"exited with status {run.returncode} without a JUnit report:\n{run.tail}"))
    cov = coverage.Coverage(config_file=str(rcfile))
    notes = plugin_notes.read_text(encoding="utf-8").splitlines() if plugin_notes.exists() else []
    notes += merge_process_data(work, cov.get_data(), lambda name: repository_path(repo, name))
    table = ContextTable()
    files = from_coverage_data(cov, repo, paths, table)
    try:
        nodeids = nodeid_list.read_text(encoding="utf-8").splitlines() if nodeid_list.exists() else []
        tests = parse_junit(junit, {junit_key(name): name for name in nodeids})
    except InputError as exc:
        return TestRun(**record, error=clip(f"unreadable JUnit report: {exc}"))
    return TestRun(**record, notes=tuple(clip(n) for n in notes), tests=tests, contexts=table.names, files=files)
