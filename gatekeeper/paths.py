"""Path hygiene and policy globs.

`path_problem` says why a changed path is hostile (a path that escapes the repository, hides characters
from a reviewer, or reaches into git's own directory); `matches` is the one glob matcher the policy uses.

Globs are anchored at the repository root and follow gitignore's wildcards:
  `**` as a whole segment matches any number of segments, zero included (`a/**/b` matches `a/b`);
  `*` matches within one segment, `?` one character of a segment, `[...]` a character class (`[!...]` negates);
  a backslash escapes the next character. `a/**` matches every file below `a/`, but not `a` itself.
Unlike gitignore, a pattern without a slash is NOT matched at every depth: `*.py` is a top-level file only.
A policy that owns "every .py anywhere" must say `**/*.py`, so nobody owns more than they wrote.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from functools import lru_cache

# Characters that reorder how text is displayed ("Trojan Source", CVE-2021-42574): a path holding them
# can look like another path in a review UI.
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def path_problem(path: str) -> str | None:
    """Why `path` must not be trusted as a repository-relative file path, or None if it is clean."""
    if path == "":
        return "empty path"
    if "\x00" in path:
        return "contains a NUL byte"
    for char in path:
        problem = _character_problem(char)
        if problem is not None:
            return problem
    if "\\" in path:
        return "contains a backslash (a Windows separator or an escape)"
    if path.startswith("/"):
        return "absolute path"
    if re.match(r"^[A-Za-z]:", path):
        return "absolute path (drive letter)"
    for segment in path.split("/"):
        if segment == "":
            return "empty path segment ('//' or a trailing '/')"
        if segment == "..":
            return "'..' segment escapes its directory"
        if segment == ".":
            return "'.' segment (not a canonical path)"
        if segment.lower() == ".git":
            return "'.git' segment reaches into git's own directory"
    return None


def _character_problem(char: str) -> str | None:
    if char in _BIDI_CONTROLS:
        return f"contains bidirectional control character U+{ord(char):04X}"
    category = unicodedata.category(char)
    if category == "Cc":
        return f"contains control character U+{ord(char):04X}"
    if category == "Cf":
        return f"contains invisible formatting character U+{ord(char):04X}"
    if category == "Cs":
        return "contains a lone surrogate (the name was not valid UTF-8)"
    return None


def matches(path: str, pattern: str) -> bool:
    """Whether repository-relative `path` matches the anchored glob `pattern` (see the module docstring)."""
    return _compile(pattern).fullmatch(path) is not None


def matches_any(path: str, patterns: Iterable[str]) -> bool:
    return any(matches(path, pattern) for pattern in patterns)


@lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    if pattern == "":
        raise ValueError("empty glob pattern")
    segments = pattern.split("/")
    parts: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            # Zero or more whole segments. As the last segment it needs at least one (a file below),
            # elsewhere it swallows its own trailing slash so that `a/**/b` also matches `a/b`.
            parts.append(".+" if last else "(?:[^/]+/)*")
        else:
            parts.append(_segment_regex(segment) + ("" if last else "/"))
    return re.compile("".join(parts), re.DOTALL)


def _segment_regex(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "\\" and i + 1 < len(segment):
            out.append(re.escape(segment[i + 1]))
            i += 2
            continue
        if char == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":  # `a**b` inside a segment is just `*`
                i += 1
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = _class_end(segment, i)
            if end is None:
                out.append(re.escape(char))  # an unclosed '[' is a literal, as in gitignore
            else:
                out.append(_class_regex(segment[i + 1 : end]))
                i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def _class_end(segment: str, start: int) -> int | None:
    """Index of the ']' closing the class opened at `start`; a ']' right after '[' or '[!' is a member."""
    i = start + 1
    if i < len(segment) and segment[i] in "!^":
        i += 1
    if i < len(segment) and segment[i] == "]":
        i += 1
    end = segment.find("]", i)
    return None if end == -1 else end


def _class_regex(body: str) -> str:
    negate = body[:1] in ("!", "^")
    if negate:
        body = body[1:]
    members = "".join("\\" + c if c in "\\^[]" else c for c in body)
    # A class never matches the separator, negated or not.
    return f"[^/{members}]" if negate else f"(?![/])[{members}]"
