"""The App's durable state in one SQLite database (WAL): the delivery queue, idempotency records, check-run
ids, overrides, evidence received from CI, and the audit log.

One server process owns a database. Every acknowledged webhook is committed here before the 2xx goes back,
so a crash loses nothing: jobs that were running when the process died are queued again at start-up.
"""

from __future__ import annotations

import sqlite3
import threading
import time
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


@dataclass(frozen=True)
class Job:
    delivery_id: str
    event: str
    action: str | None
    payload: bytes
    attempts: int  # including the current one


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


@dataclass(frozen=True)
class StoredEvidence:
    sha256: str
    document: str


class Store:
    """Thread-safe: each thread gets its own connection; writes are short transactions."""

    def __init__(self, path: str | Path, synchronous: str = "NORMAL"):
        self.path = Path(path)
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self._synchronous = synchronous
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._ready = threading.Condition()
        self._db().executescript(SCHEMA)  # idempotent DDL; executescript commits on its own

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

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    def ping(self) -> bool:
        return self._db().execute("SELECT 1").fetchone()[0] == 1

    # ------------------------------------------------------------------------------------------ queue

    def enqueue(self, delivery_id: str, event: str, action: str | None, payload: bytes,
                now: float | None = None) -> bool:
        """Store a delivery. False if this delivery id was seen before (a redelivery: no extra work)."""
        now = time.time() if now is None else now
        with self._tx() as db:
            cur = db.execute(
                "INSERT OR IGNORE INTO deliveries (id, event, action, payload, available_at, received_at)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (delivery_id, event, action, payload, now, now),
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
        """Take the oldest ready delivery and mark it running, atomically."""
        now = time.time() if now is None else now
        # Look before taking the write lock: idle workers polling must not hold up webhook acknowledgements.
        ready = self._db().execute(
            "SELECT 1 FROM deliveries WHERE status = 'queued' AND available_at <= ? LIMIT 1", (now,)).fetchone()
        if ready is None:
            return None
        with self._tx() as db:
            row = db.execute(
                "UPDATE deliveries SET status = 'running', attempts = attempts + 1"
                " WHERE rowid = (SELECT rowid FROM deliveries WHERE status = 'queued' AND available_at <= ?"
                "                ORDER BY available_at, rowid LIMIT 1)"
                " RETURNING id, event, action, payload, attempts",
                (now,),
            ).fetchone()
        if row is None:
            return None
        return Job(row["id"], row["event"], row["action"], bytes(row["payload"]), row["attempts"])

    def finish(self, delivery_id: str, outcome: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE deliveries SET status = 'done', outcome = ?, error = NULL, finished_at = ? WHERE id = ?",
                (outcome, time.time(), delivery_id),
            )

    def retry_later(self, delivery_id: str, delay_s: float, error: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE deliveries SET status = 'queued', available_at = ?, error = ? WHERE id = ?",
                (time.time() + delay_s, error, delivery_id),
            )

    def fail(self, delivery_id: str, error: str, repo: str | None = None, pr: int | None = None,
             head_sha: str | None = None, **audit_fields: Any) -> None:
        """Give up on a delivery; its audit row commits with it, so no reader sees one without the other."""
        now = time.time()
        with self._tx() as db:
            db.execute(
                "UPDATE deliveries SET status = 'failed', error = ?, finished_at = ? WHERE id = ?",
                (error, now, delivery_id),
            )
            self._audit(db, "error", repo, pr, head_sha, at=now, reason=error, delivery_id=delivery_id,
                        **audit_fields)

    def requeue_interrupted(self) -> int:
        """At start-up: whatever was running belonged to a process that is gone; run it again."""
        with self._tx() as db:
            return db.execute("UPDATE deliveries SET status = 'queued' WHERE status = 'running'").rowcount

    def delivery(self, delivery_id: str) -> dict[str, Any] | None:
        row = self._db().execute(
            "SELECT id, event, action, status, attempts, outcome, error FROM deliveries WHERE id = ?",
            (delivery_id,),
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
        return Override(row["actor"], row["reason"]) if row else None

    # ------------------------------------------------------------------------------------------ evidence

    def put_evidence(self, repo: str, head_sha: str, sha256: str, document: str, workflow_run_id: int) -> None:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO evidence VALUES (?, ?, ?, ?, ?, ?)",
                       (repo, head_sha, sha256, document, workflow_run_id, time.time()))

    def evidence_for(self, repo: str, head_sha: str) -> StoredEvidence | None:
        row = self._db().execute(
            "SELECT sha256, document FROM evidence WHERE repo = ? AND head_sha = ?", (repo, head_sha)
        ).fetchone()
        return StoredEvidence(row["sha256"], row["document"]) if row else None

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
