"""startup_guard: the static ast checks on a small contribution, and the judging of recorded probe results."""

from __future__ import annotations

import textwrap

import pytest

from gatekeeper.changes import ChangeSet
from gatekeeper.checks import CheckContext
from gatekeeper.checks.startup_guard import run
from gatekeeper.evidence import Evidence, GuardProbeRun, Origin, ProbeResult
from gatekeeper.policy import Mode, load_policy_text
from gatekeeper.provenance import Provenance
from gatekeeper.report.tables import details_table
from gatekeeper.snapshot import DictSnapshot
from gatekeeper.verdict import Status

POLICY = """
version: 1
name: tiny
owned_paths: ["tiny/**"]
require_trusted: {trusted}
checks:
  startup_guard:
    guard: "tiny.guard:check_deployment"
    raises: "tiny.guard:Unsupported"
    called_from: ["tiny.backend:Backend.__init__"]
    support_matrix: "tiny.guard:MATRIX"
    probes:
      - {{name: too-wide, deployment: {{tp: 3}}, expect: reject, must_name: [tp]}}
      - {{name: supported, deployment: {{tp: 8}}, expect: accept}}
"""

GUARD = """
MATRIX = {"tp": (8, 16)}


class Unsupported(ValueError):
    pass


def check_deployment(d):
    bad = [k for k, allowed in MATRIX.items() if d[k] not in allowed]
    if bad:
        raise Unsupported("unsupported: " + ", ".join(bad))
"""

BACKEND = """
import torch
from tiny.guard import check_deployment


class Backend:
    def __init__(self, deployment):
        check_deployment(deployment)
        self.buffer = torch.empty(16)
"""

TRUSTED = Origin(trust="trusted", source="collector")
GOOD_PROBES = (
    ProbeResult(name="too-wide", outcome="raised", exception_types=("tiny.guard.Unsupported", "builtins.ValueError"),
                message="unsupported: tp"),
    ProbeResult(name="supported", outcome="accepted"),
)


def check(guard=GUARD, backend=BACKEND, probes=GOOD_PROBES, origin=TRUSTED, trusted="[]", evidence=True):
    files = {"tiny/__init__.py": "", "tiny/guard.py": textwrap.dedent(guard), "tiny/backend.py": textwrap.dedent(backend)}
    policy = load_policy_text(POLICY.format(trusted=trusted), "policy.yaml")
    run_ = GuardProbeRun(origin=origin, guard="tiny.guard:check_deployment", results=probes)
    ctx = CheckContext(policy, ChangeSet(source="git", files=()), Provenance(), Mode.strict,
                       Evidence(guard_probes=run_) if evidence else None, DictSnapshot(files))
    return run(ctx)


def messages(result):
    return " | ".join(f"{f.path}:{f.line}: {f.message}" for f in result.findings)


def test_the_full_contribution_passes():
    result = check()
    assert result.status is Status.passed, messages(result)
    assert "✅" in details_table(result)


def test_guard_removed():
    result = check(guard=GUARD.replace("def check_deployment", "def renamed"))
    assert result.status is Status.failed
    assert "check_deployment() is not defined in tiny.guard" in messages(result)


def test_a_guard_outside_the_owned_paths_is_warned_about():
    policy = POLICY.replace('owned_paths: ["tiny/**"]', 'owned_paths: ["tiny/backend.py"]')
    files = {"tiny/guard.py": textwrap.dedent(GUARD), "tiny/backend.py": textwrap.dedent(BACKEND)}
    ctx = CheckContext(load_policy_text(policy.format(trusted="[]"), "policy.yaml"), ChangeSet(source="git", files=()),
                       Provenance(), Mode.strict, Evidence(guard_probes=GuardProbeRun(origin=TRUSTED, guard="g", results=GOOD_PROBES)),
                       DictSnapshot(files))
    result = run(ctx)
    assert result.status is Status.passed
    assert [f.message for f in result.findings] == ["the guard lives outside the owned paths: the contribution does not own the code that bounds it"]


def test_empty_or_missing_guard_module():
    assert "check_deployment() is not defined in tiny.guard" in messages(check(guard=""))
    policy = load_policy_text(POLICY.format(trusted="[]"), "policy.yaml")
    ctx = CheckContext(policy, ChangeSet(source="git", files=()), Provenance(), Mode.strict, None,
                       DictSnapshot({"tiny/backend.py": textwrap.dedent(BACKEND)}))
    assert "the guard module tiny.guard is not in the head of the repository" in messages(run(ctx))


def test_guard_not_called_from_the_entry_point():
    result = check(backend=BACKEND.replace("        check_deployment(deployment)\n", ""))
    assert result.status is Status.failed
    assert "tiny/backend.py:7: Backend.__init__() never calls the guard check_deployment()" in messages(result)


def test_allocation_before_the_guard():
    backend = BACKEND.replace(
        "        check_deployment(deployment)\n        self.buffer = torch.empty(16)\n",
        "        self.buffer = torch.empty(16)\n        check_deployment(deployment)\n",
    )
    result = check(backend=backend)
    assert result.status is Status.failed
    assert "tiny/backend.py:8: Backend.__init__() reaches torch.empty() (a kernel build or allocation) before" in messages(result)


