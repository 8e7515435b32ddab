"""Review one pull request in three stages: read every input pinned to one head (`inputs`), judge them
(`judge`, no GitHub calls), publish once (`publish`). Then only what adds to the published verdict: the
sticky comment, and a deadline job while the check waits for CI's evidence.

The policy comes from the PR's base commit, never from the head it judges; the PR's code is only ever read
as text. Work is skipped when the same (repo, PR, head SHA, policy hash, other inputs incl. the files) was
already judged.
"""

from __future__ import annotations

import json
import logging

from gatekeeper.github.checkrun import NO_POLICY_NAME, error_report
from gatekeeper.github.client import Installation
from gatekeeper.github.context import AppContext, Progress
from gatekeeper.github.failures import describe
from gatekeeper.github.inputs import ReviewInputs, read_inputs
from gatekeeper.github.judge import STICKY_MARKER, Judgement, failed_judgement, judge
from gatekeeper.github.pages import page_url
from gatekeeper.github.publish import publish
from gatekeeper.github.records import EvaluationKey
from gatekeeper.verdict import Verdict

log = logging.getLogger(__name__)

DEADLINE_EVENT = "gatekeeper_deadline"  # synthetic: judge a waiting head again once its evidence wait is over


def review_pull_request(ctx: AppContext, installation_id: int, repo: str, number: int, progress: Progress, *,
                        force: bool = False, delivery_id: str | None = None, head_sha: str | None = None) -> str:
    """Judge the PR as it is now and publish its check run. Returns a short outcome for the delivery log.
    `head_sha`: judge only while the PR is still at this head (a deadline job for a head since replaced)."""
    progress.installation_id, progress.repo, progress.pr = installation_id, repo, number
    with ctx.pr_locks.hold((repo, number)):
        return _review(ctx, ctx.github.installation(installation_id), repo, number, progress, force, delivery_id,
                       head_sha)


def _review(ctx: AppContext, gh: Installation, repo: str, number: int, progress: Progress, force: bool,
            delivery_id: str | None, expected_head: str | None) -> str:
    inputs = read_inputs(ctx.config, ctx.records, gh, repo, number, progress)
    if isinstance(inputs, str):
        return inputs
    if expected_head is not None and inputs.head_sha != expected_head:
        return f"skipped: PR #{number} has moved on from {expected_head[:12]}"
    key = inputs.key
    if not force and ctx.records.evaluation_done(key):
        return "duplicate: already evaluated"
    page_id = ctx.pages.reserve(key) if ctx.config.public_url and inputs.policy is not None else None
    try:
        judgement = judge(ctx.config, inputs, lambda sha: gh.blob(repo, sha),
                          page_url(ctx.config.public_url, page_id) if page_id else None)
    except Exception as exc:  # noqa: BLE001 - an error while judging fails the check, with its reason
        log.exception("%s#%s@%s: judging failed", repo, number, inputs.head_sha[:12])
        judgement = failed_judgement(progress.check_name or NO_POLICY_NAME, error_report(describe(exc)), inputs.policy)
    check_run_id, outcome = publish(ctx, gh, key, judgement.name, judgement.report, delivery_id=delivery_id,
                                    evidence_sha256=inputs.evidence.sha256 if inputs.evidence else None,
                                    rules=judgement.rules)
    progress.check_run_id, progress.published = check_run_id, True
    # The page shows what was published: nothing when a stronger verdict was kept (check_run_id is None).
    page = page_id if check_run_id is not None and judgement.verdict is not None else None
    return "; ".join([outcome, *_after_publish(ctx, gh, inputs, judgement, progress, delivery_id, page)])


def _after_publish(ctx: AppContext, gh: Installation, inputs: ReviewInputs, judgement: Judgement,
                   progress: Progress, delivery_id: str | None, page_id: str | None) -> list[str]:
    """Steps that only add to a published verdict. Their failures are audited and said in the outcome; they
    never reach the worker, whose failure report would otherwise replace the verdict."""
    notes = []
    if page_id is not None and judgement.verdict is not None:
        try:
            ctx.pages.store(page_id, page_json(judgement.verdict, inputs))
        except Exception as exc:  # noqa: BLE001 - see the docstring
            notes.append(_after_publish_failed(ctx, inputs, delivery_id, f"the details page could not be stored: "
                                                                          f"{describe(exc)}"))
    if judgement.wait_until is not None:
        payload = json.dumps({"installation_id": progress.installation_id, "repo": inputs.repo,
                              "pr": inputs.number, "head_sha": inputs.head_sha}).encode()
        ctx.queue.enqueue(f"deadline:{inputs.repo}#{inputs.number}@{inputs.head_sha}", DEADLINE_EVENT, None,
                          payload, available_at=judgement.wait_until)
    if ctx.config.sticky_comment and judgement.comment is not None:
        try:
            comment_id = gh.upsert_comment(inputs.repo, inputs.number,
                                           ctx.records.sticky_comment_id(inputs.repo, inputs.number),
                                           judgement.comment, STICKY_MARKER)
            ctx.records.remember_sticky_comment(inputs.repo, inputs.number, comment_id)
        except Exception as exc:  # noqa: BLE001 - see the docstring
            notes.append(_after_publish_failed(ctx, inputs, delivery_id,
                                               f"the sticky comment could not be written: {describe(exc)}"))
    return notes


def page_json(verdict: Verdict, inputs: ReviewInputs) -> str:
    """What the details page shows: the verdict, and what the App added to it on the check run (an override, CI's
    evidence counted as self-reported), under keys the verdict does not have."""
    data = verdict.model_dump(mode="json")
    if inputs.override is not None:
        data["override"] = {"actor": inputs.override.actor, "reason": inputs.override.reason,
                            "head_sha": inputs.override.head_sha}
    if inputs.evidence_untrusted is not None:
        data["evidence_untrusted"] = inputs.evidence_untrusted
    return json.dumps(data)


def _after_publish_failed(ctx: AppContext, inputs: ReviewInputs, delivery_id: str | None, reason: str) -> str:
    ctx.records.audit("error", inputs.repo, inputs.number, inputs.head_sha, reason=reason, delivery_id=delivery_id)
    log.warning("%s#%s: %s", inputs.repo, inputs.number, reason)
    return reason


def report_error(ctx: AppContext, progress: Progress, reason: str) -> bool:
    """After a permanent failure: fail the head's check with the reason ("Could not evaluate"), unless this
    job already published its verdict, which a later failure may only add to. Returns whether a check run
    was written (False: only the delivery log and the audit log say why)."""
    if progress.published or progress.installation_id is None or progress.repo is None or progress.head_sha is None:
        return False
    gh = ctx.github.installation(progress.installation_id)
    key = EvaluationKey(progress.repo, progress.pr or 0, progress.head_sha, "", "error")
    publish(ctx, gh, key, progress.check_name or NO_POLICY_NAME, error_report(reason), delivery_id=None,
            evidence_sha256=None)
    return True
