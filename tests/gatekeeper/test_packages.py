"""Policies with several owned packages: loading, the one-package shorthand, each touched package judged with its
own settings and evidence, shadow rules."""

from __future__ import annotations

import pytest

from gatekeeper.changes import ChangeSet, FileChange, FileStatus
from gatekeeper.errors import InputError
from gatekeeper.evaluate import evaluate
from gatekeeper.evidence import Evidence, GuardProbeRun, Origin, PackageEvidence, ProbeResult
from gatekeeper.policy import load_policy_text
from gatekeeper.policy_lint import lint
from gatekeeper.provenance import Provenance
from gatekeeper.snapshot import DictSnapshot
from gatekeeper.verdict import Signal, Status

ENGINE = """\
version: 1
name: engine
packages:
  - name: alpha
    model: Alpha
    scope: pure decode
    owned_paths: [eng/alpha/**]
    startup_guard:
      guard: eng.alpha.guard:check
      raises: ValueError
      probes:
        - {name: tp8, deployment: {tp: 8}, expect: accept}
        - {name: tp4, deployment: {tp: 4}, expect: reject, must_name: [tp]}
  - name: beta
    owned_paths: [eng/beta/**]
    startup_guard:
      guard: eng.beta.guard:check
      raises: ValueError
      probes:
        - {name: ok, deployment: {tp: 4}, expect: accept}
checks:
  startup_guard: {enabled: true}
"""
GUARD = "def check(d):\n    if d['tp'] != 8:\n        raise ValueError('tp')\n"
SNAPSHOT = DictSnapshot({"eng/alpha/guard.py": GUARD, "eng/beta/guard.py": GUARD.replace("8", "4"),
                         "eng/__init__.py": "", "eng/alpha/__init__.py": "", "eng/beta/__init__.py": ""})
ASSISTED = Provenance(signals=(Signal(kind="label", source="labels", detail="ai-assisted"),))
TRUSTED = Origin(trust="trusted", source="test")


def _change(*paths: str) -> ChangeSet:
    return ChangeSet(source="test", files=tuple(
        FileChange(path=p, status=FileStatus.modified, added_lines=(1,)) for p in paths))


def _run(guard: str, **outcomes: str) -> GuardProbeRun:
    return GuardProbeRun(origin=TRUSTED, guard=guard, results=tuple(
        ProbeResult(name=n, outcome=o, message="tp" if o == "raised" else "",
                    exception_types=("builtins.ValueError",) if o == "raised" else ()) for n, o in outcomes.items()))


def test_owned_paths_are_the_packages_and_the_shorthand_is_one_package():
    policy = load_policy_text(ENGINE, "e.yaml").policy
    assert policy.owned_paths == ("eng/alpha/**", "eng/beta/**")
    single = load_policy_text("version: 1\nname: one\nowned_paths: [a/**]\n", "o.yaml").policy
    [package] = single.package_list()
    assert (package.name, package.owned_paths) == ("one", ("a/**",))


def test_a_package_setting_left_out_is_the_top_levels():
    text = ENGINE.replace("checks:\n  startup_guard: {enabled: true}\n",
                          "checks:\n  startup_guard: {enabled: true, timeout_s: 7}\n")
    policy = load_policy_text(text, "e.yaml").policy
    view = policy.for_package(policy.packages[0])
    assert (view.checks.startup_guard.guard, view.checks.startup_guard.timeout_s) == ("eng.alpha.guard:check", 7)
    assert view.owned_paths == ("eng/alpha/**",) and view.packages == ()


@pytest.mark.parametrize("text, line, reason", [
    (ENGINE.replace("name: beta", "name: alpha"), 4, "package names must be unique; repeated: alpha"),
    (ENGINE + "owned_paths: [x/**]\n", 1, "give the owned paths in each package"),
    (ENGINE.replace("    owned_paths: [eng/beta/**]\n", ""), 14, "packages.1.owned_paths: Field required"),
    (ENGINE.replace("guard: eng.beta.guard:check", "guard: not a ref"), 17, "is not a 'package.module:name' reference"),
])
def test_bad_packages_name_file_and_line(text, line, reason):
    with pytest.raises(InputError) as raised:
        load_policy_text(text, "e.yaml")
    assert raised.value.line == line and reason in str(raised.value)


def test_each_touched_package_is_judged_with_its_own_guard_and_evidence():
    loaded = load_policy_text(ENGINE, "e.yaml")
    evidence = Evidence(packages={
        "alpha": PackageEvidence(guard_probes=_run("eng.alpha.guard:check", tp8="accepted", tp4="raised")),
        "beta": PackageEvidence(guard_probes=_run("eng.beta.guard:check", ok="raised")),
    })
    only_alpha = evaluate(loaded, _change("eng/alpha/k.py"), ASSISTED, evidence, snapshot=SNAPSHOT)
    assert only_alpha.packages == ("alpha",)
    assert {c.id: c.status for c in only_alpha.checks}["startup_guard"] is Status.passed
    both = evaluate(loaded, _change("eng/alpha/k.py", "eng/beta/k.py"), ASSISTED, evidence, snapshot=SNAPSHOT)
    assert both.packages == ("alpha", "beta")
    guard = next(c for c in both.checks if c.id == "startup_guard")
    assert guard.status is Status.failed
    assert [f.message for f in guard.findings if f.severity.value == "error"] == [
        "[beta] probe 'ok' (expect accept): the guard rejected a supported deployment: raised builtins.ValueError: tp"]
    assert [p["package"] for p in guard.details["packages"]] == ["alpha", "beta"]


def test_a_file_no_package_owns_is_out_of_bounds():
    loaded = load_policy_text(ENGINE, "e.yaml")
    verdict = evaluate(loaded, _change("eng/alpha/k.py", "eng/shared.py"), ASSISTED, snapshot=SNAPSHOT)
    confinement = verdict.checks[0]
    assert confinement.status is Status.failed
    assert [f.path for f in confinement.findings] == ["eng/shared.py"]


def test_a_shadow_rule_is_reported_but_never_decides():
    loaded = load_policy_text(ENGINE + "shadow: [startup_guard]\n", "e.yaml")
    evidence = Evidence(packages={"beta": PackageEvidence(guard_probes=_run("eng.beta.guard:check", ok="raised"))})
    verdict = evaluate(loaded, _change("eng/beta/k.py"), ASSISTED, evidence, snapshot=SNAPSHOT)
    guard = next(c for c in verdict.checks if c.id == "startup_guard")
    assert guard.status is Status.failed and guard.shadow
    assert verdict.verdict == "pass"


def test_lint_points_at_the_packages_own_entries_and_overlaps():
    text = ENGINE.replace("owned_paths: [eng/beta/**]", "owned_paths: [eng/beta/**, eng/alpha/shared.py]")
    policy = load_policy_text(text, "e.yaml").policy
    warnings = lint(policy, ["eng/alpha/shared.py", "eng/beta/x.py"])
    assert [(w.field, w.message) for w in warnings] == [(
        "packages.1.owned_paths",
        "package 'beta' and package 'alpha' both own eng/alpha/shared.py: a change to it is judged by both")]
