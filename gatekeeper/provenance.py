"""Agent-assistance detection: which signals say a change was agent-assisted, and where each was seen.

Signals come from commit trailers (parsed like `git interpret-trailers`: the trailer block is the last
paragraph of the message, never the title), pull-request labels, the disclosure section of the PR body
(the section `.github/pull_request_template.md` ships) and bot authors. Absence of signals is not proof of
absence: the policy decides which mode no signal selects, and `evaluate` applies it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from markdown_it import MarkdownIt
from markdown_it.token import Token
from mdit_py_plugins.tasklists import tasklists_plugin
from pydantic import BaseModel, ConfigDict

from gatekeeper.changes import Commit
from gatekeeper.policy import AgentDetection
from gatekeeper.verdict import Signal


class PullRequestInfo(BaseModel):
    """The parts of a pull request that provenance reads; built from the GitHub PR object at the edge."""

    model_config = ConfigDict(frozen=True)

    number: int | None = None
    title: str = ""
    body: str = ""
    labels: tuple[str, ...] = ()
    author_login: str | None = None
    author_type: str | None = None  # "User" or "Bot"
    head_sha: str | None = None
    base_ref: str | None = None


class Provenance(BaseModel):
    model_config = ConfigDict(frozen=True)

    signals: tuple[Signal, ...] = ()
    declared: bool | None = None  # --agent-assisted / --not-agent-assisted on the CLI overrides detection

    @property
    def agent_assisted(self) -> bool:
        return self.declared if self.declared is not None else bool(self.signals)


def detect(
    policy: AgentDetection,
    commits: Iterable[Commit] = (),
    pull_request: PullRequestInfo | None = None,
) -> Provenance:
    """Every agent-assistance signal in the commits and the pull request, in a stable order."""
    signals: list[Signal] = []
    for commit in commits:
        signals.extend(_commit_signals(policy, commit))
    if pull_request is not None:
        signals.extend(_pull_request_signals(policy, pull_request))
    return Provenance(signals=tuple(signals))


# ---------------------------------------------------------------------------------------------- trailers

# git's token grammar: letters, digits and '-', optional blanks before the ':' separator.
_TRAILER_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*)[ \t]*:[ \t]*(.*)$")
# Lines git itself writes; one of them lets a block with some non-trailer lines still count (git's 25% rule).
_GIT_GENERATED_PREFIXES = ("signed-off-by:", "(cherry picked from commit ")


def parse_trailers(message: str, known_tokens: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    """The (token, value) trailers of a commit message, following `git interpret-trailers`:

    the block is the last paragraph, and never the first one (the title); it counts when every line is a
    trailer (or a continuation line, which starts with a blank), or when at least 25% are trailers and one
    of them is git-generated or a configured token (`known_tokens`, compared case-insensitively). Comment lines
    (`#`) are left out, but a continuation line continues a trailer only if the trailer (or its continuation)
    comes right before it: after a comment line, a non-trailer line or nothing, git counts it as a non-trailer line.
    """
    lines: list[str] = []
    after_comment: set[int] = set()  # indexes in `lines` of the lines that came right after a comment line
    for line in message.replace("\r\n", "\n").split("\n"):
        if line.startswith("#"):
            after_comment.add(len(lines))
        else:
            lines.append(line)
    while lines and not lines[-1].strip():
        lines.pop()
    start = len(lines)
    while start > 0 and lines[start - 1].strip():
        start -= 1
    # As git does: the title runs to the first blank line, and the trailer block must begin after it.
    title_end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    if start <= title_end:
        return ()
    block = lines[start:]

    known = {t.casefold() for t in known_tokens}
    trailers: list[list[str]] = []
    trailer_lines = other_lines = 0
    recognized = False
    continuing = False  # whether the line before is a trailer or its continuation, with no comment line between
    for index, line in enumerate(block, start):
        continuing = continuing and index not in after_comment
        if line[0] in " \t":
            if continuing:
                trailers[-1][1] += " " + line.strip()  # a continuation of the previous trailer's value
            else:
                other_lines += 1
            continue
        match = _TRAILER_LINE.match(line)
        generated = line.casefold().startswith(_GIT_GENERATED_PREFIXES)
        if match is None and not generated:
            other_lines += 1
            continuing = False
            continue
        continuing = True
        # A line git generates counts as a trailer line for the 25% rule, even "(cherry picked from commit ...)",
        # which has no "token: value" and so is never reported as a trailer.
        trailer_lines += 1
        recognized = recognized or generated or (match is not None and match.group(1).casefold() in known)
        trailers.append([match.group(1), match.group(2).strip()] if match else ["", ""])
    if other_lines and not (recognized and trailer_lines * 4 >= trailer_lines + other_lines):
        return ()
    return tuple((token, value) for token, value in trailers if token)


def _commit_signals(policy: AgentDetection, commit: Commit) -> list[Signal]:
    where = f"commit {commit.sha[:12]}"
    assisted_tokens = {t.casefold() for t in policy.trailers}
    coauthor_tokens = {t.casefold() for t in policy.coauthor_trailers}
    signals = []
    for token, value in parse_trailers(commit.message, policy.trailers + policy.coauthor_trailers):
        folded = token.casefold()
        if folded in assisted_tokens and value:
            if folded == "ai-used-for":
                if value.casefold().rstrip(".") not in _NO_ANSWERS:
                    signals.append(Signal(kind="trailer", source=where, detail=f"{token}: {value}", used_for=value))
                continue
            signals.append(Signal(kind="trailer", source=where, detail=f"{token}: {value}",
                                  **assisted_by(value)))
        elif folded in coauthor_tokens and (identity := agent_identity(value, policy.identities)):
            signals.append(Signal(kind="trailer", source=where, detail=f"{token}: {value} (agent: {identity})",
                                  agent=identity, model=_coauthor_model(value, identity)))
    if commit.author_login and (pattern := _bot_pattern(commit.author_login, policy.bot_authors)):
        signals.append(
            Signal(kind="bot_author", source=where, detail=f"author {commit.author_login} matches {pattern!r}")
        )
    return signals


def assisted_by(value: str) -> dict:
    """Agent, model and tools of an `Assisted-by` value, in the forms in use:

    `AGENT:MODEL [TOOL1] [TOOL2]` (the Linux kernel's), e.g. `claude-code:claude-opus-4 coccinelle`;
    `<tool>` (LLVM's), e.g. `GitHub Copilot` or `Cursor <cursor@cursor.com>`: the agent, no model.
    """
    words = _EMAIL.sub("", value).split()
    if words and ":" in words[0] and not words[0].startswith(("http:", "https:")):
        agent, _, model = words[0].partition(":")
        tools = tuple(w.strip("[]") for w in words[1:] if w.strip("[]"))
        return {"agent": agent or None, "model": model or None, "tools": tools}
    return {"agent": " ".join(words) or None}


_EMAIL = re.compile(r"<[^>]*>")


def _coauthor_model(value: str, identity: str) -> str | None:
    """The model a Co-authored-by name states beside the agent: `Claude Opus 4.5 <...>` -> `Opus 4.5`."""
    name = _EMAIL.sub("", value).strip()
    rest = re.sub(rf"(?<![A-Za-z0-9]){re.escape(identity)}(?![A-Za-z0-9])", "", name, count=1, flags=re.I).strip(" -:()")
    return rest or None


def agent_identity(value: str, identities: Iterable[str]) -> str | None:
    """The known agent a `Name <email>` value names, as a whole word (so "Amp" never matches "Ampere")."""
    for identity in identities:
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(identity)}(?![A-Za-z0-9])", value, re.IGNORECASE):
            return identity
    return None


def _bot_pattern(login: str, patterns: Iterable[str]) -> str | None:
    """The first login glob that matches. Only `*` and `?` are wildcards: GitHub App logins end in a
    literal "[bot]", which fnmatch would read as a character class. Logins are case-insensitive."""
    for pattern in patterns:
        regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
        if re.fullmatch(regex, login, re.IGNORECASE | re.DOTALL):
            return pattern
    return None


# ---------------------------------------------------------------------------------------------- pull request


def _pull_request_signals(policy: AgentDetection, pr: PullRequestInfo) -> list[Signal]:
    where = f"pull request #{pr.number}" if pr.number is not None else "pull request"
    signals = []
    wanted = {label.casefold() for label in policy.labels}
    for label in pr.labels:
        if label.casefold() in wanted:
            signals.append(Signal(kind="label", source=f"{where} labels", detail=label))
    disclosure = disclosure_answer(pr.body, policy.disclosure_heading)
    if disclosure is not None:
        signals.append(Signal(kind="disclosure", source=f"{where} body", detail=disclosure))
    if pr.author_login and (pattern := _bot_pattern(pr.author_login, policy.bot_authors)):
        signals.append(
            Signal(kind="bot_author", source=f"{where} author", detail=f"{pr.author_login} matches {pattern!r}")
        )
    elif pr.author_type == "Bot":
        signals.append(
            Signal(kind="bot_author", source=f"{where} author", detail=f"{pr.author_login} is a GitHub Bot account")
        )
    return signals


_TOOL_ANSWER = re.compile(r"^\s*(?:tools?|agents?)(?:\s*\(s\))?[^:\n]{0,40}:[ \t]*(.*)$", re.I)
# What people write in a "tool" answer to say that no agent was used.
_NO_ANSWERS = {"", "-", "--", "n/a", "na", "none", "no", "nothing", "nope", "not used", "no agent", "no tool", "_"}
# CommonMark with GitHub's task lists: `- [x] item` becomes a list item with a checked checkbox.
_MARKDOWN = MarkdownIt("commonmark").use(tasklists_plugin)


def disclosure_answer(body: str, heading: str) -> str | None:
    """What the disclosure section of a PR body declares, or None when it declares no agent assistance.

    The body is parsed as Markdown (CommonMark and GitHub task lists, markdown-it-py). The section runs from a
    heading whose text is `heading` (case-insensitive, a trailing colon ignored) to the next heading of the same
    or a higher level. A checked task-list box, or a non-empty "Tool:" / "Agent:" answer, means assisted; the
    untouched template (unchecked boxes, empty answers, HTML comments) means not disclosed. Code blocks and
    HTML never count: they show an example, they do not answer.
    """
    answers = []
    for token in _section_inlines(_MARKDOWN.parse(body.replace("\r\n", "\n")), heading):
        children = token.children or []
        if children and children[0].type == "html_inline" and "task-list-item-checkbox" in children[0].content:
            if 'checked="checked"' in children[0].content:
                answers.append(f"checked: {_plain(children[1:]).strip()}")
            continue
        for line in _plain(children).split("\n"):
            if tool := _TOOL_ANSWER.match(line):
                value = tool.group(1).strip().strip("*_` ").strip()
                if value.casefold().rstrip(".") not in _NO_ANSWERS:
                    answers.append(f"tool: {value}")
    return "; ".join(answers) if answers else None


def _section_inlines(tokens: list[Token], heading: str):
    """The inline tokens (paragraphs, list items) of the section under `heading`, nested headings excluded."""
    wanted = heading.strip().casefold()
    level: int | None = None
    for index, token in enumerate(tokens):
        if token.type == "heading_open":
            depth = int(token.tag[1:])
            title = tokens[index + 1].content.strip().casefold().rstrip(":").strip()
            if level is not None and depth <= level:
                return
            if level is None and title == wanted:
                level = depth
        elif level is not None and token.type == "inline" and tokens[index - 1].type != "heading_open":
            yield token


def _plain(children: list[Token]) -> str:
    """The text of inline tokens without their markup (`**Codex**` -> `Codex`), line breaks kept."""
    parts = []
    for child in children:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append("\n")
    return "".join(parts)
