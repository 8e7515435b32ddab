"""GPU test reports committed in the pull request (`gpu_report_globs`): lines only a GPU executes may be
covered by them. Labelled self-reported: nobody here saw them run. Two formats:

- an evidence file written by `gatekeeper collect` on the GPU machine, or by `gatekeeper gpu-report` here
  from that machine's JUnit report and coverage data (`gpu_report_run`). It records the commit the tests ran
  at, so coverage of files changed since is dropped (its line numbers no longer describe the head) and the
  run says so, unless the change left the file's code as it was (comments, docstrings: coverage_carry);
- a directory of `*.xml` JUnit reports and `*.json` `coverage json --show-contexts` reports (one run per
  directory). Their line numbers are taken as describing the head: nothing records where they were made.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path, PurePosixPath

from coverage.exceptions import CoverageException

from gatekeeper.collect.coverage_carry import carry_coverage
from gatekeeper.collect.coverage_map import ContextTable, file_statements, from_coverage_json, from_coverage_report
from gatekeeper.collect.junit import junit_key, parse_junit
from gatekeeper.errors import InputError
from gatekeeper.evidence import FileCoverage, Origin, TestCase, TestRun, load_evidence
from gatekeeper.git import changed_since, file_at
from gatekeeper.paths import matches_any
from gatekeeper.snapshot import Snapshot


def load_gpu_reports(repo: Path, head: Snapshot, head_sha: str, globs: tuple[str, ...], paths: list[str]) -> list[TestRun]:
    if not globs:
        return []
    groups: dict[str, list[str]] = defaultdict(list)
    runs: list[TestRun] = []
    for path in head.paths():
        if not matches_any(path, globs):
            continue
        if path.endswith(".json") and _is_evidence(repo / path):
            runs += _from_evidence(repo, path, head_sha, paths)
        else:
            groups[str(PurePosixPath(path).parent)].append(path)
    runs += [_from_junit_and_coverage(repo, directory, sorted(files), paths) for directory, files in sorted(groups.items())]
    return runs


def _origin(what: str) -> Origin:
    return Origin(trust="self_reported", source=f"GPU report {what} in the pull request")


def _is_evidence(path: Path) -> bool:
    """An evidence document starts with its schema_version; a coverage report with its meta."""
    try:
        with open(path, encoding="utf-8") as handle:
            start = handle.read(200)
    except (OSError, UnicodeDecodeError):
        return False
    return '"schema_version"' in start and '"meta"' not in start


def _from_evidence(repo: Path, path: str, head_sha: str, paths: list[str]) -> list[TestRun]:
    try:
        evidence = load_evidence(repo / path)
    except InputError as exc:
        return [TestRun(origin=_origin(path), label=path, error=f"unusable GPU report: {exc}")]
    if not evidence.tests:
        return [TestRun(origin=_origin(path), label=path, error="the evidence file holds no test run")]
    made_at = evidence.head.sha if evidence.head is not None else None
    stale = changed_since(repo, made_at, head_sha) if made_at is not None else None
    runs = []
    for index, run in enumerate(evidence.tests):
        label = path if len(evidence.tests) == 1 else f"{path}#{index}"
        if stale is None:
            notes = ("its commit is unknown here, so none of its coverage is used",)
            files = ()
        else:
            carried = {f.path: _carried(repo, made_at, f) for f in run.files if f.path in stale and f.path in paths}
            dropped = sorted(name for name, moved in carried.items() if moved is None)
            kept = sorted(name for name, moved in carried.items() if moved is not None)
            notes = ()
            if dropped:
                notes += (f"coverage of {', '.join(dropped)} dropped: changed since the report's commit {made_at[:12]}",)
            if kept:
                notes += (f"coverage of {', '.join(kept)} carried over from the report's commit {made_at[:12]}: "
                          "changed since in comments or docstrings only",)
            files = tuple(carried.get(f.path) or f for f in run.files if f.path in paths and f.path not in dropped)
        runs.append(run.model_copy(update={"origin": _origin(label), "label": label, "files": files, "notes": run.notes + notes}))
    return runs


def _carried(repo: Path, made_at: str, measured: FileCoverage) -> FileCoverage | None:
    """The coverage of a file changed since the report's commit, on the head's lines; None when its code changed
    (or it is gone, or not Python)."""
    path = repo / measured.path
    old_source = file_at(repo, made_at, measured.path) if path.suffix == ".py" and path.is_file() else None
    if old_source is None:
        return None
    try:
        new_source = path.read_text(encoding="utf-8")
        statements, excluded = file_statements(path)
    except (UnicodeDecodeError, CoverageException):  # nothing coverage.py can read: nothing to carry onto
        return None
    return carry_coverage(measured, old_source, new_source, statements, excluded)


def _from_junit_and_coverage(repo: Path, directory: str, files: list[str], paths: list[str]) -> TestRun:
    origin = _origin(f"{directory}/")
    table = ContextTable()
    try:
        coverage = [c for f in files if f.endswith(".json") for c in from_coverage_json(repo / f, repo, paths, table)]
        tests = _outcomes([repo / f for f in files if f.endswith(".xml")], table)
    except InputError as exc:
        return TestRun(origin=origin, label=directory, error=f"unusable GPU report: {exc}")
    if not tests:
        return TestRun(origin=origin, label=directory, error="no JUnit report (*.xml) among the matched files")
    return TestRun(origin=origin, label=directory, tests=tests, contexts=table.names, files=tuple(coverage))


def gpu_report_run(junit: Path, coverage_report: Path, repo: Path, label: str, nodeids: tuple[str, ...] = ()) -> TestRun:
    """One GPU run as the test run of an evidence file (what `gatekeeper gpu-report` writes): the JUnit
    outcomes, and the per-test coverage of every measured file of `repo` from the run's coverage.py data file
    or `coverage json --show-contexts` report. `nodeids` (the plugin's list of collected tests) names tests
    that ran no measured code by their node ids too. InputError when an input is unusable."""
    table = ContextTable()
    files = from_coverage_report(coverage_report, repo, table)
    tests = _outcomes([junit], table, nodeids)
    if not tests:
        raise InputError(str(junit), "the JUnit report holds no <testcase>: no test ran")
    # Self-reported whatever it says: the collector that loads the file assigns trust (see _from_evidence).
    origin = Origin(trust="self_reported", source=f"gatekeeper gpu-report of {junit.name} and {coverage_report.name}")
    return TestRun(origin=origin, label=label,
                   tests=tests, contexts=table.names, files=files)


def _outcomes(junit_files: list[Path], table: ContextTable, nodeids: tuple[str, ...] = ()) -> tuple[TestCase, ...]:
    """JUnit outcomes, tests named by node id where the coverage contexts (or the plugin's list) know it."""
    by_key = {junit_key(name): name for name in (*nodeids, *table.names)}
    return tuple(t for f in junit_files for t in parse_junit(f, by_key))
