"""A fake GitHub REST API on loopback: real HTTP (Starlette under uvicorn), App JWT and installation-token
auth, pagination with Link headers, and injectable faults. Every JSON answer is validated against the
response schema of GitHub's OpenAPI description (fixtures/rest_schemas.json); violations are recorded and
the tests assert there are none, so the fake cannot drift from what GitHub really sends.

Objects start from the octokit/webhooks payload examples (real GitHub objects) and are adjusted to the state
the test sets up.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import functools
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jsonschema
import jwt
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

FIXTURES = Path(__file__).with_name("fixtures")
SCHEMAS = json.loads((FIXTURES / "rest_schemas.json").read_text())


def webhook_example(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / "webhooks" / f"{name}.json").read_text())


_PR_TEMPLATE = webhook_example("pull_request.opened")["pull_request"]
_LABEL_TEMPLATE = webhook_example("pull_request.labeled")["label"]
_CHECK_RUN_TEMPLATE = webhook_example("check_run.rerequested")["check_run"]
_COMMENT_TEMPLATE = webhook_example("issue_comment.created")["comment"]
_INSTALLATION_TEMPLATE = webhook_example("installation.created")["installation"]
_USER_TEMPLATE = _PR_TEMPLATE["user"]


@functools.lru_cache(maxsize=None)
def _validator(operation: str) -> jsonschema.protocols.Validator:
    """One validator per operation, built once: the schema refers into the shared components."""
    schema = {**SCHEMAS["operations"][operation], "components": SCHEMAS["components"]}
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def iso(ts: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if ts is None else ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


@dataclass
class FakeCommit:
    sha: str
    message: str
    author_name: str = "Dev"
    author_email: str = "dev@example.com"
    login: str | None = "dev"


@dataclass
class FakePull:
    number: int
    head_sha: str
    base_sha: str
    files: list[dict[str, Any]]
    commits: list[FakeCommit] = field(default_factory=list)
    title: str = "A change"
    body: str = ""
    labels: list[str] = field(default_factory=list)
    author: str = "dev"
    state: str = "open"
    base_ref: str = "main"
    head_ref: str = "feature"


@dataclass
class FakeRepo:
    full_name: str
    id: int
    installation_id: int
    trees: dict[str, dict[str, str | bytes]] = field(default_factory=dict)  # commit sha -> path -> content
    modes: dict[str, dict[str, str]] = field(default_factory=dict)  # commit sha -> path -> git mode (default 100644)
    compares: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (base, head) -> changed paths
    branches: dict[str, str] = field(default_factory=dict)  # branch name -> commit sha
    pulls: dict[int, FakePull] = field(default_factory=dict)
    # login -> admin | write | read | none; a login not listed gets 404 (not a collaborator, unknown user)
    permissions: dict[str, str] = field(default_factory=dict)
    check_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    comments: dict[int, dict[str, Any]] = field(default_factory=dict)
    artifacts: dict[int, list[tuple[int, str, bytes]]] = field(default_factory=dict)  # run id -> artifacts


@dataclass
class Fault:
    method: str
    pattern: re.Pattern
    status: int | None  # None: the real answer (after the delay; or lost, see below)
    remaining: int
    delay_s: float = 0.0  # answer this late
    retry_after: int | None = None  # a Retry-After header on the injected answer
    lost: bool = False  # do the work, then lose the answer: the client sees `status` (502 if None)


@dataclass
class HeadMove:
    """After `after` matching requests, the PR's head moves (a push between two of the App's calls)."""

    method: str
    pattern: re.Pattern
    number: int
    after: int
    head_sha: str
    files: list[dict[str, Any]] | None
    repo: str = ""
    seen: int = 0


class FakeGitHub:
    def __init__(self, app_id: int, public_key_pem: str, token_lifetime_s: float = 3600.0, validate: bool = True):
        self.app_id = app_id
        self.validate = validate  # the load benchmark turns it off: the tests prove the shapes, it measures the App
        self._public_key = public_key_pem
        self.token_lifetime_s = token_lifetime_s
        self.repos: dict[str, FakeRepo] = {}
        self.installations: set[int] = set()
        self.tokens: dict[str, tuple[int, float]] = {}  # token -> (installation, expires_at)
        self.tokens_issued = 0
        self.calls: list[tuple[str, str, int]] = []
        self.violations: list[str] = []
        self.check_run_patches: list[tuple[int, dict[str, Any]]] = []
        self._faults: list[Fault] = []
        self._moves: list[HeadMove] = []
        self.blobs: dict[str, bytes] = {}  # blob id -> content, filled as trees are served
        self.pr_changed_files_override: int | None = None  # a PR object whose changed_files lags its file list
        self._revoke_on: tuple[str, re.Pattern] | None = None
        self._ids = itertools.count(1000)
        self._lock = threading.RLock()
        self.base_url = ""  # set once serving
        self.app = Starlette(routes=self._routes())

    # ------------------------------------------------------------------------------------------ test setup

    def add_installation(self, installation_id: int) -> None:
        self.installations.add(installation_id)

    def add_repo(self, full_name: str, installation_id: int) -> FakeRepo:
        repo = FakeRepo(full_name, next(self._ids), installation_id)
        self.repos[full_name] = repo
        return repo

    def fail(self, method: str, path_regex: str, status: int | None, times: int = 1, *, delay_s: float = 0.0,
             retry_after: int | None = None, lost: bool = False) -> None:
        """The next `times` matching requests get `status` (then the real answer again). `delay_s` answers
        late; `lost` does the work first and then answers `status` (a POST whose answer never arrived)."""
        self._faults.append(Fault(method.upper(), re.compile(path_regex), status, times, delay_s, retry_after, lost))

    def delay(self, method: str, path_regex: str, seconds: float, times: int = 1) -> None:
        """The next `times` matching requests are answered correctly, `seconds` late."""
        self.fail(method, path_regex, None, times, delay_s=seconds)

    def move_head(self, full_name: str, number: int, head_sha: str, *, after: tuple[str, str, int],
                  files: list[dict[str, Any]] | None = None) -> None:
        """Push `head_sha` (with `files`, if given) to PR `number` once `after` = (method, path regex, n)
        has matched n requests: between two of the App's calls, as a real push can."""
        method, regex, n = after
        self._moves.append(HeadMove(method.upper(), re.compile(regex), number, n, head_sha, files, full_name))

    def revoke_tokens_on(self, method: str, path_regex: str) -> None:
        """When the first matching request arrives, every token issued so far stops working (as if it had
        expired early, mid-evaluation): that request and any later one with an old token get 401."""
        self._revoke_on = (method.upper(), re.compile(path_regex))

    def revoke_tokens(self) -> None:
        """Every installation token issued so far stops working, as if it had expired early."""
        with self._lock:
            self.tokens = {t: (i, 0.0) for t, (i, _) in self.tokens.items()}

    def add_check_run(self, full_name: str, head_sha: str, name: str, status: str = "in_progress",
                      external_id: str = "") -> int:
        """A check run of this App that exists on GitHub already (e.g. created just before a crash)."""
        repo = self.repos[full_name]
        run_id = next(self._ids)
        repo.check_runs[run_id] = self._check_run(repo, run_id, {"name": name, "head_sha": head_sha, "status": status,
                                                                  "external_id": external_id})
        return run_id

    def check_runs(self, full_name: str, head_sha: str | None = None) -> list[dict[str, Any]]:
        runs = self.repos[full_name].check_runs.values()
        return [r for r in runs if head_sha is None or r["head_sha"] == head_sha]

    # ------------------------------------------------------------------------------------------ plumbing

    def _routes(self) -> list[Route]:
        r = "/repos/{owner}/{name}"
        return [
            Route("/app/installations/{installation_id:int}/access_tokens", self.create_token, methods=["POST"]),
            Route("/app/installations", self.list_installations, methods=["GET"]),
            Route("/installation/repositories", self.installation_repos, methods=["GET"]),
            Route(r + "/pulls", self.list_pulls, methods=["GET"]),
            Route(r + "/pulls/{number:int}", self.get_pull, methods=["GET"]),
            Route(r + "/pulls/{number:int}/files", self.pull_files, methods=["GET"]),
            Route(r + "/pulls/{number:int}/commits", self.pull_commits, methods=["GET"]),
            Route(r + "/contents/{path:path}", self.get_contents, methods=["GET"]),
            Route(r + "/git/trees/{sha}", self.get_tree, methods=["GET"]),
            Route(r + "/git/blobs/{sha}", self.get_blob, methods=["GET"]),
            Route(r + "/compare/{basehead}", self.compare, methods=["GET"]),
            Route(r + "/check-runs", self.create_check_run, methods=["POST"]),
            Route(r + "/check-runs/{id:int}", self.update_check_run, methods=["PATCH"]),
            Route(r + "/commits/{ref}/check-runs", self.list_check_runs, methods=["GET"]),
            Route(r + "/collaborators/{login}/permission", self.permission, methods=["GET"]),
            Route(r + "/issues/{number:int}/comments", self.issue_comments, methods=["GET", "POST"]),
            Route(r + "/issues/comments/{id:int}", self.issue_comment, methods=["GET", "PATCH"]),
            Route(r + "/actions/runs/{run_id:int}/artifacts", self.list_artifacts, methods=["GET"]),
            Route(r + "/actions/artifacts/{id:int}/zip", self.download_artifact, methods=["GET"]),
            Route("/_blobs/{owner}/{name}/{id:int}", self.artifact_blob, methods=["GET"]),
        ]

    async def __call__(self, scope, receive, send):  # ASGI: faults and the call log wrap every route
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            if self._revoke_on and self._revoke_on[0] == method and self._revoke_on[1].search(path):
                self._revoke_on = None
                self.revoke_tokens()
            fault = self._take_fault(method, path)
            if fault is not None and fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault is not None and fault.status is not None and not fault.lost:
                self.calls.append((method, path, fault.status))
                headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else None
                response = JSONResponse({"message": f"injected {fault.status}"}, status_code=fault.status,
                                        headers=headers)
                return await response(scope, receive, send)
            statuses: list[int] = []
            lost = fault is not None and fault.lost

            async def record(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])
                if not lost:
                    await send(message)

            await self.app(scope, receive, record)
            self.calls.append((method, path, statuses[0] if statuses else 0))
            self._after_request(method, path)
            if lost:  # the work is done; the client never learns it
                response = JSONResponse({"message": "injected: answer lost"}, status_code=fault.status or 502)
                return await response(scope, receive, send)
            return None
        return await self.app(scope, receive, send)

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining > 0 and fault.method == method and fault.pattern.search(path):
                    fault.remaining -= 1
                    return fault
        return None

    def _after_request(self, method: str, path: str) -> None:
        with self._lock:
            for move in self._moves:
                if move.seen < move.after and move.method == method and move.pattern.search(path):
                    move.seen += 1
                    if move.seen == move.after:
                        repo = self.repos[move.repo]
                        pull = repo.pulls[move.number]
                        old = self.commit_tree(repo, pull.head_sha) or {}
                        # The old head's commit stays readable, as on GitHub.
                        repo.trees[pull.head_sha] = {p: content for p, (_, content) in old.items()}
                        repo.modes[pull.head_sha] = {p: mode for p, (mode, _) in old.items()}
                        pull.head_sha = move.head_sha
                        if move.files is not None:
                            pull.files = move.files

    def _answer(self, operation: str, data: Any, status: int = 200, headers: dict | None = None) -> JSONResponse:
        error = jsonschema.exceptions.best_match(_validator(operation).iter_errors(data)) if self.validate else None
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            self.violations.append(f"{operation}: at {where or '(root)'}: {error.message[:300]}")
        return JSONResponse(data, status_code=status, headers=headers)

    def _page(self, request: Request, items: list[Any]) -> tuple[list[Any], dict[str, str]]:
        per_page = min(int(request.query_params.get("per_page", 30)), 100)
        page = int(request.query_params.get("page", 1))
        chunk = items[(page - 1) * per_page: page * per_page]
        headers = {}
        if page * per_page < len(items):
            nxt = request.url.include_query_params(page=page + 1, per_page=per_page)
            headers["Link"] = f'<{nxt}>; rel="next"'
        return chunk, headers

    def _installation_auth(self, request: Request) -> int | JSONResponse:
        header = request.headers.get("authorization", "")
        token = header.removeprefix("token ").strip() if header.startswith("token ") else None
        with self._lock:
            grant = self.tokens.get(token) if token else None
        if grant is None or grant[1] <= time.time():
            return JSONResponse({"message": "Bad credentials"}, status_code=401)
        return grant[0]

    def _repo(self, request: Request) -> FakeRepo | JSONResponse:
        installation = self._installation_auth(request)
        if isinstance(installation, JSONResponse):
            return installation
        repo = self.repos.get(f"{request.path_params['owner']}/{request.path_params['name']}")
        if repo is None or repo.installation_id != installation:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        return repo

    def _url(self, path: str) -> str:
        return self.base_url + path

    # ------------------------------------------------------------------------------------------ apps

    def _app_jwt_ok(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        if not header.startswith("Bearer "):
            return False
        try:
            claims = jwt.decode(header[7:], self._public_key, algorithms=["RS256"])
        except jwt.PyJWTError:
            return False
        return str(claims.get("iss")) == str(self.app_id)

    async def create_token(self, request: Request) -> Response:
        if not self._app_jwt_ok(request):
            return JSONResponse({"message": "A JSON web token could not be decoded"}, status_code=401)
        installation_id = request.path_params["installation_id"]
        if installation_id not in self.installations:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        token, expires = "ghs_" + secrets.token_hex(18), time.time() + self.token_lifetime_s
        with self._lock:
            self.tokens[token] = (installation_id, expires)
            self.tokens_issued += 1
        data = {"token": token, "expires_at": iso(expires), "permissions": {"checks": "write", "contents": "read"},
                "repository_selection": "selected"}
        return self._answer("POST /app/installations/{installation_id}/access_tokens 201", data, 201)

    async def list_installations(self, request: Request) -> Response:
        if not self._app_jwt_ok(request):
            return JSONResponse({"message": "A JSON web token could not be decoded"}, status_code=401)
        items = []
        for installation_id in sorted(self.installations):
            item = copy.deepcopy(_INSTALLATION_TEMPLATE)
            # The description's account for this operation is all of a user and an enterprise.
            item["account"] = {**item["account"], "name": item["account"]["login"], "slug": item["account"]["login"],
                               "created_at": iso(), "updated_at": iso()}
            item.update(id=installation_id, app_id=self.app_id, app_slug="gatekeeper", created_at=iso(), updated_at=iso(),
                        access_tokens_url=self._url(f"/app/installations/{installation_id}/access_tokens"))
            items.append(item)
        chunk, headers = self._page(request, items)
        return self._answer("GET /app/installations 200", chunk, headers=headers)

    async def installation_repos(self, request: Request) -> Response:
        installation = self._installation_auth(request)
        if isinstance(installation, JSONResponse):
            return installation
        repos = [self._repository(r) for r in self.repos.values() if r.installation_id == installation]
        chunk, headers = self._page(request, repos)
        return self._answer("GET /installation/repositories 200",
                            {"total_count": len(repos), "repositories": chunk}, headers=headers)

    def _repository(self, repo: FakeRepo) -> dict[str, Any]:
        data = copy.deepcopy(_PR_TEMPLATE["base"]["repo"])
        owner, name = repo.full_name.split("/")
        data.update(id=repo.id, name=name, full_name=repo.full_name, url=self._url(f"/repos/{repo.full_name}"))
        data["owner"] = {**data["owner"], "login": owner}
        return data

    # ------------------------------------------------------------------------------------------ pulls

    def _pull(self, repo: FakeRepo, pull: FakePull) -> dict[str, Any]:
        data = copy.deepcopy(_PR_TEMPLATE)
        base = f"/repos/{repo.full_name}"
        data.update(
            url=self._url(f"{base}/pulls/{pull.number}"), id=repo.id * 10_000 + pull.number,
            number=pull.number, state=pull.state, title=pull.title, body=pull.body,
            labels=[{**_LABEL_TEMPLATE, "name": name} for name in pull.labels],
            user={**_USER_TEMPLATE, "login": pull.author},
            commits=len(pull.commits),
            changed_files=len(pull.files) if self.pr_changed_files_override is None else self.pr_changed_files_override,
            additions=sum(f.get("additions", 0) for f in pull.files),
            deletions=sum(f.get("deletions", 0) for f in pull.files),
        )
        data["head"] = {**data["head"], "sha": pull.head_sha, "ref": pull.head_ref, "repo": self._repository(repo)}
        data["base"] = {**data["base"], "sha": pull.base_sha, "ref": pull.base_ref, "repo": self._repository(repo)}
        return data

    def _pull_or_404(self, request: Request) -> tuple[FakeRepo, FakePull] | JSONResponse:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        pull = repo.pulls.get(request.path_params["number"])
        if pull is None:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        return repo, pull

    async def list_pulls(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        state = request.query_params.get("state", "open")
        pulls = [self._pull(repo, p) for p in repo.pulls.values() if state == "all" or p.state == state]
        chunk, headers = self._page(request, pulls)
        return self._answer("GET /repos/{owner}/{repo}/pulls 200", chunk, headers=headers)

    async def get_pull(self, request: Request) -> Response:
        found = self._pull_or_404(request)
        if isinstance(found, JSONResponse):
            return found
        return self._answer("GET /repos/{owner}/{repo}/pulls/{pull_number} 200", self._pull(*found))

    async def pull_files(self, request: Request) -> Response:
        found = self._pull_or_404(request)
        if isinstance(found, JSONResponse):
            return found
        repo, pull = found
        entries = []
        for f in pull.files[:3000]:  # GitHub lists at most 3000 files
            public = {k: v for k, v in f.items() if not k.startswith("_")}  # _content, _mode: the tree's
            entry = {"sha": git_sha(f["filename"]), "changes": f.get("additions", 0) + f.get("deletions", 0),
                     "additions": 0, "deletions": 0, **public}
            entry.update(
                blob_url=f"https://github.com/{repo.full_name}/blob/{pull.head_sha}/{f['filename']}",
                raw_url=f"https://github.com/{repo.full_name}/raw/{pull.head_sha}/{f['filename']}",
                contents_url=self._url(f"/repos/{repo.full_name}/contents/{f['filename']}?ref={pull.head_sha}"))
            entries.append(entry)
        chunk, headers = self._page(request, entries)
        return self._answer("GET /repos/{owner}/{repo}/pulls/{pull_number}/files 200", chunk, headers=headers)

    async def pull_commits(self, request: Request) -> Response:
        found = self._pull_or_404(request)
        if isinstance(found, JSONResponse):
            return found
        repo, pull = found
        items = []
        for c in pull.commits:
            person = {"name": c.author_name, "email": c.author_email, "date": iso()}
            user = {**_USER_TEMPLATE, "login": c.login} if c.login else None
            items.append({
                "url": self._url(f"/repos/{repo.full_name}/commits/{c.sha}"), "sha": c.sha, "node_id": "C_" + c.sha[:8],
                "html_url": f"https://github.com/{repo.full_name}/commit/{c.sha}",
                "comments_url": self._url(f"/repos/{repo.full_name}/commits/{c.sha}/comments"),
                "commit": {"url": self._url(f"/repos/{repo.full_name}/git/commits/{c.sha}"), "author": person,
                           "committer": person, "message": c.message, "comment_count": 0,
                           "tree": {"sha": git_sha(c.sha), "url": self._url(f"/repos/{repo.full_name}/git/trees/x")}},
                "author": user, "committer": user, "parents": [],
            })
        chunk, headers = self._page(request, items)
        return self._answer("GET /repos/{owner}/{repo}/pulls/{pull_number}/commits 200", chunk, headers=headers)

    # ------------------------------------------------------------------------------------------ contents

    async def get_contents(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        ref, path = request.query_params.get("ref"), request.path_params["path"]
        if ref.startswith("refs/heads/"):  # a branch: the tests name commits after their branches' tips
            ref = repo.branches.get(ref.removeprefix("refs/heads/"), ref)
        found = (self.commit_tree(repo, ref) or {}).get(path)
        if found is None:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        content = found[1]
        url = self._url(f"/repos/{repo.full_name}/contents/{path}?ref={ref}")
        html = f"https://github.com/{repo.full_name}/blob/{ref}/{path}"
        blob = self._blob_id(content)
        git = self._url(f"/repos/{repo.full_name}/git/blobs/{blob}")
        data = {"type": "file", "encoding": "base64", "size": len(content), "name": path.rsplit("/", 1)[-1],
                "path": path, "content": base64.b64encode(content).decode(), "sha": blob, "url": url,
                "git_url": git, "html_url": html, "download_url": html, "_links": {"git": git, "html": html, "self": url}}
        return self._answer("GET /repos/{owner}/{repo}/contents/{path} 200", data)

    def commit_tree(self, repo: FakeRepo, sha: str) -> dict[str, tuple[str, bytes]] | None:
        """path -> (mode, content) at a commit: set by the test, or (for a PR head) the base's tree with the
        PR's files applied. A file entry may carry `_content` (str or bytes) and `_mode` for its new side."""
        if sha in repo.trees:
            modes = repo.modes.get(sha, {})
            return {p: (modes.get(p, "100644"), c.encode() if isinstance(c, str) else c)
                    for p, c in repo.trees[sha].items()}
        pull = next((p for p in repo.pulls.values() if p.head_sha == sha), None)
        if pull is None:
            return None
        tree = dict(self.commit_tree(repo, pull.base_sha) or {})
        for f in pull.files:
            if f.get("previous_filename"):
                tree.pop(f["previous_filename"], None)
            if f["status"] == "removed":
                tree.pop(f["filename"], None)
                continue
            content = f.get("_content", f"content of {f['filename']}\n")
            tree[f["filename"]] = (f.get("_mode", "100644"), content.encode() if isinstance(content, str) else content)
        return tree

    def _blob_id(self, content: bytes) -> str:
        sha = hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()  # git's own blob id
        self.blobs[sha] = content
        return sha

    async def get_tree(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        sha = request.path_params["sha"]
        tree = self.commit_tree(repo, sha)
        if tree is None:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        items = []
        for path, (mode, content) in sorted(tree.items()):
            kind = "commit" if mode == "160000" else "blob"
            item = {"path": path, "mode": mode, "type": kind, "sha": self._blob_id(content)}
            if kind == "blob":
                item["size"] = len(content)
            items.append(item)
        data = {"sha": sha, "url": self._url(f"/repos/{repo.full_name}/git/trees/{sha}"), "truncated": False,
                "tree": items}
        return self._answer("GET /repos/{owner}/{repo}/git/trees/{tree_sha} 200", data)

    async def get_blob(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        sha = request.path_params["sha"]
        content = self.blobs.get(sha)
        if content is None:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        data = {"sha": sha, "node_id": "B_" + sha[:8], "size": len(content), "encoding": "base64",
                "url": self._url(f"/repos/{repo.full_name}/git/blobs/{sha}"),
                "content": base64.encodebytes(content).decode()}
        return self._answer("GET /repos/{owner}/{repo}/git/blobs/{file_sha} 200", data)

    async def compare(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        base, _, head = request.path_params["basehead"].partition("...")
        pull = next((p for p in repo.pulls.values() if p.head_sha == head), None)
        if (base, head) in repo.compares:
            paths = repo.compares[(base, head)]
        elif pull is not None:
            paths = [f["filename"] for f in pull.files]
        elif (old := self.commit_tree(repo, base)) is not None and (new := self.commit_tree(repo, head)) is not None:
            paths = sorted(p for p in set(old) | set(new) if old.get(p) != new.get(p))
        else:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        merge_base = pull.base_sha if pull is not None else base
        commit = self._commit_object(repo, merge_base)
        files = [{"sha": git_sha(p), "filename": p, "status": "modified", "additions": 1, "deletions": 0,
                  "changes": 1, "blob_url": f"https://github.com/{repo.full_name}/blob/{head}/{p}",
                  "raw_url": f"https://github.com/{repo.full_name}/raw/{head}/{p}",
                  "contents_url": self._url(f"/repos/{repo.full_name}/contents/{p}?ref={head}")} for p in paths[:300]]
        data = {"url": self._url(f"/repos/{repo.full_name}/compare/{base}...{head}"),
                "html_url": f"https://github.com/{repo.full_name}/compare/{base}...{head}",
                "permalink_url": f"https://github.com/{repo.full_name}/compare/{base}...{head}",
                "diff_url": f"https://github.com/{repo.full_name}/compare/{base}...{head}.diff",
                "patch_url": f"https://github.com/{repo.full_name}/compare/{base}...{head}.patch",
                "base_commit": self._commit_object(repo, base), "merge_base_commit": commit,
                "status": "ahead", "ahead_by": 1, "behind_by": 0, "total_commits": 1, "commits": [], "files": files}
        return self._answer("GET /repos/{owner}/{repo}/compare/{basehead} 200", data)

    def _commit_object(self, repo: FakeRepo, sha: str) -> dict[str, Any]:
        person = {"name": "Dev", "email": "dev@example.com", "date": iso()}
        return {
            "url": self._url(f"/repos/{repo.full_name}/commits/{sha}"), "sha": sha, "node_id": "C_" + sha[:8],
            "html_url": f"https://github.com/{repo.full_name}/commit/{sha}",
            "comments_url": self._url(f"/repos/{repo.full_name}/commits/{sha}/comments"),
            "commit": {"url": self._url(f"/repos/{repo.full_name}/git/commits/{sha}"), "author": person,
                       "committer": person, "message": "base", "comment_count": 0,
                       "tree": {"sha": git_sha(sha), "url": self._url(f"/repos/{repo.full_name}/git/trees/{sha}")}},
            "author": None, "committer": None, "parents": [],
        }

    # ------------------------------------------------------------------------------------------ check runs

    def _check_run(self, repo: FakeRepo, run_id: int, body: dict[str, Any]) -> dict[str, Any]:
        data = copy.deepcopy(_CHECK_RUN_TEMPLATE)
        data.update(
            id=run_id, node_id=f"CR_{run_id}", name=body["name"], head_sha=body["head_sha"],
            url=self._url(f"/repos/{repo.full_name}/check-runs/{run_id}"),
            html_url=f"https://github.com/{repo.full_name}/runs/{run_id}", details_url=None,
            external_id=body.get("external_id", ""), status=body.get("status", "queued"), conclusion=None,
            started_at=body.get("started_at") or iso(), completed_at=None, pull_requests=[],
            output={"title": None, "summary": None, "text": None, "annotations_count": 0,
                    "annotations_url": self._url(f"/repos/{repo.full_name}/check-runs/{run_id}/annotations")},
        )
        data["app"] = {**data["app"], "id": self.app_id, "permissions": {"checks": "write", "contents": "read"},
                       "events": ["pull_request", "check_run"]}
        data["annotations"] = []  # kept for the tests; not part of GitHub's answer (stripped in _public)
        return data

    @staticmethod
    def _public(run: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in run.items() if k != "annotations"}

    async def create_check_run(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        body = await request.json()
        if not body.get("name") or not body.get("head_sha"):
            return JSONResponse({"message": "Validation Failed"}, status_code=422)
        with self._lock:
            run_id = next(self._ids)
            run = repo.check_runs[run_id] = self._check_run(repo, run_id, body)
            self._apply(run, body)
        return self._answer("POST /repos/{owner}/{repo}/check-runs 201", self._public(run), 201)

    async def update_check_run(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        run = repo.check_runs.get(request.path_params["id"])
        if run is None:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        body = await request.json()
        annotations = (body.get("output") or {}).get("annotations") or []
        if len(annotations) > 50:  # GitHub's limit per request
            return JSONResponse({"message": "Only 50 annotations are allowed per request"}, status_code=422)
        if body.get("conclusion") == "action_required" and not (body.get("details_url") or run.get("details_url")):
            return JSONResponse({"message": "details_url is required for action_required"}, status_code=422)
        if body.get("conclusion") not in (None, "success", "failure", "neutral", "cancelled", "skipped", "timed_out",
                                          "action_required"):
            return JSONResponse({"message": "Invalid conclusion"}, status_code=422)
        if len((body.get("output") or {}).get("summary") or "") > 65535:
            return JSONResponse({"message": "summary is too long (maximum is 65535 characters)"}, status_code=422)
        with self._lock:
            self._apply(run, body)
            self.check_run_patches.append((run["id"], body))
        return self._answer("PATCH /repos/{owner}/{repo}/check-runs/{check_run_id} 200", self._public(run))

    @staticmethod
    def _apply(run: dict[str, Any], body: dict[str, Any]) -> None:
        for key in ("status", "conclusion", "completed_at", "started_at", "external_id", "details_url"):
            if key in body:
                run[key] = body[key]
        if body.get("conclusion"):
            run["status"] = "completed"
        if body.get("status") == "in_progress":
            run["conclusion"], run["completed_at"] = None, None
            run["annotations"] = []
        if "actions" in body:
            run["actions"] = body["actions"]
        output = body.get("output")
        if output:
            run["output"].update({k: output[k] for k in ("title", "summary", "text") if k in output})
            run["annotations"].extend(output.get("annotations") or [])
            run["output"]["annotations_count"] = len(run["annotations"])

    async def list_check_runs(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        name, app_id = request.query_params.get("check_name"), request.query_params.get("app_id")
        runs = [self._public(r) for r in repo.check_runs.values() if r["head_sha"] == request.path_params["ref"]
                and (name is None or r["name"] == name) and (app_id is None or str(r["app"]["id"]) == app_id)]
        chunk, headers = self._page(request, runs)
        return self._answer("GET /repos/{owner}/{repo}/commits/{ref}/check-runs 200",
                            {"total_count": len(runs), "check_runs": chunk}, headers=headers)

    # ------------------------------------------------------------------------------------------ people, comments

    async def permission(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        login = request.path_params["login"]
        permission = repo.permissions.get(login)
        if permission is None:  # not a collaborator (or no such user): GitHub answers 404
            return JSONResponse({"message": "Not Found"}, status_code=404)
        rights = {"admin": permission == "admin", "maintain": permission == "admin",
                  "push": permission in ("admin", "write"), "triage": permission != "none",
                  "pull": permission != "none"}
        user = {**_USER_TEMPLATE, "login": login, "permissions": rights, "role_name": permission}
        data = {"permission": permission, "role_name": permission, "user": user}
        return self._answer("GET /repos/{owner}/{repo}/collaborators/{username}/permission 200", data)

    def add_comment(self, full_name: str, number: int, body: str, login: str, user_type: str = "User") -> int:
        repo = self.repos[full_name]
        comment_id = next(self._ids)
        repo.comments[comment_id] = self._comment(repo, comment_id, number, body, login, user_type)
        return comment_id

    def _comment(self, repo: FakeRepo, comment_id: int, number: int, body: str, login: str = "gatekeeper[bot]",
                 user_type: str = "Bot") -> dict[str, Any]:
        data = copy.deepcopy(_COMMENT_TEMPLATE)
        data.update(id=comment_id, node_id=f"IC_{comment_id}", body=body,
                    url=self._url(f"/repos/{repo.full_name}/issues/comments/{comment_id}"),
                    html_url=f"https://github.com/{repo.full_name}/pull/{number}#issuecomment-{comment_id}",
                    issue_url=self._url(f"/repos/{repo.full_name}/issues/{number}"),
                    user={**_USER_TEMPLATE, "login": login, "type": user_type},
                    created_at=iso(), updated_at=iso())
        return data

    async def issue_comments(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        number = request.path_params["number"]
        issue_url = self._url(f"/repos/{repo.full_name}/issues/{number}")
        if request.method == "POST":
            body = (await request.json()).get("body", "")
            with self._lock:
                comment_id = next(self._ids)
                comment = repo.comments[comment_id] = self._comment(repo, comment_id, number, body)
            return self._answer("POST /repos/{owner}/{repo}/issues/{issue_number}/comments 201", comment, 201)
        items = [c for c in repo.comments.values() if c["issue_url"] == issue_url]
        chunk, headers = self._page(request, items)
        return self._answer("GET /repos/{owner}/{repo}/issues/{issue_number}/comments 200", chunk, headers=headers)

    async def issue_comment(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        comment = repo.comments.get(request.path_params["id"])
        if comment is None:
            return JSONResponse({"message": "Not Found"}, status_code=404)
        if request.method == "PATCH":
            comment["body"] = (await request.json()).get("body", "")
            comment["updated_at"] = iso()
            return self._answer("PATCH /repos/{owner}/{repo}/issues/comments/{comment_id} 200", comment)
        return self._answer("GET /repos/{owner}/{repo}/issues/comments/{comment_id} 200", comment)

    # ------------------------------------------------------------------------------------------ artifacts

    async def list_artifacts(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        run_id = request.path_params["run_id"]
        items = [{
            "id": art_id, "node_id": f"A_{art_id}", "name": name, "size_in_bytes": len(data),
            "url": self._url(f"/repos/{repo.full_name}/actions/artifacts/{art_id}"),
            "archive_download_url": self._url(f"/repos/{repo.full_name}/actions/artifacts/{art_id}/zip"),
            "expired": False, "created_at": iso(), "expires_at": iso(time.time() + 86400), "updated_at": iso(),
            "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "workflow_run": {"id": run_id, "repository_id": repo.id, "head_repository_id": repo.id,
                             "head_branch": "feature", "head_sha": "0" * 40},
        } for art_id, name, data in repo.artifacts.get(run_id, [])]
        chunk, headers = self._page(request, items)
        return self._answer("GET /repos/{owner}/{repo}/actions/runs/{run_id}/artifacts 200",
                            {"total_count": len(items), "artifacts": chunk}, headers=headers)

    async def download_artifact(self, request: Request) -> Response:
        repo = self._repo(request)
        if isinstance(repo, JSONResponse):
            return repo
        # Like GitHub: a redirect to short-lived blob storage that needs no token.
        return RedirectResponse(self._url(f"/_blobs/{repo.full_name}/{request.path_params['id']}"), status_code=302)

    async def artifact_blob(self, request: Request) -> Response:
        repo = self.repos[f"{request.path_params['owner']}/{request.path_params['name']}"]
        for artifacts in repo.artifacts.values():
            for art_id, _, data in artifacts:
                if art_id == request.path_params["id"]:
                    return Response(data, media_type="application/zip")
        return JSONResponse({"message": "Not Found"}, status_code=404)

    def add_artifact(self, full_name: str, run_id: int, name: str, data: bytes) -> None:
        self.repos[full_name].artifacts.setdefault(run_id, []).append((next(self._ids), name, data))


@contextmanager
def serve(app, port: int = 0) -> Iterator[str]:
    """Run an ASGI app under uvicorn on a loopback port in a background thread; yields its base URL."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{bound}"
    finally:
        server.should_exit = True
        thread.join(20)
