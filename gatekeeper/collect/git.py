"""The two history questions the collector asks git (everything else goes through gatekeeper.sources.git)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def ancestors(repo: Path, sha: str, count: int) -> tuple[str, ...]:
    """The `count` nearest ancestors of `sha`, newest first (fewer in a shallow clone)."""
    listing = _git(repo, "rev-list", f"--max-count={count + 1}", sha)
    return tuple(listing.split()[1:]) if listing is not None else ()


def changed_since(repo: Path, sha: str, head: str) -> set[str] | None:
    """The paths that differ between `sha` and `head`; None when `sha` is not a commit of this clone."""
    listing = _git(repo, "diff", "--name-only", "--no-renames", "-z", sha, head, "--")
    return None if listing is None else {p for p in listing.split("\0") if p}


def _git(repo: Path, *args: str) -> str | None:
    done = subprocess.run(["git", "-c", "core.quotePath=false", *args], cwd=repo, capture_output=True, text=True, check=False)
    return done.stdout if done.returncode == 0 else None
