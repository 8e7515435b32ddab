"""The first stage of a review: read everything it judges, pinned to one head.

GitHub's pull request endpoints answer for the PR as it is at the moment of each call, so a push between
two calls would mix two heads (judging one head by another head's files). The reads are bracketed by two
reads of the pull request; if its head or base moved in between, everything is read again. Trees and blobs
are read by commit and blob id, so what they return cannot move. The judging stage then works on these
inputs alone, and the digest of the files goes into the evaluation key.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gatekeeper.changes import SUBMODULE_MODE, SYMLINK_MODE, TreeEntry
from gatekeeper.errors import InputError
from gatekeeper.github.client import Installation
from gatekeeper.github.checkrun import NO_POLICY_NAME, check_run_name
from gatekeeper.github.config import AppConfig
from gatekeeper.github.context import Progress
from gatekeeper.github.failures import HeadMoved
from gatekeeper.github.records import EvaluationKey, Override, Records, StoredEvidence
from gatekeeper.evidence_trust import untrusted_because
from gatekeeper.policy import LoadedPolicy, load_policy_text

MAX_READS = 3  # a head that moves three times during one read is retried later as a transient failure


@dataclass(frozen=True)
class ReviewInputs:
    repo: str
    number: int
    pr: dict[str, Any]
    head_sha: str
    base_sha: str
    policy: LoadedPolicy | None  # the base commit's policy; None: see policy_problem
    policy_problem: str | None  # why there is no policy to judge by (missing or invalid)
    entries: tuple[dict[str, Any], ...] = ()  # GitHub's file entries, at most the policy's limit + 1
    file_count: int = 0  # how many files the PR changes, when over the policy's limit; else 0
    commits: tuple[dict[str, Any], ...] = ()
    head_tree: Mapping[str, TreeEntry] = field(default_factory=dict)
    old_tree: Mapping[str, TreeEntry] = field(default_factory=dict)  # the merge base's: what the PR is diffed against
    blobs: Mapping[str, bytes] = field(default_factory=dict)  # symlink targets and no-patch files, by blob id
    evidence: StoredEvidence | None = None
    evidence_untrusted: str | None = None  # why CI's evidence counts as self-reported; None: trusted
    override: Override | None = None
    first_seen: float = 0.0  # when the App first judged this head (the evidence wait counts from here)
    now: float = 0.0  # when the inputs were read: the judgement's clock

    @property
    def files_digest(self) -> str:
        """What the PR's files were when judged: part of the evaluation key, so a verdict cached for one
        list of files is never reused for another, whatever the head SHA says."""
        canonical = json.dumps([[e.get("filename"), e.get("previous_filename"), e.get("status"), e.get("sha"),
                                 e.get("patch")] for e in self.entries], separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def key(self) -> EvaluationKey:
        policy_sha256 = self.policy.sha256 if self.policy else ""
        return EvaluationKey(self.repo, self.number, self.head_sha, policy_sha256, self._inputs_digest())

    def _inputs_digest(self) -> str:
        """Everything besides head and policy that can change the verdict: an `edited` or `labeled` event that
        changes none of it does no work; one that changes the disclosure or labels is judged again."""
        relevant = {
            "base": self.base_sha,
            "policy_problem": self.policy_problem,
            "title": self.pr.get("title") or "",
            "body": self.pr.get("body") or "",
            "labels": sorted(label["name"] for label in self.pr.get("labels") or []),
            "author": (self.pr.get("user") or {}).get("login"),
            "files": self.files_digest,
            "evidence": self.evidence.sha256 if self.evidence else None,
            "override": [self.override.actor, self.override.reason] if self.override else None,
        }
        canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def read_inputs(config: AppConfig, records: Records, gh: Installation, repo: str, number: int,
                progress: Progress) -> ReviewInputs | str:
    """The inputs, or why there is nothing to judge (the PR is not open). `progress` learns the head and
    the check's name as soon as they are known, so that a failure later is reported on the right run."""
    for _ in range(MAX_READS):
        pr = gh.pull_request(repo, number)
        if pr.get("state") != "open":
            return f"skipped: PR #{number} is {pr.get('state')}"
        progress.head_sha = pr["head"]["sha"]
        inputs = _read_once(config, records, gh, repo, number, pr, progress)
        again = gh.pull_request(repo, number)
        if (again["head"]["sha"], again["base"]["sha"]) == (inputs.head_sha, inputs.base_sha):
            return inputs
    raise HeadMoved(f"{repo}#{number} moved while it was read, {MAX_READS} times in a row")


