"""`gatekeeper policy test DIR`: run fixture pull requests through a policy and compare with the verdicts they
are expected to get, so that a policy change is reviewed together with its effect.

Every directory under DIR holding a `case.yaml` is one case: a change (saved GitHub "list pull request files"
JSON, or a unified diff), optionally its commits, the PR object and evidence files, and what is expected:

    policy: ../../policies/vllm.yaml       # relative to case.yaml; --policy overrides every case's
    pr_files: pr-files.json                # or: diff: change.diff
    commits: commits.json                  # optional, with pr_files
    pr: pull.json                          # optional
    evidence: [evidence.json]              # optional
    agent_assisted: true                   # optional: as `check --agent-assisted` / `--not-agent-assisted`
    expect:
      verdict: fail
      checks: {confinement: fail, startup_guard: pass}   # only the rules named are compared
      packages: [kimi_k3-nvidia]                          # the owned packages the change touches
      blast_radius: {kimi_k3-nvidia: widens}              # per package: widens, narrows, guard_changed, ...

Exit 0 when every case gets what it expects, 1 otherwise, 2 for a bad case file (FILE:LINE: reason). A rule the
policy runs in shadow mode is compared like any other, and the listing says when it "would have failed".
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gatekeeper.errors import InputError
from gatekeeper.evidence import combine_evidence, load_evidence
from gatekeeper.inputs import EvaluationInputs, verdict_for
from gatekeeper.policy import field_line, load_policy
from gatekeeper.sources.diff import changes_from_diff
from gatekeeper.sources.github import changes_from_pr_files, pull_request_from_json
from gatekeeper.verdict import CheckId, ChangeKind, Status, Verdict

CASE_FILE = "case.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Expectation(_Strict):
    verdict: Literal["pass", "fail", "neutral"]
    checks: dict[CheckId, Literal["pass", "fail", "neutral", "skipped"]] = Field(default_factory=dict)
    packages: tuple[str, ...] | None = None
    blast_radius: dict[str, ChangeKind] = Field(default_factory=dict)


class Case(_Strict):
    policy: str | None = None
    pr_files: str | None = None
    diff: str | None = None
    commits: str | None = None
    pr: str | None = None
    evidence: tuple[str, ...] = ()
    agent_assisted: bool | None = None
    expect: Expectation


def register(actions) -> None:
    test = actions.add_parser("test", help="run fixture PRs through a policy and compare with their expected verdicts",
                              description=__doc__.splitlines()[0])
    test.add_argument("dir", metavar="DIR", help="a directory of cases (subdirectories holding case.yaml)")
    test.add_argument("--policy", metavar="FILE", help="judge every case with this policy (the change under review)")
    test.set_defaults(func=run)


def run(args) -> int:
    root = Path(args.dir)
    cases = sorted(root.rglob(CASE_FILE))
    if not cases:
        raise InputError(str(root), f"no {CASE_FILE} under this directory")
    failures = 0
    for path in cases:
        case = load_case(path)
        verdict = judge(case, path.parent, args.policy)
        problems = compare(case.expect, verdict)
        failures += bool(problems)
        name = path.parent.relative_to(root).as_posix() if path.parent != root else path.parent.name
        print(f"{'ok  ' if not problems else 'FAIL'} {name}: {verdict.verdict}{_shadow_note(verdict)}")
        for problem in problems:
            print(f"     {problem}")
    print(f"{len(cases) - failures} of {len(cases)} case(s) get their expected verdict")
    return 1 if failures else 0


def load_case(path: Path) -> Case:
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(str(path), f"invalid YAML: {getattr(exc, 'problem', None) or exc}",
                         mark.line + 1 if mark is not None else None) from None
    if not isinstance(data, dict):
        raise InputError(str(path), "a case must be a YAML mapping", 1)
    try:
        case = Case.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise InputError(str(path), f"{where}: {first['msg']}", field_line(text, tuple(first["loc"]))) from None
    if (case.pr_files is None) == (case.diff is None):
        raise InputError(str(path), "give exactly one of pr_files and diff", 1)
    return case


def judge(case: Case, where: Path, policy_override: str | None) -> Verdict:
    policy_path = policy_override or (str(where / case.policy) if case.policy else None)
    if policy_path is None:
        raise InputError(str(where / CASE_FILE), "no policy: set `policy:` in the case or pass --policy", 1)
    policy = load_policy(policy_path)
    if case.diff is not None:
        changes = changes_from_diff(_read(where / case.diff), case.diff)
    else:
        commits = _read(where / case.commits) if case.commits else None
        changes = changes_from_pr_files(_read(where / case.pr_files), case.pr_files, commits, case.commits or "commits")
    pull_request = pull_request_from_json(_read(where / case.pr), case.pr) if case.pr else None
    evidence = combine_evidence([(p, load_evidence(where / p)) for p in case.evidence])
    return verdict_for(EvaluationInputs(policy, changes, pull_request, evidence, declared=case.agent_assisted))


def compare(expect: Expectation, verdict: Verdict) -> list[str]:
    """What differs between the expectation and the verdict, one line each."""
    problems = []
    if verdict.verdict != expect.verdict:
        problems.append(f"verdict: expected {expect.verdict}, got {verdict.verdict}")
    statuses = {c.id: c for c in verdict.checks}
    for check_id, wanted in expect.checks.items():
        got = statuses[check_id]
        if got.status.value != wanted:
            problems.append(f"{check_id}: expected {wanted}, got {got.status.value}: {got.summary}")
    if expect.packages is not None and tuple(sorted(expect.packages)) != tuple(sorted(verdict.packages)):
        problems.append(f"packages: expected {', '.join(expect.packages) or 'none'}, "
                        f"got {', '.join(verdict.packages) or 'none'}")
    radii = {r.package: r.change for r in verdict.blast_radius}
    for package, wanted in expect.blast_radius.items():
        if radii.get(package) != wanted:
            problems.append(f"blast radius of {package}: expected {wanted}, got {radii.get(package, 'none')}")
    return problems


def _shadow_note(verdict: Verdict) -> str:
    would = [c.id for c in verdict.checks if c.shadow and c.status is Status.failed]
    return f" (shadow: {', '.join(would)} would have failed)" if would else ""


def _read(path: Path) -> str:
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return handle.read()
    except UnicodeDecodeError as exc:
        raise InputError(str(path), f"not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read: {exc.strerror or exc}") from None

