"""Load and crash test of the GitHub App, on loopback only.

    .venv/bin/python benchmarks/bench_webhooks.py [--events 500] [--rate 60] [--kill-at 250] [--workers 4]
                                                  [--second-server-at N] [--lease 5] [--moving-every 10]
                                                  [--db postgresql://...] [--worker-processes K] [--drain]

Starts the fake GitHub (tests/gatekeeper/github/fake_github.py) in this process and `gatekeeper serve` as a
subprocess, sends signed `pull_request.opened` webhooks (one PR each) at a fixed rate, SIGKILLs the server
after `--kill-at` events, restarts it, and redelivers what was refused while it was down (as GitHub does,
same X-GitHub-Delivery). With `--second-server-at N` a second `gatekeeper serve` starts on the same database
(another port) after N sends, and once it answers the webhooks alternate between the two. Then it checks
that every event was evaluated exactly once: one completed check run per PR head, one decision per PR in the
audit table (`duplicated_evaluations` / `lost_evaluations` count the PRs with more / none), every delivery
done. Every `--moving-every`-th PR is pushed to a new head right after the App first reads it (a head that
moves between two of the App's calls): the new head must be judged by its own files, and the first head,
whose change leaves the owned paths, must never pass (`wrongly_judged_runs`). Prints ack latency percentiles, throughput and the servers' peak RSS as JSON; exits 1 if any check
fails. Every wait is bounded.

With `--db URL` the servers share a PostgreSQL database (a fresh schema of it per run, dropped afterwards)
instead of a SQLite file. With `--worker-processes K` the web servers run `gatekeeper serve --role web` and K
processes `gatekeeper serve --role workers` (`--workers` threads each) judge: `--kill-at N` then SIGKILLs one
worker process after N sends (it is not restarted: the others take its jobs over once their leases expire),
and `--second-server-at N` starts a second web process. `--drain` measures the workers alone: every webhook
is acknowledged first, with no worker running, then the K worker processes start and drain the backlog;
`drain_evaluations_per_s` is (events - 1) / (last finish - first finish), so process start-up is not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import multiprocessing

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gatekeeper" / "github"))

from app_harness import fresh_schema  # noqa: E402
from fake_github import FakeCommit, FakeGitHub, FakePull, serve, webhook_example  # noqa: E402

from gatekeeper.github.db import Database, open_database  # noqa: E402
from gatekeeper.github.signature import sign  # noqa: E402

APP_ID, INSTALLATION, REPO = 29310, 1, "Codertocat/Hello-World"
SECRET = "bench-secret"
BASE = "f95f852bd8fca8fcc58a9a2d6c842781e32a215e"
POLICY = "version: 1\nname: bench\nowned_paths: ['kimi_k3_path/**']\n"
AGENT_COMMIT = "Speed up decode\n\nCo-authored-by: Claude <noreply@anthropic.com>\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--rate", type=float, default=60.0, help="webhooks per second (>= 50 for the claim)")
    parser.add_argument("--kill-at", type=int, metavar="N",
                        help="SIGKILL the server (with --worker-processes: one worker process) after N sends "
                             "(default 250; none with --drain)")
    parser.add_argument("--workers", type=int, default=4, help="worker threads per worker process")
    parser.add_argument("--second-server-at", type=int, metavar="N",
                        help="start a second server on the same database after N sends; alternate between them")
    parser.add_argument("--lease", type=float, default=5.0,
                        help="job_lease_s: a killed server's jobs are taken over this long after it died")
    parser.add_argument("--moving-every", type=int, default=10, metavar="K",
                        help="every K-th PR is pushed to a new head right after the App first reads it (0: none)")
    parser.add_argument("--timeout", type=float, default=180.0, help="bound on the whole run, seconds")
    parser.add_argument("--db", metavar="URL", help="a postgresql:// server to run on (default: a SQLite file)")
    parser.add_argument("--worker-processes", type=int, default=0, metavar="K",
                        help="web-only servers and K worker-only processes (default 0: `gatekeeper serve` "
                             "with its own worker process)")
    parser.add_argument("--fake-nice", type=int, default=10, metavar="N",
                        help="the fake GitHub's niceness (10: it yields the CPUs to the App, as if it ran elsewhere; "
                             "0: it competes for them as an equal)")
    parser.add_argument("--workers-async-commit", action="store_true",
                        help="PostgreSQL: the worker processes commit with synchronous_commit=off (the web "
                             "processes' acknowledgements stay durable); see docs/github-app.md")
    parser.add_argument("--drain", action="store_true",
                        help="acknowledge every webhook first, then start the worker processes and time the drain")
    args = parser.parse_args()
    if args.workers_async_commit and not (args.db and args.worker_processes):
        parser.error("--workers-async-commit needs --db and --worker-processes")
    if args.drain and not args.worker_processes:
        parser.error("--drain needs --worker-processes")
    if args.drain and args.kill_at is not None:
        parser.error("--drain starts the workers after the last send: there is nothing to kill mid-run")
    if args.kill_at is None and not args.drain:
        args.kill_at = 250

    with tempfile.TemporaryDirectory(prefix="gk-bench-") as tmp, _database(args.db, Path(tmp)) as db_target:
        work = Path(tmp)
        key_path, public_pem = _key(work)
        # The fake runs in its own process, so its work never competes with the sender for a GIL and the
        # measured latency is the App's.
        parent, child = multiprocessing.Pipe()
        fake_process = multiprocessing.Process(target=_fake_github,
                                               args=(child, public_pem, args.events, args.moving_every,
                                                     args.fake_nice))
        fake_process.start()
        try:
            fake_url, heads, final = parent.recv()
            result = _run(args, work, key_path, fake_url, heads, db_target)
            parent.send("report")
            result.update(_check(parent.recv(), heads, final, db_target))
            if not _passed(result):  # the servers' logs say why: keep them past the temporary directory
                kept = Path(tempfile.mkdtemp(prefix="gk-bench-failed-"))
                for log in work.glob("*.log"):
                    shutil.copy(log, kept)
                print(f"the run failed its checks; the servers' logs are in {kept}", file=sys.stderr)
        finally:
            fake_process.terminate()
            fake_process.join(10)
    print(json.dumps(result, indent=2))
    return 0 if _passed(result) else 1


def _passed(result: dict) -> bool:
    return result["exactly_once"] and (result["duplicated_evaluations"] == result["lost_evaluations"]
                                       == result["wrongly_judged_runs"] == 0)


@contextlib.contextmanager
def _database(url: str | None, work: Path) -> Iterator[str]:
    """GATEKEEPER_DB for the run: a SQLite file in `work`, or a fresh schema of the PostgreSQL server at
    `url` (picked by search_path in the URL, so every process of the run sees it), dropped afterwards."""
    if url is None:
        yield str(work / "gatekeeper.sqlite3")
        return
    with fresh_schema(url, prefix="bench") as target:
        yield target


def _files(path: str) -> list[dict]:
    return [{"filename": path, "status": "added", "additions": 2, "deletions": 0, "patch": "@@ -0,0 +1,2 @@\n+a\n+b\n"}]


def _fake_github(conn, public_pem: str, events: int, moving_every: int, niceness: int) -> None:
    """PR n is opened at head n. Every `moving_every`-th PR is opened with a change outside the owned paths
    and pushed, right after the App's first read of it, to a head that stays inside: a review that mixed
    the two would judge the first head by the second head's files."""
    # GitHub is another machine in real life; here it shares the CPUs, so it yields them to the App.
    os.nice(niceness)
    fake = FakeGitHub(APP_ID, public_pem, validate=False)
    fake.add_installation(INSTALLATION)
    repo = fake.add_repo(REPO, INSTALLATION)
    repo.trees[BASE] = {".github/gatekeeper.yml": POLICY}
    heads, final = {}, {}
    for n in range(1, events + 1):
        head = heads[n] = final[n] = f"{n:040x}"
        moving = moving_every > 0 and n % moving_every == 0
        files = _files(f"outside/op_{n}.py" if moving else f"kimi_k3_path/op_{n}.py")
        repo.pulls[n] = FakePull(n, head, BASE, files, [FakeCommit(head, AGENT_COMMIT)])
        if moving:
            final[n] = f"{n + 10 ** 9:040x}"
            fake.move_head(REPO, n, final[n], after=("GET", rf"/pulls/{n}$", 1),
                           files=_files(f"kimi_k3_path/op_{n}.py"))
    with serve(fake) as url:
        fake.base_url = url
        conn.send((url, heads, final))
        if conn.recv() == "report":
            completions: dict[int, int] = {}
            for run_id, body in fake.check_run_patches:
                if body.get("conclusion"):
                    completions[run_id] = completions.get(run_id, 0) + 1
            conn.send({
                "runs": [(r["head_sha"], r["status"], r["conclusion"]) for r in fake.check_runs(REPO)],
                "completed_twice": sum(1 for c in completions.values() if c > 1),
                "violations": fake.violations,
            })


