"""Per-test line coverage -> `FileCoverage`: from coverage.py's data file (the collector's own run, or a GPU
run's `.coverage` file read by `gatekeeper gpu-report`) or from a `coverage json --show-contexts` report (an
attached GPU run)."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import coverage
from coverage import CoverageData
from coverage.exceptions import CoverageException

from gatekeeper.errors import InputError
from gatekeeper.evidence import FileCoverage

COLLECTION = "(collection)"  # code that ran outside any test: imports while pytest collected the tests
MAX_COVERAGE_JSON_BYTES = 64 * 1024 * 1024
MAX_COVERAGE_DATA_BYTES = 256 * 1024 * 1024
_SQLITE_MAGIC = b"SQLite format 3\0"  # coverage.py's data file is an SQLite database


class ContextTable:
    """Test names in first-seen order, so a FileCoverage can refer to them by index."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}

    def index(self, context: str) -> int:
        # pytest-cov style labels ("node|run") and ours (the node id) name the same test.
        name = context.rsplit("|", 1)[0] if context.endswith(("|run", "|setup", "|teardown")) else context
        return self._index.setdefault(name or COLLECTION, len(self._index))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._index)


def from_coverage_data(cov: coverage.Coverage, repo: Path, paths: Iterable[str], table: ContextTable) -> tuple[FileCoverage, ...]:
    """Coverage of `paths` (repository-relative Python files) from a finished run, including files never
    imported: their statements come from parsing the source, so they show up as entirely uncovered."""
    data = cov.get_data()
    measured = {repository_path(repo, f): f for f in data.measured_files()}
    files = []
    for path in paths:
        _, statements, excluded, _, _ = cov.analysis2(str(repo / path))
        by_line = data.contexts_by_lineno(measured[path]) if path in measured else {}
        executable = set(statements)  # a list: one membership test per measured line would scan it
        # Sorted: the first-seen order of the table must not follow the sets' iteration order (PYTHONHASHSEED).
        covered = {line: tuple(sorted({table.index(c) for c in sorted(ctxs)}))
                   for line, ctxs in sorted(by_line.items()) if line in executable}
        files.append(FileCoverage(
            path=path, statements=tuple(statements), excluded=tuple(excluded),
            spans=statement_spans((repo / path).read_text(encoding="utf-8")), covered=covered,
        ))
    return tuple(files)


def from_coverage_report(report: Path, repo: Path, table: ContextTable) -> tuple[FileCoverage, ...]:
    """Coverage of every file of `repo` measured in a run made elsewhere (a GPU machine), from its coverage.py
    data file or its `coverage json --show-contexts` report, whichever `report` is."""
    try:
        with open(report, "rb") as handle:
            start = handle.read(len(_SQLITE_MAGIC))
    except OSError as exc:
        raise InputError(str(report), f"cannot read coverage data: {exc.strerror or exc}") from None
    if start == _SQLITE_MAGIC:
        return from_coverage_data_file(report, repo, table)
    if start.lstrip()[:1] == b"{":
        return from_coverage_json(report, repo, None, table)
    raise InputError(str(report), "neither a coverage.py data file (.coverage) nor a `coverage json` report")


def from_coverage_data_file(data_file: Path, repo: Path, table: ContextTable) -> tuple[FileCoverage, ...]:
    """Coverage of every file of `repo` that a coverage.py data file made elsewhere measured. Its file names
    may be absolute paths of that machine: each is matched to the repository path it ends with."""
    try:
        size = data_file.stat().st_size
        if size > MAX_COVERAGE_DATA_BYTES:
            raise InputError(str(data_file), f"coverage data is {size} bytes, more than the {MAX_COVERAGE_DATA_BYTES}-byte limit")
        measured = CoverageData(str(data_file), read_only=True)  # a fetched file may be read-only
        measured.read()
        names = measured.measured_files()
    except OSError as exc:
        raise InputError(str(data_file), f"cannot read coverage data: {exc.strerror or exc}") from None
    except CoverageException as exc:
        raise InputError(str(data_file), f"not a readable coverage.py data file: {exc}") from None
    if not measured.measured_contexts() - {""}:
        raise InputError(str(data_file), "the data has no per-test contexts: run the tests with "
                                         "`-p gatekeeper_pytest_contexts` (or pytest-cov's `--cov-context=test`)")
    paths = _repository_paths(data_file, names, repo)
    # Our statement analysis runs here, against the repository's sources; only the executed lines and their
    # contexts come from the data, under repository paths.
    cov = coverage.Coverage(data_file=None, config_file=False)
    cov.get_data().update(measured, map_path=lambda name: paths.get(name, name))
    return from_coverage_data(cov, repo, sorted(set(paths.values())), table)


