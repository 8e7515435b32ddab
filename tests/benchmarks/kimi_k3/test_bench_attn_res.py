"""The AttnRes benchmark's host side on CPU: arguments, the reference it checks against, the check that guards its
timings, and its rows as PerfEvidence. The run itself: test_bench_attn_res_gpu.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest

torch = pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from benchmarks.kimi_k3 import bench_attn_res  # noqa: E402
from gatekeeper.evidence import PerfEvidence  # noqa: E402


def test_importing_the_bench_does_not_import_cutlass():
    code = "import sys, benchmarks.kimi_k3.bench_attn_res; sys.exit('cutlass' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_arguments_parse_into_lists_and_a_fresh_seed():
    args = bench_attn_res.parse_args(["--batch", "1,16", "--blocks", "3", "--replays", "7", "--out", "x.json"])
    assert (args.batch, args.blocks, args.replays) == ((1, 16), 3, 7)
    assert isinstance(args.seed, int) and args.command.startswith("python -m benchmarks.kimi_k3.bench_attn_res")
    assert bench_attn_res.parse_args(["--out", "x.json"]).blocks == 8


@pytest.mark.parametrize("argv, message", [
    (["--blocks", "9"], "0..8 completed blocks"),
    (["--blocks", "-1"], "0..8 completed blocks"),
])
def test_bad_arguments_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_attn_res.parse_args([*argv, "--out", "x.json"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def cpu_site(m: int = 3, blocks: int = 2) -> bench_attn_res.Site:
    gen = torch.Generator().manual_seed(11)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).bfloat16()

    h = bench_attn_res.HIDDEN
    return bench_attn_res.Site(prefix=randn(m, h), delta=randn(m, h, scale=0.1), blocks=randn(m, blocks, h),
                               res_norm=randn(h, scale=0.1) + 1, res_proj=randn(h, scale=h ** -0.5),
                               out_norm=randn(h, scale=0.1) + 1, out=torch.empty(m, h, dtype=torch.bfloat16))


def test_the_reference_adds_the_input_to_the_prefix_and_mixes_every_source():
    site = cpu_site()
    want, prefix = bench_attn_res.expected(site)
    assert torch.equal(prefix, (site.prefix.float() + site.delta.float()).bfloat16())
    # the mix moves with a completed block: every source takes part
    site.blocks[:, 0] *= 3
    moved, _ = bench_attn_res.expected(site)
    assert want.shape == (3, bench_attn_res.HIDDEN) and torch.isfinite(want).all()
    assert not torch.allclose(want, moved)


def test_the_check_passes_a_rounded_output_and_names_a_wrong_unwritten_token_or_prefix():
    site = cpu_site()
    want, prefix = bench_attn_res.expected(site)
    out = want.bfloat16()  # the kernel's output dtype: its rounding alone stays well inside
    assert bench_attn_res.compare(out, want, prefix, prefix, "test") < 5e-3
    wrong = out.clone()
    wrong[2, 5] += 100.0
    with pytest.raises(bench_attn_res.BenchError, match="test: token 2: rel err"):
        bench_attn_res.compare(wrong, want, prefix, prefix, "test")
    wrong[1, 0] = float("nan")
    with pytest.raises(bench_attn_res.BenchError, match="test: token 1 holds NaN"):
        bench_attn_res.compare(wrong, want, prefix, prefix, "test")
    stale = prefix.clone()
    stale[0, 0] += 1
    with pytest.raises(bench_attn_res.BenchError, match="the prefix is not prefix"):
        bench_attn_res.compare(out, want, stale, prefix, "test")


def test_rows_are_perf_evidence_with_both_forms_in_the_note():
    pytest.importorskip("cutlass", reason="the byte count comes from the kernel module (the [kernels] extra)")
    from kimi_k3_path.kernels.attn_res import Prefix, attn_res_bytes

    got = {"cluster": {"median": 2.4, "spread_pct": 1.0, "runs": 50},
           "one_cta": {"median": 5.7, "spread_pct": 0.5, "runs": 50}, "copies": 750, "rel_err": 4e-3,
           "cluster_ctas": 4, "bytes": attn_res_bytes(1, bench_attn_res.HIDDEN, 8, Prefix.ADD, False)}
    row = bench_attn_res.perf_row("sm_90", 8, 1, 8, got, seed=5)
    evidence = PerfEvidence(commit="0123abc", command="python -m benchmarks.kimi_k3.bench_attn_res",
                            created=datetime.now(timezone.utc),
                            hardware={"gpu": "NVIDIA H200", "count": 1, "driver": "1", "arch": "sm_90"}, rows=[row])
    (row,) = evidence.rows
    assert row.axes == {"arch": "sm_90", "tp": 8, "dcp": 1, "batch": 1, "spec": "none", "layer": "attn_res"}
    assert row.candidate.median == 2.4 and row.baseline.median == 5.7
    assert row.floor == pytest.approx(sum(got["bytes"].values()) / 4.3e12 * 1e6)  # 14 rows of 7168 bf16
    for part in ("M=1, 8 completed blocks", "clusters of 4 CTAs per token 2.40 us", "one/cluster 2.375",
                 "750 rotated copies", "seed 5"):
        assert part in row.note
