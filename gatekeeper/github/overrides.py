"""`/gatekeeper override <reason>` in a PR comment: parsing, and who may do it."""

from __future__ import annotations

import re
from dataclasses import dataclass

# At the start of a line, so quoting someone else's override in a reply ("> /gatekeeper override") does not count.
_COMMAND = re.compile(r"^/gatekeeper[ \t]+override(?:[ \t]+(?P<reason>\S.*?))?[ \t]*$", re.MULTILINE)

# GitHub's collaborator `permission` values; "maintain" is reported as "write" there, "triage" as "read".
WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})


@dataclass(frozen=True)
class OverrideRequest:
    reason: str | None  # None: the command was given without the required reason

    @property
    def valid(self) -> bool:
        return bool(self.reason)


def parse_override(body: str | None) -> OverrideRequest | None:
    """None if the comment holds no override command; a request (possibly without a reason) otherwise."""
    match = _COMMAND.search(body or "")
    if match is None:
        return None
    return OverrideRequest((match.group("reason") or "").strip() or None)


def may_override(permission: str) -> bool:
    return permission in WRITE_PERMISSIONS
