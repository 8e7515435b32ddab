"""The delivery queue in the App's database: webhooks waiting to be judged, the leases of the ones being
judged, and the heartbeats that renew them.

Several servers may share the database (one SQLite file on one machine; one PostgreSQL database across
machines): a worker leases each delivery it claims and renews the lease while it runs, so a job is taken over
only when its server stopped renewing it (crashed, or hung).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from gatekeeper.github.db import Connection, Database, upsert
from gatekeeper.github.records import insert_audit

log = logging.getLogger(__name__)

# A claimable delivery: queued and due, or running under a lease that was not renewed in time. A running row
# from before leases (no lease_until) counts as expired: its server was the only one, and is gone.
_READY = "status = 'queued' AND available_at <= ?"
_EXPIRED = "status = 'running' AND COALESCE(lease_until, 0) <= ?"


def new_owner() -> str:
    """A lease owner id, unique per worker process; host and pid say whose lease it was in a takeover."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class Job:
    delivery_id: str
    event: str
    action: str | None
    payload: bytes
    attempts: int  # including the current one


@dataclass(frozen=True)
class Heartbeat:
    pid: int
    threads: int | None
    at: float


class DeliveryQueue:
    """A claim belongs to the thread that made it: only that thread can finish, retry or fail it, and only while
    this queue's owner still holds the lease of that very attempt."""

    def __init__(self, db: Database, lease_s: float = 60.0, owner: str | None = None):
        self.db = db
        self.lease_s = lease_s
        self.owner = owner or new_owner()
        self._held: set[tuple[str, int]] = set()  # (delivery id, attempt) claimed here, renewed by heartbeat()
        self._held_lock = threading.Lock()
        self._local = threading.local()  # each thread's claims
        self._ready = threading.Condition()

    # ------------------------------------------------------------------------------------------ heartbeats

    def ping(self, now: float | None = None) -> None:
        """Prove the database takes writes (healthz): a SELECT still answers on a read-only file or a full
        disk, where no webhook could be acknowledged. Raises the database's Error when it does not."""
        now = time.time() if now is None else now
        with self.db.transaction() as db:
            self._beat(db, "web", None, now)
            db.execute("DELETE FROM heartbeats WHERE at < ?", (now - 86400,))  # servers long gone

    def heartbeat(self, threads: int, now: float | None = None) -> None:
        """The workers are alive (`threads` of them): say so, and renew the leases of the jobs they hold."""
        now = time.time() if now is None else now
        with self._held_lock:
            held = list(self._held)
        with self.db.transaction() as db:
            self._beat(db, "workers", threads, now)
            db.executemany(
                "UPDATE deliveries SET lease_until = ? WHERE id = ? AND attempts = ? AND lease_owner = ?"
                " AND status = 'running'",
                [(now + self.lease_s, delivery_id, attempts, self.owner) for delivery_id, attempts in held])

    def _beat(self, db: Connection, role: str, threads: int | None, now: float) -> None:
        upsert(db, "heartbeats", ("owner", "role"), owner=self.owner, role=role, pid=os.getpid(), threads=threads,
               at=now)

    def worker_heartbeats(self, since: float) -> list[Heartbeat]:
        """The worker processes, of any server, that beat at `since` or later."""
        rows = self.db.connection().execute(
            "SELECT pid, threads, at FROM heartbeats WHERE role = 'workers' AND at >= ?", (since,)).fetchall()
        return [Heartbeat(row["pid"], row["threads"], row["at"]) for row in rows]

    def last_heartbeat(self, owner: str) -> Heartbeat | None:
        row = self.db.connection().execute(
            "SELECT pid, threads, at FROM heartbeats WHERE owner = ? AND role = 'workers'", (owner,)).fetchone()
        return Heartbeat(row["pid"], row["threads"], row["at"]) if row else None

    # ------------------------------------------------------------------------------------------ deliveries

    def enqueue(self, delivery_id: str, event: str, action: str | None, payload: bytes,
                now: float | None = None, available_at: float | None = None) -> bool:
        """Store a delivery, to run from `available_at` (default: now). False if this delivery id was seen
        before (a redelivery: no extra work)."""
        now = time.time() if now is None else now
        with self.db.transaction() as db:
            cur = db.execute(
                "INSERT INTO deliveries (id, event, action, payload, available_at, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (delivery_id, event, action, payload, now if available_at is None else available_at, now),
            )
            new = cur.rowcount == 1
        if new:
            with self._ready:
                self._ready.notify()
        return new

    def wait_for_work(self, timeout: float) -> None:
        with self._ready:
            self._ready.wait(timeout)

    def wake_all(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def claim(self, now: float | None = None) -> Job | None:
        """Lease the next delivery to this owner, atomically: one whose lease expired first (it is the oldest
        work), else the oldest ready one. The lease lasts `lease_s` unless `heartbeat` renews it. Concurrent
        claimers never get the same delivery: SQLite lets one writer in at a time, PostgreSQL locks the row
        chosen and lets the others skip it (FOR UPDATE SKIP LOCKED)."""
        now = time.time() if now is None else now
        # Look before taking the write lock: idle workers polling must not hold up webhook acknowledgements.
        if self._next(self.db.connection(), now, lock="") is None:
            return None
        with self.db.transaction() as db:
            found = self._next(db, now, lock=self.db.claim_lock)
            if found is None:
                return None
            row = db.execute(
                "UPDATE deliveries SET status = 'running', attempts = attempts + 1, lease_owner = ?,"
                " lease_until = ? WHERE id = ? RETURNING id, event, action, payload, attempts",
                (self.owner, now + self.lease_s, found["id"]),
            ).fetchone()
        job = Job(row["id"], row["event"], row["action"], bytes(row["payload"]), row["attempts"])
        if found["status"] == "running":
            log.warning("took over delivery %s (attempt %d) from %s, whose lease expired %.0f s ago",
                        job.delivery_id, job.attempts, found["lease_owner"] or "a server from before leases",
                        now - (found["lease_until"] or now))
        self._claims()[job.delivery_id] = job.attempts
        with self._held_lock:
            self._held.add((job.delivery_id, job.attempts))
        return job

    @staticmethod
    def _next(db: Connection, now: float, lock: str) -> Any:
        # Two queries, not one with OR: each is an index range on deliveries_ready. Ties in available_at go
        # by delivery id: an order both databases keep (SQLite's rowid would be the arrival order).
        return (db.execute(f"SELECT id, status, lease_owner, lease_until FROM deliveries WHERE {_EXPIRED}"
                           f" ORDER BY lease_until LIMIT 1{lock}", (now,)).fetchone()
                or db.execute(f"SELECT id, status, lease_owner, lease_until FROM deliveries WHERE {_READY}"
                              f" ORDER BY available_at, received_at, id LIMIT 1{lock}", (now,)).fetchone())

    def finish(self, delivery_id: str, outcome: str) -> bool:
        """Mark the delivery done. False (and nothing changes) if this thread's lease on it was lost."""
        with self.db.transaction() as db:
            return self._settle(db, delivery_id, "status = 'done', outcome = ?, error = NULL, finished_at = ?",
                                (outcome, time.time()))

    def retry_later(self, delivery_id: str, delay_s: float, error: str) -> bool:
        """Queue the delivery again after `delay_s`. False (and nothing changes) if the lease was lost."""
        with self.db.transaction() as db:
            return self._settle(db, delivery_id, "status = 'queued', available_at = ?, error = ?",
                                (time.time() + delay_s, error))

    def fail(self, delivery_id: str, error: str, repo: str | None = None, pr: int | None = None,
             head_sha: str | None = None, **audit_fields: Any) -> bool:
        """Give up on a delivery; its audit row commits with it, so no reader sees one without the other.
        False (and nothing is written) if the lease was lost: the delivery is its new holder's to judge."""
        now = time.time()
        with self.db.transaction() as db:
            if not self._settle(db, delivery_id, "status = 'failed', error = ?, finished_at = ?", (error, now)):
                return False
            insert_audit(db, "error", repo, pr, head_sha, at=now, reason=error, delivery_id=delivery_id,
                         **audit_fields)
        return True

    def _settle(self, db: Connection, delivery_id: str, assignments: str, params: tuple) -> bool:
        """Apply the end of an attempt, only if this thread still holds the lease of that very attempt."""
        attempts = self.abandon(delivery_id)
        settled = attempts is not None and db.execute(
            f"UPDATE deliveries SET {assignments} WHERE id = ? AND attempts = ? AND lease_owner = ?"
            " AND status = 'running'", (*params, delivery_id, attempts, self.owner)).rowcount == 1
        if not settled:
            log.warning("delivery %s: this worker no longer holds its lease (it expired and another worker took "
                        "the job over); this attempt's result is dropped", delivery_id)
        return settled

    def holds(self, delivery_id: str) -> bool:
        """Whether this thread still holds the lease of its attempt at the delivery."""
        attempts = self._claims().get(delivery_id)
        return attempts is not None and self.db.connection().execute(
            "SELECT 1 FROM deliveries WHERE id = ? AND attempts = ? AND lease_owner = ? AND status = 'running'",
            (delivery_id, attempts, self.owner)).fetchone() is not None

    def abandon(self, delivery_id: str) -> int | None:
        """Stop renewing this thread's claim (its attempt number, None if it holds none): unless settled, the
        delivery is taken over once its lease expires."""
        attempts = self._claims().pop(delivery_id, None)
        with self._held_lock:
            self._held.discard((delivery_id, attempts))
        return attempts

    def _claims(self) -> dict[str, int]:
        """This thread's claims: delivery id -> attempt."""
        claims = getattr(self._local, "claims", None)
        if claims is None:
            claims = self._local.claims = {}
        return claims

    def expire_leases(self, now: float | None = None) -> int:
        """At shutdown: the jobs still held here may be taken over at once, not a lease later."""
        now = time.time() if now is None else now
        with self._held_lock:
            held, self._held = list(self._held), set()
        with self.db.transaction() as db:
            return sum(db.execute("UPDATE deliveries SET lease_until = ? WHERE id = ? AND attempts = ?"
                                  " AND lease_owner = ? AND status = 'running'",
                                  (now, delivery_id, attempts, self.owner)).rowcount
                       for delivery_id, attempts in held)

    def delivery(self, delivery_id: str) -> dict[str, Any] | None:
        row = self.db.connection().execute(
            "SELECT id, event, action, status, attempts, outcome, error, lease_owner, lease_until"
            " FROM deliveries WHERE id = ?", (delivery_id,),
        ).fetchone()
        return dict(row) if row else None

    def counts(self) -> dict[str, int]:
        rows = self.db.connection().execute("SELECT status, COUNT(*) AS n FROM deliveries GROUP BY status").fetchall()
        return {r["status"]: r["n"] for r in rows}