def from_coverage_json(report: Path, repo: Path, paths: Iterable[str] | None, table: ContextTable) -> tuple[FileCoverage, ...]:
    """Coverage of `paths` (None: every file of `repo` it reports) from a `coverage json --show-contexts`
    report made elsewhere (a GPU machine): its file names may be absolute, so each is matched to the
    repository path it ends with."""
    try:
        size = report.stat().st_size
        if size > MAX_COVERAGE_JSON_BYTES:
            raise InputError(str(report), f"coverage report is {size} bytes, more than the {MAX_COVERAGE_JSON_BYTES}-byte limit")
        data = json.loads(report.read_bytes())
    except OSError as exc:
        raise InputError(str(report), f"cannot read coverage report: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(str(report), f"invalid coverage JSON: {exc}", getattr(exc, "lineno", None)) from None
    reported = data.get("files") if isinstance(data, dict) else None
    if not isinstance(reported, dict):
        raise InputError(str(report), "not a `coverage json` report: no 'files' object")
    if not data.get("meta", {}).get("show_contexts"):
        raise InputError(str(report), "the report has no per-test contexts: make it with `coverage json --show-contexts`")
    if paths is None:
        paths = sorted(set(_repository_paths(report, reported, repo).values()))
    files = []
    for path in paths:
        name = next((n for n in reported if n == path or n.replace("\\", "/").endswith("/" + path)), None)
        if name is None:
            continue
        entry = reported[name]
        try:
            executed = {int(n) for n in entry["executed_lines"]}
            statements = sorted(executed | {int(n) for n in entry["missing_lines"]})
            excluded = sorted(int(n) for n in entry.get("excluded_lines", ()))
            contexts = {int(line): [str(c) for c in ctxs] for line, ctxs in entry.get("contexts", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(str(report), f"malformed entry for {name}: {exc!r}") from None
        covered = {
            line: tuple(sorted({table.index(c) for c in contexts.get(line, [""])}))
            for line in executed if line in statements
        }
        files.append(FileCoverage(
            path=path, statements=tuple(statements), excluded=tuple(excluded),
            spans=statement_spans((repo / path).read_text(encoding="utf-8")), covered=covered,
        ))
    return tuple(files)


def file_statements(path: Path) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """coverage.py's statements and excluded lines of a Python file under its default configuration, as a report
    made elsewhere is analysed (from_coverage_data_file)."""
    _, statements, excluded, _, _ = coverage.Coverage(data_file=None, config_file=False).analysis2(str(path))
    return tuple(statements), tuple(excluded)


def statement_spans(source: str) -> tuple[tuple[int, int], ...]:
    """(first, last) line of every statement written over several lines; for a compound statement only its
    header (`def f(\\n a,\\n b):`). coverage.py counts a statement at its first line, so a change to any of its
    lines is a change of that statement."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    spans = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or node.end_lineno is None:
            continue
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
            last = body[0].lineno - 1
        else:
            first, last = node.lineno, node.end_lineno
        if last > first:
            spans.append((first, last))
    return tuple(sorted(spans))


def _repository_paths(report: Path, names: Iterable[str], repo: Path) -> dict[str, str]:
    """Recorded file name -> the repository path it ends with (the longest one that is a file of `repo`);
    names of files outside the repository are left out. None of them in the repository is an error: the
    report belongs to another project, or `repo` is not its checkout."""
    names = list(names)
    found = {}
    for name in names:
        parts = PurePosixPath(name.replace("\\", "/")).parts
        suffixes = ("/".join(parts[i:]) for i in range(len(parts)) if parts[i] != "/")
        path = next((p for p in suffixes if (repo / p).is_file()), None)
        if path is not None:
            found[name] = path
    if names and not found:
        raise InputError(str(report), f"none of its {len(names)} measured files is a file of {repo} "
                                      f"(e.g. {sorted(names)[0]}): is --repo the checkout the tests ran in?")
    return found


def repository_path(repo: Path, filename: str) -> str:
    """A file name coverage.py recorded (relative to the repository, or absolute) -> its repository path;
    a file outside the repository keeps its name."""
    path = Path(filename)
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:
        return filename
