"""The App's durable state in one database: SQLite (a file, WAL; the default, for one machine) or PostgreSQL
(a `postgresql://` URL; for several servers on several machines). Its schema, a connection per thread, and
short write transactions. `queue.py` (deliveries, leases, heartbeats) and `records.py` (what was decided and
why) are written once against `Database`; sharing the connection lets a delivery and its audit row commit in
one transaction.

The SQL they send is common to both: `?` placeholders (rewritten for psycopg), `INSERT ... ON CONFLICT`
upserts and `RETURNING`, which SQLite (3.35+) and PostgreSQL both speak. What differs is here and only here:
column types in the schema, how a transaction takes its locks (`claim_lock`), how a table's columns are
listed, and the driver's error class (`Database.Error`).

Every acknowledged webhook is committed here before the 2xx goes back, so a crash loses nothing.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from gatekeeper.errors import InputError

# Written once; {int}, {float}, {bytes} and {serial} are each dialect's types (see _TYPES). SQLite's are the
# types of the first release, so its databases read as they always did.
SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    id TEXT PRIMARY KEY,              -- X-GitHub-Delivery, or a synthetic id for sweeps
    event TEXT NOT NULL,
    action TEXT,
    payload {bytes} NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'done', 'failed')),
    attempts {int} NOT NULL DEFAULT 0,
    available_at {float} NOT NULL,
    received_at {float} NOT NULL,
    finished_at {float},
    outcome TEXT,
    error TEXT,
    lease_owner TEXT,                 -- who runs it (see queue.new_owner)
    lease_until {float}               -- until when, unless its heartbeat renews it
);
CREATE INDEX IF NOT EXISTS deliveries_ready ON deliveries (status, available_at);
CREATE TABLE IF NOT EXISTS heartbeats (
    owner TEXT NOT NULL,              -- a lease owner (see queue.new_owner)
    role TEXT NOT NULL,               -- workers: written by the worker threads | web: a /healthz write probe
    pid {int} NOT NULL, threads {int}, at {float} NOT NULL,
    PRIMARY KEY (owner, role)
);
CREATE TABLE IF NOT EXISTS evaluations (
    repo TEXT NOT NULL, pr {int} NOT NULL, head_sha TEXT NOT NULL,
    policy_sha256 TEXT NOT NULL, inputs_sha256 TEXT NOT NULL,
    check_run_id {int}, conclusion TEXT NOT NULL, evaluated_at {float} NOT NULL,
    PRIMARY KEY (repo, pr, head_sha, policy_sha256, inputs_sha256)
);
CREATE TABLE IF NOT EXISTS check_runs (
    repo TEXT NOT NULL, head_sha TEXT NOT NULL, name TEXT NOT NULL, check_run_id {int} NOT NULL,
    PRIMARY KEY (repo, head_sha, name)
);
CREATE TABLE IF NOT EXISTS overrides (
    repo TEXT NOT NULL, pr {int} NOT NULL, head_sha TEXT NOT NULL,
    actor TEXT NOT NULL, reason TEXT NOT NULL, at {float} NOT NULL,
    PRIMARY KEY (repo, pr, head_sha)
);
CREATE TABLE IF NOT EXISTS evidence (
    repo TEXT NOT NULL, head_sha TEXT NOT NULL, sha256 TEXT NOT NULL, document TEXT NOT NULL,
    workflow_run_id {int}, received_at {float} NOT NULL,
    workflow_path TEXT NOT NULL DEFAULT '.github/workflows/gatekeeper.yml',
    PRIMARY KEY (repo, head_sha)
);
CREATE TABLE IF NOT EXISTS heads (
    repo TEXT NOT NULL, head_sha TEXT NOT NULL, first_seen_at {float} NOT NULL,
    PRIMARY KEY (repo, head_sha)
);
CREATE TABLE IF NOT EXISTS installations (
    id {int} PRIMARY KEY, account TEXT, active {int} NOT NULL, updated_at {float} NOT NULL
);
CREATE TABLE IF NOT EXISTS sticky_comments (
    repo TEXT NOT NULL, pr {int} NOT NULL, comment_id {int} NOT NULL,
    PRIMARY KEY (repo, pr)
);
CREATE TABLE IF NOT EXISTS audit (
    id {serial},
    at {float} NOT NULL,
    kind TEXT NOT NULL,               -- decision | override | override_refused | error
    repo TEXT, pr {int}, head_sha TEXT,
    conclusion TEXT, actor TEXT, reason TEXT,
    policy_sha256 TEXT, evidence_sha256 TEXT, check_run_id {int}, delivery_id TEXT
);
CREATE INDEX IF NOT EXISTS audit_repo ON audit (repo, at);
CREATE TABLE IF NOT EXISTS details_pages (
    id TEXT PRIMARY KEY,              -- random, URL-safe: the page's address (pages.py)
    repo TEXT NOT NULL, pr {int} NOT NULL, head_sha TEXT NOT NULL, policy_sha256 TEXT NOT NULL,
    verdict TEXT,                     -- the verdict's JSON (gatekeeper/verdict.py); NULL until first published
    updated_at {float},
    UNIQUE (repo, pr, head_sha, policy_sha256)
);
"""

