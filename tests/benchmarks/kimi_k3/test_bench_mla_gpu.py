"""The MLA attention benchmark on the H200: a tiny configuration end to end (checks, times, writes evidence)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from benchmarks.kimi_k3 import bench_mla  # noqa: E402
from gatekeeper.evidence import PerfEvidence  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_tiny_run_checks_times_and_writes_one_plausible_row(tmp_path, seed):
    out = tmp_path / "mla.json"
    rc = bench_mla.main(["--tp", "8", "--batch", "1", "--context", "128", "--replays", "5", "--commit", "0123abc",
                         "--seed", str(seed), "--out", str(out)])
    assert rc == 0
    (row,) = PerfEvidence.model_validate_json(out.read_text()).rows
    assert row.axes == {"arch": "sm_90", "tp": 8, "dcp": 1, "batch": 1, "spec": "none", "layer": "mla_attention",
                        "context": 128}
    assert row.baseline is not None and row.floor is not None
    # Neither the kernel nor a pure read beats the byte floor; a 148 KB launch is mostly launch latency, so only
    # loose bounds on the top (a few us in all).
    assert row.floor < row.baseline.median < 50 and row.floor < row.candidate.median < 50
    assert "max rel err per output row" in row.note and f"seed {seed}" in row.note
