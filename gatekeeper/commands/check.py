"""`gatekeeper check`: the verdict the App would post, computed offline from a git range, a diff or saved
GitHub JSON.

Exit codes: 0 pass; 1 fail; 2 usage or input error. A neutral verdict (some required check could not be
decided, usually for lack of evidence) exits 0 but says so on stderr; `--strict` makes it exit 1.
"""

from __future__ import annotations

import argparse
import io
import sys

from gatekeeper.changes import ChangeSet
from gatekeeper.errors import InputError
from gatekeeper.evidence import combine_evidence, load_evidence
from gatekeeper.evidence_trust import untrusted_because
from gatekeeper.inputs import EvaluationInputs, verdict_for
from gatekeeper.policy import load_policy
from gatekeeper.snapshot import Snapshot
from gatekeeper.sources.diff import changes_from_diff
from gatekeeper.sources.git import GitSnapshot, changes_from_git, tree_entries
from gatekeeper.sources.github import changes_from_pr_files, pull_request_from_json
from gatekeeper.verdict import Status, Verdict

EXIT_PASS, EXIT_FAIL = 0, 1  # input and usage errors exit 2, in gatekeeper.cli
# Terminal reports written to a file (--output) are wrapped at this width, without colour.
_FILE_WIDTH = 100


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "check", help="evaluate a change against a policy",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--policy", required=True, metavar="FILE", help="the policy YAML")
    source = parser.add_argument_group("the change (exactly one of --base, --diff, --pr-files)")
    sources = source.add_mutually_exclusive_group(required=True)
    sources.add_argument("--base", metavar="REF", help="a git range base...head in --repo, as GitHub shows a PR")
    sources.add_argument("--diff", metavar="FILE", help="a unified diff in git format ('-' reads stdin)")
    sources.add_argument("--pr-files", metavar="FILE", help="saved GitHub 'list pull request files' JSON")
    source.add_argument("--head", metavar="REF", help="with --base: the head of the range (default HEAD)")
    source.add_argument("--repo", metavar="DIR", help="with --base: the git repository (default .)")
    source.add_argument("--commits", metavar="FILE", help="with --pr-files: saved 'list commits on a pull request' JSON")
    source.add_argument("--pr", metavar="FILE", help="saved pull request JSON: labels, body and author for provenance")
    parser.add_argument(
        "--evidence", metavar="FILE", action="append", default=[],
        help="evidence JSON from `gatekeeper collect` (repeatable; the files are combined)",
    )
    parser.add_argument(
        "--evidence-workflow", metavar="PATH", default=".github/workflows/gatekeeper.yml",
        help="the workflow whose evidence counts as trusted only if the change leaves it (and what it runs) as "
             "the base has it (default: .github/workflows/gatekeeper.yml)",
    )
    declared = parser.add_mutually_exclusive_group()
    declared.add_argument(
        "--agent-assisted", dest="declared", action="store_const", const=True,
        help="treat the change as agent-assisted whatever the signals say",
    )
    declared.add_argument(
        "--not-agent-assisted", dest="declared", action="store_const", const=False,
        help="treat the change as not agent-assisted, overriding any signal (the report lists them)",
    )
    parser.add_argument("--format", choices=("terminal", "markdown", "json", "html"), default="terminal",
                        help="html: the details page the App serves, one self-contained file (use with --output)")
    parser.add_argument("--output", metavar="FILE", help="write the report to FILE instead of stdout")
    parser.add_argument("--strict", action="store_true", help="exit 1 on a neutral verdict, not 0")
    parser.set_defaults(func=run, parser=parser)


def run(args) -> int:
    _check_combinations(args)
    policy = load_policy(args.policy)
    changes, snapshot = _changes(args)
    pull_request = pull_request_from_json(_read(args.pr), args.pr) if args.pr else None
    evidence = combine_evidence([(path, load_evidence(path)) for path in args.evidence])
    untrusted = _evidence_untrusted_because(args, changes, snapshot) if evidence is not None else None
    if untrusted is not None:
        print(f"gatekeeper: CI's evidence counts as self-reported: {untrusted}", file=sys.stderr)
    verdict = verdict_for(EvaluationInputs(policy, changes, pull_request, evidence, evidence_untrusted=untrusted,
                                           snapshot=snapshot, declared=args.declared))
    _write_report(verdict, args)
    return _exit_code(verdict, args.strict)