# Integers are 64-bit in SQLite and must be BIGINT in PostgreSQL (check-run ids are past 2**31); times are
# Unix seconds with a fraction, which PostgreSQL's 4-byte REAL would round to minutes.
_TYPES = {
    "sqlite": {"int": "INTEGER", "float": "REAL", "bytes": "BLOB", "serial": "INTEGER PRIMARY KEY AUTOINCREMENT"},
    "postgres": {"int": "BIGINT", "float": "DOUBLE PRECISION", "bytes": "BYTEA",
                 "serial": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"},
}

# Columns added after the first release: a database made before them gets them when it is opened.
ADDED_COLUMNS = {
    "deliveries": {"lease_owner": "TEXT", "lease_until": "{float}"},
    "evidence": {"workflow_path": "TEXT NOT NULL DEFAULT '.github/workflows/gatekeeper.yml'"},
}

POSTGRES_SCHEMES = ("postgresql", "postgres")


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    """What queue.py and records.py use of a connection: rows read by column name (row["id"], dict(row))."""

    def execute(self, sql: str, params: Any = ()) -> Cursor: ...
    def executemany(self, sql: str, params: Any) -> Cursor: ...


def is_postgres(where: str | Path) -> bool:
    scheme, separator, _ = str(where).partition("://")
    return bool(separator) and scheme.lower() in POSTGRES_SCHEMES


def open_database(where: str | Path, synchronous: str = "NORMAL") -> Database:
    """A `postgresql://` URL opens PostgreSQL; anything else is a SQLite file path. `synchronous` is SQLite's
    (PostgreSQL commits durably by default)."""
    if is_postgres(where):
        return PostgresDatabase(str(where))
    if "://" in str(where):
        scheme = str(where).split("://", 1)[0]
        raise InputError(redact(str(where)), f"unsupported database URL scheme {scheme!r}: give a SQLite file "
                                             "path or a postgresql:// URL")
    return SQLiteDatabase(where, synchronous)


def redact(where: str) -> str:
    """A database URL fit for logs and errors: its password (user:PASSWORD@ or ?password=) replaced by ***."""
    if "://" not in where:
        return where
    parts = urlsplit(where)
    if parts.password is not None:
        parts = parts._replace(netloc=f"{parts.username or ''}:***@{parts.netloc.rsplit('@', 1)[-1]}")
    query = re.sub(r"(^|&)password=[^&]*", r"\1password=***", parts.query)
    return urlunsplit(parts._replace(query=query))


def upsert(db: Connection, table: str, key: tuple[str, ...], **values: Any) -> None:
    """Insert a row, or overwrite the one with the same `key` columns: `ON CONFLICT ... DO UPDATE`, which
    SQLite and PostgreSQL both speak (and which, unlike SQLite's INSERT OR REPLACE, PostgreSQL has)."""
    columns = list(values)
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
               f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}", tuple(values.values()))


