"""The collector end to end on a fixture repository (a tiny model-owned contribution in a temp dir), then the
checks on what it recorded: the full contribution passes, and each mutation fails the right rule."""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from rich.console import Console

from gatekeeper.collect import collect
from gatekeeper.cli import main
from gatekeeper.evaluate import evaluate
from gatekeeper.evidence import load_evidence
from gatekeeper.policy import load_policy_text
from gatekeeper.provenance import Provenance
from gatekeeper.sources.git import GitSnapshot, changes_from_git
from gatekeeper.verdict import Severity, Status

POLICY = """
version: 1
name: tiny
owned_paths: ["tiny/**", "tests/tiny/**"]
checks:
  confinement: {enabled: false}
  startup_guard:
    guard: "tiny.guard:check_deployment"
    raises: "tiny.guard:Unsupported"
    called_from: ["tiny.backend:Backend.__init__"]
    support_matrix: "tiny.support:MATRIX"
    deployment_factory: "tiny.guard:Deployment"
    timeout_s: TIMEOUT
    probes:
      - {name: tp4, deployment: {tp: 4, batch: 1}, expect: reject, must_name: [tp]}
      - {name: big-batch, deployment: {tp: 8, batch: 512}, expect: reject, must_name: [batch]}
      - {name: supported, deployment: {tp: 16, batch: 64}, expect: accept}
  changed_path_tests:
    enabled: true
    command: [python, -m, pytest, tests/tiny, -q, -p, no:cacheprovider, -p, no:hypothesispytest]
    timeout_s: TIMEOUT
    gpu_report_globs: ["tiny/evidence/*.json"]
  perf_matrix: {enabled: true, min_runs: 5}
"""

