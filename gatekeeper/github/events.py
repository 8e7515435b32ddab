"""The webhook events the App acts on, as pydantic models of the few fields it reads.

GitHub payloads carry far more than this; unknown fields are ignored, but every field read here is
validated, so a malformed payload is rejected at the door instead of failing deep inside the worker.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Payload(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Account(_Payload):
    login: str
    type: str | None = None


class Repository(_Payload):
    id: int
    full_name: str = Field(pattern=r"^[^/\s]+/[^/\s]+$")


class InstallationRef(_Payload):
    id: int


class Ref(_Payload):
    sha: str
    ref: str


class PullRequestRef(_Payload):
    """A pull request as listed inside check_run / check_suite / workflow_run payloads."""

    number: int
    head: Ref | None = None


class PullRequest(_Payload):
    number: int
    state: str
    head: Ref
    base: Ref
    user: Account | None = None


class _Event(_Payload):
    repository: Repository
    installation: InstallationRef | None = None
    sender: Account | None = None


class PullRequestEvent(_Event):
    action: str
    number: int
    pull_request: PullRequest


class CheckRunApp(_Payload):
    id: int


class CheckRun(_Payload):
    id: int
    name: str
    head_sha: str
    app: CheckRunApp | None = None
    pull_requests: tuple[PullRequestRef, ...] = ()


class RequestedAction(_Payload):
    identifier: str


class CheckRunEvent(_Event):
    action: str
    check_run: CheckRun
    requested_action: RequestedAction | None = None


class CheckSuite(_Payload):
    id: int
    head_sha: str
    pull_requests: tuple[PullRequestRef, ...] = ()


class CheckSuiteEvent(_Event):
    action: str
    check_suite: CheckSuite


class WorkflowRun(_Payload):
    id: int
    name: str | None = None
    path: str | None = None
    head_sha: str
    status: str | None = None
    conclusion: str | None = None
    pull_requests: tuple[PullRequestRef, ...] = ()


class WorkflowRunEvent(_Event):
    action: str
    workflow_run: WorkflowRun


class IssuePullRequestLink(_Payload):
    url: str | None = None


class Issue(_Payload):
    number: int
    pull_request: IssuePullRequestLink | None = None  # present only when the issue is a pull request


class Comment(_Payload):
    id: int
    body: str | None = ""
    user: Account


class IssueCommentEvent(_Event):
    action: str
    issue: Issue
    comment: Comment


class Installation(_Payload):
    id: int
    account: Account | None = None


class InstallationEvent(_Payload):
    action: str
    installation: Installation
    sender: Account | None = None


class MergeGroup(_Payload):
    head_sha: str
    head_ref: str  # refs/heads/gh-readonly-queue/<base>/pr-<number>-<PR head SHA>
    base_ref: str
    base_sha: str | None = None  # GitHub sends it; octokit's example predates it


class MergeGroupEvent(_Event):
    action: str
    merge_group: MergeGroup


class PingEvent(_Payload):
    zen: str | None = None
    hook_id: int | None = None


EVENT_MODELS: dict[str, type[_Payload]] = {
    "ping": PingEvent,
    "pull_request": PullRequestEvent,
    "check_run": CheckRunEvent,
    "check_suite": CheckSuiteEvent,
    "workflow_run": WorkflowRunEvent,
    "issue_comment": IssueCommentEvent,
    "installation": InstallationEvent,
    "installation_repositories": InstallationEvent,
    "merge_group": MergeGroupEvent,
}

# The actions that lead to work; other actions of a known event are acknowledged and dropped.
ACTED_ON: dict[str, frozenset[str]] = {
    "pull_request": frozenset(
        {"opened", "synchronize", "reopened", "edited", "labeled", "unlabeled", "ready_for_review"}
    ),
    "check_run": frozenset({"rerequested", "requested_action"}),
    "check_suite": frozenset({"rerequested"}),
    "workflow_run": frozenset({"completed"}),
    "issue_comment": frozenset({"created"}),
    "installation": frozenset({"created", "deleted", "suspend", "unsuspend", "new_permissions_accepted"}),
    "installation_repositories": frozenset({"added", "removed"}),
    "merge_group": frozenset({"checks_requested"}),
}


def installation_id(event: BaseModel) -> int | None:
    if isinstance(event, InstallationEvent):
        return event.installation.id
    inst = getattr(event, "installation", None)
    return inst.id if inst is not None else None
