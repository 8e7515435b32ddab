"""The AttnRes benchmark on the GPU: one small configuration end to end (checks, times, writes evidence)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from benchmarks.kimi_k3 import bench_attn_res  # noqa: E402
from gatekeeper.evidence import PerfEvidence  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_small_run_checks_times_and_writes_plausible_rows(tmp_path, seed):
    out = tmp_path / "attn_res.json"
    rc = bench_attn_res.main(["--batch", "1,3", "--blocks", "2", "--replays", "5", "--commit", "0123abc", "--seed",
                              str(seed), "--out", str(out)])
    assert rc == 0
    rows = PerfEvidence.model_validate_json(out.read_text()).rows
    assert [(r.axes["layer"], r.axes["batch"]) for r in rows] == [("attn_res", 1), ("attn_res", 3)]
    for row in rows:
        # neither form beats the byte floor; a launch of a few hundred KB is latency, not bytes
        assert row.floor < row.candidate.median < 50 and row.floor < row.baseline.median < 50
        assert "one/cluster" in row.note and f"seed {seed}" in row.note
