"""X-Hub-Signature-256: HMAC-SHA256 of the raw request body with the webhook secret."""

from __future__ import annotations

import hashlib
import hmac

PREFIX = "sha256="


def sign(secret: str, body: bytes) -> str:
    return PREFIX + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """True only for a well-formed header whose digest matches; compared in constant time."""
    if not header or not header.startswith(PREFIX):
        return False
    return hmac.compare_digest(sign(secret, body).encode(), header.encode())
