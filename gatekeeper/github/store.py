"""The App's durable state in one SQLite database (WAL): the delivery queue, idempotency records, check-run
ids, overrides, evidence received from CI, and the audit log.

Every acknowledged webhook is committed here before the 2xx goes back, so a crash loses nothing. Several
servers on one machine may share the database: a worker leases each delivery it claims and renews the lease
while it runs, so a job is taken over only when its server stopped renewing it (crashed, or hung).
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    id TEXT PRIMARY KEY,              -- X-GitHub-Delivery, or a synthetic id for sweeps
    event TEXT NOT NULL,
    action TEXT,
    payload BLOB NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'done', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    available_at REAL NOT NULL,
    received_at REAL NOT NULL,
    finished_at REAL,
    outcome TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS deliveries_ready ON deliveries (status, available_at);
CREATE TABLE IF NOT EXISTS heartbeats (
    owner TEXT NOT NULL,              -- a lease owner (see new_owner)
    role TEXT NOT NULL,               -- workers: written by the worker threads | web: a /healthz write probe
    pid INTEGER NOT NULL, threads INTEGER, at REAL NOT NULL,
    PRIMARY KEY (owner, role)
);
CREATE TABLE IF NOT EXISTS evaluations (
    repo TEXT NOT NULL, pr INTEGER NOT NULL, head_sha TEXT NOT NULL,
    policy_sha256 TEXT NOT NULL, inputs_sha256 TEXT NOT NULL,
    check_run_id INTEGER, conclusion TEXT NOT NULL, evaluated_at REAL NOT NULL,
    PRIMARY KEY (repo, pr, head_sha, policy_sha256, inputs_sha256)
);
CREATE TABLE IF NOT EXISTS check_runs (
    repo TEXT NOT NULL, head_sha TEXT NOT NULL, name TEXT NOT NULL, check_run_id INTEGER NOT NULL,
    PRIMARY KEY (repo, head_sha, name)
);
CREATE TABLE IF NOT EXISTS overrides (
    repo TEXT NOT NULL, pr INTEGER NOT NULL, head_sha TEXT NOT NULL,
    actor TEXT NOT NULL, reason TEXT NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (repo, pr, head_sha)
);
CREATE TABLE IF NOT EXISTS evidence (
    repo TEXT NOT NULL, head_sha TEXT NOT NULL, sha256 TEXT NOT NULL, document TEXT NOT NULL,
    workflow_run_id INTEGER, received_at REAL NOT NULL,
    PRIMARY KEY (repo, head_sha)
);
CREATE TABLE IF NOT EXISTS heads (
    repo TEXT NOT NULL, head_sha TEXT NOT NULL, first_seen_at REAL NOT NULL,
    PRIMARY KEY (repo, head_sha)
);
CREATE TABLE IF NOT EXISTS installations (
    id INTEGER PRIMARY KEY, account TEXT, active INTEGER NOT NULL, updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS sticky_comments (
    repo TEXT NOT NULL, pr INTEGER NOT NULL, comment_id INTEGER NOT NULL,
    PRIMARY KEY (repo, pr)
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,               -- decision | override | override_refused | error
    repo TEXT, pr INTEGER, head_sha TEXT,
    conclusion TEXT, actor TEXT, reason TEXT,
    policy_sha256 TEXT, evidence_sha256 TEXT, check_run_id INTEGER, delivery_id TEXT
);
CREATE INDEX IF NOT EXISTS audit_repo ON audit (repo, at);
"""

# Columns added after the first release: a database made before them gets them when it is opened.
ADDED_COLUMNS = {
    "deliveries": {"lease_owner": "TEXT", "lease_until": "REAL"},  # who runs it, until when unless renewed
    "evidence": {"workflow_path": "TEXT NOT NULL DEFAULT '.github/workflows/gatekeeper.yml'"},
}


log = logging.getLogger(__name__)

# A claimable delivery: queued and due, or running under a lease that was not renewed in time. A running row
# from before leases (no lease_until) counts as expired: its server was the only one, and is gone.
_READY = "status = 'queued' AND available_at <= :now"
_EXPIRED = "status = 'running' AND COALESCE(lease_until, 0) <= :now"


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


@dataclass(frozen=True)
class EvaluationKey:
    """What makes two evaluations the same: same PR at the same head, same policy, same other inputs."""

    repo: str
    pr: int
    head_sha: str
    policy_sha256: str
    inputs_sha256: str


@dataclass(frozen=True)
class Override:
    actor: str
    reason: str
    head_sha: str  # the one head it approves


@dataclass(frozen=True)
class StoredEvidence:
    sha256: str
    document: str
    workflow_path: str  # the workflow file whose run uploaded it


