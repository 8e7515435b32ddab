"""perf_matrix: required rows from the support axes, and each way evidence can fall short."""

from __future__ import annotations

import json

import pytest

from gatekeeper.changes import ChangeSet
from gatekeeper.checks import CheckContext
from gatekeeper.checks.perf_matrix import fenced_blocks, run
from gatekeeper.errors import InputError
from gatekeeper.evidence import Evidence, HeadInfo, Origin, PerfEvidence, PerfSubmission, SupportAxes
from gatekeeper.policy import Mode, load_policy_text
from gatekeeper.provenance import Provenance, PullRequestInfo
from gatekeeper.report.tables import details_table
from gatekeeper.snapshot import DictSnapshot
from gatekeeper.verdict import Severity, Status

HEAD = "a" * 40
PARENT = "b" * 40
GRANDPARENT = "c" * 40
GREAT_GRANDPARENT = "d" * 40
TRUSTED = Origin(trust="trusted", source="CI artifact perf.json")
AXES = {"tp": (8, 16), "batch": (1, 64)}

POLICY = """
version: 1
name: tiny
owned_paths: ["tiny/**"]
require_trusted: {trusted}
checks:
  perf_matrix:
    evidence_globs: ["tiny/evidence/*.json"]
    extra_axes: {{layer: [kda]}}
    min_runs: 10
    max_spread_pct: 5
    max_regression_pct: 2
    commit_window: {window}
    commit_window_counts: {counts}
"""


def row(tp, batch, baseline=12.0, candidate=10.0, runs=20, spread=1.0, **extra):
    doc = {"axes": {"tp": tp, "batch": batch, "layer": "kda"},
           "candidate": {"median": candidate, "spread_pct": spread, "runs": runs},
           "baseline": None if baseline is None else {"median": baseline, "spread_pct": 1.0, "runs": runs}}
    doc.update(extra)
    return doc


def perf(rows=None, commit=HEAD) -> dict:
    rows = rows if rows is not None else [row(tp, b) for tp in AXES["tp"] for b in AXES["batch"]]
    return {"commit": commit, "command": "python -m tiny.bench", "created": "2026-11-30T12:00:00Z",
            "hardware": {"gpu": "NVIDIA H200", "count": 1, "driver": "570", "arch": "sm_90"}, "rows": rows}


def check(doc=None, window=0, trusted="[]", files=None, body="", axes=AXES, origin=TRUSTED, head=HEAD, counts="all",
          owned_changes=None, window_paths=None, gpus=None):
    text = POLICY.format(trusted=trusted, window=window, counts=counts)
    if window_paths is not None:
        text += f"    commit_window_paths: {window_paths}\n"
    if gpus is not None:
        text += f"    gpus: {gpus}\n"
    policy = load_policy_text(text, "policy.yaml")
    submissions = () if doc is None else (PerfSubmission(origin=origin, evidence=PerfEvidence.model_validate(doc)),)
    support = None if axes is None else SupportAxes(origin=TRUSTED, source="tiny.support:MATRIX", axes=axes)
    ancestry = HeadInfo(sha=HEAD, ancestors=(PARENT, GRANDPARENT, GREAT_GRANDPARENT), owned_changes=owned_changes)
    evidence = Evidence(head=ancestry, support_axes=support, perf=submissions)
    ctx = CheckContext(policy, ChangeSet(source="git", files=(), head_sha=head), Provenance(), Mode.strict, evidence,
                       DictSnapshot(files or {}), PullRequestInfo(body=body))
    return run(ctx)


def errors(result):
    return [f"{f.path}:{f.line}: {f.message}" if f.path else f.message for f in result.findings if f.severity is Severity.error]


def test_complete_matrix_passes_and_renders_speedups():
    result = check(perf())
    assert result.status is Status.passed, errors(result)
    assert len(result.details["rows"]) == 4
    assert "| 8 | 1 | kda | 12 us | 10 us | 1.20× |" in details_table(result)


