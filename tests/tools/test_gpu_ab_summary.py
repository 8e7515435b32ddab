"""tools/gpu_ab_summary.py: the table tools/gpu-ab.sh prints at the end of an A/B device run (base commit against the
working tree, rounds alternating), and its refusals of files it cannot compare."""
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
    header, tp8, tp16 = gpu_ab_summary.summarize(gpu_ab_summary.collect(files))
    assert header.split()[:4] == ["layer", "tp", "M", "context"]
    assert tp8.split() == ["kda_moe", "8", "1", "4096", "122.20", "122.00-122.40", "119.20", "119.00-119.40", "50.0",
                           "2.444", "2.384", f"{119.2 / 122.2:.3f}"]
    assert tp16.split()[4:8] == ["95.50", "95.00-96.00", "91.50", "91.00-92.00"]  # TPs in numeric order


@pytest.mark.parametrize(("name", "content", "message"), [
    ("base-1.json", {"rows": []}, "not an A/B result"),
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
    assert "rows measured for one variant only: [('moe', 16, 1, 4096)]" in capsys.readouterr().err


def test_no_files_no_table(capsys):
    assert gpu_ab_summary.main([]) == 1
    assert "no rows" in capsys.readouterr().err
