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
    rule_report,
    rule_run_name,
    too_many_files_report,
    verdict_report,
)
from gatekeeper.github.config import AppConfig
from gatekeeper.github.inputs import ReviewInputs
from gatekeeper.inputs import EvaluationInputs, verdict_for
from gatekeeper.policy import LoadedPolicy
from gatekeeper.report.markdown import render_markdown
from gatekeeper.sources.github import changes_from_pr_file_entries, pull_request_from_json, with_tree_facts
from gatekeeper.verdict import Status, Verdict

STICKY_MARKER = "<!-- gatekeeper:sticky-comment -->"


@dataclass(frozen=True)
class Judgement:
    name: str  # the check run's name
    report: CheckRunReport
    comment: str | None = None  # the sticky comment (marker + Markdown), when there is a verdict to show
    wait_until: float | None = None  # the report waits for CI's evidence until then
    verdict: Verdict | None = None  # what the details page shows, when there is a verdict
    # The rules' own runs (policy `app.check_runs: per_rule`), published with the overall one: (name, report).
    rules: tuple[tuple[str, CheckRunReport], ...] = ()


def failed_judgement(name: str, report: CheckRunReport, policy: LoadedPolicy | None) -> Judgement:
    """A report that is not a verdict (too many files, an error while judging): the overall run and, per rule,
    every rule's run say it, so that none of them passes what was not judged."""
    rules = ()
    if policy is not None and policy.policy.app.check_runs == "per_rule":
        rules = tuple((rule_run_name(name, rule), report) for rule in policy.policy.checks.enabled())
    return Judgement(name, report, rules=rules)


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
        return failed_judgement(name, too_many_files_report(inputs.file_count, loaded.policy.max_files), loaded)
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
    # An undecided rule says what would decide it, on the overall run or (per_rule) on its own.
    missing = missing_evidence(config, inputs) if any(c.status is Status.neutral for c in verdict.checks) else None
    comment = STICKY_MARKER + "\n" + render_markdown(verdict, template="pr_comment", details_url=page_url,
                                                     max_chars=SUMMARY_LIMIT - len(STICKY_MARKER) - 1)
    report = verdict_report(verdict, summary, inputs.override, missing, page_url)
    rules = ()
    if loaded.policy.app.check_runs == "per_rule":
        fallback = missing.details_url if missing is not None else None  # action_required needs a details_url
        rules = tuple(_rule_run(name, rule, verdict, report, inputs, page_url, fallback)
                      for rule in loaded.policy.checks.enabled())
    return Judgement(name, report, comment, missing.wait_until if missing and report.conclusion is None else None,
                     verdict, rules)


def _rule_run(name: str, rule: str, verdict: Verdict, overall: CheckRunReport, inputs: ReviewInputs,
              page_url: str | None, fallback_url: str | None) -> tuple[str, CheckRunReport]:
    url = f"{page_url}#rule-{rule}" if page_url else fallback_url  # the page's section of this rule
    summary = render_markdown(verdict, template="rule_run", only=rule, details_url=url)
    if inputs.evidence_untrusted is not None:
        summary = f"> **CI's evidence counts as self-reported:** {inputs.evidence_untrusted}.\n\n" + summary
    return rule_run_name(name, rule), rule_report(verdict, rule, overall, summary, inputs.override, url)


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
