"""The delivery queue alone: how many claims per second K worker processes get through, with no evaluation.

    .venv/bin/python benchmarks/bench_queue.py [--db postgresql://...] [--processes 1,2,4] [--threads 4]
                                               [--jobs 2000]

For each K: a fresh database (a SQLite file, or a fresh schema of the PostgreSQL server at --db) is filled
with --jobs deliveries, then K processes of --threads threads each claim and finish them as fast as they can
(DeliveryQueue.claim, then finish: the two transactions every evaluation pays). Prints, per K, the claims per
second (jobs / wall time from the start signal to the last finish) and checks that every delivery was
claimed exactly once (attempts = 1, status done); exits 1 if not. It tells the queue's own ceiling apart from
the evaluations' cost that bench_webhooks.py measures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gatekeeper" / "github"))

from app_harness import fresh_schema  # noqa: E402

from gatekeeper.github.db import open_database  # noqa: E402
from gatekeeper.github.queue import DeliveryQueue  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", metavar="URL", help="a postgresql:// server (default: a SQLite file)")
    parser.add_argument("--processes", default="1,2,4", help="comma-separated process counts")
    parser.add_argument("--threads", type=int, default=4, help="claiming threads per process")
    parser.add_argument("--jobs", type=int, default=2000)
    args = parser.parse_args()
    results, ok = [], True
    for k in [int(n) for n in args.processes.split(",")]:
        with tempfile.TemporaryDirectory(prefix="gk-queue-") as tmp, _database(args.db, Path(tmp)) as target:
            producer = DeliveryQueue(open_database(target))
            for n in range(args.jobs):
                producer.enqueue(f"d{n:06}", "pull_request", "opened", b"{}", now=1.0)
            go = multiprocessing.get_context("spawn").Event()
            ready = multiprocessing.get_context("spawn").Barrier(k + 1)
            processes = [multiprocessing.get_context("spawn").Process(target=_claimer, args=(target, args.threads,
                                                                                             ready, go))
                         for _ in range(k)]
            for process in processes:
                process.start()
            ready.wait(60)  # every process connected and waiting
            began = time.perf_counter()
            go.set()
            for process in processes:
                process.join(300)
            wall = time.perf_counter() - began
            rows = producer.db.connection().execute(
                "SELECT status, attempts, COUNT(*) AS n FROM deliveries GROUP BY status, attempts").fetchall()
            shape = {f"{r['status']}/{r['attempts']}": r["n"] for r in rows}
            exact = shape == {"done/1": args.jobs} and all(p.exitcode == 0 for p in processes)
            ok &= exact
            producer.db.close()
            results.append({"store": producer.db.dialect, "processes": k, "threads_per_process": args.threads,
                            "jobs": args.jobs, "wall_s": round(wall, 2), "claims_per_s": round(args.jobs / wall),
                            "each_claimed_once": exact, "rows": shape})
    print(json.dumps(results, indent=2))
    return 0 if ok else 1


def _claimer(target: str, threads: int, ready, go) -> None:
    db = open_database(target)
    queue = DeliveryQueue(db, lease_s=600)
    errors: list[str] = []

    def loop() -> None:
        try:
            while (job := queue.claim()) is not None:
                if not queue.finish(job.delivery_id, "ok"):
                    errors.append(f"{job.delivery_id}: lease lost")
        except Exception as exc:  # noqa: BLE001 - counted as a failed run below
            errors.append(repr(exc))
        finally:
            db.close()

    queue.db.connection()
    ready.wait(60)
    go.wait(60)
    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        print("\n".join(errors[:5]), file=sys.stderr)
        sys.exit(1)


@contextlib.contextmanager
def _database(url: str | None, work: Path) -> Iterator[str]:
    if url is None:
        yield str(work / "queue.sqlite3")
        return
    with fresh_schema(url, prefix="bench") as target:
        yield target


if __name__ == "__main__":
    sys.exit(main())