def _run(args, work: Path, key_path: Path, fake_url: str, heads: dict[int, str], db_target: str) -> dict:
    config = work / "gatekeeper.yml"
    config.write_text(f"workers: {args.workers}\nseconds_between_requests: 0\nseconds_between_writes: 0\n"
                      "reconcile_interval_s: 0\nretry_backoff_s: 0.2\nhttp_backoff_s: 0.05\n"
                      f"job_lease_s: {args.lease}\n")
    env = {**os.environ, "GATEKEEPER_WEBHOOK_SECRET": SECRET, "GATEKEEPER_APP_ID": str(APP_ID),
           "GATEKEEPER_PRIVATE_KEY_PATH": str(key_path), "GATEKEEPER_DB": db_target,
           "GATEKEEPER_GITHUB_API_URL": fake_url}
    deadline = time.monotonic() + args.timeout
    template = webhook_example("pull_request.opened")
    events = []
    for n, head in heads.items():
        payload = json.loads(json.dumps(template))
        payload["number"] = payload["pull_request"]["number"] = n
        payload["pull_request"]["head"]["sha"] = head
        body = json.dumps(payload).encode()
        events.append((str(uuid.uuid4()), body))

    role = "web" if args.worker_processes else "all"
    servers = [Server("server_1", work, env, config, role)]
    if args.second_server_at is not None:
        servers.append(Server("server_2", work, env, config, role))
    db = open_database(db_target)
    worker_env = env
    if args.workers_async_commit:  # fresh_schema's URL ends in its options=: one more server setting there
        worker_env = {**env, "GATEKEEPER_DB": db_target + "%20-csynchronous_commit%3Doff"}
    workers = [Server(f"workers_{i + 1}", work, worker_env, config, "workers", db)
               for i in range(args.worker_processes)]
    try:
        servers[0].start(deadline)
        if not args.drain:
            _start_all(workers, deadline)
        result = asyncio.run(_send_all(args, events, servers, workers, deadline))
        if args.drain:
            _start_all(workers, deadline)
        while time.monotonic() < deadline and _pending(db) > 0:
            time.sleep(0.05)
        result["processed_at"] = time.perf_counter() - result["start"]
    finally:
        for server in servers + workers:
            server.stop()  # also when the run fails: no server outlives the benchmark
    logs = "".join(server.log_path.read_text(errors="replace") for server in servers + workers)
    latencies, send_window, processed_at = result["latencies"], result["send_window"], result["processed_at"]
    span = db.connection().execute("SELECT MIN(finished_at) AS first, MAX(finished_at) AS last FROM deliveries"
                                   ).fetchone()
    first_done, last_done = span["first"], span["last"]
    db.close()
    return {
        "store": db.dialect, "events": len(heads), "rate_target_per_s": args.rate, "fake_nice": args.fake_nice,
        "worker_processes": args.worker_processes or "one per server", "worker_threads_per_process": args.workers,
        "job_lease_s": args.lease, "killed_after_sends": args.kill_at,
        "workers_async_commit": args.workers_async_commit,
        "killed": None if args.kill_at is None else "a worker process" if workers else "the server",
        "restarts": servers[0].restarts,
        "second_server_after_sends": args.second_server_at,
        "redelivered_after_restart": result["redelivered"],
        # Deliveries a worker was running when its server died, taken over by a worker (of the restarted
        # server or of the other one) once their lease had expired.
        "interrupted_and_taken_over": len(re.findall(r"took over delivery ", logs)),
        "ack_latency_ms": _percentiles(latencies),
        "ack_latency_ms_first_pass": _percentiles(latencies[: result["first_pass"]]),
        "ack_latency_ms_redeliveries": _percentiles(latencies[result["first_pass"]:]),
        "send_rate_per_s": round(len(heads) / send_window, 1),
        "all_evaluated_after_s": round(processed_at, 2),
        "evaluation_throughput_per_s": round(len(heads) / processed_at, 1),
        # With --drain: how fast the worker processes judge a backlog, start-up excluded.
        "drain_evaluations_per_s": round((len(heads) - 1) / (last_done - first_done), 1) if args.drain else None,
        # VmHWM: the most memory each process ever held resident (the web server, its worker process).
        "peak_rss_mb": {server.name: server.peak_mb() for server in servers + workers},
    }


