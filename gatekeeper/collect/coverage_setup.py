"""How the test run is measured: the coverage.py configuration of the pytest process and of every Python
process a test starts, the environment that carries it, and merging all their data files afterwards.

A child process is measured through coverage.py's start-up hook (the `.pth` file its wheel installs calls
`coverage.process_startup()` when `COVERAGE_PROCESS_START` names a config file). The child reads its config
file itself, so `context = ${GATEKEEPER_TEST_CONTEXT-}` expands to the node id that the pytest plugin put in
the environment when the test started: the child's lines are attributed to the test that spawned it. (`[run]
patch = subprocess` would not do: it hands children the parent's config as parsed at start-up, variables
already expanded, so every child would record the parent's context.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from coverage import CoverageData
from coverage.exceptions import CoverageException

DATA_FILE = "coverage.sqlite"
CHILD_RCFILE_ENV = "GATEKEEPER_CHILD_RCFILE"    # read by the plugin, which turns it into COVERAGE_PROCESS_START
CONTEXT_ENV = "GATEKEEPER_TEST_CONTEXT"         # the node id of the running test, set by the plugin
# Variables coverage.py reads at start-up (COVERAGE_FILE, COVERAGE_CORE, COVERAGE_PROCESS_START, ...): a
# value left in the CI's environment would move the data, change the tracer or start a foreign config.
_FOREIGN_PREFIXES = ("COVERAGE_",)


def write_rcfiles(work: Path, paths: list[str], repo: Path) -> tuple[Path, Path]:
    """(config of the pytest process, config of the processes the tests start). Both measure exactly the
    judged files: tracing the whole repository (a virtualenv inside it, torch included) would cost far more
    than the tests."""
    files = [_literal(str((repo / p).resolve())) for p in paths] or [_literal(str(work / "nothing-to-measure"))]
    common = (
        "[run]\n"
        f"data_file = {_escape(str(work / DATA_FILE))}\n"
        # Every process writes its own data file (name.host.pid.random); merge_process_data joins them.
        "parallel = true\n"
        "include =\n" + "".join(f"    {f}\n" for f in files) +
        # Contexts are switched by our plugin (and static in a child); sys.monitoring does not support them.
        "core = ctrace\n"
    )
    parent = work / "coveragerc"
    parent.write_text(common + "relative_files = true\n", encoding="utf-8")
    child = work / "coveragerc-child"
    # A child may run in any directory, where relative names would be relative to that directory: it
    # records absolute ones, which merge_process_data maps back to repository paths.
    child.write_text(common + "relative_files = false\n" + f"context = ${{{CONTEXT_ENV}-}}\n", encoding="utf-8")
    return parent, child


def measured_env(base: dict[str, str], child_rcfile: Path) -> dict[str, str]:
    """`base` without coverage.py's own variables and our context, plus what the plugin needs to have the
    tests' child processes measured."""
    env = {k: v for k, v in base.items() if not k.startswith(_FOREIGN_PREFIXES) and k != CONTEXT_ENV}
    env[CHILD_RCFILE_ENV] = str(child_rcfile)
    return env


def merge_process_data(work: Path, into: CoverageData, map_path: Callable[[str], str]) -> list[str]:
    """Add every process's data file in `work` to `into`, file names through `map_path`. A file that cannot
    be read (a child killed while writing it) is left out; the returned notes say which and why."""
    notes = []
    for part_file in sorted(work.glob(DATA_FILE + ".*")):
        part = CoverageData(str(part_file))
        try:
            part.read()
            into.update(part, map_path=map_path)
        except CoverageException as exc:
            notes.append(f"coverage data of one test process left out, unreadable: {exc}")
    return notes


def _literal(path: str) -> str:
    """A file name as a pattern of coverage's `include` (fnmatch) that matches only itself."""
    return _escape("".join(f"[{c}]" if c in "*?[]" else c for c in path))


def _escape(value: str) -> str:
    # coverage.py expands $VAR in every config value.
    return value.replace("$", "$$")
