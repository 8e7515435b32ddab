"""The history questions the collector and `gpu-report` ask git (everything else goes through gatekeeper.sources.git)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def ancestors(repo: Path, sha: str, count: int) -> tuple[str, ...]:
    """The `count` nearest ancestors of `sha`, newest first (fewer in a shallow clone)."""
    listing = _git(repo, "rev-list", f"--max-count={count + 1}", sha)
    return tuple(listing.split()[1:]) if listing is not None else ()


def commits_changing(repo: Path, sha: str, count: int, globs: tuple[str, ...]) -> tuple[str, ...]:
    """The `count` newest commits from `sha` back (itself included) that change a path matching `globs`."""
    pathspecs = [f":(glob){glob}" for glob in globs]
    listing = _git(repo, "rev-list", f"--max-count={count}", sha, "--", *pathspecs)
    return tuple(listing.split()) if listing is not None else ()


def changed_since(repo: Path, sha: str, head: str) -> set[str] | None:
    """The paths that differ between `sha` and `head`; None when `sha` is not a commit of this clone."""
    listing = _git(repo, "diff", "--name-only", "--no-renames", "-z", sha, head, "--")
    return None if listing is None else {p for p in listing.split("\0") if p}


def file_at(repo: Path, sha: str, path: str) -> str | None:
    """The UTF-8 text of `path` at commit `sha`; None when that commit has no such file (or is not in this clone),
    or it is not UTF-8."""
    done = subprocess.run(["git", "show", f"{sha}:{path}"], cwd=repo, capture_output=True, check=False)
    if done.returncode != 0:
        return None
    try:
        return done.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None


def commit_sha(repo: Path, rev: str) -> str | None:
    """The full SHA of the commit `rev` names; None when it names no commit of this clone."""
    listing = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    return listing.strip() if listing else None


def changed_in_worktree(repo: Path, sha: str) -> set[str] | None:
    """The paths whose checked-out content (staged or not) differs from commit `sha`; None when git cannot say."""
    listing = _git(repo, "diff", "--name-only", "--no-renames", "-z", sha, "--")
    return None if listing is None else {p for p in listing.split("\0") if p}


def _git(repo: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-c", "core.quotePath=false", *args], cwd=repo, capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else None
