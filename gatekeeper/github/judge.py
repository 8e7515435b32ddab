"""The second stage of a review: from pinned inputs to what the check run says. No GitHub calls; the head's
file texts come from blobs pinned by id, read on demand through `read_blob`."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from gatekeeper.changes import TreeEntry
from gatekeeper.evidence import parse_evidence
from gatekeeper.github.checkrun import (
    NO_POLICY_NAME,
    SUMMARY_LIMIT,
    CheckRunReport,
    MissingEvidence,
    check_run_name,
    error_report,
    too_many_files_report,
    verdict_report,
)
from gatekeeper.github.config import AppConfig
from gatekeeper.github.inputs import ReviewInputs
from gatekeeper.inputs import EvaluationInputs, verdict_for
from gatekeeper.report.markdown import render_markdown
from gatekeeper.sources.github import changes_from_pr_file_entries, pull_request_from_json, with_tree_facts
from gatekeeper.verdict import Verdict

STICKY_MARKER = "<!-- gatekeeper:sticky-comment -->"


@dataclass(frozen=True)
class Judgement:
    name: str  # the check run's name
    report: CheckRunReport
    comment: str | None = None  # the sticky comment (marker + Markdown), when there is a verdict to show
    wait_until: float | None = None  # the report waits for CI's evidence until then
    verdict: Verdict | None = None  # what the details page shows, when there is a verdict


class HeadSnapshot:
    """The repository at the judged head: paths from its tree, texts from its blobs (pinned by id)."""

    def __init__(self, tree: Mapping[str, TreeEntry], read_blob: Callable[[str], bytes]):
        self._tree, self._read_blob = tree, read_blob
        self._texts: dict[str, str | None] = {}

    def read(self, path: str) -> str | None:
        if path not in self._texts:
            entry = self._tree.get(path)
            text = None
            if entry is not None and entry.type == "blob":
                try:
                    text = self._read_blob(entry.sha).decode("utf-8")
                except UnicodeDecodeError:
                    text = None
            self._texts[path] = text
        return self._texts[path]

    def paths(self) -> Iterable[str]:
        return [path for path, entry in self._tree.items() if entry.type == "blob"]


def judge(config: AppConfig, inputs: ReviewInputs, read_blob: Callable[[str], bytes],
          page_url: str | None = None) -> Judgement:
    """Raises on anything unexpected (malformed GitHub data, unreadable evidence): the caller reports it as a
    failure to evaluate. `page_url`: the details page the reports link to (the App's public URL is set)."""
    loaded = inputs.policy
    if loaded is None:
        return Judgement(NO_POLICY_NAME, error_report(inputs.policy_problem or "no policy",
                                                      title="No valid gatekeeper policy on the base branch"))
    name = check_run_name(loaded.policy.name)
    if inputs.file_count:
        return Judgement(name, too_many_files_report(inputs.file_count, loaded.policy.max_files))
    changes = changes_from_pr_file_entries(list(inputs.entries), list(inputs.commits))
    changes = with_tree_facts(changes, inputs.head_tree, inputs.old_tree, inputs.blobs).model_copy(
        update={"base_sha": inputs.base_sha, "head_sha": inputs.head_sha})  # the perf check's commit window
    info = pull_request_from_json(json.dumps(inputs.pr), f"{inputs.repo}#{inputs.number}")
    evidence = None
    if inputs.evidence is not None:
        evidence = parse_evidence(inputs.evidence.document, f"{inputs.repo}@{inputs.head_sha}: evidence artifact")
    verdict = verdict_for(EvaluationInputs(loaded, changes, info, evidence,
                                           evidence_untrusted=inputs.evidence_untrusted,
                                           snapshot=HeadSnapshot(inputs.head_tree, read_blob)))
    summary = render_markdown(verdict, details_url=page_url)
    if inputs.evidence_untrusted is not None:
        summary = f"> **CI's evidence counts as self-reported:** {inputs.evidence_untrusted}.\n\n" + summary
    missing = missing_evidence(config, inputs) if verdict.verdict == "neutral" else None
    comment = STICKY_MARKER + "\n" + render_markdown(verdict, template="pr_comment", details_url=page_url,
                                                     max_chars=SUMMARY_LIMIT - len(STICKY_MARKER) - 1)
    report = verdict_report(verdict, summary, inputs.override, missing, page_url)
    return Judgement(name, report, comment, missing.wait_until if missing and report.conclusion is None else None,
                     verdict)


def missing_evidence(config: AppConfig, inputs: ReviewInputs) -> MissingEvidence:
    """What an undecided verdict lacks. While no evidence has come for this head and the policy's wait has
    not run out, the check waits for it."""
    workflow = config.evidence_workflows[0]
    awaited = f"the `{config.evidence_artifact}` artifact of `{workflow}` for head `{inputs.head_sha[:12]}`"
    command = (f"gatekeeper collect --policy {config.policy_path} --base {inputs.base_sha} --repo . "
               f"--out evidence.json   # in a checkout of {inputs.head_sha}, as `{workflow}` runs it")
    repo_url = ((inputs.pr.get("base") or {}).get("repo") or {}).get("html_url") or f"https://github.com/{inputs.repo}"
    details_url = f"{repo_url}/actions/workflows/{PurePosixPath(workflow).name}"
    wait_until = None
    if inputs.evidence is None and inputs.policy is not None:
        deadline = inputs.first_seen + inputs.policy.policy.app.evidence_wait_minutes * 60
        wait_until = deadline if deadline > inputs.now else None
    return MissingEvidence(awaited, command, details_url, wait_until)
