"""Evaluate one pull request and report it: the App's equivalent of `gatekeeper check`.

The policy comes from the PR's base commit, never from the head it judges; the PR's code is only ever read
as text. Work is skipped when the same (repo, PR, head SHA, policy hash, other inputs) was already judged.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable

from gatekeeper.errors import InputError
from gatekeeper.evaluate import evaluate
from gatekeeper.evidence import parse_evidence
from gatekeeper.github.checkrun import (
    NO_POLICY_NAME,
    CheckRunReport,
    check_run_name,
    too_many_files_report,
    undecided_report,
    verdict_report,
)
from gatekeeper.github.client import Installation
from gatekeeper.github.context import AppContext, Progress
from gatekeeper.github.store import EvaluationKey
from gatekeeper.policy import load_policy_text
from gatekeeper.provenance import detect
from gatekeeper.report.markdown import render_markdown
from gatekeeper.sources.github import changes_from_pr_file_entries, pull_request_from_json

log = logging.getLogger(__name__)

STICKY_MARKER = "<!-- gatekeeper:sticky-comment -->"


class HeadSnapshot:
    """The repository at the PR head, read through the contents API on demand (text only, never run)."""

    def __init__(self, gh: Installation, repo: str, head_sha: str):
        self._gh, self._repo, self._sha = gh, repo, head_sha
        self._texts: dict[str, str | None] = {}
        self._paths: list[str] | None = None

    def read(self, path: str) -> str | None:
        if path not in self._texts:
            try:
                self._texts[path] = self._gh.file_text(self._repo, path, self._sha)
            except UnicodeDecodeError:
                self._texts[path] = None
        return self._texts[path]

    def paths(self) -> Iterable[str]:
        if self._paths is None:
            self._paths = self._gh.tree_paths(self._repo, self._sha)
        return self._paths


def review_pull_request(ctx: AppContext, installation_id: int, repo: str, number: int, progress: Progress, *,
                        force: bool = False, delivery_id: str | None = None) -> str:
    """Judge the PR as it is now and complete its check run. Returns a short outcome for the delivery log."""
    progress.installation_id, progress.repo, progress.pr = installation_id, repo, number
    with ctx.pr_locks.hold((repo, number)):
        return _review(ctx, ctx.github.installation(installation_id), repo, number, progress, force, delivery_id)


def _review(ctx: AppContext, gh: Installation, repo: str, number: int, progress: Progress, force: bool,
            delivery_id: str | None) -> str:
    pr = gh.pull_request(repo, number)
    head_sha, base_sha = pr["head"]["sha"], pr["base"]["sha"]
    progress.head_sha = head_sha
    if pr.get("state") != "open":
        return f"skipped: PR #{number} is {pr.get('state')}"

    policy_source = f"{repo}@{base_sha}:{ctx.config.policy_path}"
    policy_text = gh.file_text(repo, ctx.config.policy_path, base_sha)
    stored = ctx.store.evidence_for(repo, head_sha)
    inputs = _inputs_digest(pr, stored.sha256 if stored else None)
    if policy_text is None:
        key = EvaluationKey(repo, number, head_sha, "", inputs)
        report = undecided_report(f"No policy file `{ctx.config.policy_path}` on the base branch "
                                  f"(`{pr['base']['ref']}` at `{base_sha[:12]}`). Add one to enable the gatekeeper.",
                                  title="No gatekeeper policy on the base branch")
        return _publish(ctx, gh, key, NO_POLICY_NAME, report, progress, force, None, delivery_id)
    try:
        loaded = load_policy_text(policy_text, policy_source)
    except InputError as exc:
        key = EvaluationKey(repo, number, head_sha, hashlib.sha256(policy_text.encode()).hexdigest(), inputs)
        report = undecided_report(f"The policy on the base branch is invalid:\n\n`{exc}`",
                                  title="Invalid gatekeeper policy on the base branch")
        return _publish(ctx, gh, key, NO_POLICY_NAME, report, progress, force, None, delivery_id)

    key = EvaluationKey(repo, number, head_sha, loaded.sha256, inputs)
    name = check_run_name(loaded.policy.name)
    progress.check_name = name
    if not force and ctx.store.evaluation_done(key):
        return "duplicate: already evaluated"
    check_run_id = _start(ctx, gh, repo, head_sha, name, progress)

    limit = loaded.policy.max_files
    if pr.get("changed_files", 0) > limit:
        return _publish(ctx, gh, key, name, too_many_files_report(pr["changed_files"], limit), progress, True,
                        None, delivery_id, check_run_id)
    entries = gh.pull_request_files(repo, number, limit)
    if len(entries) > limit:
        return _publish(ctx, gh, key, name, too_many_files_report(len(entries), limit), progress, True, None,
                        delivery_id, check_run_id)
    commits = gh.pull_request_commits(repo, number)
    changes = changes_from_pr_file_entries(entries, commits).model_copy(
        update={"base_sha": base_sha, "head_sha": head_sha})  # the perf check's commit window needs them
    info = pull_request_from_json(json.dumps(pr), f"{repo}#{number}")
    provenance = detect(loaded.policy.agent_detection, changes.commits, info)
    evidence = parse_evidence(stored.document, f"{repo}@{head_sha}: evidence artifact") if stored else None
    verdict = evaluate(loaded, changes, provenance, evidence, snapshot=HeadSnapshot(gh, repo, head_sha),
                       pull_request=info)
    override = ctx.store.override_for(repo, number, head_sha)
    report = verdict_report(verdict, render_markdown(verdict), override)
    outcome = _publish(ctx, gh, key, name, report, progress, True, stored.sha256 if stored else None,
                       delivery_id, check_run_id)
    if ctx.config.sticky_comment:
        body = STICKY_MARKER + "\n" + render_markdown(verdict, template="pr_comment",
                                                      max_chars=65535 - len(STICKY_MARKER) - 1)
        comment_id = gh.upsert_comment(repo, number, ctx.store.sticky_comment_id(repo, number), body, STICKY_MARKER)
        ctx.store.remember_sticky_comment(repo, number, comment_id)
    return outcome


def _inputs_digest(pr: dict, evidence_sha256: str | None) -> str:
    """Everything besides head and policy that can change the verdict: an `edited` or `labeled` event that
    changes none of it does no work, one that changes the disclosure or labels is judged again."""
    relevant = {
        "base": pr["base"]["sha"],
        "title": pr.get("title") or "",
        "body": pr.get("body") or "",
        "labels": sorted(label["name"] for label in pr.get("labels") or []),
        "author": (pr.get("user") or {}).get("login"),
        "evidence": evidence_sha256,
    }
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"))  # same inputs, same digest
    return hashlib.sha256(canonical.encode()).hexdigest()


def _start(ctx: AppContext, gh: Installation, repo: str, head_sha: str, name: str, progress: Progress) -> int:
    """The one check run for this head and name: remembered, else found on GitHub (a crash can lose the
    id between creating it and storing it), else created."""
    known = ctx.store.check_run_id(repo, head_sha, name)
    if known is None:
        known = gh.find_check_run(repo, head_sha, name, ctx.config.app_id)
    check_run_id = gh.start_check_run(repo, head_sha, name, known)
    if check_run_id != known or ctx.store.check_run_id(repo, head_sha, name) is None:
        ctx.store.remember_check_run(repo, head_sha, name, check_run_id)
    progress.check_run_id = check_run_id
    return check_run_id


def _publish(ctx: AppContext, gh: Installation, key: EvaluationKey, name: str, report: CheckRunReport,
             progress: Progress, force: bool, evidence_sha256: str | None, delivery_id: str | None,
             check_run_id: int | None = None) -> str:
    if not force and ctx.store.evaluation_done(key):
        return "duplicate: already evaluated"
    progress.check_name = name
    if check_run_id is None:
        check_run_id = _start(ctx, gh, key.repo, key.head_sha, name, progress)
    gh.complete_check_run(key.repo, check_run_id, report.conclusion, report.title, report.summary,
                          report.annotation_batches())
    ctx.store.record_decision(key, check_run_id, report.conclusion, evidence_sha256, delivery_id, report.title)
    log.info("%s#%s@%s: %s (%s)", key.repo, key.pr, key.head_sha[:12], report.conclusion, report.title)
    return f"{report.conclusion}: {report.title}"


def report_undecided(ctx: AppContext, progress: Progress, reason: str) -> bool:
    """After a permanent failure: put a neutral check with the reason on the head, if we know which.
    Returns False when nothing could be reported (then only the delivery log and audit say why)."""
    if progress.installation_id is None or progress.repo is None or progress.head_sha is None:
        return False
    gh = ctx.github.installation(progress.installation_id)
    name = progress.check_name or NO_POLICY_NAME
    report = undecided_report(f"The gatekeeper could not evaluate this pull request: {reason}\n\n"
                              "Use the Re-run button once the cause is fixed.")
    check_run_id = progress.check_run_id
    if check_run_id is None:
        check_run_id = _start(ctx, gh, progress.repo, progress.head_sha, name, progress)
    gh.complete_check_run(progress.repo, check_run_id, report.conclusion, report.title, report.summary, [])
    return True
