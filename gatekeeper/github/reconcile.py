"""The reconciliation sweep: webhooks get lost (the App was down past GitHub's retries, a delivery failed).
Every open PR of every installation whose head has no gatekeeper check run gets a review queued."""

from __future__ import annotations

import json
import logging
import threading

from gatekeeper.github.checkrun import NAME_PREFIX
from gatekeeper.github.context import AppContext
from gatekeeper.github.handlers import SWEEP_EVENT

log = logging.getLogger(__name__)


def sweep(ctx: AppContext) -> int:
    """Queue a review for each open PR head without our check run; returns how many were queued."""
    queued = 0
    for installation_id in ctx.github.installation_ids():
        gh = ctx.github.installation(installation_id)
        for repo in gh.repositories():
            for number, head_sha in gh.open_pull_requests(repo):
                if gh.has_check_run(repo, head_sha, NAME_PREFIX, ctx.config.app_id):
                    continue
                payload = json.dumps({"installation_id": installation_id, "repo": repo, "pr": number}).encode()
                # The id makes the sweep idempotent too: one synthetic delivery per head.
                if ctx.queue.enqueue(f"sweep:{repo}#{number}@{head_sha}", SWEEP_EVENT, None, payload):
                    queued += 1
    return queued


class Reconciler:
    """Runs `sweep` every `reconcile_interval_s` seconds in a background thread."""

    def __init__(self, ctx: AppContext):
        self._ctx = ctx
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._ctx.config.reconcile_interval_s <= 0:
            return
        self._thread = threading.Thread(target=self._loop, name="gatekeeper-reconcile", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(self._ctx.config.reconcile_interval_s):
            try:
                queued = sweep(self._ctx)
                if queued:
                    log.info("reconciliation queued %d review(s)", queued)
            except Exception:  # noqa: BLE001 - a failed sweep is logged and tried again next interval
                log.exception("reconciliation sweep failed")
        self._ctx.queue.db.close()
