"""`gatekeeper gpu-report`: a GPU run's JUnit report and coverage data (made where the tests ran, under a
different directory, without git) -> a compact evidence file that the collector reads as a GPU report."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import coverage
import pytest
from coverage import CoverageData

import gatekeeper.collect
from gatekeeper.cli import main
from gatekeeper.collect.gpu_reports import load_gpu_reports
from gatekeeper.evidence import load_evidence
from gatekeeper.snapshot import DictSnapshot

PLUGIN_DIR = Path(gatekeeper.collect.__file__).parent / "plugin"

OPS = '''\
def add(a, b):
    total = (a +
             b)
    return total


def gpu_only(x):
    return x * 2
'''

TESTS = '''\
import pytest

from tiny.ops import add


@pytest.mark.parametrize("n", [1, 2])
def test_add(n):
    assert add(n, 1) == n + 1


class TestMore:
    def test_fails(self):
        assert add(1, 1) == 3


def test_skipped():
    pytest.skip("no GPU here")
'''

FILES = {"tiny/__init__.py": "", "tiny/ops.py": OPS, "tiny/unused.py": "VALUE = 1\n", "tests/test_ops.py": TESTS}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def _commit_all(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


class GpuRun:
    """A checkout of the tiny project at `sha`, and what its tests left in `out` on the 'GPU machine'."""

    def __init__(self, checkout: Path, sha: str, out: Path):
        self.checkout, self.sha, self.out = checkout, sha, out
        self.junit, self.data, self.json, self.nodeids = (out / "junit.xml", out / ".coverage", out / "coverage.json",
                                                          out / "nodeids.txt")


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory) -> GpuRun:
    root = tmp_path_factory.mktemp("gpu-report")
    checkout = root / "checkout"
    for path, text in FILES.items():
        (checkout / path).parent.mkdir(parents=True, exist_ok=True)
        (checkout / path).write_text(text)
    _git(checkout, "init", "-q")
    sha = _commit_all(checkout, "tiny project")
    # The GPU machine holds a copy without .git, somewhere else: recorded file names are absolute there.
    device = root / "device" / "work" / "repo"
    shutil.copytree(checkout, device, ignore=shutil.ignore_patterns(".git"))
    out = root / "out"
    out.mkdir()
    run = GpuRun(checkout, sha, out)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE_", "GATEKEEPER_"))}
    env.update(PYTHONPATH=f"{PLUGIN_DIR}{os.pathsep}{device}", GATEKEEPER_NODEIDS=str(run.nodeids))
    subprocess.run([sys.executable, "-m", "coverage", "run", "--source=tiny", f"--data-file={run.data}", "-m", "pytest",
                    "tests", "-q", "-p", "no:cacheprovider", "-p", "gatekeeper_pytest_contexts",
                    f"--junitxml={run.junit}"], cwd=device, env=env, capture_output=True, timeout=120)
    subprocess.run([sys.executable, "-m", "coverage", "json", f"--data-file={run.data}", "--show-contexts", "-q",
                    "-o", str(run.json)], cwd=device, env=env, check=True, timeout=60)
    run.data.chmod(0o444)  # as the device tool hands files back
    return run


def _report(run: GpuRun, out: Path, *extra: str, coverage_file: Path | None = None, repo: Path | None = None) -> int:
    return main(["gpu-report", "--junit", str(run.junit), "--coverage", str(coverage_file or run.data),
                 "--commit", run.sha, "--repo", str(repo or run.checkout), "--out", str(out), *extra])


def _lines_by_test(evidence_path: Path) -> dict[str, dict[int, set[str]]]:
    run = load_evidence(evidence_path).tests[0]
    return {f.path: {line: set(run.context_names(ix)) for line, ix in f.covered.items()} for f in run.files}


def test_data_file_round_trip(gpu_run, tmp_path, capsys):
    out = tmp_path / "gpu-evidence.json"
    assert _report(gpu_run, out, "--label", "h200", "--nodeids", str(gpu_run.nodeids)) == 0
    assert f"commit {gpu_run.sha[:12]}" in capsys.readouterr().err
    evidence = load_evidence(out)
    assert evidence.head.sha == gpu_run.sha
    (run,) = evidence.tests
    assert run.label == "h200" and run.origin.trust == "self_reported"
    assert {t.id: t.outcome for t in run.tests} == {
        "tests/test_ops.py::test_add[1]": "passed", "tests/test_ops.py::test_add[2]": "passed",
        "tests/test_ops.py::TestMore::test_fails": "failed", "tests/test_ops.py::test_skipped": "skipped",
    }
    files = {f.path: f for f in run.files}
    # Every measured file of the project, never-imported ones included (coverage's --source names them).
    assert set(files) == {"tiny/__init__.py", "tiny/ops.py", "tiny/unused.py"}
    ops = files["tiny/ops.py"]
    assert ops.statements == (1, 2, 4, 7, 8) and ops.spans == ((2, 3),)
    covered = _lines_by_test(out)["tiny/ops.py"]
    assert covered[2] == {"tests/test_ops.py::test_add[1]", "tests/test_ops.py::test_add[2]", "tests/test_ops.py::TestMore::test_fails"}
    assert covered[1] == covered[7] == {"(collection)"}  # the def lines ran while pytest imported the tests
    assert 8 not in covered  # gpu_only's body: no test ran it
    assert files["tiny/unused.py"].covered == {}


def test_json_report_gives_the_same_coverage_as_the_data_file(gpu_run, tmp_path):
    from_data, from_json = tmp_path / "data.json", tmp_path / "json.json"
    assert _report(gpu_run, from_data) == 0
    assert _report(gpu_run, from_json, coverage_file=gpu_run.json) == 0
    assert _lines_by_test(from_json) == _lines_by_test(from_data)
    assert [f.statements for f in load_evidence(from_json).tests[0].files] == [f.statements for f in load_evidence(from_data).tests[0].files]


def test_nodeids_name_tests_that_ran_no_measured_code(gpu_run, tmp_path):
    without, with_list = tmp_path / "a.json", tmp_path / "b.json"
    assert _report(gpu_run, without) == 0
    assert _report(gpu_run, with_list, "--nodeids", str(gpu_run.nodeids)) == 0
    assert "tests.test_ops::test_skipped" in {t.id for t in load_evidence(without).tests[0].tests}
    assert "tests/test_ops.py::test_skipped" in {t.id for t in load_evidence(with_list).tests[0].tests}


def test_the_collector_reads_it_and_drops_what_changed_since(gpu_run, tmp_path):
    repo = tmp_path / "repo"
    _git(tmp_path, "clone", "-q", str(gpu_run.checkout), str(repo))
    report = repo / "evidence" / "gpu" / "gpu-evidence.json"
    report.parent.mkdir(parents=True)
    assert _report(gpu_run, report, repo=repo) == 0
    (repo / "tiny" / "ops.py").write_text(OPS + "\n\ndef more():\n    return 1\n")
    head_sha = _commit_all(repo, "edit ops after the GPU run")
    head = DictSnapshot({p: "" for p in _git(repo, "ls-files").splitlines()})
    (run,) = load_gpu_reports(repo, head, head_sha, ("evidence/gpu/*",), ["tiny/ops.py", "tiny/unused.py"])
    assert run.error is None and run.label == "evidence/gpu/gpu-evidence.json"
    assert run.origin.trust == "self_reported" and "pull request" in run.origin.source
    assert [f.path for f in run.files] == ["tiny/unused.py"]
    assert any("tiny/ops.py dropped" in note for note in run.notes)
    assert len(run.tests) == 4


def test_a_file_edited_in_the_checkout_is_left_out_with_a_note(gpu_run, tmp_path, capsys):
    repo = tmp_path / "repo"
    _git(tmp_path, "clone", "-q", str(gpu_run.checkout), str(repo))
    (repo / "tiny" / "ops.py").write_text("# moved\n" + OPS)
    out = tmp_path / "gpu-evidence.json"
    assert _report(gpu_run, out, repo=repo) == 0
    run = load_evidence(out).tests[0]
    assert [f.path for f in run.files] == ["tiny/__init__.py", "tiny/unused.py"]
    assert run.notes == (f"coverage of tiny/ops.py left out: the checkout differs from commit {gpu_run.sha[:12]} the tests ran at",)
    assert "warning: coverage of tiny/ops.py left out" in capsys.readouterr().err


def test_the_evidence_is_smaller_than_the_json_report(gpu_run, tmp_path):
    out = tmp_path / "gpu-evidence.json"
    assert _report(gpu_run, out) == 0
    assert out.stat().st_size < gpu_run.json.stat().st_size
    assert '"schema_version"' in out.read_text()[:200]  # how the collector tells it from a coverage report


def _data_without_contexts(path: Path, source: Path) -> Path:
    data = CoverageData(str(path))
    data.add_lines({str(source): [1]})
    data.write()
    return path


@pytest.mark.parametrize(("case", "culprit", "reason"), [
    ("missing junit", "nope.xml", "cannot read JUnit report"),
    ("malformed junit", "junit.xml", "invalid JUnit XML"),
    ("empty junit", "junit.xml", "holds no <testcase>"),
    ("missing coverage", "nope.coverage", "cannot read coverage data"),
    ("text coverage", "notes.txt", "neither a coverage.py data file"),
    ("json not coverage", "other.json", "not a `coverage json` report"),
    ("sqlite not coverage", "other.sqlite", "not a readable coverage.py data file"),
    ("no contexts", "plain.coverage", "no per-test contexts"),
    ("json no contexts", "plain.json", "no per-test contexts"),
    ("another project", "foreign.coverage", "none of its 1 measured files is a file of"),
    ("commit not hex", "--commit", "is not a commit SHA"),
    ("commit unknown", "deadbeef", "is not a commit of this repository"),
    ("repo not git", "plain-dir", "not the top of a git checkout"),
])
def test_bad_inputs_exit_2_naming_the_file_and_reason(gpu_run, tmp_path, capsys, case, culprit, reason):
    junit, cov, commit, repo = gpu_run.junit, gpu_run.data, gpu_run.sha, gpu_run.checkout
    bad = tmp_path / culprit
    if case == "missing junit":
        junit = bad
    elif case == "malformed junit":
        junit = bad
        bad.write_text("<testsuites><testcase name='x'>")
    elif case == "empty junit":
        junit = bad
        bad.write_text("<testsuites><testsuite name='pytest' tests='0'/></testsuites>")
    elif case in ("missing coverage", "text coverage", "json not coverage", "sqlite not coverage"):
        cov = bad
        if case == "text coverage":
            bad.write_text("hello\n")
        elif case == "json not coverage":
            bad.write_text('{"tests": []}')
        elif case == "sqlite not coverage":
            with sqlite3.connect(bad) as db:
                db.execute("create table t (x)")
    elif case == "no contexts":
        cov = _data_without_contexts(bad, gpu_run.checkout / "tiny" / "ops.py")
    elif case == "json no contexts":
        cov = bad
        plain = _data_without_contexts(tmp_path / "plain.coverage", gpu_run.checkout / "tiny" / "ops.py")
        cov_api = coverage.Coverage(data_file=str(plain), config_file=False)
        cov_api.load()
        cov_api.json_report(outfile=str(bad))
    elif case == "another project":
        cov = bad
        data = CoverageData(str(bad))
        data.set_context("tests/test_x.py::test_x")
        data.add_lines({"/elsewhere/project/mod.py": [1]})
        data.write()
    elif case == "commit not hex":
        commit = "HEAD~1"
    elif case == "commit unknown":
        commit = culprit
    elif case == "repo not git":
        repo = bad
        bad.mkdir()
    code = main(["gpu-report", "--junit", str(junit), "--coverage", str(cov), "--commit", commit,
                 "--repo", str(repo), "--out", str(tmp_path / "out.json")])
    err = capsys.readouterr().err
    assert code == 2
    where = culprit if culprit == "--commit" else (str(gpu_run.checkout) if case == "commit unknown" else str(bad))
    assert f"gatekeeper: error: {where}" in err and reason in err, err
    assert not (tmp_path / "out.json").exists()


def test_the_device_script_hands_back_the_data_file_not_the_json():
    script = (Path(__file__).resolve().parents[3] / "tools" / "gpu-evidence.sh").read_text()
    assert "-m coverage json" not in script
    assert '"$OUT/gpu/.coverage"' in script and "GATEKEEPER_NODEIDS=" in script


def test_the_report_is_the_same_whatever_the_hash_seed(gpu_run, tmp_path):
    """A test's index in the report's context table follows a sorted walk, not the iteration order of coverage.py's
    sets (which changes with PYTHONHASHSEED): the same run imported twice gives the same file, so a re-import shows
    no diff (361ba39's report, made twice, differed in the indexes of ~30 000 covered lines)."""
    reports = []
    for seed in ("1", "2", "3", "4"):
        out = tmp_path / f"seed{seed}.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("COVERAGE_", "GATEKEEPER_"))}
        env["PYTHONHASHSEED"] = seed
        subprocess.run([sys.executable, "-c", "import sys; from gatekeeper.cli import main; sys.exit(main(sys.argv[1:]))",
                        "gpu-report", "--junit", str(gpu_run.junit), "--coverage", str(gpu_run.data),
                        "--nodeids", str(gpu_run.nodeids), "--commit", gpu_run.sha, "--repo", str(gpu_run.checkout),
                        "--out", str(out)], env=env, check=True, capture_output=True, timeout=120)
        reports.append(out.read_bytes())
    assert all(report == reports[0] for report in reports[1:])


IMPORT_SCRIPT = Path(__file__).resolve().parents[3] / "tools" / "gpu-evidence-import.sh"


def _device_run(gpu_run: GpuRun, folder: Path, measured_at: str, gpu: str = "NVIDIA H200") -> Path:
    """The files tools/gpu-evidence.sh hands back, in its layout, its bench JSON stamped `measured_at` on `gpu`."""
    (folder / "gpu").mkdir(parents=True)
    (folder / "perf").mkdir()
    for name in ("junit.xml", ".coverage", "nodeids.txt"):
        shutil.copy(gpu_run.out / name, folder / "gpu" / name)
    (folder / "tests.log").write_text("4 tests\n")
    (folder / "bench.log").write_text("rows\n")
    (folder / "perf" / "h200.json").write_text(f'{{"commit": "{measured_at}", "hardware": {{"gpu": "{gpu}"}}, "rows": []}}')
    return folder


def _import(gpu_run: GpuRun, tmp_path: Path, measured_at: str, split: bool = False, gpu: str = "NVIDIA H200"
            ) -> tuple[subprocess.CompletedProcess, Path]:
    """Import a device run into a fresh clone; split: as a BENCH=0 folder (the tests) and a TESTS=0 one (the bench)."""
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "clone", "-q", str(gpu_run.checkout), str(checkout)], check=True, timeout=60)
    run = _device_run(gpu_run, tmp_path / "run", measured_at, gpu)
    folders = [run]
    if split:
        bench = tmp_path / "bench"
        bench.mkdir()
        shutil.move(run / "perf", bench / "perf")
        shutil.move(run / "bench.log", bench / "bench.log")
        folders.append(bench)
    env = dict(os.environ, GATEKEEPER=str(Path(sys.executable).with_name("gatekeeper")))
    done = subprocess.run(["bash", str(IMPORT_SCRIPT), *map(str, folders)], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=120)
    return done, checkout


