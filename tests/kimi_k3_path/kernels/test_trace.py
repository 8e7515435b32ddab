"""kernels/trace.py's host side on CPU: the record buffers, the active trace, and the summary of per-CTA records. The
kernels' probes are checked in test_compile.py (SASS) and on the H200 (test_kernels_gpu.py)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.kernels.trace import (  # noqa: E402
    UNWRITTEN,
    CtaTrace,
    max_resident_per_sm,
    summarize,
    trace_address,
    tracing,
)


def test_a_launch_is_traced_only_inside_tracing_and_only_if_its_buffer_holds_its_grid():
    trace = CtaTrace({"front": 4, "gemm1": 2}, "cpu")
    assert trace_address("front", 4) == 0
    with tracing(trace):
        assert trace_address("front", 4) == trace.buffers["front"].data_ptr()
        assert trace_address("finalize", 100) == 0  # not asked for
        with pytest.raises(ValueError, match="launch 'gemm1' has 3 CTAs but its buffer holds 2"):
            trace_address("gemm1", 3)
        with pytest.raises(RuntimeError, match="already active"):
            with tracing(CtaTrace({"front": 1}, "cpu")):
                pass
    assert trace_address("front", 4) == 0


def test_buffers_start_unwritten_and_reset_to_it():
    trace = CtaTrace({"gemm2": 3}, "cpu")
    trace.buffers["gemm2"].fill_(7)
    trace.reset()
    assert trace.records() == {"gemm2": [(UNWRITTEN,) * 5] * 3}
    with pytest.raises(ValueError, match="positive integers"):
        CtaTrace({"gemm2": 0}, "cpu")


def test_summary_is_relative_to_the_first_start_of_any_launch():
    records = {  # (start ns, end ns, SM, start cycle, end cycle)
        "front": [(1_000, 5_000, 0, 0, 8_000), (1_000, 6_000, 1, 10, 10_010), (3_000, 9_000, 0, 8_500, 20_500)],
        "gemm1": [(9_500, 12_000, 0, 5, 2_505), (9_000, 13_000, 1, 0, 4_000)],
    }
    s = summarize(records, sms=2)
    assert s["front"]["start_us"] == {"first": 0.0, "median": 0.0, "last": 2.0}
    assert s["front"]["end_us"] == {"first": 4.0, "median": 5.0, "last": 8.0}
    assert s["front"]["cta_life_us"] == 5.0 and s["front"]["sms"] == 2 and s["front"]["max_resident_per_sm"] == 2
    assert s["gemm1"]["start_us"]["first"] == 8.0 and s["gemm1"]["max_resident_per_sm"] == 1
    # All cycles over all nanoseconds: (8000 + 10000 + 12000) / (4000 + 5000 + 6000) cycles per ns.
    assert s["front"]["sm_mhz"] == 2000.0 and s["gemm1"]["sm_mhz"] == 1000.0


def test_a_place_freed_at_the_tick_another_cta_starts_is_not_counted_twice():
    assert max_resident_per_sm([(0, 10, 5, 0, 1), (10, 20, 5, 1, 2), (10, 20, 6, 1, 2)]) == 1
    assert max_resident_per_sm([(0, 10, 5, 0, 1), (9, 20, 5, 1, 2), (9, 12, 5, 1, 2)]) == 3


@pytest.mark.parametrize("record, message", [
    ((UNWRITTEN, 10, 0, 0, 1), "record not written"),
    ((5, UNWRITTEN, 0, 0, 1), "record not written"),
    ((5, 10, 0, 0, UNWRITTEN), "record not written"),
    ((5, 10, 0), "record not written"),
    ((5, 4, 0, 0, 1), "bad record"),
    ((5, 6, 0, 9, 8), "bad record"),
    ((5, 6, 132, 0, 1), "bad record"),
])
def test_a_cta_that_did_not_record_fails_the_summary(record, message):
    with pytest.raises(ValueError, match=f"launch 'front', CTA 1: {message}"):
        summarize({"front": [(0, 1, 0, 0, 2), record]})


def test_a_launch_without_records_fails_the_summary():
    with pytest.raises(ValueError, match="has no records"):
        summarize({"front": []})


def test_a_launch_whose_ctas_all_lived_under_a_timer_tick_has_no_clock():
    s = summarize({"front": [(5, 5, 0, 10, 20), (7, 7, 1, 3, 9)]}, sms=2)
    assert s["front"]["sm_mhz"] is None and s["front"]["cta_life_us"] == 0.0

