"""GPU test reports committed in the pull request (`gpu_report_globs`): lines only a GPU executes may be
covered by them. Each directory of matching files is one run: its `*.xml` files are JUnit reports, its
`*.json` files `coverage json --show-contexts` reports. Labelled self-reported: nobody here saw them run."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path, PurePosixPath

from gatekeeper.collect.coverage_map import ContextTable, from_coverage_json
from gatekeeper.collect.junit import junit_key, parse_junit
from gatekeeper.errors import InputError
from gatekeeper.evidence import Origin, TestRun
from gatekeeper.paths import matches_any
from gatekeeper.snapshot import Snapshot


def load_gpu_reports(repo: Path, head: Snapshot, globs: tuple[str, ...], paths: list[str]) -> list[TestRun]:
    if not globs:
        return []
    groups: dict[str, list[str]] = defaultdict(list)
    for path in head.paths():
        if matches_any(path, globs):
            groups[str(PurePosixPath(path).parent)].append(path)
    return [_load_group(repo, directory, sorted(files), paths) for directory, files in sorted(groups.items())]


def _load_group(repo: Path, directory: str, files: list[str], paths: list[str]) -> TestRun:
    origin = Origin(trust="self_reported", source=f"GPU report {directory}/ in the pull request")
    table = ContextTable()
    try:
        coverage = [c for f in files if f.endswith(".json") for c in from_coverage_json(repo / f, repo, paths, table)]
        nodeids = {junit_key(name): name for name in table.names}
        tests = tuple(t for f in files if f.endswith(".xml") for t in parse_junit(repo / f, nodeids))
    except InputError as exc:
        return TestRun(origin=origin, label=directory, error=f"unusable GPU report: {exc}")
    if not tests:
        return TestRun(origin=origin, label=directory, error="no JUnit report (*.xml) among the matched files")
    return TestRun(origin=origin, label=directory, tests=tests, contexts=table.names, files=tuple(coverage))
