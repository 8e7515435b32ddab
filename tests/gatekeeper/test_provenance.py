from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gatekeeper.changes import Commit
from gatekeeper.policy import AgentDetection
from gatekeeper.provenance import PullRequestInfo, detect, disclosure_answer, parse_trailers

POLICY = AgentDetection()

# Commit messages as the tools really write them.
CLAUDE_CODE = """Fix the MLA decode guard for TP16

The guard accepted TP16 with DCP 4, which the kernels do not support.

🤖 Generated with [Claude Code](https://claude.com/claude-code)

Co-Authored-By: Claude <noreply@anthropic.com>
"""
COPILOT_AGENT = """Add benchmark for kimi_k3 latent MoE

Co-authored-by: copilot-swe-agent[bot] <198982749+Copilot@users.noreply.github.com>
Co-authored-by: octocat <octocat@github.com>
"""
CURSOR = "Refactor executor\n\nSigned-off-by: Jane Dev <jane@example.com>\nCo-authored-by: Cursor Agent <cursoragent@cursor.com>\n"
HUMAN_PAIR = "Tune split-K\n\nCo-authored-by: Jane Doe <jane@example.com>\nSigned-off-by: Bob <bob@example.com>\n"
MENTION_IN_BODY = """Claude: explain why the cache is stale

Assisted-by: is how other projects mark agent help; we do not use it here.
This paragraph has several lines, so it is prose and not a trailer block.

Signed-off-by: Bob <bob@example.com>
"""
TITLE_ONLY = "Assisted-by: Claude"
TRAILER_NOT_LAST = "Fix\n\nAssisted-by: Codex\n\nMore words after the trailers.\n"
FOLDED_TRAILER = "Fix\n\nAssisted-by: Kimi K2\n  via the kimi-cli agent\nSigned-off-by: A <a@b.c>\n"
GENERATED_BY = "Port kernel\n\ngenerated-by: Aider v0.80 (deepseek)\n"


def _commit(message: str, sha: str = "a1b2c3d4e5f6a7b8", login: str | None = None) -> Commit:
    return Commit(sha=sha, message=message, author_login=login)


@pytest.mark.parametrize(
    "message, expected",
    [
        (CLAUDE_CODE, ["Co-Authored-By: Claude <noreply@anthropic.com> (agent: Claude)"]),
        (
            COPILOT_AGENT,
            ["Co-authored-by: copilot-swe-agent[bot] <198982749+Copilot@users.noreply.github.com> (agent: Copilot)"],
        ),
        (CURSOR, ["Co-authored-by: Cursor Agent <cursoragent@cursor.com> (agent: Cursor)"]),
        (FOLDED_TRAILER, ["Assisted-by: Kimi K2 via the kimi-cli agent"]),
        (GENERATED_BY, ["generated-by: Aider v0.80 (deepseek)"]),
        (HUMAN_PAIR, []),
        (MENTION_IN_BODY, []),
        (TITLE_ONLY, []),
        (TRAILER_NOT_LAST, []),
    ],
)
def test_trailer_signals_on_real_messages(message, expected):
    provenance = detect(POLICY, [_commit(message)])
    assert [s.detail for s in provenance.signals] == expected
    assert all(s.kind == "trailer" and s.source == "commit a1b2c3d4e5f6" for s in provenance.signals)
    assert provenance.agent_assisted is bool(expected)


def test_extra_identities_from_the_policy_are_recognized():
    message = "Fix\n\nCo-authored-by: Zed Agent <agent@zed.dev>\n"
    assert detect(POLICY, [_commit(message)]).signals == ()
    extended = AgentDetection(extra_agent_identities=("Zed Agent",))
    assert [s.detail for s in detect(extended, [_commit(message)]).signals] == [
        "Co-authored-by: Zed Agent <agent@zed.dev> (agent: Zed Agent)"
    ]


def test_identity_matches_whole_words_only():
    message = "Fix\n\nCo-authored-by: Ampere Rooney <ampere@factoryville.org>\n"
    assert detect(POLICY, [_commit(message)]).signals == ()


def test_empty_assisted_by_value_is_not_a_signal():
    assert detect(POLICY, [_commit("Fix\n\nAssisted-by:\nSigned-off-by: A <a@b.c>\n")]).signals == ()