class Store:
    """Thread-safe: each thread gets its own connection; writes are short transactions.

    A claim belongs to the thread that made it: only that thread can finish, retry or fail it, and only while
    this store's owner still holds the lease of that very attempt."""

    def __init__(self, path: str | Path, synchronous: str = "NORMAL", lease_s: float = 60.0,
                 owner: str | None = None):
        self.path = Path(path)
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self._synchronous = synchronous
        self.lease_s = lease_s
        self.owner = owner or new_owner()
        self._held: set[tuple[str, int]] = set()  # (delivery id, attempt) claimed here, renewed by heartbeat()
        self._held_lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._ready = threading.Condition()
        self._db().executescript(SCHEMA)  # idempotent DDL; executescript commits on its own
        self._add_missing_columns()

    # ------------------------------------------------------------------------------------------ plumbing

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=True)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            # NORMAL (in WAL mode): a committed delivery survives the process being killed, which is what
            # the crash test checks; FULL also survives power loss, at an fsync per acknowledged webhook.
            db.execute(f"PRAGMA synchronous={self._synchronous}")
            db.execute("PRAGMA busy_timeout=30000")
            self._local.db = db
        return db

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        db = self._db()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _add_missing_columns(self) -> None:
        if not self._missing_columns():
            return
        # Looked at again under the write lock: two servers opening one old database at once must not both
        # add a column (the second ALTER would fail with "duplicate column name").
        with self._tx() as db:
            for table, name, declaration in self._missing_columns():
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")

    def _missing_columns(self) -> list[tuple[str, str, str]]:
        missing = []
        for table, columns in ADDED_COLUMNS.items():
            present = {row["name"] for row in self._db().execute(f"PRAGMA table_info({table})")}
            missing += [(table, name, declaration) for name, declaration in columns.items() if name not in present]
        return missing

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    def ping(self, now: float | None = None) -> None:
        """Prove the database takes writes (healthz): a SELECT still answers on a read-only file or a full
        disk, where no webhook could be acknowledged. Raises sqlite3.Error when it does not."""
        now = time.time() if now is None else now
        with self._tx() as db:
            self._beat(db, "web", None, now)
            db.execute("DELETE FROM heartbeats WHERE at < ?", (now - 86400,))  # servers long gone

    # ------------------------------------------------------------------------------------------ heartbeats

    def heartbeat(self, threads: int, now: float | None = None) -> None:
        """The workers are alive (`threads` of them): say so, and renew the leases of the jobs they hold."""
        now = time.time() if now is None else now
        with self._held_lock:
            held = list(self._held)
        with self._tx() as db:
            self._beat(db, "workers", threads, now)
            db.executemany(
                "UPDATE deliveries SET lease_until = ? WHERE id = ? AND attempts = ? AND lease_owner = ?"
                " AND status = 'running'",
                [(now + self.lease_s, delivery_id, attempts, self.owner) for delivery_id, attempts in held])

    def _beat(self, db: sqlite3.Connection, role: str, threads: int | None, now: float) -> None:
        db.execute("INSERT OR REPLACE INTO heartbeats VALUES (?, ?, ?, ?, ?)",
                   (self.owner, role, os.getpid(), threads, now))

    def last_heartbeat(self, owner: str) -> Heartbeat | None:
        row = self._db().execute("SELECT pid, threads, at FROM heartbeats WHERE owner = ? AND role = 'workers'",
                                 (owner,)).fetchone()
        return Heartbeat(row["pid"], row["threads"], row["at"]) if row else None

    # ------------------------------------------------------------------------------------------ queue

    def enqueue(self, delivery_id: str, event: str, action: str | None, payload: bytes,
                now: float | None = None, available_at: float | None = None) -> bool:
        """Store a delivery, to run from `available_at` (default: now). False if this delivery id was seen
        before (a redelivery: no extra work)."""
        now = time.time() if now is None else now
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO deliveries (id, event, action, payload, available_at, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
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
        work), else the oldest ready one. The lease lasts `lease_s` unless `heartbeat` renews it."""
        now = time.time() if now is None else now
        # Look before taking the write lock: idle workers polling must not hold up webhook acknowledgements.
        if self._next(self._db(), now) is None:
            return None
        with self._tx() as db:
            found = self._next(db, now)
            if found is None:
                return None
            row = db.execute(
                "UPDATE deliveries SET status = 'running', attempts = attempts + 1, lease_owner = ?,"
                " lease_until = ? WHERE rowid = ? RETURNING id, event, action, payload, attempts",
                (self.owner, now + self.lease_s, found["rowid"]),
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
    def _next(db: sqlite3.Connection, now: float) -> sqlite3.Row | None:
        # Two queries, not one with OR: each is an index range on deliveries_ready.
        return (db.execute(f"SELECT rowid, status, lease_owner, lease_until FROM deliveries WHERE {_EXPIRED}"
                           " ORDER BY lease_until LIMIT 1", {"now": now}).fetchone()
                or db.execute(f"SELECT rowid, status, lease_owner, lease_until FROM deliveries WHERE {_READY}"
                              " ORDER BY available_at, rowid LIMIT 1", {"now": now}).fetchone())

    def finish(self, delivery_id: str, outcome: str) -> bool:
        """Mark the delivery done. False (and nothing changes) if this thread's lease on it was lost."""
        with self._tx() as db:
            return self._settle(db, delivery_id, "status = 'done', outcome = ?, error = NULL, finished_at = ?",
                                (outcome, time.time()))

    def retry_later(self, delivery_id: str, delay_s: float, error: str) -> bool:
        """Queue the delivery again after `delay_s`. False (and nothing changes) if the lease was lost."""
        with self._tx() as db:
            return self._settle(db, delivery_id, "status = 'queued', available_at = ?, error = ?",
                                (time.time() + delay_s, error))

    def fail(self, delivery_id: str, error: str, repo: str | None = None, pr: int | None = None,
             head_sha: str | None = None, **audit_fields: Any) -> bool:
        """Give up on a delivery; its audit row commits with it, so no reader sees one without the other.
        False (and nothing is written) if the lease was lost: the delivery is its new holder's to judge."""
        now = time.time()
        with self._tx() as db:
            if not self._settle(db, delivery_id, "status = 'failed', error = ?, finished_at = ?", (error, now)):
                return False
            self._audit(db, "error", repo, pr, head_sha, at=now, reason=error, delivery_id=delivery_id,
                        **audit_fields)
        return True

    def _settle(self, db: sqlite3.Connection, delivery_id: str, assignments: str, params: tuple) -> bool:
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
        return attempts is not None and self._db().execute(
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
        with self._tx() as db:
            return sum(db.execute("UPDATE deliveries SET lease_until = ? WHERE id = ? AND attempts = ?"
                                  " AND lease_owner = ? AND status = 'running'",
                                  (now, delivery_id, attempts, self.owner)).rowcount
                       for delivery_id, attempts in held)

    def delivery(self, delivery_id: str) -> dict[str, Any] | None:
        row = self._db().execute(
            "SELECT id, event, action, status, attempts, outcome, error, lease_owner, lease_until"
            " FROM deliveries WHERE id = ?", (delivery_id,),
        ).fetchone()
        return dict(row) if row else None

    def queue_counts(self) -> dict[str, int]:
        rows = self._db().execute("SELECT status, COUNT(*) AS n FROM deliveries GROUP BY status").fetchall()
        return {r["status"]: r["n"] for r in rows}

    # ------------------------------------------------------------------------------------------ idempotency

    def evaluation_done(self, key: EvaluationKey) -> bool:
        row = self._db().execute(
            "SELECT 1 FROM evaluations WHERE repo = ? AND pr = ? AND head_sha = ? AND policy_sha256 = ?"
            " AND inputs_sha256 = ?",
            (key.repo, key.pr, key.head_sha, key.policy_sha256, key.inputs_sha256),
        ).fetchone()
        return row is not None

    def decision_for(self, key: EvaluationKey) -> str | None:
        """The outcome published for exactly this evaluation, if any."""
        row = self._db().execute(
            "SELECT conclusion FROM evaluations WHERE repo = ? AND pr = ? AND head_sha = ? AND policy_sha256 = ?"
            " AND inputs_sha256 = ?",
            (key.repo, key.pr, key.head_sha, key.policy_sha256, key.inputs_sha256),
        ).fetchone()
        return row["conclusion"] if row else None

    def latest_decision(self, repo: str, pr: int, head_sha: str) -> str | None:
        """The outcome most recently published for a PR head, whatever the inputs (merge queues read it)."""
        row = self._db().execute(
            "SELECT conclusion FROM evaluations WHERE repo = ? AND pr = ? AND head_sha = ? AND policy_sha256 != ''"
            " ORDER BY evaluated_at DESC LIMIT 1", (repo, pr, head_sha)).fetchone()
        return row["conclusion"] if row else None

    def first_seen(self, repo: str, head_sha: str, now: float) -> float:
        """When this head was first judged: recorded now if it never was."""
        with self._tx() as db:
            db.execute("INSERT OR IGNORE INTO heads VALUES (?, ?, ?)", (repo, head_sha, now))
            return db.execute("SELECT first_seen_at FROM heads WHERE repo = ? AND head_sha = ?",
                              (repo, head_sha)).fetchone()["first_seen_at"]

    def record_decision(self, key: EvaluationKey, check_run_id: int | None, conclusion: str,
                        evidence_sha256: str | None, delivery_id: str | None, reason: str) -> None:
        """The evaluation record and its audit row commit together: one decision, one audit entry."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO evaluations VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key.repo, key.pr, key.head_sha, key.policy_sha256, key.inputs_sha256, check_run_id,
                 conclusion, now),
            )
            self._audit(db, "decision", key.repo, key.pr, key.head_sha, conclusion=conclusion, reason=reason,
                        policy_sha256=key.policy_sha256, evidence_sha256=evidence_sha256,
                        check_run_id=check_run_id, delivery_id=delivery_id, at=now)

    def check_run_id(self, repo: str, head_sha: str, name: str) -> int | None:
        row = self._db().execute(
            "SELECT check_run_id FROM check_runs WHERE repo = ? AND head_sha = ? AND name = ?",
            (repo, head_sha, name),
        ).fetchone()
        return row["check_run_id"] if row else None

    def remember_check_run(self, repo: str, head_sha: str, name: str, check_run_id: int) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO check_runs VALUES (?, ?, ?, ?)", (repo, head_sha, name, check_run_id))

    # ------------------------------------------------------------------------------------------ overrides

    def add_override(self, repo: str, pr: int, head_sha: str, actor: str, reason: str,
                     delivery_id: str | None) -> None:
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO overrides VALUES (?, ?, ?, ?, ?, ?)",
                       (repo, pr, head_sha, actor, reason, now))
            self._audit(db, "override", repo, pr, head_sha, actor=actor, reason=reason,
                        delivery_id=delivery_id, at=now)

    def override_for(self, repo: str, pr: int, head_sha: str) -> Override | None:
        row = self._db().execute(
            "SELECT actor, reason FROM overrides WHERE repo = ? AND pr = ? AND head_sha = ?", (repo, pr, head_sha)
        ).fetchone()
        return Override(row["actor"], row["reason"], head_sha) if row else None

    # ------------------------------------------------------------------------------------------ evidence

    def put_evidence(self, repo: str, head_sha: str, sha256: str, document: str, workflow_run_id: int,
                     workflow_path: str) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO evidence (repo, head_sha, sha256, document, workflow_run_id,"
                       " received_at, workflow_path) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (repo, head_sha, sha256, document, workflow_run_id, time.time(), workflow_path))

    def evidence_for(self, repo: str, head_sha: str) -> StoredEvidence | None:
        row = self._db().execute(
            "SELECT sha256, document, workflow_path FROM evidence WHERE repo = ? AND head_sha = ?", (repo, head_sha)
        ).fetchone()
        return StoredEvidence(row["sha256"], row["document"], row["workflow_path"]) if row else None

    # ------------------------------------------------------------------------------------------ installations

    def set_installation(self, installation_id: int, account: str | None, active: bool) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO installations VALUES (?, ?, ?, ?)",
                       (installation_id, account, int(active), time.time()))

    def installation_active(self, installation_id: int) -> bool | None:
        row = self._db().execute("SELECT active FROM installations WHERE id = ?", (installation_id,)).fetchone()
        return bool(row["active"]) if row else None

    # ------------------------------------------------------------------------------------------ sticky comment

    def sticky_comment_id(self, repo: str, pr: int) -> int | None:
        row = self._db().execute("SELECT comment_id FROM sticky_comments WHERE repo = ? AND pr = ?",
                                 (repo, pr)).fetchone()
        return row["comment_id"] if row else None

    def remember_sticky_comment(self, repo: str, pr: int, comment_id: int) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO sticky_comments VALUES (?, ?, ?)", (repo, pr, comment_id))

    # ------------------------------------------------------------------------------------------ audit

    def audit(self, kind: str, repo: str | None, pr: int | None, head_sha: str | None, **fields: Any) -> None:
        with self._tx() as db:
            self._audit(db, kind, repo, pr, head_sha, at=time.time(), **fields)

    @staticmethod
    def _audit(db: sqlite3.Connection, kind: str, repo: str | None, pr: int | None, head_sha: str | None, *,
               at: float, conclusion: str | None = None, actor: str | None = None, reason: str | None = None,
               policy_sha256: str | None = None, evidence_sha256: str | None = None,
               check_run_id: int | None = None, delivery_id: str | None = None) -> None:
        db.execute(
            "INSERT INTO audit (at, kind, repo, pr, head_sha, conclusion, actor, reason, policy_sha256,"
            " evidence_sha256, check_run_id, delivery_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (at, kind, repo, pr, head_sha, conclusion, actor, reason, policy_sha256, evidence_sha256,
             check_run_id, delivery_id),
        )

    def audit_log(self, repo: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM audit"
        params: list[Any] = []
        if repo is not None:
            sql += " WHERE repo = ?"
            params.append(repo)
        sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [dict(r) for r in self._db().execute(sql, params).fetchall()]
