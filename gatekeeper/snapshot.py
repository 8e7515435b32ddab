"""Read-only view of the repository at the PR head. The checks read files through it and never know
whether they come from a local git object store, the GitHub contents API or a dict in a test."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol


class Snapshot(Protocol):
    def read(self, path: str) -> str | None:
        """The text of `path` at the head, or None if it does not exist (or is not text)."""

    def paths(self) -> Iterable[str]:
        """Every file path at the head (used by the policy lint and by the startup-guard check)."""


class DictSnapshot:
    """A snapshot held in memory: tests, and evidence shipped with a file list."""

    def __init__(self, files: Mapping[str, str]):
        self._files = dict(files)

    def read(self, path: str) -> str | None:
        return self._files.get(path)

    def paths(self) -> Iterable[str]:
        return sorted(self._files)
