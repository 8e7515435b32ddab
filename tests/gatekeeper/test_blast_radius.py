"""The blast radius: what a change to a package can alter, and a widened matrix told apart from kernel work."""

from __future__ import annotations

from gatekeeper.blast_radius import blast_radius, statement
from gatekeeper.changes import ChangeSet, FileChange, FileStatus
from gatekeeper.evidence import Evidence, GuardProbeRun, Origin, ProbeResult, SupportAxes
from gatekeeper.policy import load_policy_text

POLICY = load_policy_text("""\
version: 1
name: k3
owned_paths: [k3/**]
checks:
  startup_guard:
    guard: k3.guard:check
    support_matrix: k3.support:MATRIX
    probes:
      - {name: tp8, deployment: {arch: sm_90, tp: 8}, expect: accept}
      - {name: tp4, deployment: {arch: sm_90, tp: 4}, expect: reject}
""", "k3.yaml").policy
[PACKAGE] = POLICY.package_list()
ORIGIN = Origin(trust="trusted", source="test")
HEAD_AXES = {"arch": ("sm_90",), "tp": (8, 16), "batch": (1, 8, 64), "spec": ("none",)}


def _axes(axes):
    return SupportAxes(origin=ORIGIN, source="k3.support:MATRIX", axes=axes)


def _probes(**outcomes):
    return GuardProbeRun(origin=ORIGIN, guard="k3.guard:check",
                         results=tuple(ProbeResult(name=n, outcome=o) for n, o in outcomes.items()))


def _change(path: str) -> ChangeSet:
    return ChangeSet(source="test", files=(FileChange(path=path, status=FileStatus.modified, added_lines=(1,)),))


def test_the_statement_names_the_model_its_hardware_and_bounds():
    assert statement(PACKAGE.model_copy(update={"model": "Kimi K3", "scope": "pure decode; prefill runs stock"}),
                     HEAD_AXES, ("other",)) == (
        "Kimi K3 on sm_90, TP 8 or 16, batch <= 64, spec none; pure decode; prefill runs stock; "
        "every other package untouched (other)")



def test_a_context_axis_reads_as_an_upper_bound_like_the_batch():
    axes = {"arch": ("sm_90",), "tp": (8, 16), "batch": (1, 64), "spec": ("none",), "context": (1024, 4096)}
    assert statement(PACKAGE.model_copy(update={"model": "Kimi K3", "scope": None}), axes, ()) == (
        "Kimi K3 on sm_90, TP 8 or 16, batch <= 64, spec none, context <= 4096")


def test_a_kernel_change_leaves_the_admitted_matrix_as_it_was():
    evidence = Evidence(support_axes=_axes(HEAD_AXES), base_support_axes=_axes(HEAD_AXES),
                        guard_probes=_probes(tp8="accepted", tp4="raised"),
                        base_guard_probes=_probes(tp8="accepted", tp4="raised"))
    radius = blast_radius(POLICY, PACKAGE, _change("k3/kernels/moe.py"), evidence)
    assert radius.change == "kernel_only" and radius.widened == {} and radius.admitted == HEAD_AXES
    touched = blast_radius(POLICY, PACKAGE, _change("k3/guard.py"), evidence)
    assert touched.change == "guard_changed"


def test_a_new_admitted_value_widens_and_is_named():
    evidence = Evidence(support_axes=_axes({**HEAD_AXES, "tp": (4, 8, 16)}), base_support_axes=_axes(HEAD_AXES),
                        guard_probes=_probes(tp8="accepted", tp4="accepted"),
                        base_guard_probes=_probes(tp8="accepted", tp4="raised"))
    radius = blast_radius(POLICY, PACKAGE, _change("k3/support.py"), evidence)
    assert radius.change == "widens"
    assert radius.widened == {"tp": (4,)} and radius.newly_accepted_probes == ("tp4",)
    assert radius.statement.startswith("k3 on sm_90, TP 4, 8 or 16")


def test_without_a_matrix_the_accepted_probes_are_the_admitted_deployments():
    policy = POLICY.model_copy(update={"checks": POLICY.checks.model_copy(update={
        "startup_guard": POLICY.checks.startup_guard.model_copy(update={"support_matrix": None})})})
    evidence = Evidence(guard_probes=_probes(tp8="accepted", tp4="raised"))
    radius = blast_radius(policy, PACKAGE, _change("k3/x.py"), evidence)
    assert radius.admitted == {"arch": ("sm_90",), "tp": (8,)}
    assert radius.change == "unknown"  # no base run: nothing to compare with


def test_no_probes_and_no_matrix_means_no_blast_radius():
    bare = load_policy_text("version: 1\nname: b\nowned_paths: [b/**]\n", "b.yaml").policy
    assert blast_radius(bare, bare.package_list()[0], _change("b/x.py"), None) is None


def test_a_base_where_the_guard_could_not_run_leaves_the_change_unknown():
    failed = GuardProbeRun(origin=ORIGIN, guard="k3.guard:check", error="ModuleNotFoundError: No module named 'k3'")
    evidence = Evidence(support_axes=_axes(HEAD_AXES), guard_probes=_probes(tp8="accepted", tp4="raised"),
                        base_guard_probes=failed)
    assert blast_radius(POLICY, PACKAGE, _change("k3/guard.py"), evidence).change == "unknown"