class Server:
    """`gatekeeper serve` as a child process that the benchmark can kill and start again."""

    def __init__(self, name: str, work: Path, env: dict[str, str], config: Path, role: str = "all",
                 db: Database | None = None):
        port = _free_port()
        self.name, self.env, self.url, self.role, self.db = name, env, f"http://127.0.0.1:{port}", role, db
        self.command = [sys.executable, "-m", "gatekeeper", "serve", "--host", "127.0.0.1", "--port", str(port),
                        "--config", str(config), "--log-level", "warning", "--role", role]
        self.log_path = work / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self._peak_kb: dict[str, int] = {}

    def start(self, deadline: float) -> None:
        self.launch()
        self.wait_ready(deadline)

    def launch(self) -> None:
        self.process = subprocess.Popen(self.command, env=self.env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, deadline: float) -> None:
        if self.role == "workers":  # no HTTP: it is up once its heartbeat is in the database
            _wait_beating(self.db, self.process.pid, deadline)
        else:
            _wait_healthy(self.url, deadline)

    def kill(self) -> None:
        self._sample_memory()
        self.process.send_signal(signal.SIGKILL)  # no shutdown hook runs: a crash, not a stop
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self._sample_memory()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()

    def peak_mb(self) -> dict[str, float]:
        return {role: round(kb / 1024, 1) for role, kb in self._peak_kb.items()}

    def _sample_memory(self) -> None:
        """The peaks so far of the web process and its worker process, kept over restarts (Linux only)."""
        own = "workers" if self.role == "workers" else "web"
        for role, pid in [(own, self.process.pid), *(("workers", pid) for pid in _worker_pids(self.process.pid))]:
            kb = _vm_hwm_kb(pid)
            if kb is not None:
                self._peak_kb[role] = max(self._peak_kb.get(role, 0), kb)


