"""Whether CI's evidence deserves the label `trusted`: pure, from the trees the App already reads.

For a pull request GitHub runs the workflow file as it is at the PR's head, so a PR that edits the
evidence workflow, or an action it uses, writes its own evidence. Evidence is trusted only when the
workflow file at the head is byte-identical to the base branch's (same blob id), and everything it runs
is pinned: remote actions and reusable workflows to a full commit SHA, docker images to a digest, and
local actions (`./path`) byte-identical to the base branch's too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from gatekeeper.changes import TreeEntry

_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")


def untrusted_because(workflow_path: str, workflow_text: str | None, head_tree: Mapping[str, TreeEntry],
                      base_tree: Mapping[str, TreeEntry]) -> str | None:
    """None when the evidence of this workflow can be trusted; otherwise the reason it cannot."""
    base, head = base_tree.get(workflow_path), head_tree.get(workflow_path)
    if base is None:
        return f"the base branch has no `{workflow_path}`, so the workflow that ran is the pull request's own"
    if head is None or workflow_text is None:
        return f"the pull request's head has no readable `{workflow_path}`"
    if head.sha != base.sha:
        return (f"the pull request changes `{workflow_path}` (blob {head.sha[:12]} at the head, {base.sha[:12]} "
                f"on the base branch)")
    try:
        uses = list(_uses(yaml.safe_load(workflow_text)))
    except yaml.YAMLError as exc:
        return f"`{workflow_path}` is not valid YAML: {exc}"
    for ref in uses:
        problem = _unpinned(ref, head_tree, base_tree)
        if problem is not None:
            return f"`{workflow_path}` uses `{ref}`, {problem}"
    return None


def _uses(workflow: Any) -> Iterator[str]:
    """Every `uses:` of the workflow: reusable workflows at job level, actions at step level."""
    jobs = workflow.get("jobs") if isinstance(workflow, dict) else None
    for job in (jobs or {}).values() if isinstance(jobs, dict) else ():
        if not isinstance(job, dict):
            continue
        if isinstance(job.get("uses"), str):
            yield job["uses"]
        for step in job.get("steps") or ():
            if isinstance(step, dict) and isinstance(step.get("uses"), str):
                yield step["uses"]


def _unpinned(ref: str, head_tree: Mapping[str, TreeEntry], base_tree: Mapping[str, TreeEntry]) -> str | None:
    if ref.startswith("./"):
        local = ref[2:].rstrip("/")  # "" for `./`: the repository itself is the action
        changed = sorted(p for p in set(head_tree) | set(base_tree)
                         if (not local or p == local or p.startswith(local + "/"))
                         and getattr(head_tree.get(p), "sha", None) != getattr(base_tree.get(p), "sha", None))
        if changed:
            return f"a local action the pull request changes ({', '.join(changed[:5])})"
        return None
    if ref.startswith("docker://"):
        return None if "@sha256:" in ref else "a docker image not pinned to a digest"
    _, at, version = ref.partition("@")
    if not at or not _COMMIT_SHA.fullmatch(version):
        return "which is not pinned to a full commit SHA (a tag or branch can be moved)"
    return None
