from __future__ import annotations

import re
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper.report.text import md_code, md_text, visible

_HIDDEN = ("Cc", "Cf", "Cs", "Zl", "Zp")
# Text an attacker controls: Markdown punctuation, bidi overrides, newlines, mentions, any unicode.
hostile_text = st.text(
    alphabet=st.one_of(st.sampled_from("|`*_[]<>#@-+=\\!()\n\r\t\u202e\u2066\u200b "), st.characters()),
    max_size=60,
)


def _hidden_chars(text: str) -> list[str]:
    return [c for c in text if unicodedata.category(c) in _HIDDEN and c != "\u2060"]


@settings(max_examples=120)
@given(hostile_text)
def test_visible_leaves_no_hidden_character(text):
    assert _hidden_chars(visible(text)) == []


@settings(max_examples=120)
@given(hostile_text)
def test_md_text_is_one_line_with_no_live_markup(text):
    out = md_text(text)
    assert "\n" not in out and _hidden_chars(out) == []
    # Every pipe, backtick, bracket and angle bracket is escaped by a backslash that is not itself escaped.
    for match in re.finditer(r"[|`\[\]<>*_]", out):
        backslashes = len(out[: match.start()]) - len(out[: match.start()].rstrip("\\"))
        assert backslashes % 2 == 1, (text, out)
    assert re.search(r"@(?!\u2060)", out) is None


@settings(max_examples=120)
@given(hostile_text)
def test_md_code_span_cannot_be_closed_early(text):
    out = md_code(text)
    fence = re.match(r"`+", out).group(0)
    inner = out[len(fence) : -len(fence)]
    assert out.endswith(fence) and "\n" not in out
    assert all(len(run) < len(fence) for run in re.findall(r"`+", inner))
