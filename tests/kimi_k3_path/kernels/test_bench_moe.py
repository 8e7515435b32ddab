"""The MoE block benchmark's host side on CPU: its arguments, and what it records when tools are missing. The
measurements themselves run on the H200 (test_bench_moe_gpu.py)."""

from __future__ import annotations

import subprocess

import pytest

torch = pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from kimi_k3_path.kernels import bench_moe  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer on a machine without a GPU")
def test_without_a_gpu_the_bench_says_so_and_exits_2(capsys):
    assert bench_moe.main(["--out", "unused.json"]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err


def test_missing_tools_are_recorded_as_unknown(monkeypatch):
    def missing(*args, **kwargs):
        raise OSError("not installed")

    monkeypatch.setattr(subprocess, "run", missing)
    assert bench_moe.driver_version() == "unknown"
    assert bench_moe.git_commit() == "0000000"


@pytest.mark.parametrize("tp, expected", [
    # what the traced launches themselves recorded on the H200's 132 SMs (evidence/kernels-v20/cta_trace/trace_m1.json;
    # the streamed finalize's 3 per SM: evidence/kernels-v23/l2_policy/, form 3x3ef)
    (8, {"front": 2240, "gemm1": 768, "gemm2": 1216, "finalize": 396}),
    (16, {"front": 2240, "gemm1": 384, "gemm2": 832, "finalize": 396}),
])
def test_block_ctas_are_the_grids_the_traced_launches_recorded(tp, expected, dims):
    assert bench_moe.block_ctas(dims(tp)) == expected


def test_median_summary_takes_each_figure_s_median_over_the_replays_and_skips_missing_clocks():
    replays = [
        {"front": {"cta_life_us": 1.0, "sm_mhz": 1900.0, "end_us": {"last": 20.0}}},
        {"front": {"cta_life_us": 3.0, "sm_mhz": None, "end_us": {"last": 22.0}}},
        {"front": {"cta_life_us": 2.0, "sm_mhz": 1950.0, "end_us": {"last": 19.0}}},
    ]
    assert bench_moe.median_summary(replays) == {"front": {"cta_life_us": 2.0, "sm_mhz": 1925.0,
                                                           "end_us": {"last": 20.0}}}
    assert bench_moe.median_summary([{"gemm1": {"sm_mhz": None}}]) == {"gemm1": {"sm_mhz": None}}

