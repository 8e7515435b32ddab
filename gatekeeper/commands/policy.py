"""`gatekeeper policy validate FILE [--repo DIR]` and `gatekeeper policy schema`.

validate: exit 2 with `FILE:LINE: field: reason` when the policy is invalid; otherwise print the semantic lint's
warnings (`FILE:LINE: warning: field: message`), which never change the exit code. With --repo, every package's
guard is also checked statically against that tree (it exists, raises, runs first; see checks/startup_guard.py):
a guard that fails there is an error (`FILE:LINE: error: ...`) and the exit code is 1.

test: `gatekeeper policy test DIR` (gatekeeper/commands/policy_test.py).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from gatekeeper.checks.startup_guard import static_findings
from gatekeeper.commands import policy_test
from gatekeeper.errors import InputError
from gatekeeper.policy import LoadedPolicy, field_line, load_policy_text, policy_json_schema
from gatekeeper.policy_lint import lint
from gatekeeper.snapshot import Snapshot
from gatekeeper.sources.git import GitSnapshot
from gatekeeper.verdict import Severity


def register(subparsers) -> None:
    parser = subparsers.add_parser("policy", help="validate a policy file, test it on fixture PRs, or print its JSON Schema")
    actions = parser.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    validate = actions.add_parser("validate", help="validate a policy file and lint it against a repository")
    validate.add_argument("file", metavar="FILE", help="the policy YAML")
    validate.add_argument(
        "--repo", metavar="DIR",
        help="check the globs against this repository (its HEAD commit if DIR is a git repository, else the "
        "files under DIR): globs matching nothing and rules overlapping on real files become warnings; and every "
        "package's guard statically (it exists, raises, runs first): one that does not hold exits 1",
    )
    validate.set_defaults(func=_validate)
    policy_test.register(actions)
    schema = actions.add_parser("schema", help="print the JSON Schema of policy files (for editors)")
    schema.set_defaults(func=_schema)


def _validate(args) -> int:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(args.file, f"cannot read policy: {exc}") from None
    loaded = load_policy_text(text, args.file)
    snapshot = None if args.repo is None else repository_snapshot(Path(args.repo))
    warnings = lint(loaded.policy, None if snapshot is None else snapshot.paths())
    for warning in warnings:
        line = field_line(text, warning.loc)
        where = f"{args.file}:{line}" if line is not None else args.file
        print(f"{where}: warning: {warning.field}: {warning.message}", file=sys.stderr)
    errors, checked = (0, 0) if snapshot is None else _check_guards(loaded, text, snapshot, args.repo)
    count = f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
    if errors:
        print(f"{args.file}: the guards do not hold in {args.repo}: {errors} error(s), {count}")
        return 1
    held = f"; {'the guard holds' if checked == 1 else f'every guard ({checked}) holds'} in {args.repo}" if checked else ""
    print(f"{args.file}: valid policy {loaded.policy.name!r} (sha256 {loaded.sha256[:12]}), {count}{held}")
    return 0


def _check_guards(loaded: LoadedPolicy, text: str, snapshot: Snapshot, repo: str) -> tuple[int, int]:
    """The static startup-guard check of every package against the repository; prints each error, returns how
    many there were and how many guards were checked."""
    policy, errors, checked = loaded.policy, 0, 0
    for index, package in enumerate(policy.package_list()):
        guard = policy.for_package(package).checks.startup_guard
        if not guard.enabled or guard.guard is None:
            continue
        loc = ("packages", index, "startup_guard") if policy.packages else ("checks", "startup_guard")
        line = field_line(text, loc)
        where = f"{loaded.source}:{line}" if line is not None else loaded.source
        checked += 1
        for finding in static_findings(snapshot, guard, package.owned_paths):
            at = f" ({repo}/{finding.path}{f':{finding.line}' if finding.line else ''})" if finding.path else ""
            severity = "error" if finding.severity is Severity.error else "warning"
            print(f"{where}: {severity}: {package.name}: {finding.message}{at}", file=sys.stderr)
            errors += finding.severity is Severity.error
    return errors, checked


class DirectorySnapshot:
    """The files under a directory that is not a git repository (an unpacked wheel's tree, say)."""

    def __init__(self, root: Path):
        self.root = root
        files, seen = [], set()
        # Symlinked directories are followed (a tree of links to an installed package), each real one once.
        for directory, dirs, names in os.walk(root, followlinks=True):
            real = os.path.realpath(directory)
            if real in seen:
                dirs[:] = []
                continue
            seen.add(real)
            dirs[:] = sorted(d for d in dirs if d not in (".git", "__pycache__"))
            relative = Path(directory).relative_to(root)
            files.extend((relative / name).as_posix() for name in sorted(names))
        self._paths = tuple(files)

    def paths(self) -> Iterable[str]:
        return self._paths

    def read(self, path: str) -> str | None:
        try:
            return (self.root / path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None


def repository_snapshot(repo: Path) -> Snapshot:
    """`repo` at its HEAD commit when it is a git repository, else the files under it."""
    if not repo.is_dir():
        raise InputError(str(repo), "--repo is not a directory")
    if (repo / ".git").exists():
        return GitSnapshot(repo, "HEAD")
    return DirectorySnapshot(repo)


def _schema(args) -> int:
    print(json.dumps(policy_json_schema(), indent=2))
    return 0