FILES = {
    "tiny/__init__.py": "",
    "tiny/support.py": '''
        class Matrix:
            def __init__(self, tp, batch):
                self.tp, self.batch = tp, batch

            def perf_axes(self):
                return {"tp": self.tp, "batch": self.batch}


        MATRIX = Matrix(tp=(8, 16), batch=(1, 64))
    ''',
    "tiny/guard.py": '''
        from dataclasses import dataclass

        from tiny.support import MATRIX


        @dataclass(frozen=True)
        class Deployment:
            tp: int
            batch: int


        class Unsupported(ValueError):
            pass


        def check_deployment(d):
            bad = []
            if d.tp not in MATRIX.tp:
                bad.append(f"tp={d.tp}")
            if d.batch > max(MATRIX.batch):
                bad.append(f"batch={d.batch}")
            if bad:
                raise Unsupported("unsupported: " + ", ".join(bad))
    ''',
    "tiny/backend.py": '''
        from tiny.guard import check_deployment


        def allocate(n):
            return [0.0] * n


        class Backend:
            def __init__(self, deployment):
                check_deployment(deployment)
                self.workspace = allocate(deployment.batch)
    ''',
    "tests/tiny/test_tiny.py": '''
        import pytest

        from tiny.backend import Backend
        from tiny.guard import Deployment, Unsupported, check_deployment
        from tiny.support import MATRIX


        def test_supported_deployment_builds_a_backend():
            assert len(Backend(Deployment(tp=8, batch=4)).workspace) == 4


        @pytest.mark.parametrize("tp", [1, 4])
        def test_unsupported_tp_is_rejected(tp):
            with pytest.raises(Unsupported, match="tp"):
                check_deployment(Deployment(tp=tp, batch=1))


        def test_oversized_batch_is_rejected():
            with pytest.raises(Unsupported, match="batch=65"):
                check_deployment(Deployment(tp=8, batch=65))


        def test_perf_axes_follow_the_matrix():
            assert MATRIX.perf_axes() == {"tp": (8, 16), "batch": (1, 64)}
    ''',
}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def write(repo: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        target = repo / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "--no-verify", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("pristine")
    git(repo, "init", "-q", "-b", "main")
    write(repo, {"README.md": "a project\n"})
    commit(repo, "base")
    git(repo, "tag", "base")
    write(repo, FILES)
    commit(repo, "the tiny contribution")
    return repo


@pytest.fixture
def repo(pristine, tmp_path) -> Path:
    copy = tmp_path / "repo"
    shutil.copytree(pristine, copy)
    return copy


def run_collect(repo: Path, timeout_s: float = 60, perf: tuple[Path, ...] = ()):
    loaded = load_policy_text(POLICY.replace("TIMEOUT", str(timeout_s)), "policy.yaml")
    evidence = collect(loaded, repo, "base", perf, Console(quiet=True))
    changes = changes_from_git(repo, "base")
    verdict = evaluate(loaded, changes, Provenance(declared=True), evidence, snapshot=GitSnapshot(repo, "HEAD"))
    return evidence, {c.id: c for c in verdict.checks}


def perf_file(tmp_path: Path, commit_sha: str) -> Path:
    rows = [{"axes": {"tp": tp, "batch": b}, "candidate": {"median": 9.0, "spread_pct": 2.0, "runs": 10},
             "baseline": {"median": 10.0, "spread_pct": 2.0, "runs": 10}} for tp in (8, 16) for b in (1, 64)]
    path = tmp_path / "perf.json"
    path.write_text(json.dumps({"commit": commit_sha, "command": "python -m tiny.bench", "created": "2026-11-30T00:00:00Z",
                                "hardware": {"gpu": "NVIDIA H200", "count": 1, "driver": "570"}, "rows": rows}))
    return path


def errors(result) -> str:
    return " | ".join(f"{f.path}:{f.line}: {f.message}" for f in result.findings if f.severity is Severity.error)


def test_the_full_contribution_passes_every_rule(repo, tmp_path):
    evidence, checks = run_collect(repo, perf=(perf_file(tmp_path, git(repo, "rev-parse", "HEAD")),))
    for rule in ("startup_guard", "changed_path_tests", "perf_matrix"):
        assert checks[rule].status is Status.passed, f"{rule}: {checks[rule].summary} {errors(checks[rule])}"
    run_ = evidence.tests[0]
    assert run_.origin.trust == "trusted"
    assert "tests/tiny/test_tiny.py::test_unsupported_tp_is_rejected[4]" in {t.id for t in run_.tests}
    guard = next(f for f in run_.files if f.path == "tiny/guard.py")
    raise_line = 23  # `raise Unsupported(...)` ran, and the report knows which tests ran it
    assert set(run_.context_names(guard.covered[raise_line])) == {
        "tests/tiny/test_tiny.py::test_unsupported_tp_is_rejected[1]", "tests/tiny/test_tiny.py::test_unsupported_tp_is_rejected[4]",
        "tests/tiny/test_tiny.py::test_oversized_batch_is_rejected"}
    assert evidence.support_axes.axes == {"tp": (8, 16), "batch": (1, 64)}
    assert [r.outcome for r in evidence.guard_probes.results] == ["raised", "raised", "accepted"]


def test_guard_that_never_raises_fails_statically_and_in_the_probes(repo):
    guard = (repo / "tiny/guard.py").read_text().replace('raise Unsupported("unsupported: " + ", ".join(bad))', "return bad")
    write(repo, {"tiny/guard.py": guard, "tests/tiny/test_tiny.py": FILES["tests/tiny/test_tiny.py"].replace(
        "        with pytest.raises(Unsupported, match=\"tp\"):\n            check_deployment", "        assert check_deployment")})
    commit(repo, "a guard that returns instead of raising")
    _, checks = run_collect(repo)
    result = checks["startup_guard"]
    assert result.status is Status.failed
    assert "tiny/guard.py:16: check_deployment() never raises Unsupported" in errors(result)
    assert "probe 'tp4' (expect reject): the guard accepted a deployment it must reject" in errors(result)


def test_probe_that_should_be_rejected_but_is_accepted(repo):
    write(repo, {"tiny/support.py": FILES["tiny/support.py"].replace("tp=(8, 16)", "tp=(4, 8, 16)")})
    commit(repo, "admit tp 4 without evidence")
    _, checks = run_collect(repo)
    assert errors(checks["startup_guard"]) == "None:None: probe 'tp4' (expect reject): the guard accepted a deployment it must reject"
    assert "tp=4, batch=1: missing" in errors(checks["perf_matrix"]) or checks["perf_matrix"].status is Status.neutral


def test_new_function_without_a_test_and_a_failing_test(repo):
    write(repo, {
        "tiny/backend.py": FILES["tiny/backend.py"] + '''

            def fast_path(x):
                y = x * 2
                return y + 1
        ''',
        "tests/tiny/test_tiny.py": FILES["tests/tiny/test_tiny.py"].replace("== 4", "== 5"),
    })
    commit(repo, "an untested fast path and a wrong expectation")
    _, checks = run_collect(repo)
    result = checks["changed_path_tests"]
    assert result.status is Status.failed
    assert "tiny/backend.py:15: 2 of 10 changed executable line(s) never ran under a test (lines 15-16)" in errors(result)
    assert "tests/tiny/test_tiny.py::test_supported_deployment_builds_a_backend failed in tests (trusted)" in errors(result)


def test_hanging_tests_and_guard_become_failed_rules_not_a_crash(repo):
    write(repo, {
        "tests/tiny/test_hang.py": "import time\n\ndef test_forever():\n    time.sleep(600)\n",
        "tiny/support.py": "import time\ntime.sleep(600)\n" + textwrap.dedent(FILES["tiny/support.py"]),
    })
    commit(repo, "hangs")
    evidence, checks = run_collect(repo, timeout_s=2)
    assert "did not complete: timed out after 2 s" in errors(checks["changed_path_tests"])
    assert "the guard probes did not run: timed out after 2 s" in errors(checks["startup_guard"])
    assert evidence.support_axes.error.startswith("timed out after 2 s")
    assert checks["perf_matrix"].status is Status.failed


def test_cli_writes_evidence_that_check_can_load(repo, tmp_path, capsys):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("TIMEOUT", "60"))
    out = tmp_path / "evidence.json"
    assert main(["collect", "--policy", str(policy), "--base", "base", "--repo", str(repo), "--out", str(out)]) == 0
    assert load_evidence(out).head.sha == git(repo, "rev-parse", "HEAD")
    assert main(["collect", "--policy", str(policy), "--base", "base", "--repo", str(tmp_path), "--out", str(out)]) == 2
    assert "not a git repository" in capsys.readouterr().err


