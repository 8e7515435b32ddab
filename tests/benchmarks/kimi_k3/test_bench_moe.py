"""The MoE block benchmark's host side on CPU: its arguments, its runs of each TP in a child process, and what it
records when tools are missing. The measurements themselves run on the H200 (test_bench_moe_gpu.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from benchmarks.kimi_k3 import bench_moe  # noqa: E402


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
    # what the traced launches themselves recorded on the H200's 132 SMs (kimi_k3_path/evidence/kernels-v20/cta_trace/
    # and kernels-v23/l2_policy/ in git history up to 6e77aa1); GEMM2's grid: its 448 CTAs and the shared gate_up's
    # Ish / 2 (two row pairs each), which the GPU trace test checked at b1cb368
    (8, {"front": 2240, "gemm1": 768, "gemm2": 448 + 384, "finalize": 396}),
    (16, {"front": 2240, "gemm1": 384, "gemm2": 448 + 192, "finalize": 396}),
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



def test_each_tp_runs_alone_with_the_parent_s_settings():
    args = argparse.Namespace(tp=[8, 16], batch=[1, 2], replays=50, seed=3, steps_at=[1])
    assert bench_moe.tp_argv(args, 16) == [
        "--tp", "16", "--batch", "1,2", "--replays", "50", "--seed", "3", "--steps-at", "1", "--processes", "one"]


def test_each_launch_is_charged_the_weight_bytes_it_reads(dims):
    """The bench's floors: the front reads the router, its bias and W_down (and W_sh13 where the shared gate_up runs
    in it), GEMM1 and GEMM2 the active experts' packed rows and scales (GEMM2 also gamma, and at one token W_sh13),
    the finalize W_up and W_sh2."""
    from types import SimpleNamespace

    d = dims(8)
    w = SimpleNamespace(experts=d.experts, hidden=d.hidden, latent=d.latent, intermediate=d.intermediate,
                        shared_intermediate=d.shared_intermediate)
    e, h, lat, i, s = d.experts, d.hidden, d.latent, d.intermediate, d.shared_intermediate

    def step(kind, name):
        return SimpleNamespace(kind=kind, name=name)

    gate_up = 2 * s * h * 2
    assert bench_moe.launch_weight_bytes(step("front", "front (router + down_proj)"), w, 16) == e * h * 2 + e * 4 + lat * h * 2
    assert bench_moe.launch_weight_bytes(step("front", "front (router + down_proj + shared_gate_up)"), w, 16) == (
        e * h * 2 + e * 4 + lat * h * 2 + gate_up)
    assert bench_moe.launch_weight_bytes(step("gemm1", "experts_gemm1_held"), w, 16) == 16 * 2 * i * lat * (1 / 2 + 1 / 32)
    two = bench_moe.launch_weight_bytes(step("gemm2", "experts_gemm2_mma (combine + norm)"), w, 2)
    assert two == 2 * lat * i * (1 / 2 + 1 / 32) + lat * 4
    assert bench_moe.launch_weight_bytes(step("gemm2", "experts_gemm2_one_token + shared_gate_up"), w, 2) == two + gate_up
    assert bench_moe.launch_weight_bytes(step("finalize", "finalize_mma"), w, 2) == h * lat * 2 + h * s * 2


def _part(tp: int, bandwidth: str, kernels: list[str], gpu: str = "NVIDIA H200"):
    evidence = {"schema_version": 1, "kind": "perf_matrix", "commit": "child", "command": f"child {tp}",
                "created": "2026-12-02T00:00:00+00:00", "hardware": {"gpu": gpu, "count": 1},
                "software": {"torch": "2.11", "copy_bandwidth_tb_s": bandwidth},
                "rows": [{"axes": {"tp": tp, "batch": m}, "note": f"tp{tp} m{m}"} for m in (1, 2)]}
    return evidence, [{"tp": tp, "kernel": k} for k in kernels]


def test_the_tp_runs_merge_in_order_each_row_noting_its_process_and_each_run_its_copy_bandwidth():
    parts = [_part(8, "4.231", ["front", "router alone"]), _part(16, "4.225", ["front"])]
    evidence, kernels = bench_moe.merge_tp_runs(parts, "abc123", "python -m benchmarks.kimi_k3.bench_moe --tp 8,16")
    assert (evidence["commit"], evidence["command"]) == ("abc123", "python -m benchmarks.kimi_k3.bench_moe --tp 8,16")
    assert [(r["axes"]["tp"], r["axes"]["batch"]) for r in evidence["rows"]] == [(8, 1), (8, 2), (16, 1), (16, 2)]
    assert all(r["note"].endswith("; measured in a process of its own") for r in evidence["rows"])
    assert evidence["software"] == {"torch": "2.11", "copy_bandwidth_tb_s": "tp8 4.231, tp16 4.225"}
    assert [(k["tp"], k["kernel"]) for k in kernels] == [(8, "front"), (8, "router alone"), (16, "front")]


def test_tp_runs_on_different_hardware_are_refused():
    with pytest.raises(SystemExit, match="not one machine"):
        bench_moe.merge_tp_runs([_part(8, "4.2", []), _part(16, "4.2", [], gpu="NVIDIA H100")], "abc", "cmd")


class _FakeChildren:
    """Stands in for subprocess.run in run_per_tp: records each child's command and writes what a child would."""

    def __init__(self, fail_tp: int | None = None):
        self.commands, self.fail_tp = [], fail_tp

    def __call__(self, command, env):
        self.commands.append(command)
        tp = int(command[command.index("--tp") + 1])
        if tp == self.fail_tp:
            return subprocess.CompletedProcess(command, 1)
        evidence, kernels = _part(tp, "4.2", ["front"])
        Path(command[command.index("--out") + 1]).write_text(json.dumps(evidence))
        Path(command[command.index("--kernels-out") + 1]).write_text(json.dumps(kernels))
        return subprocess.CompletedProcess(command, 0)


def _per_tp_args():
    return argparse.Namespace(tp=[8, 16], batch=[1], replays=5, seed=0, steps_at=[1], commit="abc123")


def test_run_per_tp_starts_one_child_per_tp_and_merges_what_they_wrote(monkeypatch):
    children = _FakeChildren()
    monkeypatch.setattr(bench_moe.subprocess, "run", children)
    evidence, kernels = bench_moe.run_per_tp(_per_tp_args())
    assert [c[c.index("--tp") + 1] for c in children.commands] == ["8", "16"]
    assert all(c[1:3] == ["-m", "benchmarks.kimi_k3.bench_moe"] and "--commit" in c for c in children.commands)
    assert evidence["commit"] == "abc123" and [r["axes"]["tp"] for r in evidence["rows"]] == [8, 8, 16, 16]
    assert [k["tp"] for k in kernels] == [8, 16]


def test_run_per_tp_stops_at_a_failing_child(monkeypatch):
    monkeypatch.setattr(bench_moe.subprocess, "run", _FakeChildren(fail_tp=16))
    with pytest.raises(SystemExit, match="tp=16 run failed in its own process"):
        bench_moe.run_per_tp(_per_tp_args())
