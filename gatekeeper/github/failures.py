"""Which failures are worth retrying. A job fails for one of three reasons, and each is handled differently:
transient (5xx, rate limit, network: retry later), token rejected (drop the cached token, retry now),
permanent (anything else: fail the check with the reason, never a silent pass)."""

from __future__ import annotations

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
    if isinstance(exc, HeadMoved):
        return Failure.transient
    # PyGithub lets requests' errors through: refused connections, timeouts, and exhausted 5xx retries.
    if isinstance(exc, (requests.ConnectionError, requests.Timeout, requests.exceptions.RetryError)):
        return Failure.transient
    return Failure.permanent


def describe(exc: BaseException) -> str:
    """A one-line reason for the check run and the audit log (no tracebacks, no request headers)."""
    if isinstance(exc, GithubException):
        message = exc.message or (exc.data.get("message") if isinstance(exc.data, dict) else None) or ""
        return f"GitHub answered {exc.status}: {message}".strip().rstrip(":")
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
