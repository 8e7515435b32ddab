"""Shared pieces of the App tests: constants, the App under uvicorn with a signing webhook sender, and
builders for the fake's repository state."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from gatekeeper.github.config import AppConfig
from gatekeeper.github.signature import sign
from gatekeeper.github.db import open_database
from gatekeeper.github.queue import DeliveryQueue
from gatekeeper.github.records import Records

from fake_github import FakeCommit, FakeGitHub, FakePull, FakeRepo, webhook_example

APP_ID = 29310  # the app id in the octokit payload examples
SECRET = "test-webhook-secret"
REPO = "Codertocat/Hello-World"  # the repository of the octokit payload examples
INSTALLATION = 1

# The test runs once on SQLite and once on PostgreSQL (the `store` fixture in conftest.py).
both_stores = pytest.mark.parametrize("store", ["sqlite", "postgres"], indirect=True)


@contextlib.contextmanager
def fresh_schema(url: str, prefix: str = "test") -> Iterator[str]:
    """A new, empty schema of the PostgreSQL server at `url`, dropped afterwards: the URL it yields picks it
    by search_path, so every process given that URL (the App's worker processes too) sees the same tables,
    and no other test's or run's."""
    import psycopg

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


def make_config(rsa_keys, fake: FakeGitHub, tmp_path: Path, **overrides: Any) -> AppConfig:
    values = dict(app_id=APP_ID, private_key_path=rsa_keys[0], webhook_secret=SECRET,
                  db_path=tmp_path / "gatekeeper.sqlite3", github_api_url=fake.base_url, workers=2,
                  retry_backoff_s=0.05, http_backoff_s=0.01, http_retries=3, reconcile_interval_s=0,
                  seconds_between_requests=0, seconds_between_writes=0)
    values.update(overrides)
    return AppConfig(**values)


@dataclass
class RunningApp:
    url: str
    config: AppConfig
    client: httpx.Client
    asgi: Starlette | None = None  # the App itself: its state holds the queue and the health checks

    def send(self, event: str, payload: dict[str, Any] | bytes, delivery: str | None = None,
             secret: str = SECRET, headers: dict[str, str] | None = None) -> httpx.Response:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        all_headers = {"Content-Type": "application/json", "X-GitHub-Event": event,
                       "X-GitHub-Delivery": delivery or str(uuid.uuid4()), "X-Hub-Signature-256": sign(secret, body),
                       "User-Agent": "GitHub-Hookshot/test"}
        all_headers.update(headers or {})
        return self.client.post(self.url + "/webhook", content=body, headers=all_headers)

    def queue(self) -> DeliveryQueue:
        return DeliveryQueue(open_database(self.config.db_path))

    def records(self) -> Records:
        return Records(open_database(self.config.db_path))

    def wait_healthy(self, timeout: float = 30.0) -> dict[str, Any]:
        """Block until /healthz answers 200 (a worker process reports once it has started); returns its body."""
        deadline = time.monotonic() + timeout
        while True:
            response = self.client.get(self.url + "/healthz")
            if response.status_code == 200 or time.monotonic() > deadline:
                assert response.status_code == 200, response.text
                return response.json()
            time.sleep(0.05)

    def wait_done(self, delivery: str, timeout: float = 15.0) -> dict[str, Any]:
        """Block until the delivery is finished or failed (bounded); returns its row."""
        queue = self.queue()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                row = queue.delivery(delivery)
                if row is not None and row["status"] in ("done", "failed"):
                    return row
                time.sleep(0.02)
        finally:
            queue.db.close()
        raise AssertionError(f"delivery {delivery} not processed within {timeout}s: {row}")


AGENT_COMMIT = "Speed up decode\n\nCo-authored-by: Claude <noreply@anthropic.com>\n"

POLICY = """\
version: 1
name: kimi-k3
owned_paths: ["kimi_k3_path/**"]
touchpoints:
  - path: vllm/model_executor/models/registry.py
    max_added: 2
    max_removed: 0
    reason: register the model
"""


def patch_for(lines: int, start: int = 1) -> str:
    return f"@@ -0,0 +{start},{lines} @@\n" + "".join(f"+line {i}\n" for i in range(lines))


def file_entry(path: str, added: int = 3, status: str = "added") -> dict[str, Any]:
    return {"filename": path, "status": status, "additions": added, "deletions": 0, "patch": patch_for(added)}


def setup_repo(repo: FakeRepo, base_sha: str, policy: str = POLICY) -> None:
    repo.trees[base_sha] = {".github/gatekeeper.yml": policy}


OPENED = webhook_example("pull_request.opened")  # PR #2 of Codertocat/Hello-World
HEAD = OPENED["pull_request"]["head"]["sha"]
BASE = OPENED["pull_request"]["base"]["sha"]


def setup_pull(fake: FakeGitHub, files: list[dict[str, Any]] | None = None, agent: bool = True) -> FakeRepo:
    """PR #2 at HEAD over BASE (which holds POLICY); by default one owned file and an agent commit."""
    repo = fake.repos[REPO]
    setup_repo(repo, BASE)
    repo.pulls[2] = FakePull(2, HEAD, BASE, files or [file_entry("kimi_k3_path/ops.py")],
                             [FakeCommit(HEAD, AGENT_COMMIT)] if agent else [])
    return repo


def comment_event(body: str, login: str, number: int = 2) -> dict[str, Any]:
    """The issue_comment.created example as a comment by `login` on PR `number` of REPO."""
    event = webhook_example("issue_comment.created")
    event["issue"]["number"] = number
    event["issue"]["pull_request"] = {"url": f"https://api.github.com/repos/{REPO}/pulls/{number}"}
    event["comment"]["body"] = body
    event["comment"]["user"]["login"] = login
    event["installation"] = {"id": INSTALLATION}
    return event


def judge_opened(app: RunningApp, delivery: str = "d-opened") -> dict[str, Any]:
    """Send the signed pull_request.opened example and wait until it is processed."""
    app.send("pull_request", OPENED, delivery=delivery)
    return app.wait_done(delivery)
