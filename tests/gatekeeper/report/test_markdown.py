from __future__ import annotations

import re

from gatekeeper.report import render_markdown
from gatekeeper.verdict import CheckResult, Finding, Signal, Status


def test_check_run_lists_verdict_mode_signals_checks_and_findings(verdict):
    text = render_markdown(verdict)
    assert text.startswith("## ❌ gatekeeper: FAIL")
    assert "mode: **strict bounded review**" in text
    assert "0 passed" not in text and "1 passed, 1 failed, 1 undecided, 1 skipped" in text
    assert "- **trailer** in commit 1a2b3c4d5e6f: `Co-authored-by: Claude <noreply@anthropic.com>`" in text
    for check in verdict.checks:
        assert f"| {check.id} | " in text
    assert "- ❌ `vllm/engine/llm_engine.py:40` outside the owned paths" in text
    assert "- ℹ️ `kimi_k3_path/big.py` no patch text" in text
    assert "| README.md | 3 / 2 | 0 / 0 |" in text  # the confinement details template
    assert "### ⏭️ perf_matrix" not in text  # skipped checks only appear in the table


def test_neutral_checks_are_called_out_loudly(verdict):
    text = render_markdown(verdict)
    assert "**Undecided:** changed_path_tests could not be decided" in text
    assert "An undecided check is never a pass." in text


def test_generic_details_render_tables_json_and_scalars(verdict, details_check):
    text = render_markdown(verdict.model_copy(update={"checks": (details_check,)}))
    assert "| tp | batch | speedup |\n|---|---|---|\n| 8 | 1 | 1.235 |\n| 16 | 64 |  |" in text
    assert '```json\n{\n  "count": 8,\n  "gpu": "NVIDIA H200"\n}\n```' in text
    assert "- **commit**: 0123abc" in text


def test_no_signal_and_overridden_signals_are_explained(verdict):
    quiet = render_markdown(verdict.model_copy(update={"signals": (), "agent_assisted": False, "mode": "default"}))
    assert "No signal of agent assistance found. Absence of signals is not proof of absence" in quiet
    overridden = render_markdown(verdict.model_copy(update={"agent_assisted": False}))
    assert "Declared **not** agent-assisted, which overrides the 1 signal found" in overridden


def test_untrusted_text_cannot_format_mention_or_reorder(verdict):
    hostile = CheckResult(
        id="confinement", status=Status.failed, summary="| injected | row |\n# heading",
        findings=(Finding(path="a\u202eb`c`.py", line=1, message="<img src=x> [link](http://x) @maintainer"),),
    )
    signal = Signal(kind="label", source="pull request #1 labels", detail="``ai`` \u2066")
    text = render_markdown(verdict.model_copy(update={"checks": (hostile,), "signals": (signal,)}))
    assert "\u202e" not in text and "\u2066" not in text
    assert "``a\\u{202E}b`c`.py:1``" in text
    assert "\\<img src=x\\> \\[link\\](http://x) @\u2060maintainer" in text
    assert "| confinement | ❌ fail | \\| injected \\| row \\| # heading |" in text
    assert "- **label** in pull request #1 labels: ``` ``ai`` \\u{2066} ```" in text


def test_pr_comment_is_short_and_links_the_full_report(verdict):
    text = render_markdown(verdict, template="pr_comment", details_url="https://example.test/runs/1")
    assert text.startswith("**gatekeeper ❌ FAIL** for policy `kimi-k3-latency-specialized` (strict bounded review, agent-assisted)")
    assert "<details><summary>❌ confinement: 2 findings</summary>" in text
    assert "[Full report](https://example.test/runs/1)" in text
    assert "Agent assistance" not in text


def _flood(verdict, count: int):
    findings = tuple(Finding(path=f"vllm/f{i}.py", line=i, message="outside the owned paths " * 4) for i in range(count))
    check = CheckResult(id="confinement", status=Status.failed, summary=f"{count} offending.", findings=findings)
    return verdict.model_copy(update={"checks": (check,)})


def test_long_reports_cut_findings_and_say_how_many_are_hidden(verdict):
    text = render_markdown(_flood(verdict, 5000))
    assert len(text) <= 65535
    shown = len(re.findall(r"^- ❌ `vllm/f", text, re.MULTILINE))
    assert shown == 200
    assert "… and 4800 more findings not shown; `gatekeeper check --format json` lists them all." in text


def test_reports_that_still_do_not_fit_are_cut_with_a_note(verdict):
    text = render_markdown(_flood(verdict, 10), max_chars=300)
    assert len(text) == 300
    assert text.endswith("run `gatekeeper check --format json` for all of it.\n")


def test_a_checks_table_is_shown_with_hidden_characters_and_mentions_defused(verdict):
    probe = {"probe": "tp4", "expect": "reject", "got": "rejected: tp=4 @ops\u202e", "ok": "yes"}
    check = CheckResult(id="startup_guard", status=Status.passed, summary="ok", details={"probes": [probe]})
    text = render_markdown(verdict.model_copy(update={"checks": (check,)}))
    assert "| probe | expect | got | ok |\n|---|---|---|---|\n| tp4 | reject | rejected: tp=4 @\u2060ops\\u{202E} | ✅ |" in text
    assert "**probes**" not in text  # the raw rows behind the table are not rendered twice


def test_many_signals_are_cut_too(verdict):
    signals = tuple(
        Signal(kind="trailer", source=f"commit {i:012x}", detail="Assisted-by: Claude " + "x" * 200) for i in range(3000)
    )
    text = render_markdown(verdict.model_copy(update={"signals": signals}))
    assert len(text) <= 65535
    assert len(re.findall(r"^- \*\*trailer\*\*", text, re.MULTILINE)) == 100
    assert "… and 2900 more signals not shown" in text
    assert "Agent-assisted: 3000 signals found." in text