def test_missing_row_is_a_gap():
    result = check(perf([row(8, 1), row(8, 64), row(16, 1)]))
    assert result.status is Status.failed
    assert errors(result) == ["tp=16, batch=64, layer=kda: missing: no evidence measured this row"]
    assert "❌ gap" in details_table(result)


def test_row_without_baseline():
    result = check(perf([row(8, 1, baseline=None), row(8, 64), row(16, 1), row(16, 64)]))
    assert errors(result) == ["tp=8, batch=1, layer=kda: no baseline measured in the same run"]


def test_stale_commit_and_the_commit_window():
    stale = check(perf(commit=GRANDPARENT), window=1)
    assert stale.status is Status.failed
    assert errors(stale) == [f"perf evidence from CI artifact perf.json was measured at {GRANDPARENT}, "
                             f"not at the PR head {HEAD[:12]} or one of its 1 nearest ancestors"]
    assert check(perf(commit=GRANDPARENT), window=2).status is Status.passed
    assert check(perf(commit=PARENT[:7]), window=1).status is Status.passed


def test_with_owned_counting_only_commits_changing_the_owned_paths_age_the_evidence():
    # The head changed the owned paths, its parent did not, the grandparent did again.
    owned = (HEAD, GRANDPARENT)
    assert check(perf(commit=GRANDPARENT), window=1, counts="owned", owned_changes=owned).status is Status.passed
    stale = check(perf(commit=GREAT_GRANDPARENT), window=1, counts="owned", owned_changes=owned)
    assert errors(stale) == [f"perf evidence from CI artifact perf.json was measured at {GREAT_GRANDPARENT}, not at "
                             f"the PR head {HEAD[:12]} or an ancestor at most 1 owned-path change(s) behind it"]
    assert check(perf(commit=GREAT_GRANDPARENT), window=2, counts="owned", owned_changes=owned).status is Status.passed
    # Counted over all commits, the same evidence is too old for a window of 1.
    assert check(perf(commit=GRANDPARENT), window=1).status is Status.failed


def notices(result):
    return [f.message for f in result.findings if f.severity is Severity.notice]


def test_evidence_at_an_ancestor_passes_with_a_notice_of_the_window_left():
    owned = (HEAD, PARENT, GREAT_GRANDPARENT)
    aged = check(perf(commit=GRANDPARENT), window=3, counts="owned", owned_changes=owned)
    assert aged.status is Status.passed, errors(aged)
    assert notices(aged) == [f"perf evidence from CI artifact perf.json was measured at {GRANDPARENT[:12]}, 2 "
                             f"owned-path change(s) behind the PR head {HEAD[:12]}; the policy allows 3, so it holds "
                             f"for 1 more"]
    # At the edge of the window: it holds for none more.
    assert notices(check(perf(commit=GRANDPARENT), window=2, counts="owned", owned_changes=owned))[0].endswith(
        "the policy allows 2, so it holds for 0 more")
    counted = check(perf(commit=PARENT), window=2)
    assert notices(counted) == [f"perf evidence from CI artifact perf.json was measured at {PARENT[:12]}, 1 commit(s) "
                                f"behind the PR head {HEAD[:12]}; the policy allows 2, so it holds for 1 more"]
    # Counted over the window's own paths, the messages name them.
    narrowed = check(perf(commit=GRANDPARENT), window=3, counts="owned", owned_changes=owned, window_paths="['tiny/**/*.py']")
    assert notices(narrowed)[0].endswith("2 change(s) to the commit window's paths (tiny/**/*.py) behind the PR head "
                                         f"{HEAD[:12]}; the policy allows 3, so it holds for 1 more")
    stale = check(perf(commit=GREAT_GRANDPARENT), window=1, counts="owned", owned_changes=owned, window_paths="['tiny/**/*.py']")
    assert errors(stale)[0].endswith("or an ancestor at most 1 change(s) to the commit window's paths (tiny/**/*.py) behind it")
    # Evidence measured at the head itself needs no notice.
    assert notices(check(perf(), window=2)) == []


