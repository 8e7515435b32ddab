"""`gatekeeper gpu-report`: turn a GPU machine's JUnit report and coverage data into a small evidence file.

The GPU machine has neither a git checkout nor the gatekeeper's dependencies, so it only runs the tests under
coverage.py with the per-test context plugin (`tools/gpu-evidence.sh`). This command runs afterwards in a
checkout of the commit the tests ran at, and writes what `gatekeeper collect` would have written there: an
evidence file whose test run maps each line to indexes into a table of test ids, stamped with that commit so
the collector drops the coverage of files changed since. It is far smaller than the `coverage json
--show-contexts` report, which repeats every test id on every line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from gatekeeper.collect.gpu_reports import gpu_report_run
from gatekeeper.errors import InputError
from gatekeeper.evidence import Evidence, HeadInfo, TestRun
from gatekeeper.git import Git, changed_in_worktree

_HEX_SHA = re.compile(r"[0-9a-f]{7,40}")


def register(subparsers) -> None:
    parser = subparsers.add_parser("gpu-report", help="GPU run's JUnit + coverage data -> compact evidence JSON",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--junit", required=True, help="the GPU run's JUnit XML (pytest --junitxml)")
    parser.add_argument("--coverage", required=True,
                        help="the GPU run's coverage.py data file (.coverage), or its `coverage json --show-contexts` report")
    parser.add_argument("--commit", required=True, help="the commit the GPU tests ran at (hex SHA, 7 to 40 digits)")
    parser.add_argument("--repo", default=".", help="a git checkout of that commit (default: .)")
    parser.add_argument("--out", required=True, help="where to write the evidence JSON")
    parser.add_argument("--label", default="gpu", help="the test run's label (default: gpu)")
    parser.add_argument("--nodeids", help="the plugin's list of collected tests (GATEKEEPER_NODEIDS), one node id a line")
    parser.set_defaults(func=_run)


def _run(args) -> int:
    repo = Path(args.repo)
    if not (repo / ".git").exists():
        raise InputError(str(repo), "not the top of a git checkout (--repo must be the checkout of the commit the tests ran at)")
    sha = _resolve_commit(repo, args.commit)
    nodeids = _read_nodeids(Path(args.nodeids)) if args.nodeids else ()
    run = gpu_report_run(Path(args.junit), Path(args.coverage), repo.resolve(), args.label, nodeids)
    run = _without_edited_files(run, repo, sha)
    for note in run.notes:
        print(f"gatekeeper gpu-report: warning: {note}", file=sys.stderr)
    out = Path(args.out)
    try:
        # Compact on purpose: the file is committed, and indentation would add a quarter to its size.
        out.write_text(Evidence(head=HeadInfo(sha=sha), tests=(run,)).model_dump_json(), encoding="utf-8")
    except OSError as exc:
        raise InputError(str(out), f"cannot write evidence: {exc.strerror or exc}") from None
    covered = sum(len(f.covered) for f in run.files)
    print(f"wrote {out}: {len(run.tests)} tests, {len(run.files)} files, {covered} covered lines, "
          f"{out.stat().st_size} bytes, commit {sha[:12]}", file=sys.stderr)
    return 0


def _resolve_commit(repo: Path, commit: str) -> str:
    if not _HEX_SHA.fullmatch(commit):
        raise InputError("--commit", f"{commit!r} is not a commit SHA (7 to 40 lowercase hex digits)")
    sha = Git(repo).commit_sha_or_none(commit)
    if sha is None or not sha.startswith(commit):
        raise InputError(str(repo), f"{commit} is not a commit of this repository")
    return sha


def _read_nodeids(path: Path) -> tuple[str, ...]:
    try:
        return tuple(line for line in path.read_text(encoding="utf-8").splitlines() if line)
    except OSError as exc:
        raise InputError(str(path), f"cannot read the node id list: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise InputError(str(path), "the node id list is not UTF-8 text") from None


def _without_edited_files(run: TestRun, repo: Path, sha: str) -> TestRun:
    """Statements are read from the checkout's sources: a file that differs from the commit the tests ran at
    would pair that commit's executed lines with other code, so its coverage is left out, with a note."""
    edited = changed_in_worktree(repo, sha)
    if edited is None:
        raise InputError(str(repo), f"git cannot compare the checkout with {sha[:12]}")
    dropped = sorted(f.path for f in run.files if f.path in edited)
    if not dropped:
        return run
    note = f"coverage of {', '.join(dropped)} left out: the checkout differs from commit {sha[:12]} the tests ran at"
    return run.model_copy(update={"files": tuple(f for f in run.files if f.path not in edited),
                                  "notes": (*run.notes, note)})
