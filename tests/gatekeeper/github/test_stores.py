"""The two stores (issue 39): SQLite on one machine, PostgreSQL for several. The same queue and records code
runs on both; these tests hold what is specific to sharing one database between many claimers, and how a
database is named and refused."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
import uvicorn
import yaml
from app_harness import HEAD, OPENED, REPO, both_stores, make_config, setup_pull

from gatekeeper.cli import main
from gatekeeper.errors import InputError
from gatekeeper.github.config import load_config
from gatekeeper.github.db import PostgresDatabase, SQLiteDatabase, _enter_wal_mode, open_database, redact
from gatekeeper.github import records as records_module
from gatekeeper.github.queue import DeliveryQueue
from gatekeeper.github.records import EvaluationKey, Records

JOBS, CLAIMERS = 200, 6


@both_stores
def test_concurrent_claimers_on_one_database_each_get_other_deliveries(store):
    """Six claimers, each a server of its own (its own owner, its own connections), race for 200 deliveries:
    each is claimed once, none is lost, no claimer waits for another's transaction to see the rest."""
    producer = DeliveryQueue(open_database(store))
    for n in range(JOBS):
        producer.enqueue(f"d{n:03}", "pull_request", "opened", b"{}", now=1.0)
    claimed: dict[str, list[str]] = {}
    lock, start, errors = threading.Lock(), threading.Barrier(CLAIMERS), []

    def claimer(i: int) -> None:
        queue = DeliveryQueue(open_database(store), lease_s=600, owner=f"server-{i}")
        start.wait()
        try:
            while (job := queue.claim(now=2.0)) is not None:
                with lock:
                    claimed.setdefault(job.delivery_id, []).append(queue.owner)
                assert queue.finish(job.delivery_id, f"done by {queue.owner}")
        except Exception as exc:  # noqa: BLE001 - reported below, with the thread's name
            errors.append(f"{queue.owner}: {exc!r}")
        finally:
            queue.db.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(claimed) == JOBS and all(len(owners) == 1 for owners in claimed.values())
    assert len({owners[0] for owners in claimed.values()}) > 1  # the work was shared, not taken by one
    assert producer.counts() == {"done": JOBS}
    rows = producer.db.connection().execute("SELECT attempts, outcome FROM deliveries").fetchall()
    assert {row["attempts"] for row in rows} == {1}


@both_stores
def test_a_decision_and_its_audit_row_commit_together_or_not_at_all(store, monkeypatch):
    records = Records(open_database(store))
    key = EvaluationKey("o/r", 1, "a" * 40, "p" * 64, "i" * 64)
    # The audit insert fails (the database refuses it) after the evaluation row was written: neither stays.
    monkeypatch.setattr(records_module, "insert_audit",
                        lambda db, *args, **kwargs: db.execute("INSERT INTO audit (at, kind) VALUES (1, NULL)"))
    with pytest.raises(records.db.Error):
        records.record_decision(key, 7, "failure", None, "d1", "Failed: confinement")
    monkeypatch.undo()
    assert not records.evaluation_done(key) and records.audit_log() == []
    # Check-run ids are past 2**31 on github.com: they must round-trip (PostgreSQL's INTEGER is 32-bit).
    records.record_decision(key, 2**40 + 3, "success", None, "d2", "ok")
    assert records.audit_log()[0]["check_run_id"] == 2**40 + 3 and records.decision_for(key) == "success"
    records.record_decision(key, 8, "failure", None, "d3", "again")  # the same evaluation: upserted, audited
    assert records.decision_for(key) == "failure" and len(records.audit_log()) == 2
    records.remember_check_run("o/r", "a" * 40, "gatekeeper / p", 2**40)
    assert records.check_run_id("o/r", "a" * 40, "gatekeeper / p") == 2**40
    assert records.first_seen("o/r", "a" * 40, now=1700000000.25) == 1700000000.25  # no rounding of times
    assert records.first_seen("o/r", "a" * 40, now=1800000000.0) == 1700000000.25


