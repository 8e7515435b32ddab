"""Agent-assistance detection: the model of what was found. Detection itself: `detect(...)` (issue 2)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

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
