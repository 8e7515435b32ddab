"""The last stage of a review: put one report on GitHub, once per head and check name (and, with the policy's
`app.check_runs: per_rule`, one per rule beside it).

- Idempotent: each run carries an `external_id` derived from the PR, head and check name, looked up before
  a run is created, so a retried job finds its run instead of making a second one.
- Nothing left behind: every other run of ours with the same name on the head that is still open or says
  something else (a duplicate from a POST whose answer was lost and retried, a run from before external
  ids) gets the same report, so no stale run can block or pass the PR on its own. So does every rule run of the
  check (`<name> / <rule>`) that this publication does not write (the policy went back to one run or disabled the
  rule; an error, which has no rule reports): it gets the overall report, so no rule run passes on its own what
  was not judged.
- Never weaker: a report for an evaluation whose outcome is already published is written only if it claims
  at least as much against merging (`checkrun.STRENGTH`). The rule runs are written with the overall run or not
  at all: an evaluation's rule reports are a function of its verdict, as the overall report is, so they cannot
  get weaker while it does not.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from gatekeeper.github.checkrun import STRENGTH, CheckRunReport
from gatekeeper.github.client import Installation
from gatekeeper.github.context import AppContext
from gatekeeper.github.records import EvaluationKey

log = logging.getLogger(__name__)


def external_id(repo: str, pr: int, head_sha: str, name: str) -> str:
    return "gatekeeper:" + hashlib.sha256(f"{repo}#{pr}@{head_sha}/{name}".encode()).hexdigest()[:32]


def publish(ctx: AppContext, gh: Installation, key: EvaluationKey, name: str, report: CheckRunReport, *,
            delivery_id: str | None, evidence_sha256: str | None,
            rules: Sequence[tuple[str, CheckRunReport]] = ()) -> tuple[int | None, str]:
    """Write the report, and the rules' reports beside it; returns the overall check run's id (None if nothing
    was written) and the outcome line."""
    published = ctx.records.decision_for(key) if key.policy_sha256 else None
    if published is not None and STRENGTH[report.outcome] < STRENGTH[published]:
        ctx.records.audit("kept", key.repo, key.pr, key.head_sha, conclusion=published, delivery_id=delivery_id,
                        reason=f"not replaced by the weaker {report.outcome}: {report.title}")
        return None, f"kept {published}: a weaker {report.outcome} does not replace a published verdict"
    # All our runs on the head in one listing: the overall run's, the rules', and rule runs left from before.
    runs = gh.our_check_runs(key.repo, key.head_sha, ctx.config.app_id)
    target = _put(ctx, gh, key, name, report, runs)
    written = {name}
    for rule_name, rule_report in rules:
        _put(ctx, gh, key, rule_name, rule_report, runs)
        written.add(rule_name)
    leftover = replace(report, title=f"Not a rule run of this evaluation: {report.title}"[:200], annotations=())
    for run in runs:
        if run["name"].startswith(name + " / ") and run["name"] not in written and _differs(run, report):
            log.warning("%s@%s: completing rule run %s (%s) like run %s", key.repo, key.head_sha[:12], run["id"],
                        run["name"], target)
            _write(gh, key.repo, run["id"], run.get("external_id") or external_id(key.repo, key.pr, key.head_sha,
                                                                                 run["name"]), leftover)
    ctx.records.record_decision(key, target, report.outcome, evidence_sha256, delivery_id, report.title)
    log.info("%s#%s@%s: %s (%s)", key.repo, key.pr, key.head_sha[:12], report.outcome, report.title)
    return target, f"{report.outcome}: {report.title}"


def _put(ctx: AppContext, gh: Installation, key: EvaluationKey, name: str, report: CheckRunReport,
         runs: list[dict[str, Any]]) -> int:
    """The report on the run of this name with our external id (created if there is none), and on every other
    run of ours of this name that says something else; returns the run's id."""
    ident = external_id(key.repo, key.pr, key.head_sha, name)
    same = [run for run in runs if run["name"] == name]
    target = min((run["id"] for run in same if run.get("external_id") == ident), default=None)
    if target is None:
        target = gh.create_check_run(key.repo, key.head_sha, name, ident)
        same = gh.our_check_runs(key.repo, key.head_sha, ctx.config.app_id, name)  # a retried POST made two?
    _write(gh, key.repo, target, ident, report)
    ctx.records.remember_check_run(key.repo, key.head_sha, name, target)
    for run in same:
        if run["id"] != target and _differs(run, report):
            log.warning("%s@%s: completing stale check run %s (%s %s) like run %s", key.repo, key.head_sha[:12],
                        run["id"], run["status"], run.get("conclusion"), target)
            stale = replace(report, title=f"Superseded by run {target}: {report.title}"[:200], annotations=())
            _write(gh, key.repo, run["id"], run.get("external_id") or ident, stale)
    return target


def _differs(run: dict[str, Any], report: CheckRunReport) -> bool:
    return run["status"] != "completed" or run.get("conclusion") != report.conclusion


def _write(gh: Installation, repo: str, check_run_id: int, ident: str, report: CheckRunReport) -> None:
    gh.write_check_run(repo, check_run_id, status=report.status, conclusion=report.conclusion, title=report.title,
                       summary=report.summary, details_url=report.details_url, external_id=ident,
                       annotation_batches=report.annotation_batches())
