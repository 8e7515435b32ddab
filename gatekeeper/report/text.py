"""Escaping for untrusted text (paths, commit trailers, messages) shown in a report.

A path may carry bidi or control characters, a message may carry Markdown, HTML or an @mention: the
reports show such text exactly as data, never as formatting, never reordered and never pinging anyone.
"""

from __future__ import annotations

import re
import unicodedata

# Characters GitHub Markdown reads as inline formatting, links, tables or HTML anywhere in a line...
_MARKDOWN_INLINE = re.compile(r"([\\`*_\[\]<>|~])")
# ...and what starts a heading, list or rule only at the start of one (">" is already escaped above).
_ORDERED_LIST_START = re.compile(r"^\d{1,9}(?=[.)](?:\s|$))")


def visible(text: str) -> str:
    """`text` with every control, bidi and invisible formatting character written as `\\u{XXXX}`."""
    if text.isprintable():  # the common case: nothing to escape (isprintable is False for all of them)
        return text
    return "".join(f"\\u{{{ord(c):04X}}}" if _hidden(c) else c for c in text)


def _hidden(char: str) -> bool:
    # Cc: controls (newlines too); Cf: bidi overrides and zero-width characters; Cs: lone surrogates;
    # Zl/Zp: line and paragraph separators.
    return unicodedata.category(char) in ("Cc", "Cf", "Cs", "Zl", "Zp")


def one_line(text: str) -> str:
    """Visible text on one line: newlines in a message would break a list item or a table row."""
    return visible(" ".join(text.splitlines()) if "\n" in text or "\r" in text else text)


def md_text(text: str) -> str:
    """Plain text for a Markdown paragraph, list item or table cell (pipes escaped, mentions broken)."""
    escaped = _escape_block_start(_MARKDOWN_INLINE.sub(r"\\\1", one_line(text).strip()))
    escaped = escaped.replace("&", "&amp;")
    # A word joiner (U+2060) after '@' keeps GitHub from notifying whoever a message names.
    return escaped.replace("@", "@\u2060")


def _escape_block_start(text: str) -> str:
    if (number := _ORDERED_LIST_START.match(text)) is not None:
        return text[: number.end()] + "\\" + text[number.end() :]
    return "\\" + text if re.match(r"(?:#{1,6}|[-+=])(?:\s|$)", text) else text


def md_code(text: str) -> str:
    """An inline code span that holds `text` verbatim, whatever backticks it contains (never in a table)."""
    text = one_line(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def md_trusted(markdown: str) -> str:
    """Markdown a check wrote itself: its formatting stays, but it may quote untrusted text (an exception
    message), so hidden characters are still shown and @mentions still broken."""
    lines = (visible(line) for line in markdown.replace("\r\n", "\n").split("\n"))
    return "\n".join(lines).replace("@", "@\u2060")


# What a blast radius's change kind (verdict.ChangeKind) means, as every report says it.
BLAST_CHANGE_TEXT = {
    "widens": "widens what the guard admits",
    "narrows": "narrows what the guard admits",
    "guard_changed": "guard code changed, same admitted deployments",
    "kernel_only": "kernels only: the admitted deployments are unchanged",
    "unknown": "not compared with the base",
}
