"""Worker threads that drain the queue. Retries transient failures with backoff, renews a rejected
token at once, and turns a permanent failure into a failed check ("Could not evaluate") with the reason."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time

from github.GithubException import GithubException

from gatekeeper.github.client import GitHubApp
from gatekeeper.github.config import AppConfig
from gatekeeper.github.context import AppContext, Progress
from gatekeeper.github.failures import Failure, classify, describe
from gatekeeper.github.handlers import handle
from gatekeeper.github.reconcile import Reconciler
from gatekeeper.github.records import Records
from gatekeeper.github.review import report_error
from gatekeeper.github.db import open_database
from gatekeeper.github.queue import DeliveryQueue, Job, new_owner

log = logging.getLogger(__name__)

# How often idle workers look for work nothing woke them for: deliveries taken in by the web process (the
# worker process gets no other signal of them) and retries whose backoff has passed.
IDLE_POLL_S = 0.1
# How often the workers write their heartbeat (what /healthz reads) and renew the leases of their jobs.
HEARTBEAT_S = 1.0


def heartbeat_interval(config: AppConfig) -> float:
    """At least three beats per lease, so that a lease outlives a beat or two delayed by a busy database."""
    return min(HEARTBEAT_S, config.job_lease_s / 3)


class Worker:
    def __init__(self, ctx: AppContext):
        self._ctx = ctx
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._heartbeat: threading.Thread | None = None
        self.owner = ctx.queue.owner  # the id of its leases and heartbeat
        self.started_at = time.time()

    def start(self) -> None:
        for i in range(self._ctx.config.workers):
            thread = threading.Thread(target=self._loop, name=f"gatekeeper-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._beat()  # before start() returns: the server is healthy as soon as it answers
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="gatekeeper-heartbeat", daemon=True)
        self._heartbeat.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._ctx.queue.wake_all()
        for thread in self._threads + ([self._heartbeat] if self._heartbeat else []):
            thread.join(timeout)
        try:  # jobs not finished by now are abandoned: another server may take them at once, not a lease later
            expired = self._ctx.queue.expire_leases()
        except self._ctx.queue.db.Error as exc:
            log.warning("could not hand over the unfinished jobs (taken over when their leases expire): %s", exc)
        else:
            if expired:
                log.warning("stopped with %d delivery(ies) unfinished; another worker may take them over", expired)

    def alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    def exitcode(self) -> int | None:
        return None  # threads of this process: they cannot exit without it

    def _heartbeat_loop(self) -> None:
        try:
            while not self._stop.wait(heartbeat_interval(self._ctx.config)):
                self._beat()
        finally:
            self._ctx.queue.db.close()

    def _beat(self) -> None:
        try:
            self._ctx.queue.heartbeat(self.alive())
        except self._ctx.queue.db.Error as exc:  # healthz sees the heartbeat age; the leases expire if this goes on
            log.warning("heartbeat not recorded: %s", exc)

    def _loop(self) -> None:
        queue = self._ctx.queue
        try:
            while not self._stop.is_set():
                try:
                    job = queue.claim()
                except queue.db.Error as exc:  # a locked or broken database must not end the thread for good
                    log.warning("could not claim a delivery: %s", exc)
                    self._stop.wait(1.0)
                    continue
                if job is None:
                    queue.wait_for_work(IDLE_POLL_S)
                    continue
                try:
                    self.run(job)
                except Exception:  # noqa: BLE001 - recording the outcome failed (the database): keep the thread
                    log.exception("delivery %s: outcome not recorded; it runs again when its lease expires",
                                  job.delivery_id)
                    queue.abandon(job.delivery_id)
        finally:
            queue.db.close()

    def run(self, job: Job) -> None:
        limit = self._ctx.config.max_attempts
        if job.attempts > limit:  # only a takeover gets here: earlier attempts' workers died mid-job
            self._ctx.queue.fail(job.delivery_id, f"gave up: attempt {job.attempts} of at most {limit}; the "
                                                  "earlier attempts were interrupted (their worker died)")
            return
        progress = Progress()
        try:
            outcome = handle(self._ctx, job, progress)
        except Exception as exc:  # noqa: BLE001 - every failure is classified and reported, none is dropped
            self._failed(job, progress, exc)
        else:
            if self._ctx.queue.finish(job.delivery_id, outcome):  # False: the lease was lost (logged)
                log.info("delivery %s (%s.%s): %s", job.delivery_id, job.event, job.action, outcome)

    def _failed(self, job: Job, progress: Progress, exc: Exception) -> None:
        config, queue = self._ctx.config, self._ctx.queue
        kind, reason = classify(exc), describe(exc)
        if kind is Failure.token_rejected and progress.installation_id is not None:
            self._ctx.github.tokens.invalidate(progress.installation_id)
        if kind is not Failure.permanent and job.attempts < config.max_attempts:
            # A rejected token is retried at once with a fresh one; GitHub trouble waits longer each time.
            delay = 0.0 if kind is Failure.token_rejected else config.retry_backoff_s * 2 ** (job.attempts - 1)
            log.warning("delivery %s attempt %d: %s; retrying in %.1fs", job.delivery_id, job.attempts, reason, delay)
            queue.retry_later(job.delivery_id, delay, reason)
            return
        if kind is not Failure.permanent:
            reason = f"{reason} (gave up after {job.attempts} attempts)"
        if kind is Failure.permanent and not isinstance(exc, GithubException):  # a bug: keep the traceback
            log.exception("delivery %s failed", job.delivery_id, exc_info=exc)
        reported = False
        try:  # a worker whose lease was taken over leaves the reporting to the job's new holder
            reported = queue.holds(job.delivery_id) and report_error(self._ctx, progress, reason)
        except Exception as report_exc:  # noqa: BLE001 - GitHub may be the very thing that is down
            reason += f"; and the failed check could not be posted: {describe(report_exc)}"
        queue.fail(job.delivery_id, reason, progress.repo, progress.pr, progress.head_sha,
                   conclusion="failure" if reported else None, check_run_id=progress.check_run_id)
        log.error("delivery %s (%s) failed: %s", job.delivery_id, job.event, reason)


class WorkerProcess:
    """The workers in a child process of the web server, so that evaluations (CPU-bound Python) never hold
    the GIL that acknowledging webhooks needs. Both processes share the database's queue.

    The child dies with its parent: a SIGKILLed server must not leave a worker finishing jobs that the
    restarted server has already queued again."""

    def __init__(self, config: AppConfig):
        self._config = config
        self._process: multiprocessing.process.BaseProcess | None = None
        self.owner = new_owner()  # given to the child: healthz finds its heartbeat under this id
        self.started_at = time.time()

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")  # no inherited event loop, threads or sockets
        # The dump masks the webhook secret, and that is right: workers never verify webhooks.
        self._process = ctx.Process(target=run_worker_process,
                                    args=(self._config.model_dump_json(), os.getpid(), self.owner),
                                    name="gatekeeper-workers", daemon=True)
        self.started_at = time.time()
        self._process.start()

    def stop(self, timeout: float = 15.0) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.terminate()  # SIGTERM: finish the jobs in hand, take no new ones
            self._process.join(timeout)
            if self._process.is_alive():
                self._process.kill()

    def exitcode(self) -> int | None:
        """None while the worker process runs (or before it started); negative: killed by that signal."""
        return None if self._process is None else self._process.exitcode


def run_worker_process(config_json: str, server_pid: int, owner: str) -> None:
    """Entry point of the worker process."""
    _die_with_parent()
    if os.getppid() != server_pid:  # the server died before the line above took effect
        return
    run_workers(AppConfig.model_validate_json(config_json), owner, server_pid)


def run_workers(config: AppConfig, owner: str | None = None, parent_pid: int | None = None) -> None:
    """The worker threads and the reconciler in this process, until SIGTERM or SIGINT (or, given
    `parent_pid`, until that process is gone): the worker process of `gatekeeper serve`, or all of
    `gatekeeper serve --role workers`."""
    db = open_database(config.db_path, config.db_synchronous)
    ctx = AppContext(config, DeliveryQueue(db, config.job_lease_s, owner), Records(db), GitHubApp(config))
    worker, reconciler = Worker(ctx), Reconciler(ctx)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):  # finish the jobs in hand, take no new ones
        signal.signal(signum, lambda *_: stop.set())
    worker.start()
    reconciler.start()
    while not stop.wait(0.5):
        if parent_pid is not None and os.getppid() != parent_pid:  # the server is gone (no PR_SET_PDEATHSIG)
            break
    reconciler.stop()
    worker.stop()


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