def test_owned_counting_without_the_recorded_changes_accepts_only_the_head():
    result = check(perf(commit=PARENT), window=5, counts="owned", owned_changes=None)
    assert result.status is Status.failed
    assert check(perf(), window=5, counts="owned", owned_changes=None).status is Status.passed


def test_unknown_head_is_undecided():
    result = check(perf(), head=None)
    assert result.status is Status.neutral and "PR head is unknown" in result.summary


def test_too_few_runs_too_much_spread_and_a_regression():
    rows = [row(8, 1, runs=3), row(8, 64, spread=9.0), row(16, 1, baseline=10.0, candidate=10.5), row(16, 64, baseline=10.0, candidate=10.1)]
    result = check(perf(rows))
    assert errors(result) == [
        "tp=8, batch=1, layer=kda: only 3 run(s); the policy requires 10",
        "tp=8, batch=64, layer=kda: spread 9.0% is above the policy's 5%",
        "tp=16, batch=1, layer=kda: regression: the candidate is 5.0% slower than the baseline (allowed 2%)",
    ]


def test_rows_must_be_measured_on_the_arch_they_claim():
    rows = [row(tp, b) for tp in (8, 16) for b in (1, 64)]
    for r in rows:
        r["axes"]["arch"] = "sm_100"
    result = check(perf(rows), axes={**AXES, "arch": ("sm_100",)})
    assert "claims arch sm_100 but was measured on sm_90" in errors(result)[0]


def test_rows_must_come_from_a_gpu_the_policy_names():
    """sm_90 is the H100's arch as well as the H200's: a policy naming its GPU keeps an H100 run out of the matrix."""
    on_h100 = perf()
    on_h100["hardware"]["gpu"] = "NVIDIA H100 80GB HBM3"
    assert check(on_h100).status is Status.passed  # no gpus in the policy: any card of the arch
    result = check(on_h100, gpus="[H200]")
    assert result.status is Status.failed
    assert errors(result)[0] == ("tp=8, batch=1, layer=kda: measured on NVIDIA H100 80GB HBM3; the policy takes "
                                 "evidence from H200 only")
    passed = check(perf(), gpus="[h200, B200]")  # case-insensitive, any of them
    assert passed.status is Status.passed and "measured on NVIDIA H200, no regression" in passed.summary


def test_a_blank_gpu_name_is_refused():
    with pytest.raises(InputError, match="blank name\\(s\\): a blank name matches every GPU") as error:
        check(perf(), gpus='["H200", " "]')
    assert error.value.line is not None  # the policy's line, as every policy error names it


def test_pr_file_and_body_block_are_self_reported_evidence():
    from_file = check(files={"tiny/evidence/h200.json": json.dumps(perf())})
    assert from_file.status is Status.passed
    assert "self-reported" in from_file.summary
    body = "Numbers:\n\n```gatekeeper-perf\n" + json.dumps(perf()) + "\n```\n"
    assert check(body=body).status is Status.passed
    required = check(files={"tiny/evidence/h200.json": json.dumps(perf())}, trusted="[perf_matrix]")
    assert required.status is Status.neutral
    assert any("requires trusted" in f.message for f in required.findings)


def test_trusted_evidence_wins_over_a_self_reported_copy():
    regressed = perf([row(tp, b, baseline=10.0, candidate=20.0) for tp in (8, 16) for b in (1, 64)])
    result = check(perf(), files={"tiny/evidence/h200.json": json.dumps(regressed)})
    assert result.status is Status.passed, errors(result)


