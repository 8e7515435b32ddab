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
    k_groups,
    mma_segment,
    reduce_tiles,
    scratch_bytes,
    store_rows,
    uses_tensor_cores,
    zero_tiles,
)

WARPS_PER_CTA = 8


def finalize_row_tiles(mt: int) -> int:
    """Tiles of 16 output rows per CTA (mma.py) for token tile mt. Each CTA reads all of normed and a_sh, M x (L +
    Ish), from L2 for its rows: at 64 tokens 4x its weight bytes. Two tiles measured (H100, alone, TP8 / TP16): 64
    tokens 57.4 -> 49.4 us / 54.5 -> 48.9; 16 tokens 25.3 -> 28.6 / 23.1 -> 25.5 (half the CTAs, x no bigger than
    the weights); four: 64 tokens 47.7 / 43.4, 16 tokens 35.5 / 32.8. So two at 64 (32 unmeasured)."""
    return 2 if mt == 64 else 1


class Finalize:
    """out [M, H] bf16 = normed [M, L] @ W_up [H, L]^T + a_sh [M, Ish] @ W_sh2 [H, Ish]^T (bf16, fp32 accumulation),
    token tile mt (16, 32 or 64). CTA c: output rows 16R*c .. 16R*(c + 1) - 1 for every token, both K segments, R =
    row_tiles (default finalize_row_tiles(mt))."""

    def __init__(self, hidden: int, latent: int, shared_inter: int, mt: int, trace_addr: int = 0,
                 row_tiles: int | None = None):
        row_tiles = finalize_row_tiles(mt) if row_tiles is None else row_tiles
        if not uses_tensor_cores(mt):
            raise ValueError(f"Finalize: token tile {mt} is not a tensor-core tile (16, 32 or 64)")
        check_mma(hidden, latent, "Finalize (latent)")
        check_mma(hidden, shared_inter, "Finalize (shared intermediate)")
        k_groups(row_tiles)
        if hidden % (MMA_ROWS * row_tiles):
            raise ValueError(f"Finalize: hidden={hidden} is not a multiple of {MMA_ROWS * row_tiles} "
                             f"({row_tiles} tiles of {MMA_ROWS} rows per CTA)")
        self.h, self.l, self.s, self.mt, self.trace_addr = hidden, latent, shared_inter, mt, trace_addr
        self.row_tiles = row_tiles

    def ctas(self) -> int:
        return self.h // (MMA_ROWS * self.row_tiles)

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
        splits: cutlass.Constexpr = k_groups(self.row_tiles)
        warp, lane = tidx // WARP, tidx % WARP
        row0 = cta * (MMA_ROWS * self.row_tiles)
        row = row0 + warp // splits * MMA_ROWS + lane // 4
        up_addr = w_up.iterator.toint() + Int64(row) * (self.l * 2)
        sh_addr = w_sh2.iterator.toint() + Int64(row) * (self.s * 2)
        acc = zero_tiles(tiles)
        mma_segment(acc, up_addr, up_addr + Int64(8 * self.l * 2), normed.iterator.toint(), warp % splits, lane,
                    m_count, self.l, tiles, DEFAULT_WEIGHT_LOAD, True, 0, splits)
        mma_segment(acc, sh_addr, sh_addr + Int64(8 * self.s * 2), a_sh.iterator.toint(), warp % splits, lane,
                    m_count, self.s, tiles, DEFAULT_WEIGHT_LOAD, True, 0, splits)
        reduce_tiles(acc, scratch, tidx, tiles, self.row_tiles)
        store_rows(scratch, out, row0, tidx, m_count, self.mt, self.row_tiles)
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

    trace = trace_address("finalize", Finalize(hidden, latent, inter, mt).ctas())
    fn = compile_cached(("finalize_mma", hidden, latent, inter, mt, trace), build)
    fn(to_cute(normed, True), to_cute(w_up), to_cute(a_sh, True), to_cute(w_sh2), to_cute(out, True),
       cu_stream(stream))