def _read_once(config: AppConfig, records: Records, gh: Installation, repo: str, number: int, pr: dict[str, Any],
               progress: Progress) -> ReviewInputs:
    head_sha, base_sha = pr["head"]["sha"], pr["base"]["sha"]
    policy, problem = read_base_policy(config, gh, repo, base_sha,
                                       f"on the base branch (`{pr['base']['ref']}` at `{base_sha[:12]}`)")
    progress.check_name = check_run_name(policy.policy.name) if policy else NO_POLICY_NAME
    now = time.time()
    base = ReviewInputs(repo, number, pr, head_sha, base_sha, policy, problem,
                        override=records.override_for(repo, number, head_sha),
                        first_seen=records.first_seen(repo, head_sha, now), now=now)
    if policy is None:
        return base
    # The real list, one entry past the limit: enough to know the PR is too large. And the PR's own count,
    # since GitHub's list stops at 3000 files.
    entries = tuple(gh.pull_request_files(repo, number, policy.policy.max_files))
    file_count = max(len(entries), pr.get("changed_files") or 0)
    if file_count > policy.policy.max_files:
        return replace(base, entries=entries, file_count=file_count)
    commits = tuple(gh.pull_request_commits(repo, number))
    head_tree = gh.tree(repo, head_sha)
    merge_base = gh.compare(repo, base_sha, head_sha)["merge_base"]
    old_tree = gh.tree(repo, merge_base)
    blobs = {sha: gh.blob(repo, sha) for sha in _blobs_to_read(entries, head_tree, old_tree)}
    evidence = records.evidence_for(repo, head_sha)
    untrusted = None
    if evidence is not None:
        # Compared with the base branch as it is now, which is what a merge would keep.
        base_tree = old_tree if merge_base == base_sha else gh.tree(repo, base_sha)
        workflow = head_tree.get(evidence.workflow_path)
        text = gh.blob(repo, workflow.sha).decode("utf-8", "replace") if workflow else None
        untrusted = untrusted_because(evidence.workflow_path, text, head_tree, base_tree)
    return replace(base, entries=entries, commits=commits, head_tree=head_tree, old_tree=old_tree, blobs=blobs,
                    evidence=evidence, evidence_untrusted=untrusted)


def read_base_policy(config: AppConfig, gh: Installation, repo: str, ref: str,
                     where: str) -> tuple[LoadedPolicy | None, str | None]:
    """The policy at `ref`, a base commit (a change is never judged by its own policy), or why there is none to
    judge by; `where` says which base, for that reason."""
    text = gh.file_text(repo, config.policy_path, ref)
    if text is None:
        return None, f"No policy file `{config.policy_path}` {where}. Add one to enable the gatekeeper."
    try:
        return load_policy_text(text, f"{repo}@{ref}:{config.policy_path}"), None
    except InputError as exc:
        return None, f"The policy {where} is invalid:\n\n`{exc}`"


def _blobs_to_read(entries, head_tree: Mapping[str, TreeEntry], old_tree: Mapping[str, TreeEntry]) -> list[str]:
    """Blob ids the file list cannot stand in for: symlinks (their target is their content) and files
    GitHub shows without a patch (binary, or too large: only the content tells)."""
    wanted: list[str] = []
    for entry in entries:
        new = head_tree.get(entry["filename"]) if entry["status"] != "removed" else None
        old = old_tree.get(entry.get("previous_filename") or entry["filename"]) if entry["status"] != "added" else None
        if new is not None and new.mode == SYMLINK_MODE:
            wanted.append(new.sha)
        if entry.get("patch") is None:
            wanted += [side.sha for side in (new, old) if side is not None and side.mode != SUBMODULE_MODE]
    return list(dict.fromkeys(wanted))
