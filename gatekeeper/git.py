"""git, run as a subprocess in one local repository: for the change a range makes and the repository at a
commit (gatekeeper.sources.git), and for the history questions the collector and `gpu-report` ask (below).

git runs without a shell, with every option that changes its output pinned on the command line, so a user's
or a repository's git config (quoted paths, noprefix, mnemonic prefixes, an fsmonitor, signatures in logs,
another log encoding) cannot change what is parsed; and without the environment variables that would point it
at another repository or index than the one asked for.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gatekeeper.errors import InputError

# Pinned so that config cannot change what git prints (see the module docstring).
_CONFIG = ("-c", "core.quotePath=true", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
           "-c", "core.fsmonitor=false", "-c", "log.showSignature=false", "-c", "i18n.logOutputEncoding=UTF-8")
# Environment variables that would point git at another repository or index than the one asked for.
_GIT_LOCATION_VARS = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR")


class Git:
    """git in the repository at `repo`. `Git.open` checks that it is one (InputError naming it otherwise);
    the history questions below take a failing git as "cannot say" instead."""

    def __init__(self, repo: str | Path):
        self.repo = Path(repo)
        self.source = str(repo)
        self._env = {k: v for k, v in os.environ.items() if k not in _GIT_LOCATION_VARS}
        self._env.update(LC_ALL="C", GIT_PAGER="cat", GIT_TERMINAL_PROMPT="0")

    @classmethod
    def open(cls, repo: str | Path) -> Git:
        git = cls(repo)
        if not git.repo.is_dir():
            raise InputError(git.source, "not a directory")
        inside = git._call("rev-parse", "--is-inside-work-tree", "--git-dir")
        if inside.returncode != 0:
            raise InputError(git.source, f"not a git repository: {_last_line(inside.stderr)}")
        return git

    def commit_sha(self, ref: str) -> str:
        """The full SHA of the commit `ref` names: InputError naming the repository and the ref otherwise."""
        if not ref or ref.startswith("-"):
            raise InputError(self.source, f"bad git ref {ref!r}")
        sha = self.commit_sha_or_none(ref)
        if sha is None:
            raise InputError(self.source, f"git ref {ref!r} does not name a commit in this repository")
        return sha

    def commit_sha_or_none(self, ref: str) -> str | None:
        """The full SHA of the commit `ref` names; None when it names none (or git cannot say)."""
        found = self.run_bytes_or_none("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
        return found.decode().strip() if found else None

    def run(self, *args: str, what: str) -> str:
        """git's output as text; InputError naming the repository and `what` failed when git fails."""
        result = self._call(*args)
        if result.returncode != 0:
            raise InputError(self.source, f"{what} failed: {_last_line(result.stderr)}")
        # Paths in the text are quoted ASCII; only file contents can be other encodings, and their bytes
        # never change which lines are added or removed.
        return result.stdout.decode("utf-8", errors="replace")

    def run_or_none(self, *args: str) -> str | None:
        """git's output as text; None when git fails."""
        found = self.run_bytes_or_none(*args)
        return None if found is None else found.decode("utf-8", errors="replace")

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


# --- history questions (the collector, `gpu-report`): None or () when git cannot answer -------------------


def ancestors(repo: Path, sha: str, count: int) -> tuple[str, ...]:
    """The `count` nearest ancestors of `sha`, newest first (fewer in a shallow clone)."""
    listing = Git(repo).run_or_none("rev-list", f"--max-count={count + 1}", sha)
    return tuple(listing.split()[1:]) if listing is not None else ()


def commits_changing(repo: Path, sha: str, count: int, globs: tuple[str, ...]) -> tuple[str, ...]:
    """The `count` newest commits from `sha` back (itself included) that change a path matching `globs`."""
    pathspecs = [f":(glob){glob}" for glob in globs]
    listing = Git(repo).run_or_none("rev-list", f"--max-count={count}", sha, "--", *pathspecs)
    return tuple(listing.split()) if listing is not None else ()


def changed_since(repo: Path, sha: str, head: str) -> set[str] | None:
    """The paths that differ between `sha` and `head`; None when `sha` is not a commit of this clone."""
    listing = Git(repo).run_or_none("diff", "--name-only", "--no-renames", "-z", sha, head, "--")
    return None if listing is None else {p for p in listing.split("\0") if p}


def changed_in_worktree(repo: Path, sha: str) -> set[str] | None:
    """The paths whose checked-out content (staged or not) differs from commit `sha`; None when git cannot say."""
    listing = Git(repo).run_or_none("diff", "--name-only", "--no-renames", "-z", sha, "--")
    return None if listing is None else {p for p in listing.split("\0") if p}


def file_at(repo: Path, sha: str, path: str) -> str | None:
    """The UTF-8 text of `path` at commit `sha`; None when that commit has no such file (or is not in this clone),
    or it is not UTF-8."""
    data = Git(repo).run_bytes_or_none("show", f"{sha}:{path}")
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None



def export_tree(repo: Path, sha: str, target: Path) -> bool:
    """The files of commit `sha` written under `target` (what importing the base's code needs); False when git
    cannot (the base is not in this clone)."""
    archive = Git(repo).run_bytes_or_none("archive", "--format=tar", sha)
    if archive is None:
        return False
    import io
    import tarfile

    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(target, filter="data")  # git's own archive, still: no links out, no absolute paths
    return True
