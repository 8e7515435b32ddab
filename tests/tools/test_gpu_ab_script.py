"""tools/gpu-ab.sh on the CPU: `prepare` archives commits into .ab/<name>, refuses bad names and non-commits, `clear`
forgets them, and `run` (with the device's environment script and the benches stood in for) runs the working tree and
every prepared variant in each round, in that order, and ends with tools/gpu_ab_summary.py's table."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Stands in for `python3 -m benchmarks...`: records the call and writes one PerfEvidence row whose median says which
# variant ran (the first path on PYTHONPATH, as the script sets it); anything else goes to the real interpreter.
FAKE_PYTHON = f"""#!/bin/sh
if [ "$1" = -m ]; then
  echo "$PWD $*" >> "$CALLS"
  out=$(echo "$*" | sed 's/.*--out \\([^ ]*\\).*/\\1/')
  first=${{PYTHONPATH%%:*}}
  case "$first" in *.ab/*) median=90.0 ;; *) median=80.0 ;; esac
  echo '{{"rows": [{{"axes": {{"layer": "moe", "tp": 8, "batch": 1}}, "candidate": {{"median": '$median'}}, "floor": 40.0}}]}}' > "$out"
  case "$*" in *--breakdown*)
    echo "breakdown kda_moe tp=8 batch=1 stock-like: 2 kernels"; echo "         1.0      1.0     0.0  stock_kernel"
    echo "breakdown kda_moe tp=8 batch=1 candidate: 1 kernels"; echo "    $median $median 0.0  ours"
    echo "kda_moe    8     1  (the row)" ;;
  esac
  case "$*" in *--kernels-out*)
    launches=$(echo "$*" | sed 's/.*--kernels-out \\([^ ]*\\).*/\\1/')
    echo '[{{"kernel": "front", "tp": 8, "batch": 1, "median_us": '$median', "floor_us": 20.0}}]' > "$launches" ;;
  esac
  exit 0
fi
exec {sys.executable} "$@"
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    for name in ("gpu-ab.sh", "gpu_ab_summary.py"):
        shutil.copy(ROOT / "tools" / name, repo / "tools" / name)
    (repo / "tools" / "gpu-env.sh").write_text("export PYTHONPATH=\"$PWD\"\n")  # the device's unpacking, stood in for
    for package in ("kimi_k3_path", "benchmarks", "gatekeeper"):
        (repo / package).mkdir()
        (repo / package / "__init__.py").write_text("")
    git(repo, "init", "-q")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "one")
    return repo


def ab(repo: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "tools/gpu-ab.sh", *args], cwd=repo, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def fake_benches(tmp_path: Path) -> tuple[Path, Path, dict]:
    """$OUT, the file the stand-in benches record their calls in, and the environment that puts them on PATH."""
    bin_dir, out, calls = tmp_path / "bin", tmp_path / "out", tmp_path / "calls"
    bin_dir.mkdir()
    out.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    return out, calls, {"OUT": str(out), "CALLS": str(calls), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_prepare_archives_each_named_commit_and_clear_forgets_them(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert ab(repo, "prepare", "HEAD").returncode == 0
    result = ab(repo, "prepare", "HEAD", "other_1")
    assert result.returncode == 0 and "variants prepared: base other_1" in result.stdout
    assert (repo / ".ab" / "other_1" / "REV").read_text().strip() == head
    assert (repo / ".ab" / "base" / "kimi_k3_path" / "__init__.py").exists()
    assert ab(repo, "clear").returncode == 0
    assert not (repo / ".ab" / "base").exists() and not (repo / ".ab" / "other_1").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("prepare", "HEAD", "tree"), "variant name 'tree'"),
    (("prepare", "HEAD", "Bad-Name"), "variant name 'Bad-Name'"),
    (("prepare", "no-such-rev"), "no-such-rev is not a commit"),
    (("bogus",), "usage:"),
])
def test_bad_requests_are_refused_with_the_reason(repo, args, message):
    result = ab(repo, *args)
    assert result.returncode != 0 and message in result.stderr
    assert not (repo / ".ab").exists() or not any((repo / ".ab").iterdir())


def test_run_needs_a_base(repo, tmp_path):
    result = ab(repo, "run", env={"OUT": str(tmp_path)})
    assert result.returncode == 1 and "no .ab/base" in result.stderr


