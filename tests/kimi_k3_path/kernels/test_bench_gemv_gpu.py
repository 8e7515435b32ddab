"""The one-token GEMV benchmark on the H200: a short run checks every kernel against fp32 and writes its rows."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="the bench needs the [kernels] extra")

from kimi_k3_path.kernels import bench_gemv  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_short_gemv_bench_checks_and_times_every_variant(tmp_path):
    out = tmp_path / "gemv.json"
    assert bench_gemv.main(["--replays", "3", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    timed = [r for r in rows if "shape" in r]
    assert len(timed) == len(bench_gemv.SHAPES) * (1 + len(bench_gemv.STREAM_VARIANTS))
    assert all(r["rel_err"] < 1e-2 and r["median_us"] > 0.9 * r["floor_us"] for r in timed), timed
    assert [r["kernel"] for r in rows if "shape" not in r] == [f"tiny kernel, {n} per graph" for n in (1, 3, 30)]
