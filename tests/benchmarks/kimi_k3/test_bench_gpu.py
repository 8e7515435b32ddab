"""The bench harness on the H200: one short run of every layer kind with the kernels as the candidate must
write PerfEvidence whose rows are physically plausible (no faster than the byte floor allows)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from gatekeeper.evidence import PerfEvidence  # noqa: E402
from benchmarks.kimi_k3 import bench  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_short_kernel_bench_writes_plausible_perf_evidence(tmp_path):
    out = tmp_path / "perf.json"
    # In this process, so that the GPU report's coverage includes the cases' code (the CPU tests cover the children).
    rc = bench.main(["--layer", "kda_moe,mla_moe,moe", "--tp", "8", "--batch", "1", "--candidate", "kernels",
                     "--processes", "one", "--replays", "5", "--commit", "0123abc", "--out", str(out)])
    assert rc == 0
    evidence = PerfEvidence.model_validate_json(out.read_text())
    assert [row.axes["layer"] for row in evidence.rows] == ["kda_moe", "mla_moe", "moe"]
    assert evidence.hardware.arch == "sm_90"
    for row in evidence.rows:
        assert row.baseline is not None and row.floor is not None
        # A median below ~90% of the byte floor means the bytes were not really read (L2 reuse, a wrong count).
        assert row.candidate.median > 0.9 * row.floor, row
        assert row.baseline.median > 0.9 * row.floor, row
