"""Finalize of the latent MoE: latent RMSNorm of the combined expert output, then one skinny GEMM that sums the
up-projection and the shared experts' down-projection:

    out[M, H] = rms_norm(y_lat) @ W_up^T + a_sh @ W_sh2^T      (W_up [H, L] whole or this rank's row shard)

The weighted top-k combine already happened in the GEMM2 epilogue (fp32 reductions into y_lat). The norm needs a
whole latent row per token, so it is its own small launch (one CTA per token) that writes bf16 normed rows; the
finalize GEMM reads them and the shared activation as two K segments of one accumulation.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import WARP, lane_group_sum
from .gemv import WARPS_PER_CTA, accumulate_rows, check_k, zero_acc

NORM_THREADS = 256


class LatentRmsNorm:
    """y_lat [M, L] fp32 -> normed [M, L] bf16 = y * rsqrt(mean(y^2) + eps) * gamma (gamma [L] fp32)."""

    def __init__(self, latent: int, eps: float):
        if latent % NORM_THREADS:
            raise ValueError(f"LatentRmsNorm: latent={latent} is not a multiple of {NORM_THREADS}")
        self.l, self.eps = latent, eps

    @cute.jit
    def __call__(self, y_lat: cute.Tensor, gamma: cute.Tensor, normed: cute.Tensor, stream: cuda.CUstream):
        self.kernel(y_lat, gamma, normed).launch(
            grid=[y_lat.shape[0], 1, 1], block=[NORM_THREADS, 1, 1], smem=64, stream=stream
        )

    @cute.kernel
    def kernel(self, y_lat: cute.Tensor, gamma: cute.Tensor, normed: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        m, _, _ = cute.arch.block_idx()
        per_thread: cutlass.Constexpr = self.l // NORM_THREADS
        vals = cute.make_rmem_tensor(per_thread, Float32)
        sq = Float32(0.0)
        for i in cutlass.range_constexpr(per_thread):
            v = y_lat[m, tidx + i * NORM_THREADS]
            vals[i] = v
            sq = sq + v * v
        sq = lane_group_sum(sq, WARP)
        smem = cutlass.memory.SmemAllocator()
        partial = smem.allocate_tensor(Float32, cute.make_layout(NORM_THREADS // WARP), byte_alignment=16)
        if tidx % WARP == 0:
            partial[tidx // WARP] = sq
        cute.arch.sync_threads()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(NORM_THREADS // WARP):
            total = total + partial[w]
        rstd = cute.math.rsqrt(total / Float32(self.l) + Float32(self.eps))
        for i in cutlass.range_constexpr(per_thread):
            k = tidx + i * NORM_THREADS
            normed[m, k] = (vals[i] * rstd * gamma[k]).to(BFloat16)


class UpProjSharedAdd:
    """out [M, H] bf16 = normed [M, L] @ W_up [H, L]^T + a_sh [M, Ish] @ W_sh2 [H, Ish]^T (all bf16, fp32 acc)."""

    def __init__(self, hidden: int, latent: int, shared_inter: int, mt: int):
        if hidden % WARPS_PER_CTA:
            raise ValueError(f"UpProjSharedAdd: hidden={hidden} is not a multiple of {WARPS_PER_CTA}")
        check_k(latent, "UpProjSharedAdd (latent)")
        check_k(shared_inter, "UpProjSharedAdd (shared intermediate)")
        self.h, self.l, self.s, self.mt = hidden, latent, shared_inter, mt

    @cute.jit
    def __call__(self, normed, w_up, a_sh, w_sh2, out, stream: cuda.CUstream):
        self.kernel(normed, w_up, a_sh, w_sh2, out, normed.shape[0]).launch(
            grid=[self.h // WARPS_PER_CTA, 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, normed, w_up, a_sh, w_sh2, out, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % WARP
        row = bidx * WARPS_PER_CTA + tidx // WARP
        up_addr = w_up.iterator.toint() + Int64(row) * (self.l * 2)
        sh_addr = w_sh2.iterator.toint() + Int64(row) * (self.s * 2)
        for m_first in cutlass.range(0, m_count, self.mt):
            acc = zero_acc(1, self.mt)
            accumulate_rows(acc, up_addr, up_addr, normed.iterator.toint(), lane, m_first, m_count, self.l, 1, self.mt)
            accumulate_rows(acc, sh_addr, sh_addr, a_sh.iterator.toint(), lane, m_first, m_count, self.s, 1, self.mt)
            for mi in cutlass.range_constexpr(self.mt):
                total = lane_group_sum(acc[0, mi], WARP)
                if lane == 0 and m_first + mi < m_count:
                    out[m_first + mi, row] = total.to(BFloat16)


def latent_rms_norm(y_lat, gamma, normed, eps: float, stream) -> None:
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    m, latent = y_lat.shape
    expect("y_lat", y_lat, (m, latent), "float32")
    expect("gamma", gamma, (latent,), "float32")
    expect("normed", normed, (m, latent), "bfloat16")

    def build():
        md = dyn()
        args = (fake(Float32, (md, latent)), fake(Float32, (latent,)), fake(BFloat16, (md, latent)), fake_stream())
        return LatentRmsNorm(latent, eps), args

    fn = compile_cached(("latent_rms_norm", latent, eps), build)
    fn(to_cute(y_lat, True), to_cute(gamma), to_cute(normed, True), cu_stream(stream))


def up_proj_shared_add(normed, w_up, a_sh, w_sh2, out, stream) -> None:
    from .gemv import token_tile
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    m, latent = normed.shape
    hidden, inter = w_sh2.shape
    expect("normed", normed, (m, latent), "bfloat16")
    expect("w_up", w_up, (hidden, latent), "bfloat16")
    expect("a_sh", a_sh, (m, inter), "bfloat16")
    expect("w_sh2", w_sh2, (hidden, inter), "bfloat16")
    expect("out", out, (m, hidden), "bfloat16")
    mt = token_tile(m)

    def build():
        md = dyn()
        args = (
            fake(BFloat16, (md, latent)),
            fake(BFloat16, (hidden, latent)),
            fake(BFloat16, (md, inter)),
            fake(BFloat16, (hidden, inter)),
            fake(BFloat16, (md, hidden)),
            fake_stream(),
        )
        return UpProjSharedAdd(hidden, latent, inter, mt), args

    fn = compile_cached(("up_proj_shared_add", hidden, latent, inter, mt), build)
    fn(to_cute(normed, True), to_cute(w_up), to_cute(a_sh, True), to_cute(w_sh2), to_cute(out, True), cu_stream(stream))


def finalize(y_lat, gamma, normed, w_up, a_sh, w_sh2, out, eps: float, stream) -> None:
    """out = rms_norm(y_lat) @ w_up^T + a_sh @ w_sh2^T (two launches; `normed` [M, L] bf16 is scratch)."""
    latent_rms_norm(y_lat, gamma, normed, eps, stream)
    up_proj_shared_add(normed, w_up, a_sh, w_sh2, out, stream)
