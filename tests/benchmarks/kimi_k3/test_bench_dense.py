"""The dense-projection benchmark's host side on CPU: arguments, the projections' shapes as kda.py and mla.py hold them, the
correctness check that guards its timings, and its rows as PerfEvidence. The run itself: test_bench_dense_gpu.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest

torch = pytest.importorskip("torch", reason="the bench needs the [kernels] extra")
pytest.importorskip("cutlass", reason="the bench's shapes come from the kernel modules (the [kernels] extra)")

from benchmarks.kimi_k3 import bench_dense  # noqa: E402
from gatekeeper.evidence import PerfEvidence  # noqa: E402


def test_importing_the_bench_does_not_import_cutlass():
    code = "import sys, benchmarks.kimi_k3.bench_dense; sys.exit('cutlass' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_arguments_parse_into_lists_and_a_fresh_seed():
    args = bench_dense.parse_args(["--tp", "16", "--batch", "1,8", "--projection", "kda_o_proj,mla_qkv_a", "--replays", "7",
                                   "--out", "x.json"])
    assert (args.tp, args.batch, args.projection, args.replays) == ((16,), (1, 8), ("kda_o_proj", "mla_qkv_a"), 7)
    assert isinstance(args.seed, int)
    assert args.command.startswith("python -m benchmarks.kimi_k3.bench_dense --tp 16")
    defaults = bench_dense.parse_args(["--out", "x.json", "--seed", "5"])
    assert (defaults.tp, defaults.batch, defaults.projection) == ((8, 16), (1, 8, 64), ("kda_in_proj", "kda_o_proj", "kda_f_b", "mla_qkv_a"))


@pytest.mark.parametrize("argv, message", [
    (["--projection", "q_proj"], "unknown projection(s) ['q_proj']"),
])
def test_bad_arguments_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_dense.parse_args([*argv, "--out", "x.json"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_shapes_are_kda_s_padded_projections_and_mla_s_qkv_a():
    assert [bench_dense.shape(8, p) for p in bench_dense.PROJECTIONS] == [(6288, 7168), (7168, 1536), (1536, 128),
                                                                          (3648, 7168)]
    assert [bench_dense.shape(16, p) for p in bench_dense.PROJECTIONS] == [(3216, 7168), (7168, 768), (768, 128),
                                                                           (2880, 7168)]


def test_the_check_passes_a_rounded_product_and_names_a_wrong_or_unwritten_token():
    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(3, 64, generator=gen).bfloat16(), torch.randn(32, 64, generator=gen).bfloat16()
    want = x.double() @ w.double().T
    y = want.bfloat16()  # the kernel's output dtype: bf16 rounding alone stays well inside
    assert bench_dense.max_token_error(y, want, "test") < 5e-3
    wrong = y.clone()
    wrong[2, 5] += 10.0
    with pytest.raises(bench_dense.BenchError, match="test: token 2: rel err"):
        bench_dense.max_token_error(wrong, want, "test")
    wrong[1, 0] = float("nan")
    with pytest.raises(bench_dense.BenchError, match="test: token 1 holds NaN"):
        bench_dense.max_token_error(wrong, want, "test")


def test_rows_are_perf_evidence_with_cublas_in_the_note():
    got = {"dense": {"median": 22.0, "spread_pct": 2.0, "runs": 50}, "cublas": {"median": 26.4, "spread_pct": 1.0,
           "runs": 50}, "copies": 3, "rel_err": 2e-3}
    read = {"median": 21.0, "spread_pct": 1.0, "runs": 50, "layout": "grid-stride", "ctas": 264, "in_flight": 4,
            "swept": 21, "bytes": 1}
    row = bench_dense.perf_row("sm_90", 8, "kda_in_proj", 1, 6288, 7168, got, read, seed=7)
    evidence = PerfEvidence(commit="0123abc", command="python -m benchmarks.kimi_k3.bench_dense",
                            created=datetime.now(timezone.utc),
                            hardware={"gpu": "NVIDIA H200", "count": 1, "driver": "1", "arch": "sm_90"}, rows=[row])
    (row,) = evidence.rows
    assert row.axes == {"arch": "sm_90", "tp": 8, "dcp": 1, "batch": 1, "spec": "none", "layer": "kda_in_proj"}
    assert row.candidate.median == 22.0 and row.baseline.median == 21.0
    assert row.floor == pytest.approx((6288 * 7168 + 7168 + 6288) * 2 / 4.3e12 * 1e6)
    for part in ("KDA in_proj alone, 6288 x 7168", "cuBLAS (torch.mm) 26.40 us", "cuBLAS/dense 1.200", "candidate/baseline 1.048 (target 1.15x)",
                 "3 rotated copies", "264 CTAs x 4", "best of 21 layouts", "seed 7"):
        assert part in row.note
