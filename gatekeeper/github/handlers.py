"""What each queued delivery does. One small handler per event, in the style of a router: the handlers
decide which pull requests to review; `review.py` does the reviewing."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable

from gatekeeper.errors import InputError
from gatekeeper.evidence import MAX_EVIDENCE_BYTES, parse_evidence
from gatekeeper.github.checkrun import NAME_PREFIX
from gatekeeper.github.context import AppContext, Progress
from gatekeeper.github.events import (
    EVENT_MODELS,
    CheckRunEvent,
    CheckSuiteEvent,
    InstallationEvent,
    IssueCommentEvent,
    PullRequestEvent,
    PullRequestRef,
    WorkflowRunEvent,
    installation_id,
)
from gatekeeper.github.overrides import may_override, parse_override
from gatekeeper.github.review import review_pull_request
from gatekeeper.github.store import Job

SWEEP_EVENT = "gatekeeper_sweep"  # synthetic deliveries queued by the reconciliation sweep
EVIDENCE_FILE = "evidence.json"  # inside the evidence artifact's zip


def handle(ctx: AppContext, job: Job, progress: Progress) -> str:
    """Run one delivery; returns a short outcome. Raises on failure (the worker decides about retries)."""
    if job.event == SWEEP_EVENT:
        data = json.loads(job.payload)
        return review_pull_request(ctx, data["installation_id"], data["repo"], data["pr"], progress,
                                   delivery_id=job.delivery_id)
    event = EVENT_MODELS[job.event].model_validate_json(job.payload)
    return HANDLERS[job.event](ctx, event, job, progress)


def _pull_request(ctx: AppContext, event: PullRequestEvent, job: Job, progress: Progress) -> str:
    return review_pull_request(ctx, installation_id(event), event.repository.full_name, event.number, progress,
                               delivery_id=job.delivery_id)


def _check_run(ctx: AppContext, event: CheckRunEvent, job: Job, progress: Progress) -> str:
    run = event.check_run
    ours = (run.app is None or run.app.id == ctx.config.app_id) and run.name.startswith(NAME_PREFIX)
    if not ours:
        return f"ignored: check run {run.name!r} is not the gatekeeper's"
    if event.action == "requested_action" and (event.requested_action is None
                                               or event.requested_action.identifier != "rerun"):
        return "ignored: unknown requested action"
    return _rerun(ctx, event, run.head_sha, run.pull_requests, job, progress)


def _check_suite(ctx: AppContext, event: CheckSuiteEvent, job: Job, progress: Progress) -> str:
    return _rerun(ctx, event, event.check_suite.head_sha, event.check_suite.pull_requests, job, progress)


def _rerun(ctx: AppContext, event, head_sha: str, prs: tuple[PullRequestRef, ...], job: Job,
           progress: Progress) -> str:
    """A re-run request: judge again even if nothing changed (the person asked for it)."""
    numbers = _pull_numbers(ctx, event, head_sha, prs)
    if not numbers:
        return f"ignored: no open pull request has head {head_sha[:12]}"
    outcomes = [review_pull_request(ctx, installation_id(event), event.repository.full_name, n, progress,
                                    force=True, delivery_id=job.delivery_id) for n in numbers]
    return "; ".join(outcomes)


def _pull_numbers(ctx: AppContext, event, head_sha: str, prs: tuple[PullRequestRef, ...]) -> list[int]:
    # GitHub leaves `pull_requests` empty for PRs from forks: find them by head SHA instead.
    if prs:
        return sorted({p.number for p in prs})
    gh = ctx.github.installation(installation_id(event))
    return sorted(n for n, sha in gh.open_pull_requests(event.repository.full_name) if sha == head_sha)


def _workflow_run(ctx: AppContext, event: WorkflowRunEvent, job: Job, progress: Progress) -> str:
    """CI finished: pick up the evidence artifact of the gatekeeper action, then judge its PRs again."""
    run, repo = event.workflow_run, event.repository.full_name
    if run.path not in ctx.config.evidence_workflows:
        return f"ignored: workflow {run.path!r} is not an evidence workflow"
    gh = ctx.github.installation(installation_id(event))
    archive = gh.evidence_artifact(repo, run.id, ctx.config.evidence_artifact)
    if archive is None:
        return f"ignored: workflow run {run.id} has no {ctx.config.evidence_artifact!r} artifact"
    source = f"{repo} workflow run {run.id}, artifact {ctx.config.evidence_artifact}/{EVIDENCE_FILE}"
    try:
        document = _evidence_document(archive, source)
        parse_evidence(document, source)  # validate before storing: bad evidence never reaches a review
    except InputError as exc:
        ctx.store.audit("error", repo, None, run.head_sha, reason=str(exc), delivery_id=job.delivery_id)
        return f"rejected evidence: {exc}"
    ctx.store.put_evidence(repo, run.head_sha, hashlib.sha256(document.encode()).hexdigest(), document, run.id)
    numbers = _pull_numbers(ctx, event, run.head_sha, run.pull_requests)
    outcomes = [review_pull_request(ctx, installation_id(event), repo, n, progress, delivery_id=job.delivery_id)
                for n in numbers]
    return "; ".join(["evidence stored", *outcomes])


def _evidence_document(archive: bytes, source: str) -> str:
    try:
        with zipfile.ZipFile(io.BytesIO(archive)) as zf:
            info = zf.getinfo(EVIDENCE_FILE)
            if info.file_size > MAX_EVIDENCE_BYTES:  # checked before inflating: a zip bomb stays packed
                raise InputError(source, f"{info.file_size} bytes, more than the {MAX_EVIDENCE_BYTES}-byte limit")
            return zf.read(info).decode("utf-8")
    except KeyError:
        raise InputError(source, f"the artifact has no {EVIDENCE_FILE}") from None
    except (zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise InputError(source, f"unreadable artifact: {exc}") from None


def _issue_comment(ctx: AppContext, event: IssueCommentEvent, job: Job, progress: Progress) -> str:
    if event.issue.pull_request is None:
        return "ignored: comment on an issue, not a pull request"
    request = parse_override(event.comment.body)
    if request is None:
        return "ignored: no gatekeeper command"
    repo, number, actor = event.repository.full_name, event.issue.number, event.comment.user.login
    gh = ctx.github.installation(installation_id(event))
    progress.installation_id, progress.repo, progress.pr = installation_id(event), repo, number
    head_sha = gh.pull_request(repo, number)["head"]["sha"]
    if not request.valid:
        ctx.store.audit("override_refused", repo, number, head_sha, actor=actor,
                        reason="no reason given: use `/gatekeeper override <reason>`", delivery_id=job.delivery_id)
        return "refused override: no reason given"
    permission = gh.collaborator_permission(repo, actor)
    if not may_override(permission):
        ctx.store.audit("override_refused", repo, number, head_sha, actor=actor,
                        reason=f"permission {permission!r} is below write: {request.reason}",
                        delivery_id=job.delivery_id)
        return f"refused override by @{actor}: permission {permission}"
    # The override holds for this head only: a new push is a new change and is judged afresh.
    ctx.store.add_override(repo, number, head_sha, actor, request.reason, job.delivery_id)
    return review_pull_request(ctx, installation_id(event), repo, number, progress, force=True,
                               delivery_id=job.delivery_id)


def _installation(ctx: AppContext, event: InstallationEvent, job: Job, progress: Progress) -> str:
    active = event.action not in ("deleted", "suspend", "removed")
    if job.event == "installation_repositories":
        active = True  # repositories came or went; the installation itself is still there
    account = event.installation.account.login if event.installation.account else None
    ctx.store.set_installation(event.installation.id, account, active)
    return f"installation {event.installation.id} {event.action}"


HANDLERS: dict[str, Callable[[AppContext, object, Job, Progress], str]] = {
    "pull_request": _pull_request,
    "check_run": _check_run,
    "check_suite": _check_suite,
    "workflow_run": _workflow_run,
    "issue_comment": _issue_comment,
    "installation": _installation,
    "installation_repositories": _installation,
}
