"""The latent MoE's finalize for batches of 2 to 64 tokens (dispatch.py), in one launch on the tensor cores (mma.py):
the up-projection of the normalized latent rows and the shared experts' down-projection, summed into the block output,

    out[M, H] = normed @ W_up^T + a_sh @ W_sh2^T

GEMM2's last CTAs wrote normed = rms_norm(y_lat) in bf16 (gemm2_mma.py), so this is one skinny GEMM over two K
segments accumulating into the same C fragments. Launched early (programmatic dependent launch) while GEMM2 runs:
each CTA waits (griddepcontrol.wait) before its first load."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Int32, Int64

from .common import DEFAULT_WEIGHT_LOAD, WARP, traced
from .mma import (
    MMA_ROWS,
    TILE_TOKENS,
    alloc_tile_scratch,
    check_mma,
    mma_segment,
    reduce_tiles,
    scratch_bytes,
    store_rows,
    uses_tensor_cores,
    zero_tiles,
)

WARPS_PER_CTA = 8


class Finalize:
    """out [M, H] bf16 = normed [M, L] @ W_up [H, L]^T + a_sh [M, Ish] @ W_sh2 [H, Ish]^T (bf16, fp32 accumulation),
    token tile mt (16, 32 or 64). CTA c: output rows 16c .. 16c + 15 for every token, both K segments."""

    def __init__(self, hidden: int, latent: int, shared_inter: int, mt: int, trace_addr: int = 0):
        if not uses_tensor_cores(mt):
            raise ValueError(f"Finalize: token tile {mt} is not a tensor-core tile (16, 32 or 64)")
        check_mma(hidden, latent, "Finalize (latent)")
        check_mma(hidden, shared_inter, "Finalize (shared intermediate)")
        self.h, self.l, self.s, self.mt, self.trace_addr = hidden, latent, shared_inter, mt, trace_addr

    def ctas(self) -> int:
        return self.h // MMA_ROWS

    @cute.jit
    def __call__(self, normed, w_up, a_sh, w_sh2, out, stream: cuda.CUstream):
        self.kernel(normed, w_up, a_sh, w_sh2, out, normed.shape[0]).launch(
            grid=[self.ctas(), 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], smem=scratch_bytes(self.mt), stream=stream,
            use_pdl=True,
        )

    @cute.kernel
    def kernel(self, normed, w_up, a_sh, w_sh2, out, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        traced(self.trace_addr, cta, tidx, False)
        scratch = alloc_tile_scratch(cutlass.memory.SmemAllocator(), self.mt)
        cute.arch.griddepcontrol_wait()  # GEMM2 has written normed; the front, a_sh
        tiles: cutlass.Constexpr = self.mt // TILE_TOKENS
        warp, lane = tidx // WARP, tidx % WARP
        row0 = cta * MMA_ROWS
        up_addr = w_up.iterator.toint() + Int64(row0 + lane // 4) * (self.l * 2)
        sh_addr = w_sh2.iterator.toint() + Int64(row0 + lane // 4) * (self.s * 2)
        acc = zero_tiles(tiles)
        mma_segment(acc, up_addr, up_addr + Int64(8 * self.l * 2), normed.iterator.toint(), warp, lane, m_count,
                    self.l, tiles, DEFAULT_WEIGHT_LOAD, True)
        mma_segment(acc, sh_addr, sh_addr + Int64(8 * self.s * 2), a_sh.iterator.toint(), warp, lane, m_count,
                    self.s, tiles, DEFAULT_WEIGHT_LOAD, True)
        reduce_tiles(acc, scratch, tidx, tiles)
        store_rows(scratch, out, row0, tidx, m_count, self.mt)
        traced(self.trace_addr, cta, tidx, True)


def finalize_mma(normed, w_up, a_sh, w_sh2, out, stream) -> None:
    """Finalize on `stream`: out = normed @ w_up^T + a_sh @ w_sh2^T for a batch of 2 to 64 tokens. Launched early:
    correct after any launch, since it waits for its predecessor before reading activations."""
    from .gemv import token_tile
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute
    from .trace import trace_address

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
        args = (fake(BFloat16, (md, latent)), fake(BFloat16, (hidden, latent)), fake(BFloat16, (md, inter)),
                fake(BFloat16, (hidden, inter)), fake(BFloat16, (md, hidden)), fake_stream())
        return Finalize(hidden, latent, inter, mt, trace), args

    trace = trace_address("finalize", hidden // MMA_ROWS)
    fn = compile_cached(("finalize_mma", hidden, latent, inter, mt, trace), build)
    fn(to_cute(normed, True), to_cute(w_up), to_cute(a_sh, True), to_cute(w_sh2), to_cute(out, True),
       cu_stream(stream))
