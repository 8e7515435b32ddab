"""The MLA attention benchmark's host side on CPU: its arguments and their errors, the copies and bytes it plans, its
inputs and correctness check (on the host), the rows it writes. The arguments and the answer without a GPU it shares
with the other per-kernel benches: test_kernel_bench.py. The measurements themselves run on the H200
(test_bench_mla_gpu.py)."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone

import pytest

torch = pytest.importorskip("torch", reason="the bench needs the [kernels] extra")
pytest.importorskip("cutlass", reason="the bench's byte counts come from the kernel module (the [kernels] extra)")

from benchmarks.kimi_k3 import bench_mla  # noqa: E402
from benchmarks.kimi_k3.bench_ceiling import L2_BYTES  # noqa: E402
from gatekeeper.evidence import PerfEvidence  # noqa: E402

ROW_BYTES = 1152  # 576 bf16: [kv_c (512) | k_pe (64)]


def test_importing_the_bench_does_not_import_cutlass():
    code = "import sys, benchmarks.kimi_k3.bench_mla; sys.exit('cutlass' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_arguments_parse_into_lists_and_a_fresh_seed():
    args = bench_mla.parse_args(["--tp", "16", "--batch", "1,8", "--context", "4096", "--replays", "7",
                                 "--out", "x.json"])
    assert (args.tp, args.batch, args.context, args.replays) == ((16,), (1, 8), (4096,), 7)
    assert isinstance(args.seed, int)
    assert args.command == ("python -m benchmarks.kimi_k3.bench_mla --tp 16 --batch 1,8 --context 4096 --replays 7 "
                            "--out x.json")
    defaults = bench_mla.parse_args(["--out", "x.json", "--seed", "5"])
    assert (defaults.tp, defaults.batch, defaults.context, defaults.seed) == ((8, 16), (1, 8, 64), (4096, 32768), 5)


@pytest.mark.parametrize("argv, message", [
    (["--batch", "1,x"], "expected comma-separated integers"),
    (["--context", "0"], "expected positive integers"),
    (["--tp", ""], "expected positive integers"),
    (["--batch", "64", "--context", "200000"], "GB of GPU memory"),
])
def test_bad_arguments_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench_mla.parse_args([*argv, "--out", "x.json"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_the_out_file_is_required(capsys):
    with pytest.raises(SystemExit):
        bench_mla.parse_args(["--tp", "8"])
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("m", [1, 8, 64])
@pytest.mark.parametrize("context", [4096, 32768])
def test_the_issue_s_configurations_rotate_past_l2_within_the_memory_budget(m, context):
    nbytes = bench_mla.cache_bytes(m, context)
    assert nbytes == m * (context + 1) * ROW_BYTES
    copies = bench_mla.rotation(nbytes)
    assert copies * nbytes >= 3 * L2_BYTES and copies >= 3
    assert bench_mla.peak_device_bytes(m, context) < bench_mla.MAX_DEVICE_BYTES


def test_copies_follow_the_bytes():
    # 4097 rows: 4.7 MB a copy, 34 copies; at M=64, 32769 rows: 2.4 GB a copy, the minimum of 3
    assert [bench_mla.rotation(bench_mla.cache_bytes(m, c)) for m, c in [(1, 4096), (8, 32768), (64, 32768)]] == [
        34, 3, 3]
    assert bench_mla.pages_per_sequence(4096) == 65  # the step's row opens a page
    assert bench_mla.pool_bytes(2, 63) == (2 * 1 + bench_mla.SPARE_PAGES) * 64 * ROW_BYTES


@pytest.mark.parametrize("m, rows", [(1, [0]), (8, list(range(8))), (64, [0, 9, 18, 27, 36, 45, 54, 63]),
                                     (9, [0, 1, 2, 3, 5, 6, 7, 8])])
def test_checked_sequences_are_all_or_spread_from_first_to_last(m, rows):
    assert bench_mla.checked_sequences(m) == rows


def test_a_copy_holds_nan_exactly_where_nothing_may_read():
    gen = torch.Generator().manual_seed(3)
    c = bench_mla.random_copy(3, 100, 6, gen, "cpu")  # 101 rows: pages of 64 and 37
    assert c.table.shape == (3, 2)
    used = set(c.table.flatten().tolist())
    assert len(used) == 6 and c.pages.shape[0] == 6 + bench_mla.SPARE_PAGES
    (spare,) = set(range(c.pages.shape[0])) - used
    assert c.pages[spare].isnan().all()
    for i in range(3):
        assert c.pages[c.table[i, 0]].isfinite().all()
        last = c.pages[c.table[i, 1]]
        assert last[:37].isfinite().all() and last[37:].isnan().all()
    assert c.seq_lens.tolist() == [101] * 3 and c.out.isnan().all()
    assert c.workspace.splits == 1  # 2 pages: at least 2 pages per split


def test_the_check_passes_the_oracle_and_names_a_wrong_or_unwritten_row():
    gen = torch.Generator().manual_seed(4)
    d = bench_mla.mla_dims(16)
    c = bench_mla.random_copy(2, 70, d.heads, gen, "cpu")
    rows = bench_mla.checked_sequences(2)
    ref = bench_mla.reference(c, rows, d)
    assert ref.shape == (2, d.heads, 512) and ref.isfinite().all()
    out = ref.to(torch.bfloat16)  # the kernel's output dtype: bf16 rounding alone stays well inside
    assert bench_mla.max_row_error(out, ref, rows, "test") < 5e-3
    wrong = out.clone()
    wrong[1, 4] *= 1.1
    with pytest.raises(bench_mla.BenchError, match="test: sequence 1, head 4: rel err"):
        bench_mla.max_row_error(wrong, ref, rows, "test")
    wrong[1, 4] = float("nan")
    with pytest.raises(bench_mla.BenchError, match="sequence 1, head 4 holds NaN"):
        bench_mla.max_row_error(wrong, ref, rows, "test")


def test_rows_are_perf_evidence_with_a_context_axis():
    kernel = {"time": {"median": 10.0, "spread_pct": 2.0, "runs": 100}, "copies": 5, "splits": 16,
              "rel_err": 2e-3, "checked": 8}
    read = {"median": 9.0, "spread_pct": 1.0, "runs": 100, "layout": "grid-stride", "ctas": 264, "in_flight": 4,
            "swept": 21, "bytes": 1}
    rows = [bench_mla.perf_row("sm_90", 8, 8, context, 12, kernel, read, seed=7) for context in (4096, 32768)]
    evidence = PerfEvidence(commit="0123abc", command="python -m benchmarks.kimi_k3.bench_mla", created=datetime.now(
        timezone.utc), hardware={"gpu": "NVIDIA H200", "count": 1, "driver": "1", "arch": "sm_90"}, rows=rows)
    row = evidence.rows[0]
    assert row.axes == {"arch": "sm_90", "tp": 8, "dcp": 1, "batch": 8, "spec": "none", "layer": "mla_attention",
                        "context": 4096}
    assert row.candidate.median == 10.0 and row.baseline.median == 9.0 and row.speedup == 0.9
    assert row.floor == pytest.approx(8 * 4097 * ROW_BYTES / 4.3e12 * 1e6)
    for part in ("cache bytes 37757952", "5 rotated copies", "16 splits", "2.0e-03 over 8 of 8", "264 CTAs x 4",
                 "best of 21 layouts", "seed 7"):
        assert part in row.note
    assert evidence.rows[1].axes["context"] == 32768
