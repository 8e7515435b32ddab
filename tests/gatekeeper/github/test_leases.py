"""Several servers on one database (issue 41, hole 6; on PostgreSQL, issue 39): a claimed delivery is leased,
the lease is renewed while its worker runs, and only a job whose lease ran out is taken over. Each test but
the SQLite upgrade runs on both stores."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import time

from app_harness import HEAD, OPENED, REPO, both_stores, setup_pull

from gatekeeper.github.db import open_database
from gatekeeper.github.queue import DeliveryQueue
from gatekeeper.github.records import Records


@both_stores
def test_a_live_servers_job_is_left_alone_and_a_dead_ones_is_taken_over(store, caplog):
    db = store
    a = DeliveryQueue(open_database(db), lease_s=10, owner="server-a")
    assert a.enqueue("d1", "pull_request", "opened", b"{}", now=100.0)
    assert a.claim(now=100.0).attempts == 1
    assert (a.delivery("d1")["lease_owner"], a.delivery("d1")["lease_until"]) == ("server-a", 110.0)

    b = DeliveryQueue(open_database(db), lease_s=10, owner="server-b")  # a second server starts on the same database
    assert b.claim(now=105.0) is None  # A's lease runs until 110
    a.heartbeat(threads=1, now=108.0)  # A's worker is alive: the lease now runs until 118
    assert b.claim(now=115.0) is None

    with caplog.at_level(logging.WARNING, logger="gatekeeper.github.queue"):  # A stopped renewing: crashed
        taken = b.claim(now=118.5)
    assert (taken.delivery_id, taken.attempts) == ("d1", 2)
    assert "took over delivery d1 (attempt 2) from server-a" in caplog.text

    # A's late results are refused: the job is B's now, and nothing of A's attempt is written, nor posted.
    assert b.holds("d1") and not a.holds("d1")
    assert not a.finish("d1", "success: late")
    assert not a.retry_later("d1", 0, "502")
    assert not a.fail("d1", "gave up", "o/r", 1, "a" * 40)
    assert (a.delivery("d1")["status"], a.delivery("d1")["lease_owner"]) == ("running", "server-b")
    assert [e for e in Records(a.db).audit_log() if e["kind"] == "error"] == []
    assert b.finish("d1", "success")
    assert b.delivery("d1")["status"] == "done" and b.claim(now=1e12) is None


@both_stores
def test_a_claim_is_settled_only_by_the_attempt_that_holds_it(store):
    queue = DeliveryQueue(open_database(store), lease_s=10)
    queue.enqueue("d1", "pull_request", "opened", b"{}", now=100.0)
    queue.claim(now=100.0)
    again = queue.claim(now=111.0)  # its lease expired (the thread hung), so this same server took it again
    assert again.attempts == 2
    assert queue.finish("d1", "done by attempt 2")
    assert not queue.finish("d1", "done twice")
    assert queue.delivery("d1")["outcome"] == "done by attempt 2"


def test_a_database_from_before_leases_opens_and_its_interrupted_job_runs_again(tmp_path):
    db = tmp_path / "old.sqlite3"
    with sqlite3.connect(db) as old:  # the deliveries table as the first release made it
        old.executescript("""
            CREATE TABLE deliveries (
                id TEXT PRIMARY KEY, event TEXT NOT NULL, action TEXT, payload BLOB NOT NULL,
                status TEXT NOT NULL DEFAULT 'queued' CHECK (status IN ('queued', 'running', 'done', 'failed')),
                attempts INTEGER NOT NULL DEFAULT 0, available_at REAL NOT NULL, received_at REAL NOT NULL,
                finished_at REAL, outcome TEXT, error TEXT);
            CREATE INDEX deliveries_ready ON deliveries (status, available_at);
            INSERT INTO deliveries (id, event, payload, status, attempts, available_at, received_at)
                VALUES ('interrupted', 'pull_request', x'7b7d', 'running', 1, 1.0, 1.0),
                       ('waiting', 'pull_request', x'7b7d', 'queued', 0, 2.0, 2.0);
        """)
    queue = DeliveryQueue(open_database(db))
    columns = {row[1] for row in queue.db.connection().execute("PRAGMA table_info(deliveries)")}
    assert {"lease_owner", "lease_until"} <= columns
    first = queue.claim()  # running under the old schema: its single server is gone
    assert (first.delivery_id, first.attempts) == ("interrupted", 2)
    assert queue.finish("interrupted", "success")
    assert queue.claim().delivery_id == "waiting"
    open_database(db)  # opening it again changes nothing


def _decisions(app) -> list[dict]:
    records = app.records()
    try:
        return [e for e in records.audit_log() if e["kind"] == "decision"]
    finally:
        records.db.close()


def _wait(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@both_stores
def test_a_second_server_starting_on_the_database_does_not_steal_a_running_job(fake, start_app):
    """A rolling deploy: server 2 starts while server 1 is in the middle of a job. Before leases, server 2
    queued that job again at start-up and judged it a second time."""
    setup_pull(fake)
    fake.delay("PATCH", r"/check-runs/\d+$", 3.0)  # server 1's job hangs in its completing PATCH
    first = start_app()
    first.send("pull_request", OPENED, delivery="d1")
    _wait(lambda: fake.check_runs(REPO, HEAD))  # the run is created: the PATCH is next
    assert first.queue().delivery("d1")["status"] == "running"

    second = start_app()
    row = first.wait_done("d1")
    assert row["status"] == "done" and row["attempts"] == 1
    assert row["lease_owner"] == first.asgi.state.queue.owner != second.asgi.state.queue.owner
    time.sleep(0.3)  # room for a duplicate to show
    assert len(_decisions(first)) == 1
    [run] = fake.check_runs(REPO, HEAD)
    assert run["status"] == "completed"
    assert sum(1 for _, body in fake.check_run_patches if body.get("conclusion")) == 1


@both_stores
def test_the_job_of_a_dead_worker_process_is_taken_over_when_its_lease_expires(fake, start_app):
    setup_pull(fake)
    fake.delay("PATCH", r"/check-runs/\d+$", 3.0)  # past the takeover: the worker dies mid-job
    first = start_app(workers="process", job_lease_s=1.0)
    first.wait_healthy()
    first.send("pull_request", OPENED, delivery="d1")
    _wait(lambda: fake.check_runs(REPO, HEAD))
    [pid] = [r["pid"] for r in first.queue().db.connection().execute("SELECT pid FROM heartbeats"
                                                                     " WHERE role = 'workers'")]
    os.kill(pid, signal.SIGKILL)  # the worker dies holding d1

    second = start_app(job_lease_s=1.0)
    row = second.wait_done("d1")
    assert row["status"] == "done" and row["attempts"] == 2
    assert row["lease_owner"] == second.asgi.state.queue.owner
    assert len(_decisions(second)) == 1
    [run] = fake.check_runs(REPO, HEAD)
    assert run["status"] == "completed" and run["conclusion"] == "success"


@both_stores
def test_a_job_whose_workers_keep_dying_is_given_up_after_max_attempts(tmp_path, rsa_keys, fake, store):
    """Each takeover counts as an attempt; past max_attempts the job fails instead of killing worker after worker."""
    from app_harness import make_config

    from gatekeeper.github.client import GitHubApp
    from gatekeeper.github.context import AppContext
    from gatekeeper.github.worker import Worker

    config = make_config(rsa_keys, fake, tmp_path, max_attempts=2, job_lease_s=10, db_path=store)
    db = open_database(config.db_path)
    queue = DeliveryQueue(db, lease_s=10)
    queue.enqueue("d-crash", "pull_request", "opened", b"{}", now=100.0)
    for now in (100.0, 111.0):  # two attempts whose worker died (the lease ran out each time)
        assert queue.claim(now=now) is not None
    job = queue.claim(now=122.0)
    assert job.attempts == 3
    Worker(AppContext(config, queue, Records(db), GitHubApp(config))).run(job)
    row = queue.delivery("d-crash")
    assert row["status"] == "failed" and "attempt 3 of at most 2" in row["error"]
