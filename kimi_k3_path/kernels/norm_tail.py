"""The latent RMSNorm at the end of GEMM2 from 2 tokens (gemm2_mma.py): GEMM2's last CTAs to arrive normalize y_lat
a token each, and GEMM1 (either form) zeroes y_lat for it."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import WARP, arrival, lane_group_sum, ld_coherent_f32, wait_for_all
from .gemv import WARPS_PER_CTA


@cute.jit
def zero_y_lat(y_lat: cute.Tensor, first: Int32, threads: Int32, m_count: Int32, latent: cutlass.Constexpr):
    """Zero y_lat [M, L] for this step's GEMM2, grid-stride (stream order puts GEMM2 after the GEMM1 launch)."""
    for idx in cutlass.range(first, m_count * latent, threads):
        y_lat[idx // latent, idx % latent] = Float32(0.0)


def alloc_tail_smem(smem):
    """(flag, partial): the last-CTA flag and the norm's per-warp partial sums (64 bytes)."""
    flag = smem.allocate_tensor(Int32, cute.make_layout(4), byte_alignment=16)
    partial = smem.allocate_tensor(Float32, cute.make_layout(WARPS_PER_CTA), byte_alignment=16)
    return flag, partial


TAIL_SMEM_BYTES = 64


# GEMM2's last CTAs share the latent norm, a token at a time each, up to one per token of the largest batch: one CTA
# for all tokens took the TP8 M=64 block to 1017 us against 834 (kimi_k3_kernels.md §6).
NORM_TAIL_CTAS = 64


@cute.jit
def norm_tail(
    y_lat: cute.Tensor,
    gamma: cute.Tensor,
    normed: cute.Tensor,
    counter: cute.Tensor,
    flag: cute.Tensor,
    partial: cute.Tensor,
    tidx: Int32,
    m_count: Int32,
    ctas: Int32,
    latent: cutlass.Constexpr,
    eps: cutlass.Constexpr,
    tail_ctas: cutlass.Constexpr = NORM_TAIL_CTAS,
):
    """normed = rms_norm(y_lat) * gamma in bf16, by the last n = min(M, tail_ctas) of GEMM2's `ctas` CTAs (empty slots
    count too) to arrive on counter[0]: the one that arrived j-th among them takes tokens j, j + n, ... once all `ctas`
    have arrived (common.wait_for_all, which leaves both counters zero)."""
    place = arrival(counter.iterator, flag, tidx) - (ctas - cutlass.min(m_count, tail_ctas))
    if place >= 0:
        tail = cutlass.min(m_count, tail_ctas)
        wait_for_all(counter, tidx, ctas, tail)
        # All 256 threads per token row (coalesced 4-byte loads from L2), partial sums meet in shared memory. The
        # second pass reads the row again: keeping it in registers took GEMM2 at TP16 from 128 to 140 registers.
        per_thread: cutlass.Constexpr = latent // (WARPS_PER_CTA * WARP)
        lane = tidx % WARP
        for t in cutlass.range(m_count, unroll=1):
            if t % tail == place:  # (a loop from `place` in steps of `tail`: 12 more registers at TP16)
                row_addr = y_lat.iterator.toint() + Int64(t) * (latent * 4)
                sq = Float32(0.0)
                for i in cutlass.range_constexpr(per_thread):
                    v = ld_coherent_f32(row_addr + Int64(tidx + i * WARPS_PER_CTA * WARP) * 4)
                    sq = sq + v * v
                sq = lane_group_sum(sq, WARP)
                if lane == 0:
                    partial[tidx // WARP] = sq
                cute.arch.sync_threads()
                total = Float32(0.0)
                for w in cutlass.range_constexpr(WARPS_PER_CTA):
                    total = total + partial[w]
                rstd = cute.math.rsqrt(total / Float32(latent) + Float32(eps))
                for i in cutlass.range_constexpr(per_thread):
                    k = tidx + i * WARPS_PER_CTA * WARP
                    v = ld_coherent_f32(row_addr + Int64(k) * 4)
                    normed[t, k] = (v * rstd * gamma[k]).to(BFloat16)
                cute.arch.sync_threads()
