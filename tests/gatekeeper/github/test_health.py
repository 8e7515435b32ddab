"""A server that answers while nothing works must say so (issue 41, holes 7 and 11): /healthz checks that the
database takes writes, the workers beat, and GitHub accepts the App's JWT; the server refuses to start with
a key or a webhook secret it cannot use; an unsigned webhook is refused before its body is received."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import threading
import time
from urllib.parse import urlsplit

import pytest
import uvicorn
from app_harness import APP_ID, make_config
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gatekeeper.cli import main
from gatekeeper.errors import InputError
from gatekeeper.github import health
from gatekeeper.github.app import create_app
from gatekeeper.github.config import load_config
from gatekeeper.github.queue import DeliveryQueue


def _healthz(app) -> tuple[int, dict]:
    response = app.client.get(app.url + "/healthz")
    return response.status_code, response.json()


def _read_only(path) -> callable:
    """Connections in SQLite's own read-only mode. It refuses writes whoever the process is, where chmod
    0444 stops nothing when the tests run as root; it fails the way a file system remounted read-only after
    disk errors does."""
    local = threading.local()

    def connect() -> sqlite3.Connection:
        if not hasattr(local, "db"):
            local.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
            local.db.row_factory = sqlite3.Row
        return local.db

    return connect


def test_healthz_is_503_when_the_database_takes_no_writes(start_app, monkeypatch):
    app = start_app()
    assert app.wait_healthy()["status"] == "ok"
    monkeypatch.setattr(app.asgi.state.queue.db, "connection", _read_only(app.config.db_path))
    status, body = _healthz(app)
    assert status == 503 and body["status"] == "unhealthy"
    assert "the database does not take writes: attempt to write a readonly database" in body["reasons"]


def test_healthz_is_503_when_github_rejects_the_apps_jwt(fake, start_app):
    app = start_app(app_id=APP_ID + 1)  # GitHub knows this key under another App id
    status, body = _healthz(app)
    assert status == 503
    [reason] = body["reasons"]
    assert reason.startswith("GitHub rejects the App's JWT (401") and "app_id" in reason
    assert _healthz(app)[0] == 503
    asked = [c for c in fake.calls if c[:2] == ("GET", "/app/installations")]
    assert len(asked) == 1  # the answer is kept for health_github_check_s: probes do not hammer GitHub


def test_healthz_asks_github_nothing_when_the_check_is_off(fake, start_app):
    app = start_app(app_id=APP_ID + 1, health_github_check_s=0)
    assert _healthz(app)[0] == 200
    assert not [c for c in fake.calls if c[:2] == ("GET", "/app/installations")]


def test_healthz_is_503_when_the_workers_stop_beating(start_app, monkeypatch):
    monkeypatch.setattr(health, "STALE_HEARTBEAT_MIN_S", 0.0)  # stale after 3 beats of 0.1 s, not 5 s
    app = start_app(job_lease_s=0.3)
    assert app.wait_healthy()["workers"] == 2
    monkeypatch.setattr(DeliveryQueue, "heartbeat", lambda self, threads, now=None: None)  # the workers hang
    time.sleep(0.6)
    status, body = _healthz(app)
    assert status == 503
    [reason] = body["reasons"]
    assert reason.startswith("no heartbeat from the workers for ")


def test_healthz_is_503_when_the_worker_process_died(start_app):
    app = start_app(workers="process")
    assert app.wait_healthy()["workers"] == app.config.workers
    [pid] = [r[0] for r in app.queue().db.connection().execute("SELECT pid FROM heartbeats WHERE role = 'workers'")]
    assert pid != os.getpid()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (answer := _healthz(app))[0] == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    status, body = answer
    assert status == 503 and "worker process exited (exit code -9)" in body["reasons"]


def _pem(key, password: bytes | None = None) -> bytes:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)


@pytest.mark.parametrize("content, reason", [
    (b"-----BEGIN RSA PRIVATE KEY-----\nbm90IGEga2V5\n-----END RSA PRIVATE KEY-----\n", "Could not deserialize"),
    (b"ghp_this_is_a_token_not_a_key\n", "Unable to load PEM file"),
    (_pem(ec.generate_private_key(ec.SECP256R1())), "not an RSA key"),
    (_pem(rsa.generate_private_key(public_exponent=65537, key_size=2048), b"pw"), "encrypted"),
])
def test_a_private_key_that_does_not_parse_stops_the_app(content, reason, rsa_keys, fake, tmp_path):
    bad = tmp_path / "app.pem"
    bad.write_bytes(content)
    with pytest.raises(InputError) as error:
        create_app(make_config((bad, rsa_keys[1]), fake, tmp_path), workers="threads")
    assert str(error.value).startswith(f"{bad}: the App private key is not a PEM RSA private key: ")
    assert reason in str(error.value)


@pytest.fixture
def no_server(monkeypatch):
    """`gatekeeper serve` must stop before the server runs; if it got that far, fail instead of serving."""
    monkeypatch.setattr(uvicorn, "run", lambda *args, **kwargs: pytest.fail("the server started"))
    monkeypatch.setenv("GATEKEEPER_APP_ID", str(APP_ID))


def test_serve_refuses_a_key_that_does_not_parse(no_server, tmp_path, capsys, monkeypatch):
    bad = tmp_path / "app.pem"
    bad.write_text("-----BEGIN RSA PRIVATE KEY-----\nbm90IGEga2V5\n-----END RSA PRIVATE KEY-----\n")
    monkeypatch.setenv("GATEKEEPER_WEBHOOK_SECRET", "hunter2")
    monkeypatch.setenv("GATEKEEPER_PRIVATE_KEY_PATH", str(bad))
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: the App private key is not a PEM RSA private key: " in err and "public key" not in err


def test_a_blank_webhook_secret_refuses_to_start(no_server, rsa_keys, capsys, monkeypatch):
    monkeypatch.setenv("GATEKEEPER_PRIVATE_KEY_PATH", str(rsa_keys[0]))
    monkeypatch.setenv("GATEKEEPER_WEBHOOK_SECRET", " \t\t ")
    with pytest.raises(InputError) as error:
        load_config(None)
    assert "webhook_secret: must not be empty or only whitespace" in str(error.value)
    assert "GATEKEEPER_WEBHOOK_SECRET" in str(error.value) and "\t" not in str(error.value)
    assert main(["serve", "--port", "0"]) == 2
    assert "webhook_secret: must not be empty or only whitespace" in capsys.readouterr().err


def _answer(sock: socket.socket) -> bytes:
    """What the server sends before it closes the connection (a reset after the answer is fine)."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


@pytest.mark.parametrize("framing, first_part", [
    ("Content-Length: 20000000", b"x" * 65536),  # under the 25 MB cap: only the signature can refuse it
    ("Transfer-Encoding: chunked", b"10000\r\n" + b"x" * 65536 + b"\r\n"),  # a first chunk, never a last
])
def test_an_unsigned_webhook_is_refused_before_its_body_is_received(start_app, framing, first_part):
    app = start_app()
    url = urlsplit(app.url)
    head = (f"POST /webhook HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
            f"X-GitHub-Event: pull_request\r\nX-GitHub-Delivery: d-unsigned\r\n{framing}\r\n\r\n").encode()
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(head + first_part)  # and never the rest: a server that waits for it times out here
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 401 ")
    assert b"connection: close" in answer.lower() and b"X-Hub-Signature-256" in answer
    assert _healthz(app)[0] == 200
