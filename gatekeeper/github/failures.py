"""Which failures are worth retrying. A job fails for one of three reasons, and each is handled differently:
transient (5xx, rate limit, network, the App's own database busy or unreachable: retry later), token rejected
(drop the cached token, retry now), permanent (anything else: fail the check with the reason, never a silent
pass)."""

from __future__ import annotations

import sqlite3
import sys
from enum import Enum

import requests
from github.GithubException import BadCredentialsException, GithubException, RateLimitExceededException


class HeadMoved(Exception):
    """A pull request kept moving while its inputs were read (pushes in quick succession): retried later."""


class Failure(str, Enum):
    transient = "transient"
    token_rejected = "token_rejected"
    permanent = "permanent"


def classify(exc: BaseException) -> Failure:
    if isinstance(exc, BadCredentialsException):
        return Failure.token_rejected
    if isinstance(exc, RateLimitExceededException):
        return Failure.transient
    if isinstance(exc, GithubException):
        if exc.status == 401:
            return Failure.token_rejected
        if exc.status == 429 or exc.status >= 500:
            return Failure.transient
        return Failure.permanent
    if isinstance(exc, HeadMoved) or _database_unavailable(exc):
        return Failure.transient
    # PyGithub lets requests' errors through: refused connections, timeouts, and exhausted 5xx retries.
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.RetryError)):
        return Failure.transient
    return Failure.permanent


def _database_unavailable(exc: BaseException) -> bool:
    """The App's database failed for a reason that is not the PR's: locked past its timeout, restarting,
    unreachable, a deadlock it broke (DB-API's OperationalError, in either driver). A check that said "could
    not evaluate" for that would be wrong; the job is retried like a GitHub 5xx."""
    psycopg = sys.modules.get("psycopg")  # loaded only when the App runs on PostgreSQL
    return isinstance(exc, sqlite3.OperationalError) or (psycopg is not None and
                                                         isinstance(exc, psycopg.OperationalError))


def describe(exc: BaseException) -> str:
    """A one-line reason for the check run and the audit log (no tracebacks, no request headers)."""
    if isinstance(exc, GithubException):
        message = exc.message or (exc.data.get("message") if isinstance(exc.data, dict) else None) or ""
        return f"GitHub answered {exc.status}: {message}".strip().rstrip(":")
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
