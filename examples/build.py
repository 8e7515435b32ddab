"""Rebuild an example pull request and collect its evidence, for real (see examples/README.md).

    python examples/build.py pr-confined [--base REF]

In a temporary clone of this repository at BASE (default: HEAD), the example's `change.diff` is applied and
committed with the example's `message.txt` (fixed author, dates: the same base gives the same head SHA). From that
commit it writes what GitHub's REST API would return for the pull request (`pr-files.json`, `commits.json`, and
`pull.json` with the head and base SHAs filled in), then runs `gatekeeper collect` on the clone, which runs the
policy's tests under coverage and the guard probes at the head and at the base, and writes `evidence.json`.
Nothing here is typed in: every number in the evidence is measured by the collector.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICY = "policies/kimi-k3-latency-specialized.yaml"
AUTHOR = {"name": "Mona Octocat", "email": "octocat@users.noreply.github.com", "date": "2026-11-28T14:02:11Z"}
USER = {"login": "octocat", "id": 583231, "type": "User", "site_admin": False}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": AUTHOR["name"], "GIT_AUTHOR_EMAIL": AUTHOR["email"],
           "GIT_AUTHOR_DATE": AUTHOR["date"], "GIT_COMMITTER_NAME": AUTHOR["name"],
           "GIT_COMMITTER_EMAIL": AUTHOR["email"], "GIT_COMMITTER_DATE": AUTHOR["date"]}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def pr_files(repo: Path, base: str, head: str) -> list[dict]:
    """GitHub's "list pull request files": per file its status, counts and the patch (hunks only)."""
    statuses = {"A": "added", "M": "modified", "D": "removed", "R": "renamed"}
    files = []
    for line in git(repo, "diff", "--name-status", "--no-renames", base, head).splitlines():
        status, path = line.split("\t", 1)
        added, removed = git(repo, "diff", "--numstat", base, head, "--", path).split("\t")[:2]
        patch = git(repo, "diff", "--no-color", base, head, "--", path)
        hunks = patch[patch.index("@@"):] if "@@" in patch else ""
        files.append({
            "sha": git(repo, "rev-parse", f"{head}:{path}").strip() if status != "D" else None,
            "filename": path, "status": statuses[status[0]], "additions": int(added), "deletions": int(removed),
            "changes": int(added) + int(removed), "patch": hunks.rstrip("\n"),
        })
    return files


def commits(repo: Path, base: str, head: str) -> list[dict]:
    out = []
    for sha in reversed(git(repo, "rev-list", f"{base}..{head}").split()):
        message = git(repo, "log", "-1", "--format=%B", sha).rstrip("\n") + "\n"
        parents = git(repo, "log", "-1", "--format=%P", sha).split()
        out.append({"sha": sha, "commit": {"author": AUTHOR, "committer": AUTHOR, "message": message},
                    "author": USER, "committer": USER, "parents": [{"sha": p} for p in parents]})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example", help="a directory under examples/ holding change.diff, message.txt, pull.json")
    parser.add_argument("--base", default="HEAD", help="the commit of this repository the change applies to")
    args = parser.parse_args()
    example = ROOT / "examples" / args.example
    base = git(ROOT, "rev-parse", args.base).strip()
    with tempfile.TemporaryDirectory(prefix="gatekeeper-example-") as tmp:
        repo = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(repo)], check=True)
        git(repo, "checkout", "-q", base)
        git(repo, "apply", "--index", str(example / "change.diff"))
        git(repo, "commit", "-q", "-F", str(example / "message.txt"))
        head = git(repo, "rev-parse", "HEAD").strip()
        (example / "pr-files.json").write_text(json.dumps(pr_files(repo, base, head), indent=2) + "\n")
        (example / "commits.json").write_text(json.dumps(commits(repo, base, head), indent=2) + "\n")
        pull = json.loads((example / "pull.json").read_text())
        pull["head"]["sha"], pull["base"]["sha"] = head, base
        (example / "pull.json").write_text(json.dumps(pull, indent=2, ensure_ascii=False) + "\n")
        collect = [sys.executable, "-m", "gatekeeper", "collect", "--policy", POLICY, "--base", base,
                   "--repo", str(repo), "--out", str(example / "evidence.json")]
        print("+", " ".join(collect), file=sys.stderr)
        return subprocess.run(collect, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
