"""ChangeSet from a local git range, and `GitSnapshot`: the repository at one commit.

The range is read the way GitHub shows a pull request: the diff from the merge base of `base` and `head`
to `head` (`git diff base...head`), and the commits of `git log base..head`, oldest first.

git runs through gatekeeper.git, which pins its config; the diff options below pin the rest of what could
change the output (external diff drivers, textconv, submodule summaries, another diff algorithm), so a user's
or a repository's git config cannot change what is parsed. The patch text goes through the same parser as
`--diff` input; git's `--raw -z` listing then cross-checks it (exact paths, no quoting) and fills in what the
patch text cannot show: the modes of pure renames and the targets of renamed symlinks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from gatekeeper.changes import SYMLINK_MODE, ChangeSet, Commit, FileChange, FileStatus, TreeEntry
from gatekeeper.errors import InputError
from gatekeeper.git import Git
from gatekeeper.sources.diff import parse_git_diff

_NO_MODE = "000000"
_DIFF_OPTIONS = ("--no-color", "--no-ext-diff", "--no-textconv", "--no-relative", "--full-index",
                 "--submodule=short", "--ignore-submodules=none", "--diff-algorithm=myers", "-M", "-C",
                 "--src-prefix=a/", "--dst-prefix=b/")


def changes_from_git(repo: str | Path, base: str, head: str = "HEAD") -> ChangeSet:
    """The change `base...head` in the repository at `repo`; its base_sha is the merge base, the commit
    the diff is taken against. Not a repository, a bad ref, or histories without a common ancestor:
    InputError naming the repository and the ref."""
    git = Git.open(repo)
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


def tree_entries(repo: str | Path, ref: str) -> dict[str, TreeEntry]:
    """Every entry of the commit's tree with its mode and object id, as GitHub's trees API lists them."""
    git = Git.open(repo)
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
        self._git = Git.open(repo)
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


def _complete_from_raw(files: list[FileChange], raw: list[_RawEntry], git: Git) -> list[FileChange]:
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


def _commits(git: Git, base_sha: str, head_sha: str) -> tuple[Commit, ...]:
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