MESSAGES_FOR_GIT = [
    CLAUDE_CODE, COPILOT_AGENT, CURSOR, HUMAN_PAIR, MENTION_IN_BODY, TITLE_ONLY, TRAILER_NOT_LAST,
    FOLDED_TRAILER, GENERATED_BY,
    "Subject\n\nSome prose line\nSigned-off-by: A <a@b.c>\n",
    "Subject\n\nprose one\nprose two\nprose three\nprose four\nSigned-off-by: A <a@b.c>\n",
    "Subject\n\nKey: value\nnot a trailer\n",
    "Subject\n\nbody\n\n(cherry picked from commit 0123456789abcdef0123456789abcdef01234567)\nFoo: bar\n",
    "Subject\n\nToken : spaced separator\n",
    "Subject\r\n\r\nAssisted-by: Claude\r\n",
    "\nAssisted-by: Claude\n",  # a leading blank line leaves an empty title: git reads the trailer (found by hypothesis)
    # A cherry-pick line counts as a trailer line for git's 25% rule (found by hypothesis in CI).
    "\nSubject line\nSubject line\nSubject line\nAssisted-by: Claude\n"
    "(cherry picked from commit 0123456789abcdef0123456789abcdef01234567)\n",
    # A continuation line after a comment line continues nothing: git counts it as a non-trailer line (found by
    # hypothesis in a local run), as it does one after a non-trailer line (those four lines outweigh the trailer).
    "\nAssisted-by: Claude\n#comment line\n  folded continuation\n",
    "Subject\n\nSigned-off-by: A <a@b.c>\n  continued\n#comment\n  not continued\nKey: value\n",
    "Subject\n\nSigned-off-by: A <a@b.c>\nprose\n  one\n  two\n  three\n",
]


@pytest.mark.parametrize("message", MESSAGES_FOR_GIT)
def test_trailer_parsing_agrees_with_git_interpret_trailers(message):
    # With no trailer configuration, git recognizes only the trailers it generates itself.
    git = subprocess.run(
        ["git", "interpret-trailers", "--parse", "--no-divider"],
        input=message.replace("\r\n", "\n"), capture_output=True, text=True, check=True,
    )
    expected = [tuple(part.strip() for part in line.split(":", 1)) for line in git.stdout.splitlines()]
    assert [(t, v) for t, v in parse_trailers(message)] == expected


def test_bot_author_of_a_commit_and_of_the_pull_request():
    pr = PullRequestInfo(number=7, author_login="Copilot", author_type="Bot")
    provenance = detect(POLICY, [_commit("Fix", login="dependabot[bot]")], pr)
    assert [(s.kind, s.source) for s in provenance.signals] == [
        ("bot_author", "commit a1b2c3d4e5f6"),
        ("bot_author", "pull request #7 author"),
    ]


def test_bot_account_type_alone_is_a_signal():
    pr = PullRequestInfo(number=3, author_login="acme-helper", author_type="Bot")
    assert [s.detail for s in detect(POLICY, [], pr).signals] == ["acme-helper is a GitHub Bot account"]


def test_labels_are_case_insensitive():
    pr = PullRequestInfo(number=1, labels=("perf", "AI-Assisted"))
    provenance = detect(POLICY, [], pr)
    assert [(s.kind, s.detail, s.source) for s in provenance.signals] == [
        ("label", "AI-Assisted", "pull request #1 labels")
    ]


TEMPLATE = """## Summary

Speeds up decode.

## Agent assistance

<!-- Tick the box if a coding agent wrote or edited any part of this PR, e.g.
- [x] like this
Tool: like this -->

- [ ] An AI coding agent or assistant wrote or edited code in this pull request
- Tool and how it was used:

## Checklist

- [x] Tests pass
"""


def test_untouched_template_is_not_a_disclosure():
    assert disclosure_answer(TEMPLATE, "Agent assistance") is None
    assert detect(POLICY, [], PullRequestInfo(body=TEMPLATE)).signals == ()


def test_checked_box_is_a_disclosure_and_other_sections_do_not_count():
    body = TEMPLATE.replace("- [ ] An AI", "- [X] An AI")
    assert disclosure_answer(body, "agent assistance") == (
        "checked: An AI coding agent or assistant wrote or edited code in this pull request"
    )


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Claude Code wrote the kernel; I reviewed it", "tool: Claude Code wrote the kernel; I reviewed it"),
        ("**Codex**", "tool: Codex"),
        ("none", None),
        ("N/A.", None),
        ("", None),
    ],
)
def test_tool_answer(answer, expected):
    body = TEMPLATE.replace("- Tool and how it was used:", f"- Tool and how it was used: {answer}")
    assert disclosure_answer(body.replace("\n", "\r\n"), "Agent assistance") == expected


def test_disclosure_in_a_code_block_or_without_the_heading_does_not_count():
    body = "Notes\n\n```\n## Agent assistance\n- [x] yes\n```\n"
    assert disclosure_answer(body, "Agent assistance") is None
    assert disclosure_answer("- [x] An AI coding agent wrote this", "Agent assistance") is None


def test_section_ends_at_a_heading_of_the_same_level_but_not_a_deeper_one():
    body = "### Agent assistance\n#### Details\n- [x] yes\n### Other\n- [x] unrelated\n"
    assert disclosure_answer(body, "Agent assistance") == "checked: yes"


