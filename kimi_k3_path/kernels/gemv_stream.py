"""A streaming GEMV for one token (y[1, N] = x[1, K] @ W[N, K]^T, bf16), an experiment against SkinnyGemm's M=1 case.

SkinnyGemm at M=1 moves ~2.8 TB/s (kernels/NOTES.md): each of its 1792 CTAs issues its loads once, waits, reduces
through shared memory and exits, so an SM's bytes in flight drop to zero between CTAs. Here one CTA per SM (at
most) stays resident and each warp streams a run of whole rows: while it multiplies one block of a row (BLOCK
16-byte vectors per lane) the next block's loads are already in flight, in a second register buffer. A row's sum
is reduced within the warp (shuffles), so there is no shared memory and no barrier. Rows per warp are chosen so
that every warp gets the same number (no tail of idle warps).

Not used by latent_moe_decode yet: the bench times it beside SkinnyGemm (bench_moe, M=1) to decide.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import BF16_PER_VEC, VEC_BYTES, WARP, bf16x2_to_f32, dot_bf16x8, lane_group_sum, ld_act_v4, ld_weight_v4

WARPS_PER_CTA = 8
BLOCK = 7  # 16-byte vectors per lane per block: a row of 7168 bf16 is 4 blocks, of 3584 is 2


def rows_per_warp(n: int, sms: int) -> int:
    """The fewest rows per warp that fit N rows into at most one CTA per SM and divide evenly."""
    rows = max(1, -(-n // (WARPS_PER_CTA * sms)))
    while n % (WARPS_PER_CTA * rows):
        rows += 1
    return rows


def check_stream(n: int, k: int, sms: int) -> None:
    if k % (BF16_PER_VEC * WARP * BLOCK):
        raise ValueError(f"StreamGemv: K={k} is not a multiple of {BF16_PER_VEC * WARP * BLOCK} (blocks of {BLOCK} "
                         f"16-byte vectors per lane)")
    if n < 1 or sms < 1:
        raise ValueError(f"StreamGemv: N={n} and the SM count {sms} must be positive")


class StreamGemv:
    """y [1, N] = x [1, K] @ W [N, K]^T, bf16 in and out, fp32 accumulation; N / (8 * rows) CTAs."""

    def __init__(self, n: int, k: int, sms: int):
        check_stream(n, k, sms)
        self.n, self.k = n, k
        self.rows = rows_per_warp(n, sms)
        self.blocks_per_row = k // (BF16_PER_VEC * WARP * BLOCK)

    def ctas(self) -> int:
        return self.n // (WARPS_PER_CTA * self.rows)

    @cute.jit
    def __call__(self, x: cute.Tensor, w: cute.Tensor, y: cute.Tensor, stream: cuda.CUstream):
        self.kernel(x, w, y).launch(grid=[self.ctas(), 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, x: cute.Tensor, w: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        lane = tidx % WARP
        first_row = (bidx * WARPS_PER_CTA + tidx // WARP) * self.rows
        blocks: cutlass.Constexpr = self.rows * self.blocks_per_row
        w_addr = w.iterator.toint() + Int64(first_row) * (self.k * 2) + Int64(lane) * VEC_BYTES
        x_addr = x.iterator.toint() + Int64(lane) * VEC_BYTES
        even = cute.make_rmem_tensor(cute.make_layout((BLOCK, 4), stride=(4, 1)), Int32)
        odd = cute.make_rmem_tensor(cute.make_layout((BLOCK, 4), stride=(4, 1)), Int32)
        acc = cute.make_rmem_tensor(cute.make_layout(1), Float32)
        acc[0] = Float32(0.0)
        self.load_block(even, w_addr, 0)
        # Two blocks per trip, so each buffer is named statically (a run-time index would spill it to local memory).
        for b in cutlass.range(0, blocks - 1, 2, unroll=1):
            self.load_block(odd, w_addr, b + 1)
            self.multiply_block(even, acc, x_addr, b, first_row, y, lane)
            if b + 2 < blocks:
                self.load_block(even, w_addr, b + 2)
            self.multiply_block(odd, acc, x_addr, b + 1, first_row, y, lane)
        if cutlass.const_expr(blocks % 2 == 1):
            self.multiply_block(even, acc, x_addr, blocks - 1, first_row, y, lane)

    @cute.jit
    def load_block(self, buf: cute.Tensor, w_addr: Int64, b: Int32):
        """Block b of this warp's run (row b // blocks_per_row, part b % blocks_per_row) into buf."""
        row = b // self.blocks_per_row
        part = b % self.blocks_per_row
        base = w_addr + Int64(row) * (self.k * 2) + Int64(part) * (BLOCK * WARP * VEC_BYTES)
        for j in cutlass.range_constexpr(BLOCK):
            words = ld_weight_v4(base + Int64(j * WARP * VEC_BYTES))
            for i in cutlass.range_constexpr(4):
                buf[j, i] = words[i]

    @cute.jit
    def multiply_block(self, buf: cute.Tensor, acc: cute.Tensor, x_addr: Int64, b: Int32, first_row: Int32,
                       y: cute.Tensor, lane: Int32):
        """acc += block b times x; after a row's last block, the warp's sum goes to y and acc restarts."""
        part = b % self.blocks_per_row
        x_base = x_addr + Int64(part) * (BLOCK * WARP * VEC_BYTES)
        total = acc[0]
        for j in cutlass.range_constexpr(BLOCK):
            xw = ld_act_v4(x_base + Int64(j * WARP * VEC_BYTES))
            xs = []
            for i in cutlass.range_constexpr(4):
                lo, hi = bf16x2_to_f32(xw[i])
                xs.append(lo)
                xs.append(hi)
            total = dot_bf16x8([buf[j, 0], buf[j, 1], buf[j, 2], buf[j, 3]], xs, total)
        acc[0] = total
        if part == self.blocks_per_row - 1:
            row_sum = lane_group_sum(acc[0], WARP)
            if lane == 0:
                y[0, first_row + b // self.blocks_per_row] = row_sum.to(BFloat16)
            acc[0] = Float32(0.0)


def stream_gemv(x, w, out, stream, sms: int | None = None) -> None:
    """out[1, N] = x[1, K] @ w[N, K]^T for one token, all bf16 CUDA tensors, launched on the torch `stream`."""
    import torch

    from .runtime import compile_cached, cu_stream, expect, fake, fake_stream, to_cute

    n, k = w.shape
    expect("x", x, (1, k), "bfloat16")
    expect("w", w, (n, k), "bfloat16")
    expect("out", out, (1, n), "bfloat16")
    sms = sms or torch.cuda.get_device_properties(x.device).multi_processor_count

    def build():
        args = (fake(BFloat16, (1, k)), fake(BFloat16, (n, k)), fake(BFloat16, (1, n)), fake_stream())
        return StreamGemv(n, k, sms), args

    fn = compile_cached(("stream_gemv", n, k, sms), build)
    fn(to_cute(x), to_cute(w), to_cute(out), cu_stream(stream))
