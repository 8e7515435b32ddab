"""The dense-projection benchmark on the H200: one small configuration end to end (checks, times, writes evidence)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from benchmarks.kimi_k3 import bench_dense  # noqa: E402
from gatekeeper.evidence import PerfEvidence  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_small_run_checks_times_and_writes_plausible_rows(tmp_path, seed):
    out = tmp_path / "dense.json"
    rc = bench_dense.main(["--tp", "16", "--batch", "1,2", "--projection", "kda_f_b", "--replays", "5", "--commit",
                           "0123abc", "--seed", str(seed), "--out", str(out)])
    assert rc == 0
    rows = PerfEvidence.model_validate_json(out.read_text()).rows
    assert [(r.axes["layer"], r.axes["batch"]) for r in rows] == [("kda_f_b", 1), ("kda_f_b", 2)]
    for row in rows:
        # Neither the kernel nor a pure read beats the byte floor; a 197 KB launch is mostly launch latency.
        assert row.floor < row.baseline.median < 50 and row.floor < row.candidate.median < 50
        assert "cuBLAS/dense" in row.note and f"seed {seed}" in row.note