def test_rows_split_by_an_axis_the_policy_does_not_require_must_each_pass():
    # Only tp (and the policy's extra axis, layer) are required; the rows are split by batch as well.
    rows = [row(8, 1), row(8, 64), row(16, 1), row(16, 64, candidate=20.0)]
    result = check(perf(rows), axes={"tp": (8, 16)})
    assert result.status is Status.failed
    assert errors(result) == ["tp=16, layer=kda, batch=64: regression: the candidate is 66.7% slower than the baseline (allowed 2%)"]
    assert len(result.details["rows"]) == 4
    assert details_table(result).splitlines()[0].startswith("| tp | layer | batch | baseline |")


def test_hostile_pr_file_is_an_error_naming_the_file():
    nan = json.dumps(perf()).replace("10.0", "NaN")
    result = check(files={"tiny/evidence/bad.json": nan})
    assert result.status is Status.failed
    assert errors(result) == ["tiny/evidence/bad.json:None: unusable perf evidence: NaN is not a number evidence may contain"]
    negative = json.dumps(perf([row(8, 1, candidate=-1.0)]))
    assert "greater than 0" in errors(check(files={"tiny/evidence/neg.json": negative}))[0]
    body = "x\n```gatekeeper-perf\n{\n oops\n```"
    assert errors(check(perf(), body=body)) == ["pull request body:4: unusable perf evidence: invalid JSON: Expecting property name enclosed in double quotes (column 2)"]


def test_without_evidence_or_axes_the_rule_is_neutral():
    nothing = check(None)
    assert nothing.status is Status.neutral and "for the 4 required row(s)" in nothing.summary
    assert details_table(nothing).count("❌ gap") == 4
    # No support matrix in this policy: the extra axes alone (layer) are the matrix.
    assert check(perf(), axes=None).status is Status.passed


def test_a_declared_support_matrix_whose_axes_were_not_recorded_is_undecided():
    policy = load_policy_text(POLICY.format(trusted="[]", window=0, counts="all") + "  startup_guard: {guard: 'tiny.guard:check', support_matrix: 'tiny.support:MATRIX'}\n", "p.yaml")
    evidence = Evidence(perf=(PerfSubmission(origin=TRUSTED, evidence=PerfEvidence.model_validate(perf())),))
    ctx = CheckContext(policy, ChangeSet(source="git", files=(), head_sha=HEAD), Provenance(), Mode.strict, evidence)
    result = run(ctx)
    assert result.status is Status.neutral and "axes are unknown" in result.summary


def test_support_matrix_that_could_not_be_read_fails():
    policy = load_policy_text(POLICY.format(trusted="[]", window=0, counts="all"), "p.yaml")
    broken = SupportAxes(origin=TRUSTED, source="tiny.support:MATRIX", error="ImportError: no module named torch")
    evidence = Evidence(support_axes=broken, perf=(PerfSubmission(origin=TRUSTED, evidence=PerfEvidence.model_validate(perf())),))
    result = run(CheckContext(policy, ChangeSet(source="git", files=(), head_sha=HEAD), Provenance(), Mode.strict, evidence))
    assert result.status is Status.failed
    assert errors(result) == ["the support matrix axes could not be read from tiny.support:MATRIX: ImportError: no module named torch"]


def test_fenced_blocks():
    body = "a\n~~~gatekeeper-perf\n{}\n~~~\n```python\nx\n```\n```gatekeeper-perf\n[1]\n```"
    assert fenced_blocks(body, "gatekeeper-perf") == [(2, "{}"), (8, "[1]")]


EXEMPT = """    axis_exemptions:
      - where: {layer: [kda]}
        ignore: [context]
        reason: KDA reads no KV cache
"""


def exempt_check(doc, exemptions=EXEMPT, axes=None):
    text = POLICY.format(trusted="[]", window=0, counts="all") + exemptions
    policy = load_policy_text(text.replace("extra_axes: {layer: [kda]}", "extra_axes: {layer: [kda, mla]}"), "policy.yaml")
    support = SupportAxes(origin=TRUSTED, source="tiny.support:MATRIX", axes=axes or {"tp": (8,), "context": (4096, 32768)})
    evidence = Evidence(head=HeadInfo(sha=HEAD, ancestors=()), support_axes=support,
                        perf=(PerfSubmission(origin=TRUSTED, evidence=PerfEvidence.model_validate(doc)),))
    return run(CheckContext(policy, ChangeSet(source="git", files=(), head_sha=HEAD), Provenance(), Mode.strict, evidence))


