"""What each queued delivery does. One small handler per event, in the style of a router: the handlers
decide which pull requests to review; `review.py` does the reviewing."""

from __future__ import annotations

import hashlib
import io
import json
import re
import zipfile
from collections.abc import Callable

from gatekeeper.errors import InputError
from gatekeeper.evidence import MAX_EVIDENCE_BYTES, parse_evidence
from gatekeeper.github.checkrun import (
    NAME_PREFIX,
    NO_POLICY_NAME,
    CheckRunReport,
    check_run_name,
    error_report,
    rule_run_name,
    truncate,
)
from gatekeeper.github.context import AppContext, Progress
from gatekeeper.github.failures import describe
from gatekeeper.github.events import (
    EVENT_MODELS,
    CheckRunEvent,
    CheckSuiteEvent,
    InstallationEvent,
    IssueCommentEvent,
    MergeGroupEvent,
    PullRequestEvent,
    PullRequestRef,
    WorkflowRunEvent,
    installation_id,
)
from gatekeeper.github.inputs import read_base_policy
from gatekeeper.github.overrides import OverrideRequest, may_override, parse_override
from gatekeeper.github.publish import publish
from gatekeeper.github.review import DEADLINE_EVENT, review_pull_request
from gatekeeper.github.queue import Job
from gatekeeper.github.records import EvaluationKey

SWEEP_EVENT = "gatekeeper_sweep"  # synthetic deliveries queued by the reconciliation sweep
EVIDENCE_FILE = "evidence.json"  # inside the evidence artifact's zip


def handle(ctx: AppContext, job: Job, progress: Progress) -> str:
    """Run one delivery; returns a short outcome. Raises on failure (the worker decides about retries)."""
    if job.event == SWEEP_EVENT:
        data = json.loads(job.payload)
        return review_pull_request(ctx, data["installation_id"], data["repo"], data["pr"], progress,
                                   delivery_id=job.delivery_id)
    if job.event == DEADLINE_EVENT:  # the head's evidence wait is over: judge it again, if it is still the head
        data = json.loads(job.payload)
        return review_pull_request(ctx, data["installation_id"], data["repo"], data["pr"], progress, force=True,
                                   delivery_id=job.delivery_id, head_sha=data["head_sha"])
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
        ctx.records.audit("error", repo, None, run.head_sha, reason=str(exc), delivery_id=job.delivery_id)
        return f"rejected evidence: {exc}"
    ctx.records.put_evidence(repo, run.head_sha, hashlib.sha256(document.encode()).hexdigest(), document, run.id,
                           run.path)
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
    pr = gh.pull_request(repo, number)
    head_sha = pr["head"]["sha"]
    refusal = request.problem or _override_refusal(ctx, gh, repo, pr, actor, request)
    if refusal is not None:
        ctx.records.audit("override_refused", repo, number, head_sha, actor=actor,
                        reason=f"{refusal} ({request.reason or 'no reason'})", delivery_id=job.delivery_id)
        _reply(ctx, gh, repo, number, head_sha, job,
               f"@{actor} the gatekeeper override was refused: {refusal}.")
        return f"refused override by @{actor}: {refusal}"
    # The override holds for this head only: a new push is a new change and is judged afresh.
    ctx.records.add_override(repo, number, head_sha, actor, request.reason, job.delivery_id)
    return review_pull_request(ctx, installation_id(event), repo, number, progress, force=True,
                               delivery_id=job.delivery_id, head_sha=head_sha)


def _override_refusal(ctx: AppContext, gh, repo: str, pr: dict, actor: str, request: OverrideRequest) -> str | None:
    head_sha = pr["head"]["sha"]
    if not request.approves(head_sha):
        return (f"it names head `{request.head_prefix}`, but the head is now `{head_sha[:12]}`; an override approves "
                f"only the head its author reviewed, so comment again naming `{head_sha[:12]}` once you have")
    permission = gh.collaborator_permission(repo, actor)
    if not may_override(permission):
        return f"@{actor}'s permission on {repo} is `{permission}`; an override needs write, maintain or admin"
    if actor == (pr.get("user") or {}).get("login") and not _policy_allows_author_override(ctx, gh, repo, pr):
        return "the pull request's author may not override its gatekeeper check (policy `app.allow_author_override`)"
    return None


def _policy_allows_author_override(ctx: AppContext, gh, repo: str, pr: dict) -> bool:
    """The base commit's policy decides; a missing or invalid policy allows nothing."""
    loaded, _ = read_base_policy(ctx.config, gh, repo, pr["base"]["sha"], "on the base branch")
    return loaded is not None and loaded.policy.app.allow_author_override


def _reply(ctx: AppContext, gh, repo: str, number: int, head_sha: str, job: Job, body: str) -> None:
    """A reply only adds: if GitHub refuses it (e.g. the App may not comment), the refusal stays audited."""
    try:
        gh.reply(repo, number, body)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        ctx.records.audit("error", repo, number, head_sha, reason=f"the reply could not be posted: {describe(exc)}",
                        delivery_id=job.delivery_id)


# A merge queue's temporary branch names the pull request and the PR head it merges.
_QUEUE_REF = re.compile(r"^(?:refs/heads/)?gh-readonly-queue/.+/pr-(?P<number>\d+)-(?P<head>[0-9a-f]{40})$")


