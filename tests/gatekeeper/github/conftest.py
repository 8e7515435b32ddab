"""Fixtures for the App tests: an RSA key made per session, the fake GitHub on loopback, the App under
uvicorn (see app_harness.py), and the database it runs on: a SQLite file, or, for the tests marked
`both_stores`, also a fresh schema of the PostgreSQL server at $GATEKEEPER_TEST_POSTGRES_URL
(tools/postgres-test-server.sh starts one; `make test` and CI do)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from app_harness import APP_ID, INSTALLATION, REPO, RunningApp, fresh_schema, make_config
from fake_github import FakeGitHub, serve
from gatekeeper.github.app import create_app


@pytest.fixture(scope="session")
def rsa_keys(tmp_path_factory) -> tuple[Path, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path_factory.mktemp("key") / "app.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return path, public


@pytest.fixture
def fake(rsa_keys) -> Iterator[FakeGitHub]:
    fake = FakeGitHub(APP_ID, rsa_keys[1])
    fake.add_installation(INSTALLATION)
    fake.add_repo(REPO, INSTALLATION)
    with serve(fake) as url:
        fake.base_url = url
        yield fake
    assert fake.violations == [], "the fake answered outside GitHub's schemas"


POSTGRES_URL = os.environ.get("GATEKEEPER_TEST_POSTGRES_URL")


@pytest.fixture
def store(request, tmp_path) -> Iterator[str]:
    """The test's database (config.db_path): SQLite unless parametrized with "postgres" (see both_stores)."""
    if getattr(request, "param", "sqlite") == "sqlite":
        yield str(tmp_path / "gatekeeper.sqlite3")
        return
    if not POSTGRES_URL:
        pytest.skip("GATEKEEPER_TEST_POSTGRES_URL is unset: no PostgreSQL server to test against "
                    "(run: export GATEKEEPER_TEST_POSTGRES_URL=\"$(tools/postgres-test-server.sh)\")")
    with fresh_schema(POSTGRES_URL) as url:  # a schema of its own per test
        yield url


@pytest.fixture
def start_app(rsa_keys, fake, tmp_path, store) -> Iterator[Callable[..., RunningApp]]:
    stack = []

    def start(workers: str = "threads", **overrides: Any) -> RunningApp:
        config = make_config(rsa_keys, fake, tmp_path, **{"db_path": store, **overrides})
        asgi = create_app(config, workers=workers)
        server = serve(asgi)
        url = server.__enter__()
        client = httpx.Client(timeout=10)
        stack.append((server, client))
        return RunningApp(url, config, client, asgi)

    yield start
    for server, client in reversed(stack):
        client.close()
        server.__exit__(None, None, None)
