"""Skinny bf16 GEMM for decode batches (y[M, N] = x[M, K] @ W[N, K]^T): the routed down-projection 7168 -> 3584,
whole or as this rank's column shard, and the row-dot core the router, shared-expert and finalize kernels reuse.

Mapping: one warp per weight row, lanes stride K in 16-byte vectors (coalesced 512 B per warp load), tokens in
compile-time tiles of `mt` (1, 2, 4 or 8) with a run-time loop over tiles, fp32 accumulation, one warp reduction
per (row, token). Weights stream through L2 only; activations stay in L1 because every warp of the SM rereads them.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import BF16_PER_VEC, VEC_BYTES, WARP, dot_bf16x8, lane_group_sum, ld_weight_v4, load_bf16_tokens

WARPS_PER_CTA = 8


def token_tile(m: int) -> int:
    """Compile-time token tile for a batch of m tokens (a run-time loop covers the rest)."""
    for mt in (1, 2, 4):
        if m <= mt:
            return mt
    return 8


def check_k(k: int, what: str) -> None:
    if k % BF16_PER_VEC:
        raise ValueError(f"{what}: K={k} is not a multiple of {BF16_PER_VEC} (16-byte loads of bf16)")


def unroll_for(steps: int) -> int:
    return 4 if steps % 4 == 0 else (2 if steps % 2 == 0 else 1)


def rows_dot_tokens_step(acc, row_addrs, x_addr: Int64, x_row_bytes, vec, m_first, m_count, mt: int) -> None:
    """acc[r, mi] += dot of the 8 bf16 values at vector `vec` of row r (byte address row_addrs[r]) and of token
    m_first + mi."""
    weights = [ld_weight_v4(addr + Int64(vec) * VEC_BYTES) for addr in row_addrs]
    tokens = load_bf16_tokens(x_addr, x_row_bytes, m_first, m_count, vec, mt)
    for r in range(len(row_addrs)):
        for mi in range(mt):
            acc[r, mi] = dot_bf16x8(weights[r], tokens[mi], acc[r, mi])


@cute.jit
def accumulate_rows(
    acc: cute.Tensor,
    row0: Int64,
    row1: Int64,
    x_addr: Int64,
    lane: Int32,
    m_first: Int32,
    m_count: Int32,
    k: cutlass.Constexpr,
    rows: cutlass.Constexpr,
    mt: cutlass.Constexpr,
):
    """acc[r, mi] += this lane's share of dot(row r, token m_first + mi) over K=k bf16 values (rows: 1 or 2 weight
    rows at byte addresses row0/row1; x rows k values apart). Lanes stride K in 16-byte vectors; a K that is not a
    multiple of 256 ends with a partial warp step. The caller reduces across the warp."""
    row_addrs = [row0, row1][:rows]
    vectors: cutlass.Constexpr = k // BF16_PER_VEC
    full: cutlass.Constexpr = vectors // WARP
    for step in cutlass.range(full, unroll=unroll_for(full)):
        rows_dot_tokens_step(acc, row_addrs, x_addr, k * 2, lane + step * WARP, m_first, m_count, mt)
    if cutlass.const_expr(vectors % WARP != 0):
        if lane < vectors % WARP:
            rows_dot_tokens_step(acc, row_addrs, x_addr, k * 2, lane + full * WARP, m_first, m_count, mt)


def zero_acc(rows: int, mt: int):
    acc = cute.make_rmem_tensor(cute.make_layout((rows, mt), stride=(mt, 1)), Float32)
    for r in range(rows):
        for mi in range(mt):
            acc[r, mi] = Float32(0.0)
    return acc


class SkinnyGemm:
    """y = x @ W^T for bf16 x [M, K] (M dynamic), W [N, K] and y [M, N]; N a multiple of 8, K of 8."""

    def __init__(self, n: int, k: int, mt: int):
        if n % WARPS_PER_CTA:
            raise ValueError(f"SkinnyGemm: N={n} is not a multiple of {WARPS_PER_CTA}")
        check_k(k, "SkinnyGemm")
        self.n, self.k, self.mt = n, k, mt

    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, y: cute.Tensor, stream: cuda.CUstream):
        self.kernel(x, w, y, x.shape[0]).launch(
            grid=[self.n // WARPS_PER_CTA, 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, y: cute.Tensor, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % WARP
        row = bidx * WARPS_PER_CTA + tidx // WARP
        row_addr = w.iterator.toint() + Int64(row) * (self.k * 2)
        x_addr = x.iterator.toint()
        for m_first in cutlass.range(0, m_count, self.mt):
            acc = zero_acc(1, self.mt)
            accumulate_rows(acc, row_addr, row_addr, x_addr, lane, m_first, m_count, self.k, 1, self.mt)
            for mi in cutlass.range_constexpr(self.mt):
                total = lane_group_sum(acc[0, mi], WARP)
                if lane == 0 and m_first + mi < m_count:
                    y[m_first + mi, row] = total.to(BFloat16)


def _compile_skinny_gemm(n: int, k: int, mt: int):
    from cutlass import BFloat16

    from .runtime import compile_cached, dyn, fake, fake_stream

    def build():
        m = dyn()
        return SkinnyGemm(n, k, mt), (fake(BFloat16, (m, k)), fake(BFloat16, (n, k)), fake(BFloat16, (m, n)), fake_stream())

    return compile_cached(("skinny_gemm", n, k, mt), build)


def skinny_gemm(x, w, out, stream) -> None:
    """out[M, N] = x[M, K] @ w[N, K]^T, all bf16 CUDA tensors, launched on the torch `stream`."""
    from .runtime import cu_stream, expect, to_cute

    m, k = x.shape
    n = w.shape[0]
    expect("x", x, (m, k), "bfloat16")
    expect("w", w, (n, k), "bfloat16")
    expect("out", out, (m, n), "bfloat16")
    fn = _compile_skinny_gemm(n, k, token_tile(m))
    fn(to_cute(x, True), to_cute(w), to_cute(out, True), cu_stream(stream))


def down_proj_sharded(x, w_down, out, rank: int, tp: int, stream) -> None:
    """This rank's column shard of the latent down-projection: out[M, L/tp] = x @ w_down[rank*L/tp:(rank+1)*L/tp]^T
    (w_down is the full replicated [L, H] weight; the communication path gathers the shards)."""
    latent = w_down.shape[0]
    if tp < 1 or latent % tp or not 0 <= rank < tp:
        raise ValueError(f"down_proj_sharded: rank={rank}, tp={tp} do not split latent={latent} evenly")
    cols = latent // tp
    skinny_gemm(x, w_down[rank * cols : (rank + 1) * cols], out, stream)
