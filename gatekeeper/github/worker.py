"""Worker threads that drain the SQLite queue. Retries transient failures with backoff, renews a rejected
token at once, and turns a permanent failure into a neutral check with the reason."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading

from github.GithubException import GithubException

from gatekeeper.github.client import GitHubApp
from gatekeeper.github.config import AppConfig
from gatekeeper.github.context import AppContext, Progress
from gatekeeper.github.failures import Failure, classify, describe
from gatekeeper.github.handlers import handle
from gatekeeper.github.reconcile import Reconciler
from gatekeeper.github.review import report_undecided
from gatekeeper.github.store import Job, Store

log = logging.getLogger(__name__)

# How often idle workers look for work nothing woke them for: deliveries taken in by the web process (the
# worker process gets no other signal of them) and retries whose backoff has passed.
IDLE_POLL_S = 0.1


class Worker:
    def __init__(self, ctx: AppContext):
        self._ctx = ctx
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self._ctx.config.workers):
            thread = threading.Thread(target=self._loop, name=f"gatekeeper-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._ctx.store.wake_all()
        for thread in self._threads:
            thread.join(timeout)

    def alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def _loop(self) -> None:
        store = self._ctx.store
        try:
            while not self._stop.is_set():
                job = store.claim()
                if job is None:
                    store.wait_for_work(IDLE_POLL_S)
                    continue
                self.run(job)
        finally:
            store.close()

    def run(self, job: Job) -> None:
        progress = Progress()
        try:
            outcome = handle(self._ctx, job, progress)
        except Exception as exc:  # noqa: BLE001 - every failure is classified and reported, none is dropped
            self._failed(job, progress, exc)
        else:
            self._ctx.store.finish(job.delivery_id, outcome)
            log.info("delivery %s (%s.%s): %s", job.delivery_id, job.event, job.action, outcome)

    def _failed(self, job: Job, progress: Progress, exc: Exception) -> None:
        config, store = self._ctx.config, self._ctx.store
        kind, reason = classify(exc), describe(exc)
        if kind is Failure.token_rejected and progress.installation_id is not None:
            self._ctx.github.tokens.invalidate(progress.installation_id)
        if kind is not Failure.permanent and job.attempts < config.max_attempts:
            # A rejected token is retried at once with a fresh one; GitHub trouble waits longer each time.
            delay = 0.0 if kind is Failure.token_rejected else config.retry_backoff_s * 2 ** (job.attempts - 1)
            log.warning("delivery %s attempt %d: %s; retrying in %.1fs", job.delivery_id, job.attempts, reason, delay)
            store.retry_later(job.delivery_id, delay, reason)
            return
        if kind is not Failure.permanent:
            reason = f"{reason} (gave up after {job.attempts} attempts)"
        if kind is Failure.permanent and not isinstance(exc, GithubException):  # a bug: keep the traceback
            log.exception("delivery %s failed", job.delivery_id, exc_info=exc)
        reported = False
        try:
            reported = report_undecided(self._ctx, progress, reason)
        except Exception as report_exc:  # noqa: BLE001 - GitHub may be the very thing that is down
            reason += f"; and the neutral check could not be posted: {describe(report_exc)}"
        store.fail(job.delivery_id, reason, progress.repo, progress.pr, progress.head_sha,
                   conclusion="neutral" if reported else None, check_run_id=progress.check_run_id)
        log.error("delivery %s (%s) failed: %s", job.delivery_id, job.event, reason)


class WorkerProcess:
    """The workers in a child process of the web server, so that evaluations (CPU-bound Python) never hold
    the GIL that acknowledging webhooks needs. Both processes share the SQLite queue (WAL allows it).

    The child dies with its parent: a SIGKILLed server must not leave a worker finishing jobs that the
    restarted server has already queued again."""

    def __init__(self, config: AppConfig):
        self._config = config
        self._process: multiprocessing.process.BaseProcess | None = None

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no inherited event loop, threads or sockets
        # The dump masks the webhook secret, and that is right: workers never verify webhooks.
        self._process = ctx.Process(target=run_worker_process, args=(self._config.model_dump_json(), os.getpid()),
                                    name="gatekeeper-workers", daemon=True)
        self._process.start()

    def stop(self, timeout: float = 15.0) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.terminate()  # SIGTERM: finish the jobs in hand, take no new ones
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()

    def alive(self) -> int:
        return self._config.workers if self._process is not None and self._process.is_alive() else 0


def run_worker_process(config_json: str, server_pid: int) -> None:
    """Entry point of the worker process."""
    _die_with_parent()
    if os.getppid() != server_pid:  # the server died before the line above took effect
        return
    config = AppConfig.model_validate_json(config_json)
    store = Store(config.db_path, config.db_synchronous)
    ctx = AppContext(config, store, GitHubApp(config))
    worker, reconciler = Worker(ctx), Reconciler(ctx)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    worker.start()
    reconciler.start()
    while not stop.wait(0.5):
        if os.getppid() != server_pid:  # the server is gone (where PR_SET_PDEATHSIG is not available)
            break
    reconciler.stop()
    worker.stop()


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
