"""What GET /healthz checks. A server can answer HTTP while nothing works: the database refuses writes (no
webhook can be acknowledged), the workers died or hang (nothing is judged), or GitHub rejects the App's JWT
(no token, so no check run). Each of these makes it 503 with the reasons."""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from github import Auth, GithubIntegration
from github.GithubException import GithubException

from gatekeeper.github.config import AppConfig
from gatekeeper.github.queue import DeliveryQueue, Heartbeat
from gatekeeper.github.worker import heartbeat_interval

# The workers are stuck or gone when their last heartbeat is older than this, or three beats if longer.
STALE_HEARTBEAT_MIN_S = 5.0
GITHUB_TIMEOUT_S = 5  # a health probe must answer before the load balancer gives up on it


class Workers(Protocol):
    owner: str  # whose heartbeat to read
    started_at: float

    def exitcode(self) -> int | None: ...


class GitHubCheck:
    """Does GitHub accept the App's JWT? Asked at most once per `health_github_check_s`, since /healthz is
    polled often and GitHub rate-limits the App; the answer, good or bad, is kept that long."""

    def __init__(self, config: AppConfig):
        self._every = config.health_github_check_s
        self._integration = GithubIntegration(
            auth=Auth.AppAuth(config.app_id, config.private_key()), base_url=config.github_api_url,
            timeout=GITHUB_TIMEOUT_S, per_page=1, seconds_between_requests=None, seconds_between_writes=None)
        self._lock = threading.Lock()
        self._asked_at = float("-inf")
        self._answer: tuple[str | None, str | None] = (None, None)

    def __call__(self) -> tuple[str | None, str | None]:
        """(why the server is unhealthy, a warning); (None, None) when GitHub took the JWT or the check is off."""
        if self._every <= 0:
            return None, None
        with self._lock:  # one question at a time: concurrent probes wait for its answer
            if time.monotonic() - self._asked_at >= self._every:
                self._answer, self._asked_at = self._ask(), time.monotonic()
            return self._answer

    def _ask(self) -> tuple[str | None, str | None]:
        try:
            self._integration.get_installations().get_page(0)  # GET /app/installations?per_page=1
        except GithubException as exc:
            if exc.status in (401, 403):
                message = exc.data.get("message") if isinstance(exc.data, dict) else None
                return (f"GitHub rejects the App's JWT ({exc.status} {message or ''}".rstrip()
                        + "): check app_id and the private key", None)
            return None, f"GitHub answered {exc.status} to the App's JWT check"
        except Exception as exc:  # noqa: BLE001 - a network failure is GitHub's or the network's, see below
            # Not a 503: GitHub being unreachable is no fault of this server, and a load balancer would take
            # every server out and lose the webhooks GitHub still sends. The jobs retry GitHub on their own.
            return None, f"GitHub could not be reached for the App's JWT check: {type(exc).__name__}"
        return None, None


class Health:
    """`workers`: this server's own (a worker process, or threads); None for a web-only server, which
    reports the live worker processes of all servers on the database instead."""

    def __init__(self, config: AppConfig, queue: DeliveryQueue, workers: Workers | None):
        self._queue = queue
        self._workers = workers
        self._github = GitHubCheck(config)
        self._stale_after_s = max(STALE_HEARTBEAT_MIN_S, 3 * heartbeat_interval(config))

    def report(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body). Blocking (database writes, at times one GitHub request): run it in a thread."""
        reasons: list[str] = []
        body: dict[str, Any] = {}
        try:
            self._queue.ping()
        except self._queue.db.Error as exc:
            reasons.append(f"the database does not take writes: {exc}")
        warnings: list[str] = []
        exitcode = self._workers.exitcode() if self._workers is not None else None
        if exitcode is not None:
            reasons.append(f"worker process exited (exit code {exitcode})")
        try:
            if self._workers is None:
                live = self._queue.worker_heartbeats(since=time.time() - self._stale_after_s)
            else:
                beat = self._queue.last_heartbeat(self._workers.owner)
            body["queue"] = self._queue.counts()
        except self._queue.db.Error as exc:
            reasons.append(f"the database cannot be read: {exc}")
        else:
            if self._workers is None:
                # Not a 503: this server takes webhooks in as it should, and a load balancer that took every
                # web server out would lose them; the deliveries wait in the queue for a worker.
                body["workers"], body["worker_processes"] = sum(b.threads or 0 for b in live), len(live)
                if not live:
                    warnings.append(f"no worker process has beaten in the last {self._stale_after_s:.0f} s: "
                                    "the deliveries wait in the queue until one runs")
            else:
                body["workers"] = beat.threads if beat else 0
                if exitcode is None:
                    reasons += self._heartbeat_problems(beat)
        problem, warning = self._github()
        reasons += [problem] if problem else []
        warnings += [warning] if warning else []
        body.update({"warnings": warnings} if warnings else {})
        if reasons:
            return 503, {"status": "unhealthy", "reasons": reasons, **body}
        return 200, {"status": "ok", **body}

    def _heartbeat_problems(self, beat: Heartbeat | None) -> list[str]:
        if beat is None:
            waited = time.time() - self._workers.started_at
            return [f"no heartbeat from the workers yet ({waited:.0f} s after they were started)"]
        age = time.time() - beat.at
        if age > self._stale_after_s:
            return [f"no heartbeat from the workers for {age:.0f} s"]
        return [] if beat.threads else ["no worker thread is alive"]
