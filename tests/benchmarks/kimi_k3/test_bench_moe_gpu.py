"""The MoE block benchmark on the H200: a short run writes PerfEvidence and per-kernel rows that add up."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from gatekeeper.evidence import PerfEvidence  # noqa: E402
from benchmarks.kimi_k3 import bench_moe  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_short_block_bench_writes_evidence_and_kernel_rows(tmp_path):
    out, kernels_out = tmp_path / "moe.json", tmp_path / "kernels.json"
    rc = bench_moe.main(["--tp", "8", "--batch", "1", "--replays", "5", "--commit", "0123abc",
                         "--out", str(out), "--kernels-out", str(kernels_out)])
    assert rc == 0
    evidence = PerfEvidence.model_validate_json(out.read_text())
    (row,) = evidence.rows
    assert row.axes["tp"] == 8 and row.axes["batch"] == 1
    assert row.baseline is not None and row.candidate.median > 0.9 * row.floor
    kernels = json.loads(kernels_out.read_text())
    assert kernels and all(k["median_us"] > 0 and k["floor_us"] > 0 for k in kernels)
    # Each kernel alone cannot beat its own byte floor by much either.
    assert all(k["median_us"] > 0.9 * k["floor_us"] for k in kernels), kernels


def test_the_bench_times_each_launch_of_a_batch_in_its_form(tmp_path):
    out, kernels_out = tmp_path / "moe.json", tmp_path / "kernels.json"
    rc = bench_moe.main(["--tp", "8", "--batch", "9", "--replays", "3", "--steps-at", "9",
                         "--commit", "0123abc", "--out", str(out), "--kernels-out", str(kernels_out)])
    assert rc == 0
    names = [k["kernel"] for k in json.loads(kernels_out.read_text()) if k["batch"] == 9]
    assert names == ["front (router + down_proj + shared_gate_up)", "experts_gemm1_mma",
                     "experts_gemm2_mma (combine + norm)", "finalize_mma (up_proj + shared down)"]


def test_profile_once_runs_one_eager_pass_and_the_out_file_is_required_otherwise(capsys):
    assert bench_moe.main(["--profile-once"]) == 0
    with pytest.raises(SystemExit):
        bench_moe.main(["--tp", "8"])
    assert "--out is required" in capsys.readouterr().err
