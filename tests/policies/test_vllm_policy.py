"""policies/vllm.yaml against vLLM 0.33's own sources (the installed wheel's vllm/ tree), on the CPU: the four
specialized_decode packages validate, the static guard check holds there and fails on a mutated copy, every probe
gets the expected answer from the real guard (vLLM's VllmConfig built with the platform faked), and a guard whose
`raise` became `pass` fails the startup_guard rule.

vLLM is imported in two child processes only: the real tree with all four packages' probes batched (about 80 s on
two cores: importing vLLM, then building each model's first VllmConfig, which imports its model class, costs ~20 s
per model), and the mutated tree with the two Kimi K3 packages (one model, about 35 s).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_tree import installed_vllm, mirror, mutate_raises

from gatekeeper.changes import ChangeSet, FileChange, FileStatus
from gatekeeper.checks.startup_guard import static_findings
from gatekeeper.collect.probes import run_probe_jobs
from gatekeeper.commands.policy import DirectorySnapshot
from gatekeeper.cli import main
from gatekeeper.evaluate import evaluate
from gatekeeper.evidence import Evidence, Origin, PackageEvidence
from gatekeeper.policy import load_policy
from gatekeeper.provenance import Provenance
from gatekeeper.verdict import Severity, Signal, Status

ROOT = Path(__file__).resolve().parents[2]
POLICY = ROOT / "policies" / "vllm.yaml"
PACKAGE, WHY = installed_vllm()
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(PACKAGE is None, reason=WHY)]
TRUSTED = Origin(trust="trusted", source="tests/policies/test_vllm_policy.py")
ASSISTED = Provenance(signals=(Signal(kind="declared", source="test", detail="--agent-assisted"),))


@pytest.fixture(scope="module")
def loaded():
    return load_policy(POLICY)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return mirror(PACKAGE, tmp_path_factory.mktemp("vllm-tree"))


# The mutated run: both Kimi K3 packages (one model to build, so one model's cost), each guard shaped differently.
MUTATED = ("kimi_k3-nvidia", "kimi_k3-amd")


@pytest.fixture(scope="module")
def mutated(tmp_path_factory, loaded) -> Path:
    """A copy of vLLM whose Kimi K3 guards each lost their last `raise` (the one refusing unsupported deployments)."""
    root = mirror(PACKAGE, tmp_path_factory.mktemp("vllm-mutated"))
    for package in loaded.policy.packages:
        if package.name in MUTATED:
            mutate_raises(root, package.startup_guard.guard, which="last")
    return root


def _probe(loaded, python_path: Path, work: Path, names: tuple[str, ...] | None = None) -> dict:
    policy = loaded.policy
    jobs = {p.name: policy.for_package(p).checks.startup_guard for p in policy.packages
            if names is None or p.name in names}
    return run_probe_jobs(jobs, python_path, work, TRUSTED, POLICY.parent, pythonpath=(python_path,))


@pytest.fixture(scope="module")
def probed(tmp_path_factory, loaded, tree):
    return _probe(loaded, tree, tmp_path_factory.mktemp("probes"))


@pytest.fixture(scope="module")
def probed_mutated(tmp_path_factory, loaded, mutated):
    return _probe(loaded, mutated, tmp_path_factory.mktemp("probes-mutated"), MUTATED)


def test_the_policy_names_the_four_packages(loaded):
    assert [p.name for p in loaded.policy.packages] == [
        "kimi_k3-nvidia", "kimi_k3-amd", "deepseek_v41-nvidia", "minimax_m3-amd"]


def test_validate_against_vllms_sources_holds(tree, capsys):
    assert main(["policy", "validate", str(POLICY), "--repo", str(tree)]) == 0
    out, err = capsys.readouterr()
    assert "every guard (4) holds in" in out
    assert " error: " not in err
    # The wheel ships no tests: only the packages' test globs match nothing there.
    assert all("tests/models/" in line for line in err.splitlines() if "matches no file" in line)


def test_the_static_check_fails_on_a_copy_whose_guard_never_raises(loaded, tmp_path, capsys):
    root = mirror(PACKAGE, tmp_path)
    package = loaded.policy.packages[0]
    mutate_raises(root, package.startup_guard.guard, which="all")
    findings = static_findings(DirectorySnapshot(root), package.startup_guard, package.owned_paths)
    assert [f.message for f in findings if f.severity is Severity.error] == [
        "specialized_decode_config() never raises ValueError (directly or through a helper in "
        "vllm.models.kimi_k3.nvidia.specialized_decode.runtime)"]
    assert main(["policy", "validate", str(POLICY), "--repo", str(root)]) == 1
    assert "kimi_k3-nvidia: specialized_decode_config() never raises ValueError" in capsys.readouterr().err


def test_every_probe_gets_the_expected_answer_from_the_real_guard(loaded, probed):
    for package in loaded.policy.packages:
        run, _ = probed[package.name]
        assert run.error is None, run.error
        outcomes = {r.name: r for r in run.results}
        for probe in package.startup_guard.probes:
            got = outcomes[probe.name]
            assert got.outcome == {"accept": "accepted", "reject": "raised"}[probe.expect], (package.name, got)
            for name in probe.must_name:
                assert name.lower() in got.message.lower(), (package.name, probe.name, got.message)
        assert run.assumptions and "platform faked" in run.assumptions[0]


def test_the_platform_is_faked_to_the_probed_gpu(probed):
    results = {r.name: r for r in probed["kimi_k3-nvidia"][0].results}
    assert results["gb300-tp8"].deployment["capability"] == "10.3"
    assert results["h200"].deployment["capability"] == "9.0"
    assert results["h200"].message == "Kimi K3 specialized decode does not support this GPU (SM100/103)"
    amd = {r.name: r for r in probed["kimi_k3-amd"][0].results}
    assert amd["mi300x"].deployment["platform"].startswith("FakedRocmPlatform")
    assert "this GPU (gfx950 / MI355X only)" in amd["mi300x"].message


def _verdict(loaded, probed, tree: Path):
    """Every probed package touched (its guard file edited), judged with the probe results as trusted evidence."""
    files = []
    for package in (p for p in loaded.policy.packages if p.name in probed):
        module = package.startup_guard.guard.split(":")[0].replace(".", "/")
        path = f"{module}.py" if (tree / f"{module}.py").exists() else f"{module}/__init__.py"
        files.append(FileChange(path=path, status=FileStatus.modified, added_lines=(1,), has_patch=True))
    evidence = Evidence(packages={name: PackageEvidence(guard_probes=run) for name, (run, _) in probed.items()})
    return evaluate(loaded, ChangeSet(source="test", files=tuple(files)), ASSISTED, evidence,
                    snapshot=DirectorySnapshot(tree))


def test_the_startup_guard_rule_passes_on_vllm(loaded, probed, tree):
    verdict = _verdict(loaded, probed, tree)
    guard = next(c for c in verdict.checks if c.id == "startup_guard")
    assert guard.status is Status.passed, [f.message for f in guard.findings]
    assert set(verdict.packages) == {p.name for p in loaded.policy.packages}
    radius = {r.package: r for r in verdict.blast_radius}
    assert radius["kimi_k3-nvidia"].admitted["arch"] == ("sm_100", "sm_103")
    assert radius["kimi_k3-nvidia"].statement.startswith("Kimi K3 on sm_100 or sm_103, TP 8 or 16")


def test_a_guard_whose_raise_became_pass_fails_the_rule(loaded, probed_mutated, mutated):
    verdict = _verdict(loaded, probed_mutated, mutated)
    guard = next(c for c in verdict.checks if c.id == "startup_guard")
    assert guard.status is Status.failed
    failing = {f.message.split("]")[0].lstrip("[") for f in guard.findings if f.severity is Severity.error}
    assert failing == set(MUTATED)  # every mutated guard is caught
    assert any("probe 'h200' (expect reject): the guard accepted a deployment it must reject" in f.message
               for f in guard.findings)