GPU_FILES = {
    "tiny/kernels.py": """
        def fused(x):
            # Only a GPU runs this in the real contribution.
            return [v * 2 for v in x]
    """,
    "tests/tiny/test_kernels.py": """
        import os

        import pytest

        from tiny.kernels import fused


        @pytest.mark.skipif(not os.environ.get("FAKE_GPU"), reason="needs a GPU")
        def test_fused():
            assert fused([1, 2]) == [2, 4]
    """,
}


def test_gpu_report_covers_gpu_only_lines_until_the_file_changes(repo, monkeypatch):
    write(repo, GPU_FILES)
    commit(repo, "a GPU-only kernel")
    _, checks = run_collect(repo)
    assert "tiny/kernels.py:3: 1 of 2 changed executable line(s) never ran" in errors(checks["changed_path_tests"])

    # On the "GPU machine": the same collector, with the GPU test enabled; its evidence is committed.
    monkeypatch.setenv("FAKE_GPU", "1")
    gpu_evidence, _ = run_collect(repo)
    monkeypatch.delenv("FAKE_GPU")
    (repo / "tiny/evidence").mkdir()
    (repo / "tiny/evidence/gpu.json").write_text(gpu_evidence.model_dump_json())
    commit(repo, "GPU test evidence")
    evidence, checks = run_collect(repo)
    result = checks["changed_path_tests"]
    assert result.status is Status.passed, errors(result)
    kernels = next(row for row in result.details["files"] if row["path"] == "tiny/kernels.py")
    assert kernels["sources"] == ["tests (trusted)", "tiny/evidence/gpu.json (self-reported)"]
    assert "tests/tiny/test_kernels.py::test_fused" in kernels["tests"]

    # Reworded comments move the lines but not the code: the coverage is carried to the new lines, and says so.
    reworded = GPU_FILES["tiny/kernels.py"].replace(
        "# Only a GPU runs this", '"""Doubles x."""\n            # Only a GPU (an H200 here) runs this')
    write(repo, {"tiny/kernels.py": reworded})
    commit(repo, "reword the kernel's comments after the GPU run")
    _, checks = run_collect(repo)
    result = checks["changed_path_tests"]
    assert result.status is Status.passed, errors(result)
    warnings = [f.message for f in result.findings if f.severity is Severity.warning]
    assert any("coverage of tiny/kernels.py carried over from the report's commit" in w for w in warnings)
    kernels = next(row for row in result.details["files"] if row["path"] == "tiny/kernels.py")
    assert "tests/tiny/test_kernels.py::test_fused" in kernels["tests"]

    # Once the kernel's code changes, the report's line numbers no longer describe it: its coverage is dropped.
    write(repo, {"tiny/kernels.py": reworded.replace("v * 2", "v + v")})
    commit(repo, "change the kernel after the GPU run")
    _, checks = run_collect(repo)
    result = checks["changed_path_tests"]
    assert result.status is Status.failed
    warnings = [f.message for f in result.findings if f.severity is Severity.warning]
    assert any("coverage of tiny/kernels.py dropped: changed since the report's commit" in w for w in warnings)


