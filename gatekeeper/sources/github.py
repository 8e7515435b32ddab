"""ChangeSet and PullRequestInfo from saved GitHub REST responses.

  files    "List pull request files": an array of diff-entry objects (filename, status, additions,
           deletions, changes, patch?, previous_filename?, sha, blob_url, raw_url, contents_url).
  commits  "List commits on a pull request": an array of commit objects, oldest first.
  pull     "Get a pull request": the pull request object.

What GitHub's PR files cannot show, and what that means here (the App adds it back from the trees and
blobs of the head and the merge base, `with_tree_facts`; saved files alone cannot):
  * no file modes: a symlink or a mode change looks like any other file, so old_mode, new_mode and
    symlink_target stay None (unknown). Read the change from git when those matter.
    Submodules are the one exception, inferred (fail-closed, so a false alarm is possible, a miss is not
    meant to be): GitHub sends `blob_url` and `raw_url` as null for a gitlink (github/rest-api-description
    issue 1945), and its patch is nothing but `Subproject commit <sha>` lines. Either sign records mode
    160000 on the side(s) the status says exist.
  * no binary flag: a binary file comes without a `patch`, like a diff too large to show.
  * without a `patch` (binary, too large, or a pure rename) the changed lines are unknown: has_patch=False
    and no line numbers. The confinement check reports such a file; it never counts it as a pass.
Statuses: "changed" (GitHub's word for a mode or type change) and "unchanged" become `modified`, so every
entry becomes a FileChange; nothing is dropped. A PR with more than 3000 files is returned whole (GitHub's
API stops listing at 3000): the confinement check fails it closed, with its reason, rather than a loader
error hiding which files were seen.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gatekeeper.changes import SUBMODULE_MODE, SYMLINK_MODE, ChangeSet, Commit, FileChange, FileStatus, TreeEntry
from gatekeeper.errors import InputError
from gatekeeper.provenance import PullRequestInfo
from gatekeeper.sources.diff import hunk_line_numbers, parse_hunks


class _Edge(BaseModel):
    # Strict types (no "3" for 3); unknown keys are ignored, since GitHub adds fields over time.
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class DiffEntry(_Edge):
    # GitHub sends null for these on some entries (submodules: the URLs), though its schema says string.
    sha: str | None = None
    blob_url: str | None = None
    raw_url: str | None = None
    filename: str
    status: Literal["added", "removed", "modified", "renamed", "copied", "changed", "unchanged"]
    additions: int = Field(ge=0)
    deletions: int = Field(ge=0)
    changes: int = Field(ge=0)
    patch: str | None = None
    previous_filename: str | None = None


class _User(_Edge):
    login: str
    type: str | None = None


class _GitAuthor(_Edge):
    name: str | None = None
    email: str | None = None


class _CommitDetail(_Edge):
    message: str
    author: _GitAuthor | None = None


class _PullCommit(_Edge):
    sha: str
    commit: _CommitDetail
    author: _User | None = None  # null when the commit email matches no GitHub account


class _Label(_Edge):
    name: str


class _Ref(_Edge):
    sha: str | None = None
    ref: str | None = None


class _PullRequest(_Edge):
    number: int
    title: str = ""
    body: str | None = None
    labels: list[_Label] = []
    user: _User | None = None
    head: _Ref | None = None
    base: _Ref | None = None


_STATUS = {
    "added": FileStatus.added, "removed": FileStatus.removed, "modified": FileStatus.modified,
    "renamed": FileStatus.renamed, "copied": FileStatus.copied,
    "changed": FileStatus.modified, "unchanged": FileStatus.modified,
}


def changes_from_pr_files(
    files: str, source: str, commits: str | None = None, commits_source: str = "commits"
) -> ChangeSet:
    """ChangeSet from the JSON text of "list pull request files" (and optionally "list commits")."""
    entries = _json_array(files, source, "diff-entry objects (GitHub 'list pull request files')")
    commit_list = None if commits is None else _json_array(commits, commits_source, "commit objects")
    return _changes(entries, source, commit_list, commits_source)


def changes_from_pr_file_entries(entries: list[dict], commits: list[dict] | None = None) -> ChangeSet:
    """The same from already-decoded data (the App gets dicts from PyGithub's `raw_data`)."""
    for name, value in (("pull request files", entries), ("pull request commits", commits)):
        if value is not None and not isinstance(value, list):
            raise InputError(name, f"expected a list, got {type(value).__name__}")
    return _changes(entries, "pull request files", commits, "pull request commits")


def pull_request_from_json(text: str, source: str) -> PullRequestInfo:
    data = _json(text, source)
    pull = _validate(_PullRequest, data, source, "")
    return PullRequestInfo(
        number=pull.number,
        title=pull.title,
        body=pull.body or "",
        labels=tuple(label.name for label in pull.labels),
        author_login=pull.user.login if pull.user else None,
        author_type=pull.user.type if pull.user else None,
        head_sha=pull.head.sha if pull.head else None,
        base_ref=pull.base.ref if pull.base else None,
    )


def _changes(entries: list[Any], source: str, commits: list[Any] | None, commits_source: str) -> ChangeSet:
    files = tuple(
        _file_change(_validate(DiffEntry, entry, source, f"[{i}]"), source, i) for i, entry in enumerate(entries)
    )
    parsed_commits = () if commits is None else tuple(
        _commit(_validate(_PullCommit, c, commits_source, f"[{i}]")) for i, c in enumerate(commits)
    )
    return ChangeSet(source="github", files=files, commits=parsed_commits)


def _file_change(entry: DiffEntry, source: str, index: int) -> FileChange:
    where = f"[{index}] {entry.filename!r}"
    status = _STATUS[entry.status]
    moved = status in (FileStatus.renamed, FileStatus.copied)
    if moved and entry.previous_filename is None:
        raise InputError(source, f"{where}: status {entry.status!r} without previous_filename")
    if not moved and entry.previous_filename is not None:
        raise InputError(source, f"{where}: previous_filename given for status {entry.status!r}")
    if entry.changes != entry.additions + entry.deletions:
        raise InputError(source, f"{where}: changes is {entry.changes}, but additions + deletions is "
                                 f"{entry.additions + entry.deletions}")
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    if entry.patch is not None:
        try:
            added, removed = hunk_line_numbers(parse_hunks(entry.patch, source))
        except InputError as exc:  # its line is a line of the patch string, not of the JSON file
            raise InputError(source, f"{where}: patch line {exc.line}: {exc.reason}") from None
        if (len(added), len(removed)) != (entry.additions, entry.deletions):
            raise InputError(source, f"{where}: additions/deletions say {entry.additions}/{entry.deletions}, "
                                     f"the patch shows {len(added)}/{len(removed)}")
    gitlink = SUBMODULE_MODE if _looks_like_submodule(entry) else None
    return FileChange(
        path=entry.filename,
        old_path=entry.previous_filename,
        status=status,
        added_lines=added,
        removed_lines=removed,
        old_mode=None if status == FileStatus.added else gitlink,
        new_mode=None if status == FileStatus.removed else gitlink,
        has_patch=entry.patch is not None,
    )


_SUBPROJECT_LINE = re.compile(r"[+-]Subproject commit [0-9a-f]{40,64}")


def _looks_like_submodule(entry: DiffEntry) -> bool:
    urls_null = {"blob_url", "raw_url"} <= entry.model_fields_set and entry.blob_url is entry.raw_url is None
    if urls_null:
        return True
    if entry.patch is None or "Subproject commit" not in entry.patch:  # the cheap test first: 3000 patches
        return False
    changed = [line for line in entry.patch.split("\n") if line[:1] in ("+", "-")]
    return bool(changed) and all(_SUBPROJECT_LINE.fullmatch(line) for line in changed)


BINARY_SNIFF_BYTES = 8000  # git's own test: a NUL byte in the first 8000 bytes makes content binary


def with_tree_facts(changes: ChangeSet, head_tree: Mapping[str, TreeEntry], old_tree: Mapping[str, TreeEntry],
                    blobs: Mapping[str, bytes]) -> ChangeSet:
    """The ChangeSet with what git shows and the file list does not, so that the App judges exactly as
    `gatekeeper check --base` does: both modes of every file (from the head's and the merge base's trees),
    symlink targets, binary content (a file shown without a patch whose blob has a NUL byte), and that a
    file shown without a patch changed no line when its content did not change or it is an empty file.
    `blobs` maps blob ids to content, for the symlinks and the files without a patch."""
    files = tuple(_tree_facts(change, head_tree, old_tree, blobs) for change in changes.files)
    return changes.model_copy(update={"files": files})


def _tree_facts(change: FileChange, head_tree: Mapping[str, TreeEntry], old_tree: Mapping[str, TreeEntry],
                blobs: Mapping[str, bytes]) -> FileChange:
    new = head_tree.get(change.path) if change.status is not FileStatus.removed else None
    old = old_tree.get(change.old_path or change.path) if change.status is not FileStatus.added else None
    update: dict[str, Any] = {"new_mode": new.mode if new else change.new_mode,
                              "old_mode": old.mode if old else change.old_mode}
    if new is not None and new.mode == SYMLINK_MODE and new.sha in blobs:
        update["symlink_target"] = blobs[new.sha].decode("utf-8", "surrogateescape")
    if not change.has_patch:
        sides = [blobs.get(side.sha) for side in (new, old) if side is not None]
        update["binary"] = change.binary or any(d is not None and b"\0" in d[:BINARY_SNIFF_BYTES] for d in sides)
        # No line changed when the content did not (a pure rename, a mode change) or an empty file came or went.
        unchanged = new is not None and old is not None and new.sha == old.sha
        empty = (new is None) != (old is None) and sides == [b""]
        update["has_patch"] = (unchanged or empty) and not update["binary"]
    return change.model_copy(update=update)


def _commit(entry: _PullCommit) -> Commit:
    author = entry.commit.author
    return Commit(
        sha=entry.sha,
        message=entry.commit.message,
        author_name=author.name if author else None,
        author_email=author.email if author else None,
        author_login=entry.author.login if entry.author else None,
    )


def _json(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"invalid JSON: {exc.msg} (column {exc.colno})", exc.lineno) from None


_JSON_KIND = {dict: "an object", str: "a string", int: "a number", float: "a number", bool: "a boolean",
              type(None): "null"}


def _json_array(text: str, source: str, what: str) -> list[Any]:
    data = _json(text, source)
    if not isinstance(data, list):
        kind = _JSON_KIND.get(type(data), "something else")
        raise InputError(source, f"expected a JSON array of {what}, got {kind}", 1)
    return data


def _validate(model: type[_Edge], data: Any, source: str, where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        extra = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        location = f"{where}{field}".lstrip(".") or "(top level)"
        raise InputError(source, f"{location}: {first['msg']}{extra}") from None