def _start_all(servers: list[Server], deadline: float) -> None:
    """Start them all at once, then wait for each: they start up in parallel."""
    for server in servers:
        server.launch()
    for server in servers:
        server.wait_ready(deadline)


def _worker_pids(pid: int) -> list[int]:
    """The server's worker process (multiprocessing's spawn), not its resource tracker."""
    try:
        import psutil
    except ImportError:
        return []
    try:
        children = psutil.Process(pid).children()
        return [c.pid for c in children if any("spawn_main" in part for part in c.cmdline())]
    except psutil.Error:
        return []


def _vm_hwm_kb(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) if found else None


async def _send_all(args, events, servers: list[Server], workers: list[Server], deadline: float) -> dict:
    """Fire each webhook at its scheduled time without waiting for earlier answers (GitHub delivers
    concurrently). The first server is SIGKILLed at event `kill_at` and restarted a second later, in the
    background; what was refused meanwhile is redelivered after the restart, with the same delivery id, to
    the server it was meant for. With worker-only processes, the first of those is SIGKILLed instead (and
    stays dead). A second server starts at event `second_server_at`; once it answers, odd events go to it."""
    interval = 1.0 / args.rate
    latencies: list[float] = []
    refused: list[tuple[Server, str, bytes]] = []
    first, second = servers[0], servers[1] if len(servers) > 1 else None
    second_up = asyncio.Event()

    async def crash_and_restart() -> None:
        first.kill()
        await asyncio.sleep(1.0)
        await asyncio.to_thread(first.start, deadline)
        first.restarts += 1

    async def start_second() -> None:
        await asyncio.to_thread(second.start, deadline)
        second_up.set()

    async with httpx.AsyncClient(timeout=10.0, limits=httpx.Limits(max_connections=64)) as client:
        async def deliver(server: Server, delivery: str, body: bytes) -> None:
            ok, latency = await _send(client, server.url, delivery, body)
            (latencies.append(latency) if ok else refused.append((server, delivery, body)))

        start = time.perf_counter()
        tasks, background = [], []
        for i, (delivery, body) in enumerate(events):
            await asyncio.sleep(max(0.0, start + i * interval - time.perf_counter()))
            if i == args.kill_at:
                if workers:
                    workers[0].kill()  # kill -9 of a worker process in the middle of its jobs
                else:
                    background.append(asyncio.create_task(crash_and_restart()))
            if second is not None and i == args.second_server_at:
                background.append(asyncio.create_task(start_second()))
            target = second if second_up.is_set() and i % 2 else first
            tasks.append(asyncio.create_task(deliver(target, delivery, body)))
        await asyncio.gather(*tasks)
        send_window = time.perf_counter() - start
        await asyncio.gather(*background)
        redelivered = list(refused)
        refused.clear()
        first_pass = len(latencies)
        resend_start = time.perf_counter()
        resends = []
        for i, (server, delivery, body) in enumerate(redelivered):  # at the same rate, not as one burst
            await asyncio.sleep(max(0.0, resend_start + i * interval - time.perf_counter()))
            resends.append(asyncio.create_task(deliver(server, delivery, body)))
        await asyncio.gather(*resends)
        if refused:
            raise SystemExit(f"{len(refused)} redeliveries refused after the restart")
    return {"latencies": latencies, "first_pass": first_pass, "send_window": send_window,
            "redelivered": len(redelivered), "start": start}


