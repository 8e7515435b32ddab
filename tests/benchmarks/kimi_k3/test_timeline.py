"""benchmarks/kimi_k3/timeline.py: each launch's share of a step's span on its stream, with launches that overlap
(programmatic dependent launch), gaps between them, and spans that nest."""
from __future__ import annotations

import pytest

from benchmarks.kimi_k3.timeline import KernelSpan, PathShare, breakdown_lines, critical_path, short_name


def test_an_early_launch_is_charged_only_what_it_adds_after_the_one_before():
    # attn_res 0-6; in_proj starts at 1 (PDL) and waits until 6, ends at 30; o_proj after a 2 us gap
    spans = [KernelSpan("o_proj", 32.0, 40.0), KernelSpan("attn_res", 0.0, 6.0), KernelSpan("in_proj", 1.0, 30.0)]
    assert critical_path(spans) == [PathShare("attn_res", 6.0, 6.0, 0.0), PathShare("in_proj", 29.0, 24.0, 0.0),
                                    PathShare("o_proj", 8.0, 8.0, 2.0)]


def test_shares_and_gaps_add_up_to_the_span():
    spans = [KernelSpan("a", 10.0, 15.0), KernelSpan("b", 12.0, 14.0), KernelSpan("c", 13.5, 20.0),
             KernelSpan("d", 23.0, 24.5)]
    shares = critical_path(spans)
    assert [s.exclusive_us for s in shares] == [5.0, 0.0, 5.0, 1.5]  # b ends inside a: nothing of its own
    assert sum(s.exclusive_us + s.gap_us for s in shares) == pytest.approx(24.5 - 10.0)


def test_a_span_that_ends_before_it_starts_is_refused():
    with pytest.raises(ValueError, match="kernel bad: ends"):
        critical_path([KernelSpan("bad", 5.0, 4.0)])


def test_the_printed_breakdown_lists_the_launches_in_order_with_the_totals():
    lines = breakdown_lines("kda_moe tp=8 batch=1 candidate",
                            [KernelSpan("in_proj", 1.0, 30.0), KernelSpan("attn_res", 0.0, 6.0)])
    assert lines[0] == ("breakdown kda_moe tp=8 batch=1 candidate: 2 kernels, 30.0 us from first start to last end "
                        "(eager): 30.0 us charged to kernels, 0.0 us idle between them")
    assert [line.split()[-1] for line in lines[2:]] == ["attn_res", "in_proj"]
    assert lines[3].split()[:3] == ["24.0", "29.0", "0.0"]
    assert breakdown_lines("empty", []) == ["breakdown empty: no kernels"]


def test_cute_kernel_names_keep_their_module_class_and_method():
    assert short_name("kernel_cutlass_kernel_kimi_k3_pathkernelsattn_resAttnResMix_object_at__tensorptrbf16") == (
        "attn_resAttnResMix")
    assert short_name("kernel_cutlass_split_kernel_kimi_k3_pathkernelsmla_attentionMlaSplitKv_object_at__t") == (
        "mla_attentionMlaSplitKv.split_kernel")
    assert short_name("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT") == "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
    lines = breakdown_lines("x", [KernelSpan("kernel_cutlass_kernel_kimi_k3_pathkernelsfrontFrontKernel_object_at_0",
                                             0.0, 1.0)])
    assert lines[2].split()[-1] == "frontFrontKernel"
