from __future__ import annotations

import re

from rich.console import Console

from gatekeeper.report import render_terminal
from gatekeeper.verdict import CheckResult, Finding, Severity, Status


def _text(verdict) -> str:
    console = Console(record=True, width=120, force_terminal=False)
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