def test_guard_reached_through_a_helper_counts_and_so_does_a_kernel_build_in_one():
    via_helper = BACKEND.replace("        check_deployment(deployment)\n", "        self._validate(deployment)\n") + (
        "\n    def _validate(self, deployment):\n        check_deployment(deployment)\n")
    assert check(backend=via_helper).status is Status.passed
    builds_first = BACKEND.replace("        check_deployment(deployment)\n", "        self._build()\n        check_deployment(deployment)\n") + (
        "\n    def _build(self):\n        return cute.compile(kernel)\n")
    result = check(backend=builds_first)
    assert "reaches self._build -> cute.compile()" in messages(result)


def test_guard_that_never_raises():
    result = check(guard=GUARD.replace('        raise Unsupported("unsupported: " + ", ".join(bad))', "        return bad"))
    assert result.status is Status.failed
    assert "tiny/guard.py:9: check_deployment() never raises Unsupported" in messages(result)


def test_raising_through_a_helper_counts():
    guard = GUARD.replace('        raise Unsupported("unsupported: " + ", ".join(bad))', "        _refuse(bad)") + (
        "\n\ndef _refuse(bad):\n    raise Unsupported(bad)\n")
    assert check(guard=guard).status is Status.passed


def test_support_matrix_written_as_prose():
    result = check(guard=GUARD.replace('MATRIX = {"tp": (8, 16)}', 'MATRIX = "tp 8 or 16"'))
    assert result.status is Status.failed
    assert "tiny/guard.py:2: the support matrix MATRIX is a string" in messages(result)


def test_a_probe_that_should_be_rejected_but_is_accepted():
    probes = (ProbeResult(name="too-wide", outcome="accepted"), GOOD_PROBES[1])
    result = check(probes=probes)
    assert result.status is Status.failed
    assert "probe 'too-wide' (expect reject): the guard accepted a deployment it must reject" in messages(result)
    assert "❌" in details_table(result)


@pytest.mark.parametrize(("probe", "expected"), [
    (ProbeResult(name="too-wide", outcome="raised", exception_types=("builtins.KeyError",), message="tp"),
     "raised builtins.KeyError, not tiny.guard:Unsupported"),
    (ProbeResult(name="too-wide", outcome="raised", exception_types=("tiny.guard.Unsupported",), message="nope"),
     "the message does not name tp"),
    (ProbeResult(name="too-wide", outcome="error", message="TypeError: bad field"),
     "the deployment could not be built: TypeError: bad field"),
])
def test_rejections_must_raise_the_declared_type_naming_the_field(probe, expected):
    result = check(probes=(probe, GOOD_PROBES[1]))
    assert result.status is Status.failed
    assert expected in messages(result)


def test_an_accept_probe_that_is_rejected():
    probes = (GOOD_PROBES[0], ProbeResult(name="supported", outcome="raised", exception_types=("tiny.guard.Unsupported",), message="tp"))
    assert "rejected a supported deployment" in messages(check(probes=probes))


def test_missing_probe_result_and_failed_probe_run():
    assert "probe 'supported' (expect accept): no result recorded" in messages(check(probes=GOOD_PROBES[:1]))
    failed = GuardProbeRun(origin=TRUSTED, guard="x:y", error="timed out after 60 s")
    files = {"tiny/guard.py": GUARD, "tiny/backend.py": BACKEND}
    policy = load_policy_text(POLICY.format(trusted="[]"), "policy.yaml")
    ctx = CheckContext(policy, ChangeSet(source="git", files=()), Provenance(), Mode.strict, Evidence(guard_probes=failed), DictSnapshot(files))
    assert "the guard probes did not run: timed out after 60 s" in messages(run(ctx))


def test_without_probe_evidence_the_rule_is_neutral():
    result = check(evidence=False)
    assert result.status is Status.neutral
    assert "no guard probe results" in result.summary


def test_self_reported_probes_do_not_satisfy_require_trusted():
    result = check(origin=Origin(trust="self_reported", source="PR file"), trusted="[startup_guard]")
    assert result.status is Status.neutral
    assert "self-reported" in result.summary


def test_static_problems_fail_even_without_probe_evidence():
    result = check(guard=GUARD.replace("raise Unsupported", "print"), evidence=False)
    assert result.status is Status.failed


def test_a_guard_module_that_does_not_parse():
    result = check(guard="def check_deployment(:\n")
    assert result.status is Status.failed
    assert "does not parse" in messages(result)


def test_what_a_thin_policy_leaves_unchecked_is_said():
    thin = load_policy_text("version: 1\nname: thin\nowned_paths: ['tiny/**']\n"
                            "checks: {startup_guard: {guard: 'tiny.guard:check_deployment'}}\n", "thin.yaml")
    ctx = CheckContext(thin, ChangeSet(source="git", files=()), Provenance(), Mode.strict, None,
                       DictSnapshot({"tiny/guard.py": textwrap.dedent(GUARD)}))
    result = run(ctx)
    assert result.status is Status.passed
    assert [(f.path, f.severity.value) for f in result.findings] == [("thin.yaml", "warning")] * 3
    assert "no entry point (called_from)" in result.findings[1].message