def test_signals_keep_commit_then_pull_request_order_and_declared_overrides():
    pr = PullRequestInfo(number=9, labels=("agent-assisted",))
    provenance = detect(POLICY, [_commit(CLAUDE_CODE, sha="1" * 40), _commit(GENERATED_BY, sha="2" * 40)], pr)
    assert [s.source for s in provenance.signals] == [
        "commit 111111111111", "commit 222222222222", "pull request #9 labels",
    ]
    assert provenance.model_copy(update={"declared": False}).agent_assisted is False


@pytest.mark.parametrize(
    "login, matched",
    [("dependabot[bot]", "*[bot]"), ("Copilot", "Copilot"), ("copilot", "Copilot"), ("robot", None), ("octocat", None)],
)
def test_bot_login_globs_treat_brackets_literally(login, matched):
    signals = detect(POLICY, [], PullRequestInfo(author_login=login, author_type="User")).signals
    assert [s.detail for s in signals] == ([f"{login} matches {matched!r}"] if matched else [])


def test_the_shipped_pull_request_template_and_the_detector_agree():
    template = (Path(__file__).resolve().parents[2] / ".github" / "pull_request_template.md").read_text()
    heading = POLICY.disclosure_heading
    assert disclosure_answer(template, heading) is None  # an untouched template discloses nothing
    ticked = template.replace("- [ ] An AI coding agent", "- [x] An AI coding agent")
    assert disclosure_answer(ticked, heading).startswith("checked: An AI coding agent")
    named = template.replace("- Tool and how it was used:", "- Tool and how it was used: Kimi CLI drafted the kernel")
    assert disclosure_answer(named, heading) == "tool: Kimi CLI drafted the kernel"


_LINES = st.sampled_from([
    "Subject line", "", "", "Some prose.", "Assisted-by: Claude", "Signed-off-by: A <a@b.c>",
    "Co-authored-by: Copilot <c@github.com>", "  folded continuation", "Key : spaced", "not: a trailer? maybe",
    "(cherry picked from commit 0123456789abcdef0123456789abcdef01234567)", "Fixes #12", "x-y-z: w",
    "Made-with: Cursor", "#comment line", "URL: http://example.com/a:b",
])


@settings(max_examples=100, deadline=None)
@given(st.lists(_LINES, min_size=1, max_size=10))
def test_trailer_parsing_agrees_with_git_on_generated_messages(lines):
    test_trailer_parsing_agrees_with_git_interpret_trailers("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    "trailer, agent, model, tools, used_for",
    [
        # The Linux kernel's form: AGENT:MODEL [TOOL1] [TOOL2].
        ("Assisted-by: claude-code:claude-opus-4-5 [coccinelle] [sparse]", "claude-code", "claude-opus-4-5",
         ("coccinelle", "sparse"), None),
        ("Assisted-by: codex:gpt-5", "codex", "gpt-5", (), None),
        # LLVM's form: the tool's name.
        ("Assisted-by: GitHub Copilot", "GitHub Copilot", None, (), None),
        ("Assisted-by: Cursor <cursoragent@cursor.com>", "Cursor", None, (), None),
        # vLLM's: the agent as a co-author, its model where the name states one.
        ("Co-authored-by: Claude Opus 4.5 <noreply@anthropic.com>", "Claude", "Opus 4.5", (), None),
        ("Co-authored-by: Claude <noreply@anthropic.com>", "Claude", None, (), None),
        ("AI-used-for: test generation, docs", None, None, (), "test generation, docs"),
    ],
)
def test_trailer_forms_in_use_record_agent_and_model(trailer, agent, model, tools, used_for):
    provenance = detect(POLICY, [_commit(f"Fix decode\n\nBody.\n\n{trailer}\n")])
    [signal] = provenance.signals
    assert (signal.agent, signal.model, signal.tools, signal.used_for) == (agent, model, tools, used_for)
    assert signal.detail.startswith(trailer)


def test_ai_used_for_none_is_not_a_signal():
    assert detect(POLICY, [_commit("Fix\n\nBody.\n\nAI-used-for: none\n")]).signals == ()


def test_the_disclosure_is_parsed_as_markdown_not_matched_line_by_line():
    # A box ticked inside an HTML comment, an indented code block or a quote in another section never counts;
    # a ticked box in a nested list of the section does, its text without markup.
    body = ("## Agent assistance\n\n<!--\n- [x] example\n-->\n\n    - [x] indented code\n\n"
            "- Details\n  - [x] An **AI agent** wrote the tests\n\n## Other\n\n> - [x] quoted elsewhere\n")
    assert disclosure_answer(body, "Agent assistance") == "checked: An AI agent wrote the tests"
    assert disclosure_answer("## Agent assistance:\n\nTool: `aider`\n", "Agent assistance") == "tool: aider"
