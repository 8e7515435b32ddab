"""The one change model. Every source (git range, unified diff, GitHub PR-files JSON) becomes a ChangeSet.

Loaders live in `gatekeeper/sources/`; this module holds only the model, so the checks depend on nothing else.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

SYMLINK_MODE = "120000"
SUBMODULE_MODE = "160000"


class TreeEntry(NamedTuple):
    """One entry of a commit's tree, as `git ls-tree -r` and GitHub's trees API list it."""

    mode: str  # git's: 100644, 100755, 120000 (symlink), 160000 (submodule), 040000 (tree)
    type: str  # blob | tree | commit
    sha: str  # the object id


class FileStatus(str, Enum):
    added = "added"
    modified = "modified"
    removed = "removed"
    renamed = "renamed"
    copied = "copied"


class FileChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str                    # the path after the change (for a removal: the removed path)
    old_path: str | None = None  # the path before a rename or copy; None otherwise
    status: FileStatus
    added_lines: tuple[int, ...] = ()    # line numbers in the new file
    removed_lines: tuple[int, ...] = ()  # line numbers in the old file
    binary: bool = False
    old_mode: str | None = None  # git modes such as "100644", "100755", "120000", "160000"
    new_mode: str | None = None
    symlink_target: str | None = None  # the new target of a symlink, when the source shows it
    has_patch: bool = True  # False when the source gave no hunk text (GitHub omits it for large files)

    @property
    def additions(self) -> int:
        return len(self.added_lines)

    @property
    def deletions(self) -> int:
        return len(self.removed_lines)

    @property
    def is_symlink(self) -> bool:
        return SYMLINK_MODE in (self.old_mode, self.new_mode)

    @property
    def is_submodule(self) -> bool:
        return SUBMODULE_MODE in (self.old_mode, self.new_mode)

    @property
    def mode_changed(self) -> bool:
        return self.old_mode is not None and self.new_mode is not None and self.old_mode != self.new_mode

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the change touches: a rename deletes its old path, so both count."""
        return (self.path,) if self.old_path is None else (self.old_path, self.path)


class Commit(BaseModel):
    model_config = ConfigDict(frozen=True)

    sha: str
    message: str
    author_name: str | None = None
    author_email: str | None = None
    author_login: str | None = None


class ChangeSet(BaseModel):
    model_config = ConfigDict(frozen=True)

    source: str  # "git", "diff" or "github", for the report
    files: tuple[FileChange, ...]
    base_sha: str | None = None
    head_sha: str | None = None
    commits: tuple[Commit, ...] = ()

    def by_path(self) -> dict[str, FileChange]:
        return {f.path: f for f in self.files}
