"""Shared experts' first half: a[M, Ish] = situ_glu(x @ W_sh13[:Ish]^T, x @ W_sh13[Ish:]^T) for this rank's
shard. One warp per output column j reads gate row j and up row Ish + j in the same pass over x, so the pair never
leaves registers. The second half (a @ W_sh2^T) is fused into the finalize kernel's up-projection; `SkinnyGemm`
runs it alone where it is needed alone."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Int32, Int64

from .common import WARP, lane_group_sum, situ_glu
from .gemv import WARPS_PER_CTA, accumulate_rows, check_k, zero_acc


class SharedGateUpSitu:
    """x [M, H] bf16 (M dynamic), w13 [2*Ish, H] bf16 (gate rows then up rows) -> a [M, Ish] bf16."""

    def __init__(self, inter: int, hidden: int, mt: int):
        if inter % WARPS_PER_CTA:
            raise ValueError(f"SharedGateUpSitu: shared intermediate={inter} is not a multiple of {WARPS_PER_CTA}")
        check_k(hidden, "SharedGateUpSitu")
        self.i, self.h, self.mt = inter, hidden, mt

    @cute.jit
    def __call__(self, x: cute.Tensor, w13: cute.Tensor, a: cute.Tensor, stream: cuda.CUstream):
        self.kernel(x, w13, a, x.shape[0]).launch(
            grid=[self.i // WARPS_PER_CTA, 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, w13: cute.Tensor, a: cute.Tensor, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % WARP
        j = bidx * WARPS_PER_CTA + tidx // WARP
        gate_addr = w13.iterator.toint() + Int64(j) * (self.h * 2)
        up_addr = w13.iterator.toint() + Int64(self.i + j) * (self.h * 2)
        x_addr = x.iterator.toint()
        for m_first in cutlass.range(0, m_count, self.mt):
            acc = zero_acc(2, self.mt)
            accumulate_rows(acc, gate_addr, up_addr, x_addr, lane, m_first, m_count, self.h, 2, self.mt)
            for mi in cutlass.range_constexpr(self.mt):
                gate = lane_group_sum(acc[0, mi], WARP)
                up = lane_group_sum(acc[1, mi], WARP)
                if lane == 0 and m_first + mi < m_count:
                    a[m_first + mi, j] = situ_glu(gate, up).to(BFloat16)


def shared_gate_up_situ(x, w13, a, stream) -> None:
    """a[M, Ish] = situ_glu(gate, up) of x[M, H] @ w13[2*Ish, H]^T; bf16 CUDA tensors, launched on `stream`."""
    from cutlass import BFloat16

    from .gemv import token_tile
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    m, h = x.shape
    inter = w13.shape[0] // 2
    expect("x", x, (m, h), "bfloat16")
    expect("w13", w13, (2 * inter, h), "bfloat16")
    expect("a", a, (m, inter), "bfloat16")
    mt = token_tile(m)

    def build():
        md = dyn()
        args = (fake(BFloat16, (md, h)), fake(BFloat16, (2 * inter, h)), fake(BFloat16, (md, inter)), fake_stream())
        return SharedGateUpSitu(inter, h, mt), args

    fn = compile_cached(("shared_gate_up_situ", inter, h, mt), build)
    fn(to_cute(x, True), to_cute(w13), to_cute(a, True), cu_stream(stream))


def shared_experts(x, w13, w2, a, out, stream) -> None:
    """Both shared experts of this rank alone: out[M, H] = situ_glu(x @ w13^T) @ w2^T (a: [M, Ish] scratch)."""
    from .gemv import skinny_gemm

    shared_gate_up_situ(x, w13, a, stream)
    skinny_gemm(a, w2, out, stream)