def _open_at_once(where, servers: int = 6) -> list[str]:
    """`servers` threads opening the database at `where` at the same moment: what each raised."""
    start, errors = threading.Barrier(servers), []

    def open_it() -> None:
        start.wait()
        try:
            open_database(where).close()
        except Exception as exc:  # noqa: BLE001 - returned
            errors.append(repr(exc))

    threads = [threading.Thread(target=open_it) for _ in range(servers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return errors


def test_new_sqlite_files_opened_by_several_servers_at_once_all_open(tmp_path):
    """The switch to WAL does not wait for SQLite's busy timeout: without the retry around it, about one new
    file in thirty refused one of six servers opening it together ("database is locked"; CI saw it). A
    hundred and fifty files make a regression show here nearly every run."""
    paths = [tmp_path / f"new-{n}.sqlite3" for n in range(150)]
    assert [error for path in paths for error in _open_at_once(path)] == []
    assert SQLiteDatabase(paths[-1]).connection().execute("PRAGMA journal_mode").fetchone()[0] == "wal"


class _Journal:
    """A connection whose `PRAGMA journal_mode=WAL` answers from a script, the last answer repeated: an exception
    to raise, or the journal mode to report."""

    def __init__(self, *answers):
        self.answers, self.asked, self.mode = list(answers), 0, None

    def execute(self, sql: str):
        assert sql == "PRAGMA journal_mode=WAL"
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        self.mode = answer
        return self

    def fetchone(self):
        return (self.mode,)


def test_the_switch_to_wal_is_retried_while_locked_and_refused_where_it_cannot_happen():
    locked = sqlite3.OperationalError("database is locked")
    waited = _Journal(locked, locked, "wal")
    _enter_wal_mode(waited, deadline=time.monotonic() + 5)
    assert waited.asked == 3
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # past the deadline: the lock's own error
        _enter_wal_mode(_Journal(locked), deadline=time.monotonic() + 0.05)
    with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):  # not a lock: at once
        _enter_wal_mode(_Journal(sqlite3.OperationalError("disk I/O error"), "wal"), deadline=time.monotonic() + 5)
    with pytest.raises(sqlite3.OperationalError, match="cannot switch to WAL journaling .*'delete'"):
        _enter_wal_mode(_Journal("delete"), deadline=time.monotonic() + 5)


def test_gatekeeper_db_takes_a_postgres_url_and_refuses_other_schemes(tmp_path):
    base = {"GATEKEEPER_APP_ID": "1", "GATEKEEPER_PRIVATE_KEY_PATH": "/k.pem", "GATEKEEPER_WEBHOOK_SECRET": "s"}
    url = "postgresql://gk:hunter2@db.internal:5432/gatekeeper"
    assert load_config(None, {**base, "GATEKEEPER_DB": url}).db_path == url
    assert load_config(None, {**base, "GATEKEEPER_DB": "/var/lib/gk.sqlite3"}).db_path == "/var/lib/gk.sqlite3"
    with pytest.raises(InputError) as error:
        load_config(None, {**base, "GATEKEEPER_DB": "mysql://gk:hunter2@db/gatekeeper"})
    assert "db_path: a database URL must start with postgresql://" in str(error.value)
    assert "GATEKEEPER_DB" in str(error.value) and "hunter2" not in str(error.value)
    assert redact(url) == "postgresql://gk:***@db.internal:5432/gatekeeper"
    assert redact("postgresql://gk@db/x") == "postgresql://gk@db/x"
    assert redact("postgresql://db/x?user=gk&password=hunter2&sslmode=require") == \
        "postgresql://db/x?user=gk&password=***&sslmode=require"
    assert isinstance(open_database(tmp_path / "a.sqlite3"), SQLiteDatabase)


def test_an_unreachable_postgres_is_refused_naming_it_without_its_password(tmp_path, capsys, monkeypatch):
    pytest.importorskip("psycopg")
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://gk:hunter2@127.0.0.1:{port}/gatekeeper"
    with pytest.raises(InputError) as error:
        PostgresDatabase(url, connect_timeout_s=2)
    message = str(error.value)
    assert message.startswith(f"postgresql://gk:***@127.0.0.1:{port}/gatekeeper: cannot open the PostgreSQL "
                              "database: ") and "hunter2" not in message
    assert main(["audit", "--db", url]) == 2
    err = capsys.readouterr().err
    assert "cannot open the PostgreSQL database" in err and "hunter2" not in err


def test_serve_refuses_a_database_it_cannot_open(rsa_keys, fake, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: pytest.fail("the server started"))
    config = make_config(rsa_keys, fake, tmp_path)
    bad = tmp_path / "not-a-database.sqlite3"
    bad.write_bytes(b"garbage" * 1000)
    monkeypatch.setenv("GATEKEEPER_APP_ID", str(config.app_id))
    monkeypatch.setenv("GATEKEEPER_PRIVATE_KEY_PATH", str(config.private_key_path))
    monkeypatch.setenv("GATEKEEPER_WEBHOOK_SECRET", "s3cret")
    monkeypatch.setenv("GATEKEEPER_DB", str(bad))
    assert main(["serve", "--port", "0"]) == 2
    assert f"{bad}: cannot open the SQLite database: file is not a database" in capsys.readouterr().err


@both_stores
def test_web_only_and_worker_only_processes_share_the_queue(fake, start_app, tmp_path):
    """`gatekeeper serve --role web` takes webhooks in and judges nothing; `--role workers` (no HTTP) judges
    what any web server queued. The web server's /healthz counts the live worker processes of the database."""
    setup_pull(fake)
    web = start_app(workers="none")
    health = web.client.get(web.url + "/healthz").json()
    assert (health["status"], health["workers"], health["worker_processes"]) == ("ok", 0, 0)
    assert health["warnings"][0].startswith("no worker process has beaten in the last 5 s")
    web.send("pull_request", OPENED, delivery="d1")
    time.sleep(0.5)
    assert web.queue().delivery("d1")["status"] == "queued"  # nobody here judges it

    settings = {k: v for k, v in web.config.model_dump(mode="json").items() if k != "webhook_secret"}
    config_file = tmp_path / "workers.yml"
    config_file.write_text(yaml.safe_dump({**settings, "webhook_secret": "unused-by-workers"}))
    workers = subprocess.Popen([sys.executable, "-m", "gatekeeper", "serve", "--role", "workers", "--config",
                                str(config_file), "--log-level", "warning"], env={**os.environ})
    try:
        row = web.wait_done("d1", timeout=30)
        assert row["status"] == "done" and row["outcome"].startswith("success")
        assert row["lease_owner"].split(":")[1] == str(workers.pid)
        [run] = fake.check_runs(REPO, HEAD)
        assert run["conclusion"] == "success"
        health = web.client.get(web.url + "/healthz").json()
        assert (health["status"], health["worker_processes"], health["workers"]) == ("ok", 1, web.config.workers)
        assert "warnings" not in health
    finally:
        workers.send_signal(signal.SIGTERM)  # a clean stop: the process exits 0
        assert workers.wait(20) == 0


@both_stores
def test_the_database_failing_mid_evaluation_is_retried_not_reported_as_the_prs_failure(fake, start_app,
                                                                                        monkeypatch):
    """A busy or unreachable database (OperationalError, in either driver) is the App's trouble, not the PR's:
    the job is retried, and the check run ends as the verdict, never as "Could not evaluate"."""
    setup_pull(fake)
    app = start_app()
    if app.asgi.state.queue.db.dialect == "postgres":
        from psycopg import OperationalError
    else:
        from sqlite3 import OperationalError
    real, calls = Records.first_seen, []

    def first_seen_fails_once(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:  # what the driver raises for a server that went away, or a lock held too long
            raise OperationalError("server closed the connection unexpectedly")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Records, "first_seen", first_seen_fails_once)
    app.send("pull_request", OPENED, delivery="d1")
    row = app.wait_done("d1")
    assert (row["status"], row["attempts"]) == ("done", 2) and row["outcome"].startswith("success")
    [run] = fake.check_runs(REPO, HEAD)
    assert run["conclusion"] == "success"


@both_stores
def test_servers_starting_at_once_on_an_empty_database_all_open_it(store):
    """Each server creates the tables it finds missing; several starting together must not trip over each
    other's CREATE TABLE (in PostgreSQL, IF NOT EXISTS is no guard against a concurrent one)."""
    assert _open_at_once(store) == []
    assert DeliveryQueue(open_database(store)).enqueue("d1", "pull_request", "opened", b"{}")
