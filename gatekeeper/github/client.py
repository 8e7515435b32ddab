"""GitHub I/O through PyGithub, authenticated as an App installation.

Installation tokens are cached until shortly before they expire and fetched again on demand, so a long
evaluation never runs into an expired token; a token that GitHub rejects early is dropped (see
`errors.classify`). 5xx answers and rate limits are retried with backoff inside PyGithub's GithubRetry.
Everything returned is plain data (dicts, str), so the rest of the App never touches PyGithub objects.
"""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from github import Auth, Github, GithubIntegration, GithubRetry
from github.GithubException import UnknownObjectException

from gatekeeper.changes import TreeEntry
from gatekeeper.github.config import AppConfig



CHECK_RUN_ACTIONS = [{"label": "Re-run", "description": "Evaluate this PR again", "identifier": "rerun"}]


class InstallationTokens:
    """Installation access tokens, one per installation, renewed `margin_s` before they expire."""

    def __init__(self, integration: GithubIntegration, margin_s: float, clock: Callable[[], float] = time.time):
        self._integration = integration
        self._margin_s = margin_s
        self._clock = clock
        self._tokens: dict[int, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def get(self, installation_id: int) -> str:
        with self._lock:
            cached = self._tokens.get(installation_id)
            if cached is not None and cached[1] - self._margin_s > self._clock():
                return cached[0]
            grant = self._integration.get_access_token(installation_id)
            expires = grant.expires_at.timestamp() if grant.expires_at else self._clock() + 3600
            self._tokens[installation_id] = (grant.token, expires)
            return grant.token

    def invalidate(self, installation_id: int) -> None:
        with self._lock:
            self._tokens.pop(installation_id, None)


class _InstallationAuth(Auth.Auth):
    """Asks the cache for every request, so a token renewed mid-evaluation is picked up at once."""

    def __init__(self, tokens: InstallationTokens, installation_id: int):
        self._tokens = tokens
        self._installation_id = installation_id

    @property
    def token_type(self) -> str:
        return "token"

    @property
    def token(self) -> str:
        return self._tokens.get(self._installation_id)

    @property
    def _masked_token(self) -> str:
        return "token (installation, masked)"


class GitHubApp:
    """The App's view of GitHub: one PyGithub client per installation, sharing one token cache."""

    def __init__(self, config: AppConfig):
        self._config = config
        retry = GithubRetry(total=config.http_retries, backoff_factor=config.http_backoff_s,
                            secondary_rate_wait=max(1.0, config.http_backoff_s))
        self._http = dict(
            base_url=config.github_api_url, retry=retry, timeout=config.http_timeout_s,
            pool_size=config.workers,  # one pooled connection per worker thread
            seconds_between_requests=config.seconds_between_requests,
            seconds_between_writes=config.seconds_between_writes,
            lazy=True,  # objects are fetched when read, so a check-run update is one PATCH, not GET + PATCH
        )
        self.integration = GithubIntegration(auth=Auth.AppAuth(config.app_id, config.private_key()), **self._http)
        self.tokens = InstallationTokens(self.integration, config.token_refresh_margin_s)
        self._clients: dict[int, Installation] = {}
        self._lock = threading.Lock()

    def installation(self, installation_id: int) -> Installation:
        with self._lock:
            client = self._clients.get(installation_id)
            if client is None:
                gh = Github(auth=_InstallationAuth(self.tokens, installation_id), per_page=100, **self._http)
                client = self._clients[installation_id] = Installation(gh, self._config.max_artifact_bytes)
            return client

    def installation_ids(self) -> list[int]:
        return [inst.id for inst in self.integration.get_installations()]


class Installation:
    """The REST calls the App makes inside one installation."""

    def __init__(self, gh: Github, max_artifact_bytes: int):
        self._gh = gh
        self._max_artifact_bytes = max_artifact_bytes

    def _repo(self, full_name: str):
        return self._gh.get_repo(full_name)  # lazy (see GitHubApp.installation): no GET of the repository

    # ---------------------------------------------------------------------------------------- reading

    def pull_request(self, repo: str, number: int) -> dict[str, Any]:
        return self._repo(repo).get_pull(number).raw_data

    def pull_request_files(self, repo: str, number: int, limit: int) -> list[dict[str, Any]]:
        """Up to `limit + 1` file entries: one more than allowed is enough to know the PR is too large."""
        files = []
        for entry in self._repo(repo).get_pull(number).get_files():
            files.append(entry.raw_data)
            if len(files) > limit:
                break
        return files

    def pull_request_commits(self, repo: str, number: int) -> list[dict[str, Any]]:
        # Not PyGithub's Commit objects: reading their raw_data fetches every commit again, one call each.
        return list(self._pages(f"/repos/{repo}/pulls/{number}/commits"))

    def file_text(self, repo: str, path: str, ref: str) -> str | None:
        """The text of a file at a commit; None if it does not exist there (the base branch's policy)."""
        try:
            content = self._repo(repo).get_contents(path, ref=ref)
        except UnknownObjectException:
            return None
        if isinstance(content, list):  # a directory
            return None
        return content.decoded_content.decode("utf-8")

    def tree(self, repo: str, sha: str) -> dict[str, TreeEntry]:
        """Every entry of the commit's tree, recursively, with git's modes and blob ids. A tree GitHub
        truncates (over 100,000 entries) cannot show every file's mode: that is an error, not a guess."""
        _, data = self._gh.requester.requestJsonAndCheck("GET", f"/repos/{repo}/git/trees/{sha}",
                                                         parameters={"recursive": "1"})
        if data.get("truncated"):
            raise ValueError(f"GitHub truncated the tree of {repo}@{sha[:12]}: too many entries to judge")
        return {item["path"]: TreeEntry(item["mode"], item["type"], item["sha"])
                for item in data["tree"]}

    def blob(self, repo: str, sha: str) -> bytes:
        """A blob's bytes by id: pinned by content, and served up to 100 MB (the contents API stops at 1 MB)."""
        _, data = self._gh.requester.requestJsonAndCheck("GET", f"/repos/{repo}/git/blobs/{sha}")
        if data.get("encoding") != "base64":
            raise ValueError(f"blob {sha[:12]} of {repo} came in encoding {data.get('encoding')!r}, not base64")
        return base64.b64decode(data["content"])

    def compare(self, repo: str, base_sha: str, head_sha: str) -> dict[str, Any]:
        """`base...head`: the merge base GitHub diffs a pull request against, and the changed files (GitHub
        lists at most 300 of them; `files_complete` says whether that was all)."""
        _, data = self._gh.requester.requestJsonAndCheck("GET", f"/repos/{repo}/compare/{base_sha}...{head_sha}",
                                                         parameters={"per_page": 1})
        files = data.get("files") or []
        return {"merge_base": data["merge_base_commit"]["sha"], "files": [f["filename"] for f in files],
                "files_complete": len(files) < 300}

    def open_pull_requests(self, repo: str) -> list[tuple[int, str]]:
        return [(pr.number, pr.head.sha) for pr in self._repo(repo).get_pulls(state="open")]

    def repositories(self) -> list[str]:
        """Full names of the repositories this installation can see."""
        return [r["full_name"] for r in self._pages("/installation/repositories", list_item="repositories")]

    def _pages(self, path: str, list_item: str | None = None, **params: str) -> Iterator[dict[str, Any]]:
        """The raw items of a paginated list endpoint, 100 per request, through PyGithub's requester (so
        its auth and retries apply)."""
        page = 1
        while True:
            _, data = self._gh.requester.requestJsonAndCheck("GET", path, parameters={**params, "per_page": 100, "page": page})
            items = data[list_item] if list_item else data
            yield from items
            if len(items) < 100:
                return
            page += 1

    def collaborator_permission(self, repo: str, login: str) -> str:
        """admin | maintain | write | triage | read | none; "none" for someone GitHub does not know here."""
        try:
            return self._repo(repo).get_collaborator_permission(login)
        except UnknownObjectException:
            return "none"

    def evidence_artifact(self, repo: str, run_id: int, name: str) -> bytes | None:
        """The zip of the named artifact of a workflow run, or None if the run has none."""
        # Listed raw: PyGithub's WorkflowRun would first GET the whole run just to learn this URL.
        artifacts = self._pages(f"/repos/{repo}/actions/runs/{run_id}/artifacts", list_item="artifacts")
        artifact = next((a for a in artifacts if a["name"] == name and not a["expired"]), None)
        if artifact is None:
            return None
        if artifact["size_in_bytes"] > self._max_artifact_bytes:
            raise ValueError(f"artifact {name!r} is {artifact['size_in_bytes']} bytes, over the "
                             f"{self._max_artifact_bytes}-byte limit")
        _, _, stream = self._gh.requester.getStream(artifact["archive_download_url"], chunk_size=65536)
        data = bytearray()
        for chunk in stream:
            data.extend(chunk)
            if len(data) > self._max_artifact_bytes:
                raise ValueError(f"artifact {name!r} is over the {self._max_artifact_bytes}-byte limit")
        return bytes(data)

    # ---------------------------------------------------------------------------------------- check runs

    def our_check_runs(self, repo: str, head_sha: str, app_id: int, name: str | None = None) -> list[dict[str, Any]]:
        # Raw pages, not PyGithub's CheckRun objects (reading their raw_data GETs each run again). Another
        # App may use the same name; only our own runs count (asked of GitHub too: CI's many runs stay out of the
        # pages when all our runs of a head are listed).
        params: dict[str, Any] = {"app_id": app_id}
        if name:
            params["check_name"] = name
        runs = self._pages(f"/repos/{repo}/commits/{head_sha}/check-runs", list_item="check_runs", **params)
        return [run for run in runs if (run.get("app") or {}).get("id") == app_id]

    def has_check_run(self, repo: str, head_sha: str, name_prefix: str, app_id: int) -> bool:
        return any(run["name"].startswith(name_prefix) for run in self.our_check_runs(repo, head_sha, app_id))

    def create_check_run(self, repo: str, head_sha: str, name: str, external_id: str) -> int:
        """A new, queued check run. The caller looked for one with this external_id first."""
        return self._repo(repo).create_check_run(name=name, head_sha=head_sha, external_id=external_id,
                                                 status="queued").id

    def write_check_run(self, repo: str, check_run_id: int, *, status: str, conclusion: str | None, title: str,
                        summary: str, details_url: str | None, external_id: str,
                        annotation_batches: list[list[dict[str, Any]]]) -> None:
        """Put the whole report on the run: the first batch of annotations with it, then GitHub appends each
        further batch (50 per request). `in_progress` leaves the run open with the summary shown."""
        run = self._repo(repo).get_check_run(check_run_id)
        batches = annotation_batches or [[]]
        output = {"title": title, "summary": summary, "annotations": batches[0]}
        fields: dict[str, Any] = {"status": status, "output": output, "external_id": external_id,
                                  "actions": CHECK_RUN_ACTIONS}
        if details_url:
            fields["details_url"] = details_url
        if status == "completed":
            fields.update(conclusion=conclusion, completed_at=datetime.now(timezone.utc))
        else:
            fields["started_at"] = datetime.now(timezone.utc)
        run.edit(**fields)
        for batch in batches[1:]:
            run.edit(output={"title": title, "summary": summary, "annotations": batch})

    # ---------------------------------------------------------------------------------------- comments

    def upsert_comment(self, repo: str, number: int, comment_id: int | None, body: str, marker: str) -> int:
        """Update our comment in place; find it by marker if its id was lost; create it only if absent."""
        issue = self._repo(repo).get_issue(number)
        if comment_id is not None:
            try:
                comment = issue.get_comment(comment_id)
                comment.edit(body)
                return comment.id
            except UnknownObjectException:
                pass  # deleted by someone: fall through and look for another copy, or create one
        for comment in issue.get_comments():
            # Only a bot's comment: anyone can paste the marker into their own, which we may not edit.
            if comment.user.type == "Bot" and marker in (comment.body or ""):
                comment.edit(body)
                return comment.id
        return issue.create_comment(body).id

    def reply(self, repo: str, number: int, body: str) -> int:
        return self._repo(repo).get_issue(number).create_comment(body).id