async def _send(client: httpx.AsyncClient, url: str, delivery: str, body: bytes) -> tuple[bool, float]:
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": delivery,
               "X-Hub-Signature-256": sign(SECRET, body)}
    began = time.perf_counter()
    try:
        response = await client.post(url + "/webhook", content=body, headers=headers)
    except httpx.TransportError:
        return False, 0.0
    if response.status_code not in (200, 202):
        raise SystemExit(f"unexpected answer {response.status_code}: {response.text}")
    return True, time.perf_counter() - began


def _check(fake_report: dict, heads: dict[int, str], final: dict[int, str], db_target: str) -> dict:
    """Exactly once: one completed, successful check run per final head; one decision per PR; every delivery
    done. Judged right: a head whose files leave the owned paths never gets anything but a failure."""
    runs_per_head: dict[str, list[tuple]] = {}
    for head, status, conclusion in fake_report["runs"]:
        runs_per_head.setdefault(head, []).append((status, conclusion))
    db = open_database(db_target)
    try:
        conn = db.connection()
        decisions = {row["pr"]: row["n"] for row in conn.execute(
            "SELECT pr, COUNT(*) AS n FROM audit WHERE kind = 'decision' GROUP BY pr").fetchall()}
        statuses = {row["status"]: row["n"] for row in conn.execute(
            "SELECT status, COUNT(*) AS n FROM deliveries GROUP BY status").fetchall()}
        failed = [dict(row) for row in conn.execute(
            "SELECT id, attempts, error FROM deliveries WHERE status = 'failed'").fetchall()]
    finally:
        db.close()
    one_run_each = all(runs_per_head.get(h) == [("completed", "success")] for h in final.values())
    bad_heads = {heads[n] for n in heads if heads[n] != final[n]}
    wrong = sum(1 for head, _, conclusion in fake_report["runs"]
                if conclusion != ("failure" if head in bad_heads else "success"))
    one_decision_each = all(decisions.get(n) == 1 for n in heads)
    return {
        "deliveries": statuses,
        "duplicated_evaluations": sum(1 for n in heads if decisions.get(n, 0) > 1),  # PRs judged more than once
        "lost_evaluations": sum(1 for n in heads if decisions.get(n, 0) == 0),  # PRs never judged
        # Runs that were being completed when the server died: re-evaluated after the restart, same run.
        "check_runs_completed_twice": fake_report["completed_twice"],
        "one_completed_run_per_head": one_run_each,
        "moved_heads": len(bad_heads),
        # A run whose conclusion is not its own head's: the moved-from heads may only fail, the others pass.
        "wrongly_judged_runs": wrong,
        "one_decision_per_pr": one_decision_each,
        "exactly_once": one_run_each and one_decision_each and statuses == {"done": len(heads)},
        "schema_violations": len(fake_report["violations"]),
        "failed_deliveries": failed,  # each with its reason: none may fail
    }


def _percentiles(seconds: list[float]) -> dict:
    if not seconds:
        return {"samples": 0}
    ms = sorted(x * 1000 for x in seconds)
    return {"p50": round(statistics.median(ms), 2), "p99": round(ms[int(0.99 * (len(ms) - 1))], 2),
            "max": round(ms[-1], 2), "samples": len(ms)}


def _pending(db: Database) -> int:
    return db.connection().execute(
        "SELECT COUNT(*) AS n FROM deliveries WHERE status IN ('queued', 'running')").fetchone()["n"]


def _wait_healthy(url: str, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise SystemExit("the server did not become healthy in time")


def _wait_beating(db: Database, pid: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        if db.connection().execute("SELECT 1 FROM heartbeats WHERE role = 'workers' AND pid = ?",
                                   (pid,)).fetchone():
            return
        time.sleep(0.05)
    raise SystemExit(f"the worker process {pid} did not beat in time")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _key(work: Path) -> tuple[Path, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = work / "app.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return path, public.decode()


if __name__ == "__main__":
    sys.exit(main())