class Database(ABC):
    """Thread-safe: each thread gets its own connection, opened on first use; writes are short transactions.
    Subclasses supply the dialect."""

    dialect: str
    Error: type[Exception]  # what the driver raises for any database failure (DB-API's Error)
    # Appended to the claim's SELECT: what locks the chosen row against the other claimers, if the
    # transaction itself does not.
    claim_lock: str = ""

    def __init__(self, where: str):
        self.where = where  # for messages (a URL's password is redacted)
        self._local = threading.local()
        self._create_schema(SCHEMA.format(**_TYPES[self.dialect]))
        self._add_missing_columns()

    def connection(self) -> Connection:
        """This thread's connection, opened on first use (and again after the server dropped it)."""
        db = getattr(self._local, "db", None)
        if db is None or self._broken(db):
            db = self._local.db = self._connect()
        return db

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction: all of it commits, or none of it (an exception rolls it back)."""
        db = self.connection()
        with self._transaction(db):
            yield db

    def close(self) -> None:
        """Close this thread's connection (the queue's and the records' alike: they share it)."""
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None

    @abstractmethod
    def _connect(self) -> Connection: ...

    @abstractmethod
    def _broken(self, db: Connection) -> bool: ...

    @abstractmethod
    def _transaction(self, db: Connection) -> Any: ...

    @abstractmethod
    def _create_schema(self, schema: str) -> None: ...

    @abstractmethod
    def _columns(self, db: Connection, table: str) -> set[str]: ...

    def _lock_schema(self, db: Connection) -> None:
        """Inside a transaction: no other server changes the schema until it ends. (SQLite's BEGIN IMMEDIATE
        already holds the one write lock.)"""

    def _add_missing_columns(self) -> None:
        if not self._missing_columns(self.connection()):
            return
        # Looked at again under the schema lock: two servers opening one old database at once must not both
        # add a column (the second ALTER would fail).
        with self.transaction() as db:
            self._lock_schema(db)
            for table, name, declaration in self._missing_columns(db):
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration.format(**_TYPES[self.dialect])}")

    def _missing_columns(self, db: Connection) -> list[tuple[str, str, str]]:
        missing = []
        for table, columns in ADDED_COLUMNS.items():
            present = self._columns(db, table)
            missing += [(table, name, declaration) for name, declaration in columns.items() if name not in present]
        return missing


_BUSY_TIMEOUT_S = 30.0  # how long a connection waits for another's write lock


class SQLiteDatabase(Database):
    dialect = "sqlite"
    Error = sqlite3.Error

    def __init__(self, path: str | Path, synchronous: str = "NORMAL"):
        self.path = Path(path)
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL, not {synchronous!r}")
        self._synchronous = synchronous
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            super().__init__(str(self.path))
        except sqlite3.DatabaseError as exc:  # not a database file, unreadable, a full disk
            raise InputError(str(self.path), f"cannot open the SQLite database: {exc}") from None

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=True)
        db.row_factory = sqlite3.Row
        _enter_wal_mode(db, deadline=time.monotonic() + _BUSY_TIMEOUT_S)
        # NORMAL (in WAL mode): a committed delivery survives the process being killed, which is what the
        # crash test checks; FULL also survives power loss, at an fsync per acknowledged webhook.
        db.execute(f"PRAGMA synchronous={self._synchronous}")
        db.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_S * 1000)}")
        return db

    def _broken(self, db: sqlite3.Connection) -> bool:
        return False  # a file: there is no server to lose

    @contextmanager
    def _transaction(self, db: sqlite3.Connection) -> Iterator[None]:
        # BEGIN IMMEDIATE takes the write lock at once, so what the transaction read stays true until it
        # commits: one writer at a time is SQLite's way, and what makes the claim's SELECT-then-UPDATE safe.
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _create_schema(self, schema: str) -> None:
        self.connection().executescript(schema)  # idempotent DDL; executescript commits on its own

    def _columns(self, db: sqlite3.Connection, table: str) -> set[str]:
        return {row["name"] for row in db.execute(f"PRAGMA table_info({table})")}


