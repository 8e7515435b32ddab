"""The App's durable state in one SQLite database (WAL): its schema, a connection per thread, and short write
transactions. `queue.py` (deliveries, leases, heartbeats) and `records.py` (what was decided and why) work on
it; sharing the connection lets a delivery and its audit row commit in one transaction.

Every acknowledged webhook is committed here before the 2xx goes back, so a crash loses nothing.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
    owner TEXT NOT NULL,              -- a lease owner (see queue.new_owner)
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


class Database:
    """Thread-safe: each thread gets its own connection; writes are short transactions."""

    def __init__(self, path: str | Path, synchronous: str = "NORMAL"):
        self.path = Path(path)
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self._synchronous = synchronous
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self.connection().executescript(SCHEMA)  # idempotent DDL; executescript commits on its own
        self._add_missing_columns()

    def connection(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use."""
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
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that takes the write lock at once (BEGIN IMMEDIATE): what it read stays true."""
        db = self.connection()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        """Close this thread's connection (the queue's and the records' alike: they share it)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    def _add_missing_columns(self) -> None:
        if not self._missing_columns():
            return
        # Looked at again under the write lock: two servers opening one old database at once must not both
        # add a column (the second ALTER would fail with "duplicate column name").
        with self.transaction() as db:
            for table, name, declaration in self._missing_columns():
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")

    def _missing_columns(self) -> list[tuple[str, str, str]]:
        missing = []
        for table, columns in ADDED_COLUMNS.items():
            present = {row["name"] for row in self.connection().execute(f"PRAGMA table_info({table})")}
            missing += [(table, name, declaration) for name, declaration in columns.items() if name not in present]
        return missing