def test_the_import_script_brings_a_run_at_head_into_the_evidence(gpu_run, tmp_path):
    done, checkout = _import(gpu_run, tmp_path, gpu_run.sha)
    assert done.returncode == 0, done.stderr
    evidence = checkout / "kimi_k3_path" / "evidence"
    assert load_evidence(evidence / "gpu" / "gpu-evidence.json").head.sha == gpu_run.sha
    assert (evidence / "perf" / "h200.json").read_text().startswith(f'{{"commit": "{gpu_run.sha}"')
    # Only what the policy reads comes into the tree; the run's logs stay in its folders.
    assert sorted(str(p.relative_to(evidence)) for p in evidence.rglob("*") if p.is_file()) == [
        "gpu/gpu-evidence.json", "perf/h200.json"]
    assert "logs and kernel JSON stay in" in done.stdout


def test_the_import_script_takes_a_run_split_into_a_tests_call_and_a_bench_call(gpu_run, tmp_path):
    done, checkout = _import(gpu_run, tmp_path, gpu_run.sha, split=True)
    assert done.returncode == 0, done.stderr
    evidence = checkout / "kimi_k3_path" / "evidence"
    assert load_evidence(evidence / "gpu" / "gpu-evidence.json").head.sha == gpu_run.sha
    assert (evidence / "perf" / "h200.json").read_text().startswith(f'{{"commit": "{gpu_run.sha}"')
    # Only what the policy reads comes into the tree; the run's logs stay in its folders.
    assert sorted(str(p.relative_to(evidence)) for p in evidence.rglob("*") if p.is_file()) == [
        "gpu/gpu-evidence.json", "perf/h200.json"]
    assert "logs and kernel JSON stay in" in done.stdout


def test_the_import_script_refuses_a_matrix_measured_on_another_card(gpu_run, tmp_path):
    """The device lends H100s under the H200's kind; the floors are the H200's copy rate."""
    done, checkout = _import(gpu_run, tmp_path, gpu_run.sha, gpu="NVIDIA H100 80GB HBM3")
    assert done.returncode == 1
    assert "was measured on 'NVIDIA H100 80GB HBM3', not an H200: not imported as evidence of record" in done.stderr
    assert not (checkout / "kimi_k3_path").exists()  # nothing written


@pytest.mark.parametrize("split", [False, True])
def test_the_import_script_refuses_a_run_measured_at_another_commit(gpu_run, tmp_path, split):
    done, checkout = _import(gpu_run, tmp_path, "0" * 40, split)
    assert done.returncode == 1
    assert f"was measured at {'0' * 40}, not at HEAD {gpu_run.sha}" in done.stderr
    assert not (checkout / "kimi_k3_path").exists()  # nothing written
