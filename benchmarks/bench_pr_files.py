"""Benchmark: `gatekeeper check --pr-files` on a synthetic 3000-file pull request (issue 2, item 9).

Goal on the 2-core CI machine: under 2 s wall and under 300 MB peak RSS, end to end, in a fresh process.

    .venv/bin/python benchmarks/bench_pr_files.py [--files 3000] [--runs 7] [--policy policies/vllm-kimi-k3.yaml]

Each run is a child process (`python -m gatekeeper check ... --format json`) timed from spawn to exit; its
peak RSS comes from os.wait4, i.e. getrusage of that one child. Until `gatekeeper check` accepts
`--pr-files`, the child only loads the ChangeSet (`changes_from_pr_files`), and the output says so.
The synthetic PR is deterministic: mostly edits inside the policy's owned paths, some files outside them,
renames (one from outside), removals, files without a patch (as GitHub sends for large or binary files).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HEAD_SHA = "6dcb09b5b57875f334f61aebed695e2e4193db5e"
LOADER_ONLY = (
    "import sys; from gatekeeper.sources.github import changes_from_pr_files; "
    "changes = changes_from_pr_files(open(sys.argv[1]).read(), sys.argv[1]); print(len(changes.files))"
)


def synthetic_pr_files(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    entries = []
    for i in range(count):
        owned = rng.random() < 0.9
        path = f"vllm/models/kimi_k3/nvidia/pkg{i % 40}/mod_{i}.py" if owned else f"vllm/other/area{i % 7}/file_{i}.py"
        kind = rng.choices(["modified", "added", "removed", "renamed", "nopatch"], [70, 15, 5, 5, 5])[0]
        lines: list[str] = []
        if kind in ("modified", "renamed"):
            start = rng.randint(1, 400)
            for hunk in range(rng.randint(1, 3)):
                old = [f" ctx {j}" for j in range(3)] + [f"-old {j}" for j in range(rng.randint(0, 4))]
                new = [f"+new {j}" for j in range(rng.randint(1, 6))] + [f" ctx {j}" for j in range(3)]
                n_old = sum(1 for x in old + new if not x.startswith("+"))
                n_new = sum(1 for x in old + new if not x.startswith("-"))
                lines += [f"@@ -{start},{n_old} +{start},{n_new} @@ def f{hunk}():", *old, *new]
                start += 50
        elif kind == "added":
            n = rng.randint(1, 60)
            lines = [f"@@ -0,0 +1,{n} @@"] + [f"+line {j}" for j in range(n)]
        elif kind == "removed":
            n = rng.randint(1, 30)
            lines = [f"@@ -1,{n} +0,0 @@"] + [f"-line {j}" for j in range(n)]
        additions = sum(1 for x in lines if x.startswith("+"))
        deletions = sum(1 for x in lines if x.startswith("-"))
        entry = {
            "sha": f"{i:040x}",
            "filename": path,
            "status": {"nopatch": "modified"}.get(kind, kind),
            "additions": additions if kind != "nopatch" else 1200,
            "deletions": deletions if kind != "nopatch" else 800,
            "changes": (additions + deletions) if kind != "nopatch" else 2000,
            "blob_url": f"https://github.com/vllm-project/vllm/blob/{HEAD_SHA}/{path}",
            "raw_url": f"https://github.com/vllm-project/vllm/raw/{HEAD_SHA}/{path}",
            "contents_url": f"https://api.github.com/repos/vllm-project/vllm/contents/{path}?ref={HEAD_SHA}",
        }
        if kind != "nopatch":
            entry["patch"] = "\n".join(lines)
        if kind == "renamed":
            entry["previous_filename"] = f"vllm/model_executor/layers/old_{i}.py" if i % 2 else path + ".orig"
        entries.append(entry)
    return entries


def cli_has_pr_files() -> bool:
    result = subprocess.run([sys.executable, "-m", "gatekeeper", "check", "--help"], capture_output=True, text=True,
                            cwd=REPO_ROOT)
    return result.returncode == 0 and "--pr-files" in result.stdout


def run_child(command: list[str]) -> tuple[float, float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS in MB, exit code, stderr tail) of one child process.
    CPU time (user + system) is reported beside wall time because it hardly moves when other work shares
    the machine, while wall time does."""
    with tempfile.TemporaryFile() as stderr:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO_ROOT)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait on it again
        stderr.seek(0)
        tail = stderr.read().decode(errors="replace")[-400:]
    peak_mb = usage.ru_maxrss / 1024  # Linux reports kilobytes
    return wall, usage.ru_utime + usage.ru_stime, peak_mb, child.returncode, tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--policy", default="policies/vllm-kimi-k3.yaml")
    parser.add_argument("--loader-only", action="store_true", help="time only changes_from_pr_files")
    args = parser.parse_args()

    load_before = f"{os.getloadavg()[0]:.2f}"
    with tempfile.TemporaryDirectory() as tmp:
        pr_files = Path(tmp) / "pr-files.json"
        pr_files.write_text(json.dumps(synthetic_pr_files(args.files), indent=2))
        size_mb = pr_files.stat().st_size / 1e6
        end_to_end = not args.loader_only and cli_has_pr_files()
        if end_to_end:
            command = [sys.executable, "-m", "gatekeeper", "check", "--policy", args.policy,
                       "--pr-files", str(pr_files), "--format", "json", "--output", os.devnull]
            ok_codes = {0, 1}  # pass or fail are both verdicts; 2 would be an input error
        else:
            command = [sys.executable, "-c", LOADER_ONLY, str(pr_files)]
            ok_codes = {0}
        walls, cpus, peaks = [], [], []
        for _ in range(args.runs):
            wall, cpu, peak, code, tail = run_child(command)
            if code not in ok_codes:
                print(f"run failed with exit code {code}:\n{tail}", file=sys.stderr)
                return 2
            walls.append(wall)
            cpus.append(cpu)
            peaks.append(peak)

    if end_to_end:
        what = "gatekeeper check --pr-files (end to end)"
    else:
        what = "changes_from_pr_files only" + ("" if args.loader_only else " (`gatekeeper check --pr-files` not ready)")
    print(f"{what}: {args.files} files ({size_mb:.1f} MB JSON), {args.runs} runs, "
          f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    print(f"wall s: median {statistics.median(walls):.3f}  min {min(walls):.3f}  max {max(walls):.3f}")
    print(f"CPU s:  median {statistics.median(cpus):.3f}  min {min(cpus):.3f}  max {max(cpus):.3f}")
    print(f"load average before/after: {load_before}/{os.getloadavg()[0]:.2f}")
    print(f"peak RSS MB: median {statistics.median(peaks):.1f}  max {max(peaks):.1f}")
    goal_met = statistics.median(walls) < 2.0 and max(peaks) < 300
    print("goal (< 2 s, < 300 MB):", "met" if goal_met else "NOT met")
    return 0 if goal_met else 1


if __name__ == "__main__":
    sys.exit(main())
