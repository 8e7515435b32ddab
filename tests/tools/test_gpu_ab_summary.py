"""tools/gpu_ab_summary.py: the table tools/gpu-ab.sh prints at the end of an A/B device run (a base commit against the
working tree and any other prepared commits, rounds alternating), and its refusals of files it cannot compare."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_ab_summary.py"
spec = importlib.util.spec_from_file_location("gpu_ab_summary", TOOL)
gpu_ab_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_ab_summary)


def row(layer: str, tp: int, median: float, floor: float = 50.0) -> dict:
    return {"axes": {"arch": "sm_90", "tp": tp, "dcp": 1, "batch": 1, "spec": "none", "layer": layer, "context": 4096},
            "candidate": {"median": median, "spread_pct": 0.5, "runs": 20}, "floor": floor}


def write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"commit": "0000000", "rows": rows}))
    return path


def test_medians_over_rounds_their_range_and_the_ratio_per_row(tmp_path):
    files = [write(tmp_path, "ab-base-1.json", [row("kda_moe", 16, 96.0), row("kda_moe", 8, 122.0)]),
             write(tmp_path, "ab-base-2.json", [row("kda_moe", 16, 95.0), row("kda_moe", 8, 122.4)]),
             write(tmp_path, "ab-tree-1.json", [row("kda_moe", 16, 92.0), row("kda_moe", 8, 119.0)]),
             write(tmp_path, "ab-tree-2.json", [row("kda_moe", 16, 91.0), row("kda_moe", 8, 119.4)])]
    header, tp8_base, tp8_tree, tp16_base, tp16_tree = gpu_ab_summary.summarize(gpu_ab_summary.collect(files))
    assert header.split() == ["layer", "tp", "M", "context", "variant", "us", "range", "floor", "us", "x", "floor",
                              "x", "base"]
    assert tp8_base.split() == ["kda_moe", "8", "1", "4096", "base", "122.20", "122.00-122.40", "50.0", "2.444",
                                "1.000"]
    assert tp8_tree.split() == ["kda_moe", "8", "1", "4096", "tree", "119.20", "119.00-119.40", "50.0", "2.384",
                                f"{119.2 / 122.2:.3f}"]
    assert tp16_base.split()[1] == "16" and tp16_tree.split()[4:7] == ["tree", "91.50", "91.00-92.00"]  # TP order


def test_every_prepared_variant_gets_its_line_and_ratio_to_the_base(tmp_path):
    files = [write(tmp_path, f"ab-{variant}-{r}.json", [row("moe", 8, median + r)])
             for variant, median in (("q_b_only", 101.0), ("base", 100.0), ("tree", 98.0), ("gate_v2", 97.0))
             for r in (1, 2)]
    lines = gpu_ab_summary.summarize(gpu_ab_summary.collect(files))
    assert [line.split()[4] for line in lines[1:]] == ["base", "tree", "gate_v2", "q_b_only"]
    assert [line.split()[-1] for line in lines[1:]] == [f"{v / 101.5:.3f}" for v in (101.5, 99.5, 98.5, 102.5)]


def write_launches(tmp_path: Path, name: str, rows: list[tuple[str, int, int, float]]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps([{"tp": tp, "batch": m, "kernel": kernel, "median_us": us, "spread_pct": 1.0,
                                 "weight_bytes": 1, "effective_tb_s": 1.0, "floor_us": 20.0}
                                for kernel, tp, m, us in rows]))
    return path


def test_the_moe_benchs_launches_alone_get_a_second_table_in_the_blocks_order(tmp_path):
    block = [("front", 8, 64, 60.0), ("gemm1", 8, 64, 200.0), ("finalize", 8, 64, 50.0), ("front", 8, 16, 40.0)]
    files = [write(tmp_path, f"ab-{v}-1.json", [row("latent_moe", 8, 500.0)]) for v in ("base", "tree")]
    files += [write_launches(tmp_path, "ab-base-1.launches.json", block),
              write_launches(tmp_path, "ab-tree-1.launches.json", [(k, tp, m, us * 0.9) for k, tp, m, us in block])]
    lines = gpu_ab_summary.summarize(gpu_ab_summary.collect(files))
    assert lines[3] == "" and lines[4].split()[:5] == ["launch", "alone", "tp", "M", "variant"]
    assert [line.split()[:4] for line in lines[5::2]] == [
        ["front", "8", "16", "base"], ["front", "8", "64", "base"], ["gemm1", "8", "64", "base"],
        ["finalize", "8", "64", "base"]]
    assert lines[10].split() == ["gemm1", "8", "64", "tree", "180.00", "180.00-180.00", "20.0", "9.000", "0.900"]


def test_launches_of_one_variant_only_are_an_error(tmp_path):
    files = [write_launches(tmp_path, "ab-base-1.launches.json", [("front", 8, 64, 60.0)]),
             write_launches(tmp_path, "ab-tree-1.launches.json", [("front", 8, 16, 60.0)])]
    with pytest.raises(gpu_ab_summary.SummaryError, match="rows measured for one of base and tree only"):
        gpu_ab_summary.collect(files)
    bad = tmp_path / "ab-base-2.launches.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(gpu_ab_summary.SummaryError, match="not the MoE bench's launches"):
        gpu_ab_summary.collect([bad])


def test_a_run_without_a_base_has_nothing_to_divide_by(tmp_path):
    files = [write(tmp_path, "ab-tree-1.json", [row("moe", 8, 50.0)]),
             write(tmp_path, "ab-other-1.json", [row("moe", 8, 49.0)])]
    with pytest.raises(gpu_ab_summary.SummaryError, match=r"no base variant among \['other', 'tree'\]"):
        gpu_ab_summary.collect(files)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("base-1.json", {"rows": []}, "not an A/B result"),
    ("ab-Base-1.json", {"rows": []}, "not an A/B result"),
    ("ab-base-1.json", {"commit": "x"}, "not PerfEvidence"),
    ("ab-base-1.json", {"rows": [row("moe", 8, 1.0), row("moe", 8, 2.0)]}, "appears twice"),
])
def test_a_file_it_cannot_read_is_named(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(json.dumps(content))
    with pytest.raises(gpu_ab_summary.SummaryError, match=message) as error:
        gpu_ab_summary.collect([path])
    assert str(path) in str(error.value)


def test_a_row_of_one_variant_only_is_an_error_not_a_gap(tmp_path, capsys):
    files = [write(tmp_path, "ab-base-1.json", [row("moe", 8, 50.0), row("moe", 16, 40.0)]),
             write(tmp_path, "ab-tree-1.json", [row("moe", 8, 49.0)])]
    assert gpu_ab_summary.main([str(f) for f in files]) == 1
    assert "rows measured for one of base and tree only: [('moe', 16, 1, 4096)]" in capsys.readouterr().err


def test_no_files_no_table(capsys):
    assert gpu_ab_summary.main([]) == 1
    assert "no rows" in capsys.readouterr().err