def _merge_group(ctx: AppContext, event: MergeGroupEvent, job: Job, progress: Progress) -> str:
    """A merge group carries the verdict of the pull request it merges: success only if the gatekeeper
    published success (or an override) for exactly that PR head, and the group changes no file that PR
    does not. The group's own check run has the required check's name, so the queue can wait for it. With the
    policy's `app.check_runs: per_rule`, each rule's run on the group likewise carries that rule's run on the PR
    head: `success` only where that run concluded `success` and the group changes no other file."""
    group, repo = event.merge_group, event.repository.full_name
    gh = ctx.github.installation(installation_id(event))
    progress.installation_id, progress.repo, progress.head_sha = installation_id(event), repo, group.head_sha
    base = group.base_sha or group.base_ref
    loaded, problem = read_base_policy(ctx.config, gh, repo, base, f"at the group's base `{base}`")
    rules: list[tuple[str, CheckRunReport]] = []
    if loaded is None:
        report, name = error_report(problem, title="No valid gatekeeper policy"), NO_POLICY_NAME
    else:
        name = check_run_name(loaded.policy.name)
        progress.check_name = name
        carry = _merge_group_carrier(ctx, gh, event)
        report = carry(None)
        if loaded.policy.app.check_runs == "per_rule":
            rules = [(rule_run_name(name, rule), carry(rule_run_name(name, rule)))
                     for rule in loaded.policy.checks.enabled()]
    outcomes = ",".join(r.outcome for r in (report, *(rule for _, rule in rules)))
    key = EvaluationKey(repo, 0, group.head_sha, loaded.sha256 if loaded else "",
                        hashlib.sha256(f"{group.head_ref}:{outcomes}".encode()).hexdigest())
    _, outcome = publish(ctx, gh, key, name, report, delivery_id=job.delivery_id, evidence_sha256=None, rules=rules)
    progress.published = True
    return f"merge group {group.head_sha[:12]}: {outcome}"


def _merge_group_carrier(ctx: AppContext, gh, event: MergeGroupEvent) -> Callable[[str | None], CheckRunReport]:
    """What the group's runs say: `carry(None)` for the overall run, `carry(rule run name)` for a rule's run. The
    PR and its files are read once, whatever the number of runs."""
    group, repo = event.merge_group, event.repository.full_name
    match = _QUEUE_REF.match(group.head_ref)
    if match is None:
        report = error_report(f"the merge group's ref `{group.head_ref}` does not name a pull request and its head")
        return lambda run_name: report
    number, pr_head = int(match.group("number")), match.group("head")
    decision = ctx.records.latest_decision(repo, number, pr_head)
    if decision is None:  # not judged here yet (e.g. the App was installed after the PR was last pushed)
        review_pull_request(ctx, installation_id(event), repo, number, Progress(), delivery_id=None, head_sha=pr_head)
        decision = ctx.records.latest_decision(repo, number, pr_head)
    read: dict[str, object] = {}  # what only some runs need, read once: the PR head's runs, the group's files

    def carry(run_name: str | None) -> CheckRunReport:
        carried, what = decision, "gatekeeper check"
        if run_name is not None:  # the rule's run on the PR head, as published there
            if "runs" not in read:
                read["runs"] = gh.our_check_runs(repo, pr_head, ctx.config.app_id)
            same = [r for r in read["runs"] if r["name"] == run_name]
            carried = same[0].get("conclusion") if len(same) == 1 and same[0]["status"] == "completed" else None
            what = f"check run `{run_name}`"
        if carried != "success":
            return CheckRunReport("failure", f"PR #{number} is not passed by the gatekeeper", truncate(
                f"The merge group merges PR #{number} at `{pr_head[:12]}`, whose {what} is "
                f"`{carried or 'missing'}`. Only a PR head the gatekeeper passed may be merged.\n"))
        if "extra" not in read:
            read["extra"] = _merge_group_extra_files(gh, event, number)
        return read["extra"] or CheckRunReport("success", f"Carries PR #{number}'s verdict", truncate(
            f"The merge group merges PR #{number} at `{pr_head[:12]}`, whose {what} passed, and changes no "
            f"other file.\n"))

    return carry


def _merge_group_extra_files(gh, event: MergeGroupEvent, number: int) -> CheckRunReport | None:
    """A failure when the group changes files the PR does not (it holds another PR's changes); else None."""
    group, repo = event.merge_group, event.repository.full_name
    compared = gh.compare(repo, group.base_sha or group.base_ref, group.head_sha)
    entries = gh.pull_request_files(repo, number, 3000)
    judged = {e["filename"] for e in entries} | {e["previous_filename"] for e in entries if e.get("previous_filename")}
    extra = sorted(set(compared["files"]) - judged)
    if extra or not compared["files_complete"]:
        why = (f"it changes files PR #{number} does not: {', '.join(extra[:10])}" if extra
               else "it changes more than the 300 files GitHub can list for a comparison")
        return CheckRunReport("failure", "Merge group holds more than the judged PR", truncate(
            f"The merge group cannot carry PR #{number}'s verdict: {why}. The gatekeeper judges merge groups of "
            f"one pull request each (set the merge queue's maximum group size to 1).\n"))
    return None


def _installation(ctx: AppContext, event: InstallationEvent, job: Job, progress: Progress) -> str:
    active = event.action not in ("deleted", "suspend", "removed")
    if job.event == "installation_repositories":
        active = True  # repositories came or went; the installation itself is still there
    account = event.installation.account.login if event.installation.account else None
    ctx.records.set_installation(event.installation.id, account, active)
    return f"installation {event.installation.id} {event.action}"


HANDLERS: dict[str, Callable[[AppContext, object, Job, Progress], str]] = {
    "pull_request": _pull_request,
    "check_run": _check_run,
    "check_suite": _check_suite,
    "workflow_run": _workflow_run,
    "issue_comment": _issue_comment,
    "installation": _installation,
    "installation_repositories": _installation,
    "merge_group": _merge_group,
}
