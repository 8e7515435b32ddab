"""`/gatekeeper override <head SHA> <reason>` in a PR comment: parsing, and who may do it.

An override approves one head, the one its author looked at, so the command names it: the first 7 to 40
hex digits of the head commit's SHA. A push after the comment is a new change the commenter never saw;
the SHA no longer matches and the override is refused with a reply.

Only a command on a line of its own counts, in the comment's plain text: not inside a fenced or indented
code block, not in a quote (a reply quoting someone else's override is not an override).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COMMAND = re.compile(r"^/gatekeeper[ \t]+override\b(?P<rest>.*)$")
_SHA = re.compile(r"[0-9a-fA-F]{7,40}")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")

# GitHub's collaborator `permission` values; "maintain" is reported as "write" there, "triage" as "read".
WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})

USAGE = "`/gatekeeper override <head SHA, 7+ hex digits> <reason>`"


@dataclass(frozen=True)
class OverrideRequest:
    head_prefix: str | None  # None: the command named no head SHA
    reason: str | None  # None: the command was given without the required reason

    @property
    def problem(self) -> str | None:
        """Why the command cannot be honoured as written; None when it is well formed."""
        if self.head_prefix is None:
            return f"the command names no head SHA: use {USAGE}"
        if not self.reason:
            return f"no reason given: use {USAGE}"
        return None

    def approves(self, head_sha: str) -> bool:
        return self.head_prefix is not None and head_sha.lower().startswith(self.head_prefix.lower())


def parse_override(body: str | None) -> OverrideRequest | None:
    """None if the comment holds no override command; a request (possibly malformed) otherwise."""
    for line in _plain_lines(body or ""):
        match = _COMMAND.match(line.strip())
        if match is None:
            continue
        words = match.group("rest").split(maxsplit=1)
        if words and _SHA.fullmatch(words[0]):
            return OverrideRequest(words[0].lower(), words[1].strip() if len(words) > 1 else None)
        return OverrideRequest(None, match.group("rest").strip() or None)
    return None


def _plain_lines(text: str):
    """The lines of Markdown text outside code blocks and quotes."""
    fence: str | None = None
    for line in text.replace("\r\n", "\n").split("\n"):
        opener = _FENCE.match(line)
        if fence is not None:
            if opener and opener.group(1)[0] == fence[0] and len(opener.group(1)) >= len(fence):
                fence = None
            continue
        if opener:
            fence = opener.group(1)
            continue
        if line.startswith(("    ", "\t")) or line.lstrip(" ").startswith(">"):
            continue
        yield line


def may_override(permission: str) -> bool:
    return permission in WRITE_PERMISSIONS
