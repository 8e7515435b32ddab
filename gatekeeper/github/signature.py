"""X-Hub-Signature-256: HMAC-SHA256 of the raw request body with the webhook secret."""

from __future__ import annotations

import hashlib
import hmac
import re

PREFIX = "sha256="
_HEADER = re.compile(r"sha256=[0-9a-f]{64}")  # the only form GitHub sends


def well_formed(header: str | None) -> bool:
    """Checked before the body is read: a request that cannot be signed is refused without receiving it."""
    return header is not None and _HEADER.fullmatch(header) is not None


def hasher(secret: str) -> hmac.HMAC:
    """An HMAC to feed the body to as it arrives (`matches` then checks it)."""
    return hmac.new(secret.encode(), digestmod=hashlib.sha256)


def matches(mac: hmac.HMAC, header: str) -> bool:
    """Compared in constant time."""
    return hmac.compare_digest((PREFIX + mac.hexdigest()).encode(), header.encode())


def sign(secret: str, body: bytes) -> str:
    mac = hasher(secret)
    mac.update(body)
    return PREFIX + mac.hexdigest()


def verify(secret: str, body: bytes, header: str | None) -> bool:
    """True only for a well-formed header whose digest matches."""
    if not well_formed(header):
        return False
    mac = hasher(secret)
    mac.update(body)
    return matches(mac, header)
