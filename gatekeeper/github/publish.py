"""The last stage of a review: put one report on GitHub, once per head and check name.

- Idempotent: the run carries an `external_id` derived from the PR, head and check name, looked up before
  a run is created, so a retried job finds its run instead of making a second one.
- Nothing left behind: every other run of ours with the same name on the head that is still open or says
  something else (a duplicate from a POST whose answer was lost and retried, a run from before external
  ids) gets the same report, so no stale run can block or pass the PR on its own.
- Never weaker: a report for an evaluation whose outcome is already published is written only if it claims
  at least as much against merging (`checkrun.STRENGTH`).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace

from gatekeeper.github.checkrun import STRENGTH, CheckRunReport
from gatekeeper.github.client import Installation
from gatekeeper.github.context import AppContext
from gatekeeper.github.records import EvaluationKey

log = logging.getLogger(__name__)


def external_id(repo: str, pr: int, head_sha: str, name: str) -> str:
    return "gatekeeper:" + hashlib.sha256(f"{repo}#{pr}@{head_sha}/{name}".encode()).hexdigest()[:32]


def publish(ctx: AppContext, gh: Installation, key: EvaluationKey, name: str, report: CheckRunReport, *,
            delivery_id: str | None, evidence_sha256: str | None) -> tuple[int | None, str]:
    """Write the report; returns the check run's id (None if nothing was written) and the outcome line."""
    published = ctx.records.decision_for(key) if key.policy_sha256 else None
    if published is not None and STRENGTH[report.outcome] < STRENGTH[published]:
        ctx.records.audit("kept", key.repo, key.pr, key.head_sha, conclusion=published, delivery_id=delivery_id,
                        reason=f"not replaced by the weaker {report.outcome}: {report.title}")
        return None, f"kept {published}: a weaker {report.outcome} does not replace a published verdict"
    ident = external_id(key.repo, key.pr, key.head_sha, name)
    runs = gh.our_check_runs(key.repo, key.head_sha, ctx.config.app_id, name)
    target = min((r["id"] for r in runs if r.get("external_id") == ident), default=None)
    if target is None:
        target = gh.create_check_run(key.repo, key.head_sha, name, ident)
        runs = gh.our_check_runs(key.repo, key.head_sha, ctx.config.app_id, name)  # a retried POST made two?
    _write(gh, key.repo, target, ident, report)
    ctx.records.remember_check_run(key.repo, key.head_sha, name, target)
    for run in runs:
        if run["id"] != target and (run["status"] != "completed" or run.get("conclusion") != report.conclusion):
            log.warning("%s@%s: completing stale check run %s (%s %s) like run %s", key.repo, key.head_sha[:12],
                        run["id"], run["status"], run.get("conclusion"), target)
            stale = replace(report, title=f"Superseded by run {target}: {report.title}"[:200], annotations=())
            _write(gh, key.repo, run["id"], run.get("external_id") or ident, stale)
    ctx.records.record_decision(key, target, report.outcome, evidence_sha256, delivery_id, report.title)
    log.info("%s#%s@%s: %s (%s)", key.repo, key.pr, key.head_sha[:12], report.outcome, report.title)
    return target, f"{report.outcome}: {report.title}"


def _write(gh: Installation, repo: str, check_run_id: int, ident: str, report: CheckRunReport) -> None:
    gh.write_check_run(repo, check_run_id, status=report.status, conclusion=report.conclusion, title=report.title,
                       summary=report.summary, details_url=report.details_url, external_id=ident,
                       annotation_batches=report.annotation_batches())
