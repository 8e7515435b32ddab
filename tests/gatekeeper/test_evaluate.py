from __future__ import annotations

import copy

import pytest

from gatekeeper.changes import ChangeSet, FileChange, FileStatus
from gatekeeper.evaluate import evaluate
from gatekeeper.policy import load_policy_text
from gatekeeper.provenance import Provenance
from gatekeeper.verdict import Signal, Status

POLICY = load_policy_text(
    "version: 1\nname: t\nowned_paths: [pkg/**]\ndefault_mode_checks: []\n"
    "checks:\n  perf_matrix: {enabled: true, extra_axes: {tp: [8]}}\n",
    "t.yaml",
)
INSIDE = ChangeSet(source="test", files=(FileChange(path="pkg/a.py", status=FileStatus.added, added_lines=(1,)),))
OUTSIDE = ChangeSet(source="test", files=(FileChange(path="other.py", status=FileStatus.modified, added_lines=(3,)),))
ASSISTED = Provenance(signals=(Signal(kind="label", source="pull request labels", detail="ai-assisted"),))


def test_same_inputs_give_the_same_verdict_and_inputs_are_untouched():
    before = copy.deepcopy((POLICY, OUTSIDE, ASSISTED))
    first = evaluate(POLICY, OUTSIDE, ASSISTED)
    second = evaluate(POLICY, OUTSIDE, ASSISTED)
    assert first == second
    assert first.model_dump_json() == second.model_dump_json()
    assert (POLICY, OUTSIDE, ASSISTED) == before


def test_a_signal_selects_strict_mode_where_every_enabled_check_is_required():
    verdict = evaluate(POLICY, INSIDE, ASSISTED)
    assert verdict.mode == "strict" and verdict.agent_assisted
    statuses = {c.id: c.status for c in verdict.checks}
    assert statuses["confinement"] is Status.passed
    assert statuses["perf_matrix"] is Status.neutral  # required, but no evidence was given
    assert statuses["startup_guard"] is Status.skipped and statuses["changed_path_tests"] is Status.skipped
    assert verdict.verdict == "neutral"
    assert verdict.signals == ASSISTED.signals


def test_no_signal_selects_default_mode_where_only_default_mode_checks_run():
    verdict = evaluate(POLICY, OUTSIDE, Provenance())
    assert verdict.mode == "default" and not verdict.agent_assisted
    assert [c.status for c in verdict.checks] == [Status.skipped] * 4
    assert verdict.checks[0].summary == "Not required in default mode."
    assert verdict.checks[1].summary == "Disabled in the policy."
    assert verdict.verdict == "pass"


@pytest.mark.parametrize("declared, mode", [(True, "strict"), (False, "default")])
def test_a_declaration_overrides_detection(declared, mode):
    assert evaluate(POLICY, OUTSIDE, ASSISTED.model_copy(update={"declared": declared})).mode == mode


def test_any_failure_fails_even_with_undecided_checks():
    verdict = evaluate(POLICY, OUTSIDE, ASSISTED)
    assert [c.status for c in verdict.checks if c.status is not Status.skipped] == [Status.failed, Status.neutral]
    assert verdict.verdict == "fail"


def test_evaluate_does_no_io(monkeypatch):
    evaluate(POLICY, OUTSIDE, ASSISTED)  # the first call imports the check modules; that is the only I/O allowed

    def forbidden(*args, **kwargs):
        raise AssertionError(f"evaluate did I/O: {args!r}")

    import builtins
    import socket
    import subprocess

    monkeypatch.setattr(builtins, "open", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(socket, "socket", forbidden)
    assert evaluate(POLICY, OUTSIDE, ASSISTED).verdict == "fail"
