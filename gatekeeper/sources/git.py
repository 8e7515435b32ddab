"""ChangeSet from a local git range, and `GitSnapshot`: the repository at one commit.

The range is read the way GitHub shows a pull request: the diff from the merge base of `base` and `head`
to `head` (`git diff base...head`), and the commits of `git log base..head`, oldest first.

git runs as a subprocess without a shell, with every option that changes its output pinned on the command
line, so a user's or a repository's git config (noprefix, external diff drivers, textconv, submodule
summaries, another diff algorithm) cannot change what is parsed. The patch text goes through the same
parser as `--diff` input; git's `--raw -z` listing then cross-checks it (exact paths, no quoting) and fills
in what the patch text cannot show: the modes of pure renames and the targets of renamed symlinks.
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from gatekeeper.changes import SYMLINK_MODE, ChangeSet, Commit, FileChange, FileStatus
from gatekeeper.errors import InputError
from gatekeeper.sources.diff import parse_git_diff

_NO_MODE = "000000"
# Pinned so that config cannot change what git prints (see the module docstring).
_CONFIG = ("-c", "core.quotePath=true", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
           "-c", "core.fsmonitor=false", "-c", "log.showSignature=false", "-c", "i18n.logOutputEncoding=UTF-8")
_DIFF_OPTIONS = ("--no-color", "--no-ext-diff", "--no-textconv", "--no-relative", "--full-index",
                 "--submodule=short", "--ignore-submodules=none", "--diff-algorithm=myers", "-M", "-C",
                 "--src-prefix=a/", "--dst-prefix=b/")
# Environment variables that would point git at another repository or index than the one asked for.
_GIT_LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


def changes_from_git(repo: str | Path, base: str, head: str = "HEAD") -> ChangeSet:
    """The change `base...head` in the repository at `repo`; its base_sha is the merge base, the commit
    the diff is taken against. Not a repository, a bad ref, or histories without a common ancestor:
    InputError naming the repository and the ref."""
    git = _Git(repo)
    base_sha = git.commit_sha(base)
    head_sha = git.commit_sha(head)
    found = git.run_bytes_or_none("merge-base", base_sha, head_sha)
    if not found:
        raise InputError(git.source, f"{base} and {head} share no history (no merge base)")
    merge_base = found.decode().strip()
    # -U0: only the + and - lines matter, and without context the text to parse is smallest.
    patch_text = git.run("diff", *_DIFF_OPTIONS, "-U0", merge_base, head_sha, "--", what="git diff")
    files = parse_git_diff(patch_text, f"git diff {base}...{head}")
    raw = git.run("diff", "--raw", "-z", "--no-abbrev", *_DIFF_OPTIONS, merge_base, head_sha, "--",
                  what="git diff --raw")
    files = _complete_from_raw(files, _parse_raw(raw, git.source), git)
    commits = _commits(git, base_sha, head_sha)
    return ChangeSet(source="git", files=tuple(files), base_sha=merge_base, head_sha=head_sha, commits=commits)


class TreeEntry(NamedTuple):
    mode: str
    type: str
    sha: str


def tree_entries(repo: str | Path, ref: str) -> dict[str, TreeEntry]:
    """Every entry of the commit's tree with its mode and object id, as GitHub's trees API lists them."""
    git = _Git(repo)
    listing = git.run("ls-tree", "-r", "-z", "--full-tree", git.commit_sha(ref), what="git ls-tree")
    entries = {}
    for record in filter(None, listing.split("\0")):
        meta, path = record.split("\t", 1)
        mode, kind, sha = meta.split()
        entries[path] = TreeEntry(mode, kind, sha)
    return entries


class GitSnapshot:
    """The repository at `ref` (resolved once to the commit `sha`), read from git's object store; the work
    tree is never looked at, so uncommitted edits cannot change what the checks read."""

    def __init__(self, repo: str | Path, ref: str):
        self._git = _Git(repo)
        self.sha = self._git.commit_sha(ref)
        self._paths: tuple[str, ...] | None = None

    def read(self, path: str) -> str | None:
        """The text of `path` (a symlink's text is its target); None if absent, not a file, or binary."""
        data = self._git.run_bytes_or_none("cat-file", "blob", f"{self.sha}:{path}")
        if data is None or b"\0" in data:  # a NUL byte is git's own test for binary content
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def paths(self) -> Iterable[str]:
        if self._paths is None:
            listing = self._git.run("ls-tree", "-r", "-z", "--full-tree", "--name-only", self.sha,
                                    what="git ls-tree")
            self._paths = tuple(p for p in listing.split("\0") if p)
        return self._paths


class _Git:
    def __init__(self, repo: str | Path):
        self.repo = Path(repo)
        self.source = str(repo)
        self._env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_VARS}
        self._env.update(LC_ALL="C", GIT_PAGER="cat", GIT_TERMINAL_PROMPT="0")
        if not self.repo.is_dir():
            raise InputError(self.source, "not a directory")
        inside = self._call("rev-parse", "--is-inside-work-tree", "--git-dir")
        if inside.returncode != 0:
            raise InputError(self.source, f"not a git repository: {_last_line(inside.stderr)}")

    def commit_sha(self, ref: str) -> str:
        if not ref or ref.startswith("-"):
            raise InputError(self.source, f"bad git ref {ref!r}")
        result = self._call("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
        if result.returncode != 0:
            raise InputError(self.source, f"git ref {ref!r} does not name a commit in this repository")
        return result.stdout.decode().strip()

    def run(self, *args: str, what: str) -> str:
        result = self._call(*args)
        if result.returncode != 0:
            raise InputError(self.source, f"{what} failed: {_last_line(result.stderr)}")
        # Paths in the text are quoted ASCII; only file contents can be other encodings, and their bytes
        # never change which lines are added or removed.
        return result.stdout.decode("utf-8", errors="replace")

    def run_bytes_or_none(self, *args: str) -> bytes | None:
        result = self._call(*args)
        return result.stdout if result.returncode == 0 else None

    def _call(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(
                ["git", "-C", str(self.repo), *_CONFIG, *args],
                capture_output=True, env=self._env, check=False, stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            raise InputError(self.source, "the git executable was not found on PATH") from None


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode("utf-8", errors="replace").strip().splitlines()
    return lines[-1] if lines else "(no message)"


class _RawEntry:
    """One record of `git diff --raw -z`: exact paths, both modes and blob ids."""

    def __init__(self, old_mode: str, new_mode: str, new_blob: str, status: str, paths: list[str]):
        self.old_mode = None if old_mode == _NO_MODE else old_mode
        self.new_mode = None if new_mode == _NO_MODE else new_mode
        self.new_blob = new_blob
        self.status = status
        self.paths = paths

    def keys(self) -> list[tuple[FileStatus, str | None, str]]:
        """The (status, old path, path) of the patch entries this record shows up as."""
        if self.status == "R":
            return [(FileStatus.renamed, self.paths[0], self.paths[1])]
        if self.status == "C":
            return [(FileStatus.copied, self.paths[0], self.paths[1])]
        path = self.paths[0]
        if self.status == "T":  # a type change (file <-> symlink <-> submodule) prints as delete + add
            return [(FileStatus.removed, None, path), (FileStatus.added, None, path)]
        simple = {"A": FileStatus.added, "D": FileStatus.removed, "M": FileStatus.modified}
        return [(simple[self.status], None, path)]


def _parse_raw(raw: str, source: str) -> list[_RawEntry]:
    fields = raw.split("\0")
    entries: list[_RawEntry] = []
    i = 0
    while i < len(fields) and fields[i]:
        meta = fields[i].lstrip(":").split(" ")
        if len(meta) != 5 or meta[4][:1] not in "ACDMRT":
            raise InputError(source, f"unexpected `git diff --raw` record {fields[i]!r}")
        status = meta[4][0]
        count = 2 if status in "RC" else 1
        entries.append(_RawEntry(meta[0], meta[1], meta[3], status, fields[i + 1 : i + 1 + count]))
        i += 1 + count
    return entries


def _complete_from_raw(files: list[FileChange], raw: list[_RawEntry], git: _Git) -> list[FileChange]:
    """Check the parsed patch against git's exact listing, then take modes (and symlink targets the patch
    text does not show) from the listing. Any disagreement is an error: nothing may go missing."""
    by_key: dict[tuple[FileStatus, str | None, str], tuple[_RawEntry, int]] = {}
    for entry in raw:
        for side, key in enumerate(entry.keys()):
            by_key[key] = (entry, side)
    parsed_keys = Counter((f.status, f.old_path, f.path) for f in files)
    if parsed_keys != Counter(iter(by_key)) or len(by_key) != sum(len(e.keys()) for e in raw):
        differ = sorted({k[2] for k in set(parsed_keys) ^ set(by_key)})
        raise InputError(git.source,
                         f"the patch text and `git diff --raw` disagree about {differ or 'duplicate entries'}")
    completed = []
    for change in files:
        entry, side = by_key[(change.status, change.old_path, change.path)]
        old_mode, new_mode = entry.old_mode, entry.new_mode
        if entry.status == "T":  # split in two: the removal keeps the old mode, the addition the new one
            old_mode, new_mode = (old_mode, None) if side == 0 else (None, new_mode)
        for shown, actual in ((change.old_mode, old_mode), (change.new_mode, new_mode)):
            if shown is not None and shown != actual:
                raise InputError(git.source, f"{change.path}: the patch says mode {shown}, git says {actual}")
        target = change.symlink_target
        if new_mode == SYMLINK_MODE and target is None:
            target = git.run("cat-file", "blob", entry.new_blob, what=f"reading symlink {change.path}")
        completed.append(
            change.model_copy(update={"old_mode": old_mode, "new_mode": new_mode, "symlink_target": target}))
    return completed


def _commits(git: _Git, base_sha: str, head_sha: str) -> tuple[Commit, ...]:
    # NUL-separated fields: a commit message may hold any other character.
    log = git.run("log", "--reverse", "-z", "--format=%H%x00%an%x00%ae%x00%B", f"{base_sha}..{head_sha}", "--",
                  what="git log")
    fields = log.split("\0")
    if fields and fields[-1] == "":
        fields.pop()
    if len(fields) % 4:
        raise InputError(git.source, "unexpected `git log` output")
    return tuple(
        # GitHub's commit messages carry no final newline; git's %B does.
        Commit(sha=sha, message=message.rstrip("\n"), author_name=name or None, author_email=email or None)
        for sha, name, email, message in (fields[i : i + 4] for i in range(0, len(fields), 4))
    )
