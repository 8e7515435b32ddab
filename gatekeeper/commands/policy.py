"""`gatekeeper policy validate FILE [--repo DIR]` and `gatekeeper policy schema`.

validate: exit 2 with `FILE:LINE: field: reason` when the policy is invalid; otherwise exit 0 and print
the semantic lint's warnings (`FILE:LINE: warning: field: message`), which never change the exit code.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from gatekeeper.errors import InputError
from gatekeeper.policy import field_line, load_policy_text, policy_json_schema
from gatekeeper.policy_lint import lint
from gatekeeper.sources.git import GitSnapshot


def register(subparsers) -> None:
    parser = subparsers.add_parser("policy", help="validate a policy file, or print its JSON Schema")
    actions = parser.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    validate = actions.add_parser("validate", help="validate a policy file and lint it against a repository")
    validate.add_argument("file", metavar="FILE", help="the policy YAML")
    validate.add_argument(
        "--repo", metavar="DIR",
        help="check the globs against this repository (its HEAD commit if DIR is a git repository, else the "
        "files under DIR): globs matching nothing and rules overlapping on real files become warnings",
    )
    validate.set_defaults(func=_validate)
    schema = actions.add_parser("schema", help="print the JSON Schema of policy files (for editors)")
    schema.set_defaults(func=_schema)


def _validate(args) -> int:
    try:
        text = Path(args.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(args.file, f"cannot read policy: {exc}") from None
    loaded = load_policy_text(text, args.file)
    repo_paths = None if args.repo is None else _repository_files(Path(args.repo))
    warnings = lint(loaded.policy, repo_paths)
    for warning in warnings:
        line = field_line(text, warning.loc)
        where = f"{args.file}:{line}" if line is not None else args.file
        print(f"{where}: warning: {warning.field}: {warning.message}", file=sys.stderr)
    count = f"{len(warnings)} warning{'s' if len(warnings) != 1 else ''}"
    print(f"{args.file}: valid policy {loaded.policy.name!r} (sha256 {loaded.sha256[:12]}), {count}")
    return 0


def _repository_files(repo: Path) -> Iterable[str]:
    if not repo.is_dir():
        raise InputError(str(repo), "--repo is not a directory")
    if (repo / ".git").exists():
        return GitSnapshot(repo, "HEAD").paths()
    files = []
    for root, dirs, names in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if d != ".git")
        relative = Path(root).relative_to(repo)
        files.extend((relative / name).as_posix() for name in sorted(names))
    return files


def _schema(args) -> int:
    print(json.dumps(policy_json_schema(), indent=2))
    return 0