def _enter_wal_mode(db: sqlite3.Connection, deadline: float) -> None:
    """Switch the file to WAL (persistent: done once per file). The switch needs the file to itself and,
    unlike every other statement, does not wait for the busy timeout: servers opening a new database at
    once get "database is locked" at once. So it is retried here until the deadline."""
    while True:
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
            continue
        if mode.lower() != "wal":  # e.g. an in-memory database, or a file system without shared memory
            raise sqlite3.OperationalError(f"cannot switch to WAL journaling (the journal mode stays {mode!r})")
        return


class PostgresDatabase(Database):
    """PostgreSQL through psycopg 3, for servers on several machines sharing one database. Transactions are
    READ COMMITTED: every write in queue.py and records.py is a single-row UPDATE guarded by its WHERE, or an
    upsert, which PostgreSQL makes atomic per row; the claim locks the row it picks with FOR UPDATE SKIP
    LOCKED, so concurrent claimers each get another delivery and never wait for each other."""

    dialect = "postgres"
    claim_lock = " FOR UPDATE SKIP LOCKED"
    # Any one constant: schema creation and upgrades take it, so servers starting at once do not race on
    # CREATE TABLE IF NOT EXISTS (which is not atomic against itself in PostgreSQL).
    _SCHEMA_LOCK = 0x6761746B  # "gatk"

    def __init__(self, url: str, connect_timeout_s: int = 10):
        try:
            import psycopg
        except ImportError:
            raise InputError(redact(url), "a postgresql:// database needs psycopg: "
                                          "pip install 'gatekeeper[postgres]'") from None
        self._psycopg = psycopg
        self.Error = psycopg.Error
        self.url = url
        self._connect_timeout_s = connect_timeout_s
        try:
            super().__init__(redact(url))
        except psycopg.Error as exc:  # unreachable, refused, no such database, bad password, no right to CREATE
            reason = " ".join(str(exc).split())
            raise InputError(redact(url), f"cannot open the PostgreSQL database: {reason}") from None

    def _connect(self) -> _PostgresConnection:
        from psycopg.rows import dict_row

        conn = self._psycopg.connect(self.url, autocommit=True, row_factory=dict_row,
                                     connect_timeout=self._connect_timeout_s, application_name="gatekeeper")
        return _PostgresConnection(conn)

    def _broken(self, db: _PostgresConnection) -> bool:
        return db.raw.closed  # the server restarted or the network dropped it: reconnect on next use

    def _transaction(self, db: _PostgresConnection) -> Any:
        return db.raw.transaction()

    def _create_schema(self, schema: str) -> None:
        with self.transaction() as db:
            self._lock_schema(db)
            db.raw.execute(schema)  # several statements, no parameters: psycopg sends them as one script

    def _lock_schema(self, db: _PostgresConnection) -> None:
        db.execute(f"SELECT pg_advisory_xact_lock({self._SCHEMA_LOCK})")  # released when the transaction ends

    def _columns(self, db: _PostgresConnection, table: str) -> set[str]:
        rows = db.execute("SELECT column_name FROM information_schema.columns"
                          " WHERE table_schema = current_schema() AND table_name = ?", (table,)).fetchall()
        return {row["column_name"] for row in rows}


class _PostgresConnection:
    """A psycopg connection that takes the `?` placeholders the shared SQL is written with."""

    def __init__(self, raw: Any):
        self.raw = raw

    def execute(self, sql: str, params: Any = ()) -> Any:
        return self.raw.execute(_postgres_sql(sql), params)

    def executemany(self, sql: str, params: Any) -> Any:
        cursor = self.raw.cursor()
        cursor.executemany(_postgres_sql(sql), list(params))
        return cursor

    def close(self) -> None:
        self.raw.close()


@functools.lru_cache(maxsize=256)
def _postgres_sql(sql: str) -> str:
    """`?` -> `%s`; a literal `%` doubled, since psycopg reads `%` as the start of a placeholder. (The shared
    SQL never has a `?` inside a string literal.)"""
    return sql.replace("%", "%%").replace("?", "%s")