def test_run_alternates_the_tree_and_every_variant_each_round_and_summarizes(repo, tmp_path):
    ab(repo, "prepare", "HEAD")
    ab(repo, "prepare", "HEAD", "gate_v2")
    out, calls, env = fake_benches(tmp_path)
    result = ab(repo, "run", env={**env, "BENCH": "moe", "BATCH": "1,8"})
    assert result.returncode == 0, result.stderr
    dirs = [line.split()[0] for line in calls.read_text().splitlines()]
    assert dirs == [str(repo), str(repo / ".ab" / "base"), str(repo / ".ab" / "gate_v2")] * 2
    assert all("benchmarks.kimi_k3.bench_moe --tp 8,16 --batch 1,8 --steps-at 1,8" in line
               and f"--kernels-out {out}/ab-" in line for line in calls.read_text().splitlines())
    # the launches' files are summarized, then removed (at most 8 files come back from the device)
    assert sorted(p.name for p in out.glob("ab-*.json")) == [f"ab-{v}-{r}.json" for v in ("base", "gate_v2", "tree")
                                                             for r in (1, 2)]
    summary = (out / "ab-summary.txt").read_text().splitlines()
    assert [line.split()[4:6] + line.split()[-1:] for line in summary[1:4]] == [
        ["base", "90.00", "1.000"], ["tree", "80.00", f"{80 / 90:.3f}"], ["gate_v2", "90.00", "1.000"]]
    assert summary[4] == "" and summary[5].split()[:3] == ["launch", "alone", "tp"]
    assert [line.split()[:4] + line.split()[-1:] for line in summary[6:]] == [
        ["front", "8", "1", "base", "1.000"], ["front", "8", "1", "tree", f"{80 / 90:.3f}"],
        ["front", "8", "1", "gate_v2", "1.000"]]
    assert json.loads((out / "ab-tree-1.json").read_text())["rows"][0]["candidate"]["median"] == 80.0


def test_the_mla_bench_takes_the_contexts_and_no_launch_files(repo, tmp_path):
    ab(repo, "prepare", "HEAD")
    out, calls, env = fake_benches(tmp_path)
    result = ab(repo, "run", env={**env, "BENCH": "mla", "BATCH": "1,2", "TPS": "8", "CONTEXT": "4096,32768",
                                  "ROUNDS": "1"})
    assert result.returncode == 0, result.stderr
    lines = calls.read_text().splitlines()
    assert [line.split()[0] for line in lines] == [str(repo), str(repo / ".ab" / "base")]
    assert all("benchmarks.kimi_k3.bench_mla --tp 8 --batch 1,2 --context 4096,32768 --replays 100" in line
               and "--kernels-out" not in line for line in lines)
    assert sorted(p.name for p in out.glob("ab-*")) == ["ab-base-1.json", "ab-summary.txt", "ab-tree-1.json"]


def test_breakdown_passes_the_flag_and_gathers_the_candidates_tables(repo, tmp_path):
    ab(repo, "prepare", "HEAD")
    out, calls, env = fake_benches(tmp_path)
    result = ab(repo, "run", env={**env, "BREAKDOWN": "graph", "ROUNDS": "1", "LAYERS": "kda_moe"})
    assert result.returncode == 0, result.stderr
    assert all(line.endswith("--breakdown graph") for line in calls.read_text().splitlines())
    assert (out / "ab-breakdown.txt").read_text().splitlines() == [
        "== tree, round 1", "breakdown kda_moe tp=8 batch=1 candidate: 1 kernels", "    80.0 80.0 0.0  ours",
        "== base, round 1", "breakdown kda_moe tp=8 batch=1 candidate: 1 kernels", "    90.0 90.0 0.0  ours"]


@pytest.mark.parametrize(("env", "message"), [
    ({"BREAKDOWN": "graph", "BENCH": "moe"}, "BREAKDOWN needs BENCH=layer"),
    ({"BREAKDOWN": "replay"}, "BREAKDOWN=replay: graph or eager"),
])
def test_a_breakdown_the_bench_cannot_make_is_refused(repo, tmp_path, env, message):
    ab(repo, "prepare", "HEAD")
    result = ab(repo, "run", env={"OUT": str(tmp_path), **env})
    assert result.returncode == 2 and message in result.stderr