def layer_row(layer, context, candidate=10.0):
    r = row(8, 1, candidate=candidate)
    r["axes"] = {"tp": 8, "context": context, "layer": layer}
    return r


def test_an_axis_exemption_needs_one_row_at_any_value_of_the_ignored_axis():
    # mla needs both contexts; kda one row at either.
    rows = [layer_row("kda", 4096), layer_row("mla", 4096), layer_row("mla", 32768)]
    result = exempt_check(perf(rows))
    assert result.status is Status.passed, errors(result)
    assert [r["axes"] for r in result.details["rows"]] == [
        {"tp": 8, "layer": "kda", "context": 4096}, {"tp": 8, "context": 4096, "layer": "mla"},
        {"tp": 8, "context": 32768, "layer": "mla"}]
    assert result.details["exemptions"] == [{"where": {"layer": ["kda"]}, "ignore": ["context"],
                                              "reason": "KDA reads no KV cache"}]
    table = details_table(result)
    assert "Rows with layer kda: one row at any context stands for all (KDA reads no KV cache)." in table
    # Without the exemption the same evidence misses kda at 32768; mla at 32768 is never exempt.
    plain = exempt_check(perf(rows), exemptions="")
    assert errors(plain) == ["tp=8, context=32768, layer=kda: missing: no evidence measured this row"]
    gap = exempt_check(perf(rows[:2]))
    assert errors(gap) == ["tp=8, context=32768, layer=mla: missing: no evidence measured this row"]
    # A missing exempt row shows `any` for the ignored axis.
    missing = exempt_check(perf(rows[1:]))
    assert errors(missing) == ["tp=8, layer=kda: missing: no evidence measured this row"]
    assert "| 8 | any | kda | – | – |" in details_table(missing)


def test_every_row_measured_at_an_ignored_axis_is_judged():
    rows = [layer_row("kda", 4096), layer_row("kda", 32768, candidate=20.0), layer_row("mla", 4096),
            layer_row("mla", 32768)]
    assert errors(exempt_check(perf(rows))) == [
        "tp=8, layer=kda, context=32768: regression: the candidate is 66.7% slower than the baseline (allowed 2%)"]


def test_an_exemption_that_cannot_apply_is_an_error_not_a_silent_no_op():
    rows = [layer_row(layer, c) for layer in ("kda", "mla") for c in (4096, 32768)]
    typo = EXEMPT.replace("ignore: [context]", "ignore: [contxt]").replace("[kda]", "[kda, gdn]")
    result = exempt_check(perf(rows), exemptions=typo)
    assert result.status is Status.failed
    assert errors(result) == [
        "axis_exemptions[0] names the axis 'contxt', which the required rows do not have (they have tp, context, layer)",
        "axis_exemptions[0] selects layer ['gdn'], which no required row has (layer: kda, mla)"]


def test_an_exemption_must_select_rows_and_ignore_other_axes():
    import pytest

    from gatekeeper.errors import InputError

    base = POLICY.format(trusted="[]", window=0, counts="all")
    for bad, message in [
        ("      - where: {layer: [kda]}\n        ignore: [layer]\n        reason: r\n", "both select the rows"),
        ("      - where: {layer: []}\n        ignore: [context]\n        reason: r\n", "where lists no value"),
        ("      - where: {layer: [kda]}\n        ignore: [context]\n", "reason"),
    ]:
        with pytest.raises(InputError, match=message):
            load_policy_text(base + "    axis_exemptions:\n" + bad, "policy.yaml")
