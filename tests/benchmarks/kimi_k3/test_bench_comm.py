"""The communication bench's harness on CPU: two real processes under torchrun (gloo), a real all_reduce timed per
layer, the slowest rank's samples, PerfEvidence rows with a tp_world axis; and its refusal of NVLink multicast."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from benchmarks.kimi_k3 import bench_comm  # noqa: E402
from gatekeeper.evidence import PerfEvidence  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_world_2_on_cpu_end_to_end(tmp_path):
    out = tmp_path / "comm.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for key in bench_comm.NO_MULTICAST:
        env.pop(key, None)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
         "benchmarks.kimi_k3.bench_comm", "--cpu-smoke", "--batch", "1,3", "--hidden", "64", "--samples", "4",
         "--layers", "2", "--commit", "0000000", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    evidence = PerfEvidence.model_validate_json(out.read_text())
    assert [(r.axes["tp_world"], r.axes["batch"], r.axes["impl"]) for r in evidence.rows] == [
        (2, 1, "all_reduce"), (2, 3, "all_reduce")]
    row = evidence.rows[0]
    assert row.candidate.runs == 4 and row.baseline == row.candidate and row.axes["layer"] == "comm"
    assert evidence.software["NCCL_NVLS_ENABLE"] == "0"
    assert json.loads(out.read_text())["hardware"]["gpu"].startswith("none (CPU smoke run")


def test_multicast_stays_off(monkeypatch):
    for key in bench_comm.NO_MULTICAST:
        monkeypatch.delenv(key, raising=False)
    bench_comm.no_multicast_env()
    assert all(os.environ[k] == v for k, v in bench_comm.NO_MULTICAST.items())
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0")
    with pytest.raises(bench_comm.CommBenchError, match="TORCH_SYMM_MEM_DISABLE_MULTICAST=0: NVLink multicast"):
        bench_comm.no_multicast_env()


def test_peer_to_peer_implementations_need_the_gpu():
    with pytest.raises(bench_comm.CommBenchError, match="oneshot needs the GPU"):
        bench_comm.implementations(("oneshot",), 0, 2, 4, 64, "cpu")
