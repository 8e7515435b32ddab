"""Real git repositories in temp dirs, and the three views of one change: git range, `git diff` text, and a
GitHub "list pull request files" response synthesized from the repository.

The synthesizer deliberately shares no code with gatekeeper.sources: it asks git for names, statuses and
counts in git's own machine formats (-z) and cuts each file's hunks out of `git diff`, the way GitHub's
diff-entry presents them (hunks only, no file header, no final newline, no `patch` when there are no hunks).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest


_ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Ada Author", "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada Author", "GIT_COMMITTER_EMAIL": "ada@example.com",
}
_GITHUB_STATUS = {"A": "added", "D": "removed", "M": "modified", "R": "renamed", "C": "copied"}
_REPO_URL = "https://github.com/octo-org/hello"


class GitRepo:
    def __init__(self, root: Path):
        self.root = root
        self._gitlinks: dict[str, str] = {}
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str, input: bytes | None = None) -> str:
        result = subprocess.run(["git", "-C", str(self.root), *args], env=_ENV, capture_output=True, input=input)
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode("utf-8", errors="replace")

    def git_bytes(self, *args: str) -> bytes:
        result = subprocess.run(["git", "-C", str(self.root), *args], env=_ENV, capture_output=True)
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout

    def write(self, path: str, content: str | bytes, executable: bool = False) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        target.write_bytes(content.encode() if isinstance(content, str) else content)
        target.chmod(0o755 if executable else 0o644)

    def symlink(self, path: str, points_to: str) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        os.symlink(points_to, target)

    def remove(self, path: str) -> None:
        self.git("rm", "-q", "--", path)

    def move(self, old: str, new: str) -> None:
        (self.root / new).parent.mkdir(parents=True, exist_ok=True)
        self.git("mv", "--", old, new)

    def submodule(self, path: str, sha: str) -> None:
        """A gitlink entry, exactly what a submodule bump records, without needing a second repository."""
        self._gitlinks[path] = sha

    def commit(self, message: str) -> str:
        self.git("add", "-A")
        # `add -A` would stage a gitlink without a checked-out directory as deleted: record it after.
        for path, sha in self._gitlinks.items():
            self.git("update-index", "--add", "--cacheinfo", f"160000,{sha},{path}")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD").strip()

    def diff_text(self, base: str, head: str = "HEAD") -> str:
        """What a user would save with `git diff base...head > change.diff` (default context, default config)."""
        return self.git("diff", "-M", "-C", f"{base}...{head}")

    def pr_files(self, base: str, head: str = "HEAD", omit_patch: Iterable[str] = ()) -> list[dict]:
        """The "list pull request files" response GitHub would give for base...head (diff-entry schema).
        Files in `omit_patch` come without `patch`, as GitHub does for diffs too large to show."""
        head_sha = self.git("rev-parse", head).strip()
        records = self.git("diff", "--raw", "-z", "--no-abbrev", "-M", "-C", f"{base}...{head}").split("\0")
        numstat = self.git("diff", "--numstat", "-z", "-M", "-C", f"{base}...{head}").split("\0")
        sections = _sections(self.git("diff", "-M", "-C", f"{base}...{head}"))
        entries: list[dict] = []
        i = j = 0
        while records[i]:
            old_mode, new_mode, old_blob, new_blob, status = records[i][1:].split(" ")
            paths = records[i + 1 : i + 3] if status[0] in "RC" else records[i + 1 : i + 2]
            i += 1 + len(paths)
            counts = numstat[j].split("\t")
            j += 3 if counts[2] == "" else 1  # -z prints a rename's two paths as separate fields
            filename = paths[-1]
            blob = new_blob if status[0] != "D" else old_blob
            entry = {
                "sha": blob,
                "filename": filename,
                "status": _GITHUB_STATUS[status[0]],
                "additions": 0 if counts[0] == "-" else int(counts[0]),
                "deletions": 0 if counts[1] == "-" else int(counts[1]),
                "changes": 0,
                "blob_url": f"{_REPO_URL}/blob/{head_sha}/{filename}",
                "raw_url": f"{_REPO_URL}/raw/{head_sha}/{filename}",
                "contents_url": f"https://api.github.com/repos/octo-org/hello/contents/{filename}?ref={head_sha}",
            }
            entry["changes"] = entry["additions"] + entry["deletions"]
            if "160000" in (old_mode, new_mode):
                # What GitHub sends for a gitlink (github/rest-api-description issue 1945).
                entry["blob_url"] = entry["raw_url"] = None
            if old_mode != new_mode and status[0] == "M" and entry["changes"] == 0:
                entry["status"] = "changed"  # GitHub's word for a mode-only change
            hunks = sections.pop(0)
            if hunks and filename not in omit_patch:
                entry["patch"] = hunks
            if status[0] in "RC":
                entry["previous_filename"] = paths[0]
            entries.append(entry)
        assert not sections, "every diff section belongs to one entry"
        return entries

    def pr_files_json(self, base: str, head: str = "HEAD", omit_patch: Iterable[str] = ()) -> str:
        return json.dumps(self.pr_files(base, head, omit_patch), indent=2)


def _sections(diff: str) -> list[str]:
    """Each file's hunks (from its first `@@` line), without the final newline; '' when it has none."""
    sections: list[list[str]] = []
    for line in diff.split("\n"):
        if line.startswith("diff --git "):
            sections.append([])
        elif sections and (sections[-1] or line.startswith("@@ ")):
            sections[-1].append(line)
    return ["\n".join(lines).rstrip("\n") for lines in sections]


@pytest.fixture
def new_repo() -> Callable[[], GitRepo]:
    """A factory, so that hypothesis examples each get a fresh repository."""
    made: list[tempfile.TemporaryDirectory] = []

    def make() -> GitRepo:
        made.append(tempfile.TemporaryDirectory(prefix="gk-repo-"))
        return GitRepo(Path(made[-1].name))

    yield make
    for directory in made:
        directory.cleanup()


@pytest.fixture
def repo(new_repo) -> GitRepo:
    return new_repo()