def test_file_at_reads_a_commits_text_and_says_none_for_what_it_cannot(repo):
    from gatekeeper.git import file_at

    (repo / "latin1.py").write_bytes("# caf\xe9\n".encode("latin-1"))
    sha = commit(repo, "a file that is not UTF-8")
    assert file_at(repo, sha, "README.md") == "a project\n"
    assert file_at(repo, sha, "latin1.py") is None
    assert file_at(repo, sha, "no/such/file.py") is None
    assert file_at(repo, "0" * 40, "README.md") is None


def test_with_owned_counting_the_collector_records_which_commits_changed_the_owned_paths(repo):
    from gatekeeper.collect import head_info

    contribution = git(repo, "rev-parse", "HEAD")
    write(repo, {"README.md": "a project, elsewhere\n"})
    elsewhere = commit(repo, "a change outside the owned paths")
    write(repo, {"tiny/extra.py": "X = 1\n"})
    owned = commit(repo, "a change inside")
    text = POLICY.replace("TIMEOUT", "60").replace("min_runs: 5}", "min_runs: 5, commit_window: 1, commit_window_counts: owned}")
    info = head_info(load_policy_text(text, "policy.yaml").policy, repo, owned)
    assert info.sha == owned and info.ancestors[:2] == (elsewhere, contribution)
    assert info.owned_changes == (owned, contribution)  # at most commit_window + 1, newest first
    counted_all = head_info(load_policy_text(POLICY.replace("TIMEOUT", "60"), "policy.yaml").policy, repo, owned)
    assert counted_all.owned_changes is None

    # With the window's own paths, a change to the contribution's notes does not age what was measured.
    write(repo, {"tiny/NOTES.md": "what we measured\n"})
    notes = commit(repo, "notes inside the owned paths")
    code_only = text.replace("commit_window_counts: owned}", "commit_window_counts: owned, commit_window_paths: ['tiny/**/*.py']}")
    info = head_info(load_policy_text(code_only, "policy.yaml").policy, repo, notes)
    assert info.owned_changes == (owned, contribution)
    assert head_info(load_policy_text(text, "policy.yaml").policy, repo, notes).owned_changes == (notes, owned)


def test_the_base_run_tells_a_new_package_from_a_widened_matrix(repo):
    """Against `base` the contribution is new: nothing to compare with (and nothing imported from elsewhere).
    A later change admitting TP 4 is compared with the contribution it changes: the matrix widens."""
    loaded = load_policy_text(POLICY.replace("TIMEOUT", "60"), "policy.yaml")
    evidence = collect(loaded, repo, "base", (), Console(quiet=True))
    assert "not in the base commit" in evidence.base_guard_probes.error
    verdict = evaluate(loaded, changes_from_git(repo, "base"), Provenance(declared=True), evidence,
                       snapshot=GitSnapshot(repo, "HEAD"))
    assert verdict.blast_radius[0].change == "unknown"

    git(repo, "tag", "contribution")
    support = repo / "tiny" / "support.py"
    support.write_text(support.read_text().replace("tp=(8, 16)", "tp=(4, 8, 16)"))
    commit(repo, "admit TP 4")
    evidence = collect(loaded, repo, "contribution", (), Console(quiet=True))
    assert evidence.base_support_axes.axes == {"tp": (8, 16), "batch": (1, 64)}
    verdict = evaluate(loaded, changes_from_git(repo, "contribution"), Provenance(declared=True), evidence,
                       snapshot=GitSnapshot(repo, "HEAD"))
    [radius] = verdict.blast_radius
    assert (radius.change, radius.widened, radius.newly_accepted_probes) == ("widens", {"tp": (4,)}, ("tp4",))
    assert {c.id: c.status for c in verdict.checks}["startup_guard"] is Status.failed  # tp4 must be rejected
