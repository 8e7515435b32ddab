from __future__ import annotations

import re

from rich.console import Console

from gatekeeper.report import render_terminal
from gatekeeper.verdict import CheckResult, Finding, Severity, Status


def _text(verdict, width: int = 120) -> str:
    console = Console(record=True, width=width, force_terminal=False)
    render_terminal(verdict, console)
    return console.export_text()


def test_terminal_shows_verdict_signals_checks_findings_and_budgets(verdict):
    text = _text(verdict)
    assert "gatekeeper: FAIL" in text
    assert "mode: strict bounded review" in text
    assert "trailer in commit 1a2b3c4d5e6f: Co-authored-by: Claude <noreply@anthropic.com>" in text
    assert "vllm/engine/llm_engine.py:40  outside the owned paths" in text
    assert "│ README.md  │ 3 / 2" in text
    assert "UNDECIDED: changed_path_tests" in text


def test_every_severity_is_set_apart_from_what_follows(verdict):
    for severity in Severity:
        finding = Finding(path="k.py", severity=severity, message="m")
        check = CheckResult(id="confinement", status=Status.passed, summary="s", findings=(finding,))
        assert re.search(rf"\b{severity.value} +k\.py  m", _text(verdict.model_copy(update={"checks": (check,)})))


def test_generic_details_and_markup_in_messages_stay_literal(verdict, details_check):
    markup = CheckResult(
        id="confinement", status=Status.failed, summary="[bold red]x[/bold red]",
        findings=(Finding(path="a\u202e.py", message="[link=http://x]click[/link]"),),
    )
    text = _text(verdict.model_copy(update={"checks": (markup, details_check)}))
    assert "[bold red]x[/bold red]" in text
    assert "a\\u{202E}.py  [link=http://x]click[/link]" in text
    assert re.search(r"commit +0123abc", text)
    assert '{"count": 8, "gpu": "NVIDIA H200"}' in text


def test_a_checks_table_is_drawn(verdict):
    probe = {"probe": "tp4", "expect": "reject", "got": "rejected", "ok": "yes"}
    check = CheckResult(id="startup_guard", status=Status.passed, summary="ok", details={"probes": [probe]})
    text = _text(verdict.model_copy(update={"checks": (check,)}))
    assert re.search(r"tp4 +│ +reject +│ +rejected", text) or re.search(r"tp4 +reject +rejected", text)


def _perf_check(rows: int) -> CheckResult:
    row = {"axes": {"tp": 8, "batch": 1, "context": 32768, "layer": "mla_moe"}, "unit": "us", "baseline": 440.7,
           "candidate": 139.9, "speedup": 3.15, "floor": 71.28, "runs": 20, "spread_pct": 0.3, "problems": []}
    details = {"axes": {"tp": [8], "batch": [1], "context": [32768]}, "rows": [row] * rows}
    return CheckResult(id="perf_matrix", status=Status.passed, summary="ok", details=details)


def test_a_table_wider_than_the_terminal_lists_its_rows_whole(verdict):
    """A CI log is 80 columns: the perf matrix's 11 columns squeezed into it were cut to 'sm_…', '39…'."""
    check = _perf_check(rows=2)
    narrow = _text(verdict.model_copy(update={"checks": (check,)}), width=80)
    assert "…" not in narrow
    flowed = " ".join(narrow.replace("│", " ").split())  # the list's lines wrap inside the panel
    row = ("✅ tp 8 · batch 1 · context 32768 · layer mla_moe · baseline 440.7 us · candidate 139.9 us · "
           "speedup 3.15× · floor 71.28 us · runs 20 · spread 0.3%")
    assert flowed.count(row) == 2
    wide = _text(verdict.model_copy(update={"checks": (check,)}), width=200)
    assert re.search(r"8 +1 +32768 +mla_moe +440.7 us +139.9 us +3.15× +71.28 us +20 +0.3% +✅", wide)
