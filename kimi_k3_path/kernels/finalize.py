"""Finalize of the latent MoE in one launch: latent RMSNorm, up-projection and the shared experts' down-projection
summed into the block output:

    out[M, H] = rms_norm(y_lat) @ W_up^T + a_sh @ W_sh2^T      (W_up [H, L] whole or this rank's row shard)

The weighted top-k combine already happened in the GEMM2 epilogue (fp32 reductions into y_lat), and GEMM2's last
CTA computed rstd[t] = 1/sqrt(mean(y_lat[t]^2) + eps). The norm is linear per token, so it folds into this GEMM:
rms_norm(y)[t] . W_up[h] = rstd[t] * ((gamma * y[t]) . W_up[h]); y_lat is read in fp32 with gamma applied on the
fly, and no normalized copy is ever written. Split-K over the CTA's warps as in gemv.py.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import WARP
from .gemv import BF16_PER_VEC, SCRATCH_BYTES, WARPS_PER_CTA, alloc_scratch, check_k, dot_slice, split_k_reduce, zero_acc

FINALIZE_SPLIT = 4


@cute.jit
def finalize_part(
    y_lat: cute.Tensor,
    gamma: cute.Tensor,
    rstd: cute.Tensor,
    w_up: cute.Tensor,
    a_sh: cute.Tensor,
    w_sh2: cute.Tensor,
    out: cute.Tensor,
    scratch: cute.Tensor,
    cta: Int32,
    warp: Int32,
    lane: Int32,
    m_count: Int32,
    latent: cutlass.Constexpr,
    inter: cutlass.Constexpr,
    mt: cutlass.Constexpr,
):
    part = warp % FINALIZE_SPLIT
    row = cta * (WARPS_PER_CTA // FINALIZE_SPLIT) + warp // FINALIZE_SPLIT
    up_vec: cutlass.Constexpr = latent // BF16_PER_VEC // FINALIZE_SPLIT
    sh_vec: cutlass.Constexpr = inter // BF16_PER_VEC // FINALIZE_SPLIT
    up_addr = w_up.iterator.toint() + Int64(row) * (latent * 2)
    sh_addr = w_sh2.iterator.toint() + Int64(row) * (inter * 2)
    for m_first in cutlass.range(0, m_count, mt, unroll=1):
        acc = zero_acc(2, mt)
        dot_slice(acc, up_addr, up_addr, y_lat.iterator.toint(), gamma.iterator.toint(), part * up_vec, lane,
                  m_first, m_count, 0, 1, latent, True, up_vec, mt)
        dot_slice(acc, sh_addr, sh_addr, a_sh.iterator.toint(), Int64(0), part * sh_vec, lane,
                  m_first, m_count, 1, 1, inter, False, sh_vec, mt)
        split_k_reduce(acc, scratch, warp, lane, FINALIZE_SPLIT, 2, mt)
        if lane == 0 and part == 0:
            for mi in cutlass.range_constexpr(mt):
                if m_first + mi < m_count:
                    out[m_first + mi, row] = (acc[0, mi] * rstd[m_first + mi] + acc[1, mi]).to(BFloat16)


class Finalize:
    """out [M, H] bf16 = rstd * ((gamma * y_lat) @ W_up^T) + a_sh @ W_sh2^T.
    y_lat [M, L] fp32, gamma [L] fp32, rstd [M] fp32, W_up [H, L] bf16, a_sh [M, Ish] bf16, W_sh2 [H, Ish] bf16."""

    def __init__(self, hidden: int, latent: int, shared_inter: int, mt: int):
        if hidden % (WARPS_PER_CTA // FINALIZE_SPLIT):
            raise ValueError(f"Finalize: hidden={hidden} is not a multiple of {WARPS_PER_CTA // FINALIZE_SPLIT}")
        check_k(latent, FINALIZE_SPLIT, "Finalize (latent)")
        check_k(shared_inter, FINALIZE_SPLIT, "Finalize (shared intermediate)")
        self.h, self.l, self.s, self.mt = hidden, latent, shared_inter, mt

    def ctas(self) -> int:
        return self.h // (WARPS_PER_CTA // FINALIZE_SPLIT)

    @cute.jit
    def __call__(self, y_lat, gamma, rstd, w_up, a_sh, w_sh2, out, stream: cuda.CUstream):
        self.kernel(y_lat, gamma, rstd, w_up, a_sh, w_sh2, out, y_lat.shape[0]).launch(
            grid=[self.ctas(), 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], smem=SCRATCH_BYTES, stream=stream
        )

    @cute.kernel
    def kernel(self, y_lat, gamma, rstd, w_up, a_sh, w_sh2, out, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        scratch = alloc_scratch(cutlass.memory.SmemAllocator())
        finalize_part(y_lat, gamma, rstd, w_up, a_sh, w_sh2, out, scratch, bidx, tidx // WARP, tidx % WARP, m_count,
                      self.l, self.s, self.mt)


def finalize(y_lat, gamma, rstd, w_up, a_sh, w_sh2, out, stream) -> None:
    """out = rms_norm(y_lat) @ w_up^T + a_sh @ w_sh2^T, given rstd [M] of y_lat (GEMM2's last CTA makes it)."""
    from .gemv import token_tile
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    m, latent = y_lat.shape
    hidden, inter = w_sh2.shape
    expect("y_lat", y_lat, (m, latent), "float32")
    expect("gamma", gamma, (latent,), "float32")
    expect("rstd", rstd, (m,), "float32")
    expect("w_up", w_up, (hidden, latent), "bfloat16")
    expect("a_sh", a_sh, (m, inter), "bfloat16")
    expect("w_sh2", w_sh2, (hidden, inter), "bfloat16")
    expect("out", out, (m, hidden), "bfloat16")
    mt = token_tile(m)

    def build():
        md = dyn()
        args = (
            fake(Float32, (md, latent)), fake(Float32, (latent,)), fake(Float32, (md,)),
            fake(BFloat16, (hidden, latent)), fake(BFloat16, (md, inter)), fake(BFloat16, (hidden, inter)),
            fake(BFloat16, (md, hidden)), fake_stream(),
        )
        return Finalize(hidden, latent, inter, mt), args

    fn = compile_cached(("finalize", hidden, latent, inter, mt), build)
    fn(to_cute(y_lat, True), to_cute(gamma), to_cute(rstd, True), to_cute(w_up), to_cute(a_sh, True), to_cute(w_sh2),
       to_cute(out, True), cu_stream(stream))