def _evidence_untrusted_because(args, changes: ChangeSet, snapshot: Snapshot | None) -> str | None:
    """The App's rule where the change's source can show it: with --base, the workflow at the head must be
    the base's, with everything it runs pinned; from a diff or PR files, the change must not touch it."""
    workflow = args.evidence_workflow
    if args.base is not None:
        repo = args.repo or "."
        head_tree, base_tree = tree_entries(repo, args.head or "HEAD"), tree_entries(repo, args.base)
        if workflow not in head_tree and workflow not in base_tree:
            return None  # no such workflow on either side: the evidence came from elsewhere, nothing to tell
        return untrusted_because(workflow, snapshot.read(workflow), head_tree, base_tree)
    touched = sorted(p for f in changes.files for p in f.paths if p == workflow or p.startswith(".github/actions/"))
    if touched:
        return f"the change edits the evidence workflow or its actions ({', '.join(touched)})"
    return None


def _check_combinations(args) -> None:
    """Options that only make sense with one source: a usage error (exit 2), never silently ignored."""
    wrong = [
        (args.head is not None and args.base is None, "--head needs --base"),
        (args.repo is not None and args.base is None, "--repo needs --base"),
        (args.commits is not None and args.pr_files is None, "--commits needs --pr-files"),
    ]
    for is_wrong, message in wrong:
        if is_wrong:
            args.parser.error(message)


def _changes(args) -> tuple[ChangeSet, Snapshot | None]:
    if args.base is not None:
        repo, head = args.repo or ".", args.head or "HEAD"
        return changes_from_git(repo, args.base, head), GitSnapshot(repo, head)
    if args.diff is not None:
        return changes_from_diff(_read(args.diff), "<stdin>" if args.diff == "-" else args.diff), None
    commits = _read(args.commits) if args.commits else None
    return changes_from_pr_files(_read(args.pr_files), args.pr_files, commits, args.commits or "commits"), None


def _read(path: str) -> str:
    try:
        # newline="": a lone \r inside a diffed file is content, not a line break (it would shift line numbers).
        if path == "-":
            raw = getattr(sys.stdin, "buffer", None)  # absent when stdin was replaced by a text stream
            return io.TextIOWrapper(raw, encoding="utf-8", newline="").read() if raw else sys.stdin.read()
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(path, f"cannot read: {exc.strerror or exc}") from None


def _write_report(verdict: Verdict, args) -> None:
    # Each format imports only its own renderer (rich and jinja2 cost a noticeable part of a short run).
    if args.format == "terminal":
        from rich.console import Console

        from gatekeeper.report.terminal import render_terminal

        if args.output is None:
            render_terminal(verdict, Console())
        else:
            with _open_output(args.output) as handle:
                render_terminal(verdict, Console(file=handle, width=_FILE_WIDTH, color_system=None))
    else:
        if args.format == "json":
            from gatekeeper.report.json_report import render_json as render
        elif args.format == "html":
            from gatekeeper.report.html import render_html as render
        else:
            from gatekeeper.report.markdown import render_markdown as render
        text = render(verdict)
        if args.output is None:
            sys.stdout.write(text)
        else:
            with _open_output(args.output) as handle:
                handle.write(text)
    if args.output is not None:
        print(f"gatekeeper: {verdict.verdict.upper()}; report written to {args.output}", file=sys.stderr)
    undecided = [c.id for c in verdict.checks if c.status is Status.neutral]
    if undecided:
        print(f"gatekeeper: UNDECIDED: {', '.join(undecided)} (see the report for why)", file=sys.stderr)
    if verdict.verdict == "neutral":
        outcome = "exit 1 (--strict)" if args.strict else "exit 0; --strict makes it exit 1"
        print(f"gatekeeper: the verdict is NEUTRAL, which is not a pass: {outcome}", file=sys.stderr)


def _open_output(path: str):
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as exc:
        raise InputError(path, f"cannot write the report: {exc.strerror or exc}") from None


def _exit_code(verdict: Verdict, strict: bool) -> int:
    if verdict.verdict == "fail":
        return EXIT_FAIL
    if verdict.verdict == "neutral" and strict:
        return EXIT_FAIL
    return EXIT_PASS
