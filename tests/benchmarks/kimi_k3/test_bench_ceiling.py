"""The read-ceiling bench's host side on CPU: its segments file, the issue's criteria, the L2 rotation. The reads run
on the H200 (test_bench_ceiling_gpu.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.kimi_k3 import bench_ceiling
from benchmarks.kimi_k3.bench_ceiling import (
    SEGMENTS,
    SegmentsError,
    block_chains,
    criterion,
    layouts,
    load_segments,
    rotation,
    words_of,
)

# The one-token block's launches as bench_moe --kernels-out recorded them on the H200 at commit ee24be6 (copied
# from that run's folder, which later left the tree: git show ee24be6:kimi_k3_path/evidence/run-ee24be6/).
RECORD = Path(__file__).parent / "data" / "moe_kernels_m1.json"


def test_the_block_chains_of_the_record_are_its_four_launches_in_order():
    chains = block_chains(load_segments(RECORD))
    assert set(chains) == {8, 16}
    rows = {(r["tp"], r["kernel"]): r["weight_bytes"] for r in json.loads(RECORD.read_text())}
    assert chains[8] == [next(n for (tp, name), n in rows.items() if tp == 8 and name.startswith(prefix))
                         for prefix in SEGMENTS]
    assert sum(chains[8]) == 183_748_096  # the TP8 block's 183.7 MB (docs/design/kimi_k3_kernels.md)


def test_the_chain_follows_the_launches_whichever_carries_the_shared_gate_up():
    names = ("front (router + down_proj)", "experts_gemm1_situ", "experts_gemm2_combine_norm + shared_gate_up",
             "finalize (up_proj + shared down)")
    rows = [{"tp": 8, "batch": 1, "kernel": name, "weight_bytes": 1000 * (i + 1)} for i, name in enumerate(names)]
    rows.append({"tp": 8, "batch": 1, "kernel": "block [CUDA cores]", "weight_bytes": 7})
    assert block_chains(rows) == {8: [1000, 2000, 3000, 4000]}


def test_a_tp_missing_a_segment_has_no_chain():
    rows = [{"tp": 8, "batch": 1, "kernel": name, "weight_bytes": 1000} for name in SEGMENTS[:3]]
    assert block_chains(rows) == {}


@pytest.mark.parametrize("text, message", [
    ("not json", "cannot read kernel rows"),
    ('{"kernel": "x"}', "expected a JSON list"),
    ('[{"tp": 8}]', "row 0 is not a kernel row"),
    ('[{"kernel": "front", "weight_bytes": -3}]', "row 0 (front): weight_bytes must be a positive integer"),
    ('[{"kernel": "block [CUDA cores]", "median_us": 3.0}]', "no kernel rows with weight_bytes"),
])
def test_a_bad_segments_file_is_named_with_the_reason(tmp_path, text, message):
    path = tmp_path / "kernels.json"
    path.write_text(text)
    with pytest.raises(SegmentsError, match=str(path)) as err:
        load_segments(path)
    assert message in str(err.value)


def test_main_refuses_a_bad_segments_file_before_touching_the_gpu(tmp_path, capsys):
    path = tmp_path / "kernels.json"
    path.write_text("[]")
    assert bench_ceiling.main(["--segments", str(path), "--out", str(tmp_path / "out.json")]) == 2
    assert f"bench_ceiling: {path}: no kernel rows" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()


def test_from_50_mb_the_criterion_is_bandwidth_below_it_the_floor_ratio():
    bw = 4.3e12
    big = criterion(51_380_224, 13.0, bw)  # 3.95 TB/s
    assert big["rule"] == ">= 3.9 TB/s" and big["met"] and big["tb_s"] == pytest.approx(3.952, abs=1e-3)
    assert not criterion(51_380_224, 13.3, bw)["met"]  # 3.86 TB/s
    small = criterion(11_712_512, 3.5, bw)  # floor 2.72 us
    assert small["rule"] == "<= 1.3x floor" and small["met"] and small["floor_ratio"] == pytest.approx(1.285, abs=1e-3)
    assert not criterion(11_712_512, 3.6, bw)["met"]


def test_every_size_is_rotated_through_three_l2s_of_buffers():
    assert rotation(200_000_000) == 3
    assert rotation(5_863_424) * 5_863_424 >= 3 * 50 * 2**20
    assert words_of(17) == 8 and words_of(16) == 4  # whole 16-byte vectors


def test_the_sweep_has_grid_stride_layouts_and_one_batch_per_cta_reading_every_vector():
    configs = layouts(23_396_352, 132, 256)
    grid = [c for c in configs if c[0] == "grid-stride"]
    assert len(grid) == len(bench_ceiling.CTAS_PER_SM) * len(bench_ceiling.IN_FLIGHT)
    assert {ctas for _, ctas, _ in grid} == {132 * n for n in bench_ceiling.CTAS_PER_SM}
    for _, ctas, in_flight in (c for c in configs if c[0] == "one batch per CTA"):
        vectors = 23_396_352 // 16
        assert (ctas - 1) * 256 * in_flight < vectors <= ctas * 256 * in_flight


def test_staged_reads_sweep_up_to_16_vectors_per_thread_registers_up_to_8():
    staged = layouts(62_390_272, 132, 256, "bulk")
    assert {n for _, _, n in staged} == set(bench_ceiling.STAGED_IN_FLIGHT) and max(bench_ceiling.IN_FLIGHT) == 8
    assert len(staged) == (len(bench_ceiling.CTAS_PER_SM) + 1) * len(bench_ceiling.STAGED_IN_FLIGHT)


@pytest.mark.parametrize("via", ["tma", "cp.async,bulk"])
def test_main_refuses_an_unknown_way_in_or_one_without_registers(via, tmp_path, capsys):
    pytest.importorskip("torch", reason="the check follows the [kernels] extra's import")
    pytest.importorskip("cutlass", reason="the check follows the [kernels] extra's import")
    assert bench_ceiling.main(["--segments", str(RECORD), "--out", str(tmp_path / "out.json"), "--via", via]) == 2
    assert f"--via {via}: each must be one of registers, cp.async, bulk" in capsys.readouterr().err
    assert not (tmp_path / "out.json").exists()
