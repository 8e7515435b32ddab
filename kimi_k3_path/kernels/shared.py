"""Shared experts' first half: a[M, Ish] = situ_glu(x @ W_sh13[:Ish]^T, x @ W_sh13[Ish:]^T) for this rank's
shard. On the CUDA cores a CTA owns 8 / split output columns: the `split` warps of column j split K and each
reads gate row j and up row Ish + j in the same pass over x, so the pair meets in registers / shared memory, never
in device memory (split 8 in the front; 4 in GEMM2's one-token grid, ONE_TOKEN_SHARED_SPLIT). From 2 tokens (tensor
cores, mma.py) a CTA owns 8R columns, R = row_tiles: each of its tiles of 16 MMA rows is gate rows j..j+7 and up
rows Ish+j..Ish+j+7. The second half (a @ W_sh2^T) is fused into the finalize's up-projection. These are device
functions: the front (front.py) and, at one token, GEMM2's grid (gemm2_one_token.py) run them."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Int32, Int64

from .common import DEFAULT_WEIGHT_LOAD, WARP, situ_glu
from .gemv import BF16_PER_VEC, WARPS_PER_CTA, check_k, dot_slice, split_k_reduce, zero_acc
from .mma import (
    MMA_ROWS,
    TILE_TOKENS,
    check_mma,
    k_groups,
    mma_segment,
    reduce_tiles,
    uses_tensor_cores,
    zero_tiles,
)

SHARED_SPLIT = 8  # warps sharing one (gate, up) row pair's K; a CTA owns WARPS_PER_CTA / split pairs
# The split of the shared gate_up's one-token CTAs in GEMM2's grid (gemm2_one_token.ExpertsGemm2OneToken): 4, two row pairs
# per CTA, gives a warp 224 of a row's 896 vectors, 7 full 16-byte steps, where 8 leaves the last of 4 steps half
# empty: the M=1 block measured 0.85 us faster than with 8 at TP8, 0.17 at TP16; 2 and 1 were slower.
ONE_TOKEN_SHARED_SPLIT = 4


MMA_COLUMNS = MMA_ROWS // 2  # columns of a per tensor-core CTA: its gate rows, then the matching up rows


def check_shared(inter: int, hidden: int, mt: int, split: int = SHARED_SPLIT, row_tiles: int = 1) -> None:
    if inter < 1:
        raise ValueError(f"shared gate_up: shared intermediate={inter} must be positive")
    if WARPS_PER_CTA % split:
        raise ValueError(f"shared gate_up: split={split} must divide the CTA's {WARPS_PER_CTA} warps")
    if inter % (WARPS_PER_CTA // split):
        raise ValueError(f"shared gate_up: shared intermediate={inter} is not a multiple of "
                         f"{WARPS_PER_CTA // split} (row pairs per CTA at split {split})")
    check_k(hidden, split, "shared gate_up")
    if uses_tensor_cores(mt):
        check_mma(2 * inter, hidden, "shared gate_up")
        k_groups(row_tiles)
        if inter % (MMA_COLUMNS * row_tiles):
            raise ValueError(f"shared gate_up: shared intermediate={inter} is not a multiple of "
                             f"{MMA_COLUMNS * row_tiles} ({row_tiles} row tiles of {MMA_COLUMNS} columns per CTA)")


def shared_ctas(inter: int, mt: int, split: int = SHARED_SPLIT, row_tiles: int = 1) -> int:
    """CTAs of the shared gate_up: split warps per row pair on the CUDA cores, row_tiles tiles on the tensor cores."""
    return inter // (MMA_COLUMNS * row_tiles) if uses_tensor_cores(mt) else inter // (WARPS_PER_CTA // split)


@cute.jit
def shared_part(
    x: cute.Tensor,
    w13: cute.Tensor,
    a: cute.Tensor,
    scratch: cute.Tensor,
    cta: Int32,
    warp: Int32,
    lane: Int32,
    m_count: Int32,
    inter: cutlass.Constexpr,
    hidden: cutlass.Constexpr,
    mt: cutlass.Constexpr,
    split: cutlass.Constexpr = SHARED_SPLIT,
):
    """CTA `cta` computes columns j = cta * pairs + p of a (pairs = WARPS_PER_CTA / split): gate row j and up row
    inter + j in one pass over x by the split warps p * split .. p * split + split - 1."""
    n_vec: cutlass.Constexpr = hidden // BF16_PER_VEC // split
    pairs: cutlass.Constexpr = WARPS_PER_CTA // split
    j = cta * pairs + warp // split
    gate_addr = w13.iterator.toint() + Int64(j) * (hidden * 2)
    up_addr = w13.iterator.toint() + Int64(inter + j) * (hidden * 2)
    for m_first in cutlass.range(0, m_count, mt, unroll=1):
        acc = zero_acc(2, mt)
        dot_slice(acc, [gate_addr, up_addr], x.iterator.toint(), (warp % split) * n_vec, lane, m_first, m_count, 0,
                  hidden, n_vec, mt, DEFAULT_WEIGHT_LOAD, pinned=False)
        split_k_reduce(acc, scratch, warp, lane, split, 2, mt)
        if warp % split == 0 and lane == 0:
            for mi in cutlass.range_constexpr(mt):
                if m_first + mi < m_count:
                    a[m_first + mi, j] = situ_glu(acc[0, mi], acc[1, mi]).to(BFloat16)


@cute.jit
def mma_shared_part(
    x: cute.Tensor,
    w13: cute.Tensor,
    a: cute.Tensor,
    scratch: cute.Tensor,
    cta: Int32,
    tidx: Int32,
    m_count: Int32,
    inter: cutlass.Constexpr,
    hidden: cutlass.Constexpr,
    mt: cutlass.Constexpr,
    in_flight: cutlass.Constexpr = 0,
    row_tiles: cutlass.Constexpr = 1,
):
    """CTA `cta` computes columns j0 = 8R*cta .. j0 + 8R - 1 of a on the tensor cores, R = row_tiles (row tile r:
    MMA rows g gate j0 + 8r + g, g + 8 up; in_flight: as mma.mma_segment)."""
    tiles: cutlass.Constexpr = mt // TILE_TOKENS
    splits: cutlass.Constexpr = k_groups(row_tiles)
    lane = tidx % WARP
    warp = tidx // WARP
    j0 = cta * (MMA_COLUMNS * row_tiles)
    gate_addr = w13.iterator.toint() + Int64(j0 + warp // splits * MMA_COLUMNS + lane // 4) * (hidden * 2)
    up_addr = gate_addr + Int64(inter) * (hidden * 2)
    acc = zero_tiles(tiles)
    mma_segment(acc, gate_addr, up_addr, x.iterator.toint(), warp % splits, lane, m_count, hidden, tiles,
                DEFAULT_WEIGHT_LOAD, False, in_flight, splits)
    reduce_tiles(acc, scratch, tidx, tiles, row_tiles)
    per_tile: cutlass.Constexpr = mt * MMA_COLUMNS
    outputs: cutlass.Constexpr = row_tiles * per_tile
    for o in cutlass.range_constexpr((outputs + WARPS_PER_CTA * WARP - 1) // (WARPS_PER_CTA * WARP)):
        idx = tidx + o * WARPS_PER_CTA * WARP
        row_tile = idx // per_tile
        token = idx % per_tile // MMA_COLUMNS
        j = idx % MMA_COLUMNS
        if idx < outputs and token < m_count:
            first = row_tile * splits
            a[token, j0 + row_tile * MMA_COLUMNS + j] = situ_glu(scratch[first, token, j],
                                                                 scratch[first, token, j + MMA_COLUMNS]).to(BFloat16)
