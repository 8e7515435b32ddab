"""Tensor-core row dots for decode batches of 2 to 64 tokens: mma.sync m16n8k16, bf16 in, fp32 accumulate.

Above one token the SIMT kernels stop being bound by bytes: every weight meets every token on the CUDA cores (with a
bf16 -> fp32 unpack per weight), and a batch of 64 walks each weight row once per tile of 8 tokens. Here a warp owns
16 weight rows and all tokens; its lanes load their MMA fragments straight from global memory (no shared-memory
staging: each weight is used by one warp only):

  lane = 4*g + q. For each 32-wide K chunk, lane (g, q) loads the 16 bytes k = 8q .. 8q+7 of rows g and g+8 (a quad
  reads 64 contiguous bytes of a row) and, for each tile of 8 tokens, the same 8 k of token g. One k16 MMA step wants
  from lane (g, q) the k pairs (2q, 2q+1) and (2q+8, 2q+9) of A rows g and g+8 and of B column g; feeding it words
  (0, 1) of the loaded vectors in the first step and words (2, 3) in the second is a permutation of k that is the
  same for A and B, so the two steps add up exactly the chunk's 32 products per (row, token).

  The C fragment of token tile t: lane (g, q) holds rows (g, g+8) x tokens (8t + 2q, 8t + 2q + 1).

The CTA's 8 warps split K (chunk c goes to warp c mod 8, so at any moment the CTA reads adjacent 64-byte pieces of
its rows), and their partial tiles meet in shared memory (`reduce_tiles`); each kernel's epilogue reads the totals.

With `row_tiles` R > 1 a CTA owns R tiles of 16 rows: warp w computes row tile w // (8/R) over K group w mod (8/R),
so R warps read each chunk of x at about the same time and all but the first find it in L1. A CTA of 16 rows reads
the whole of x (M x K) from L2 for 16 rows of weights: at 64 tokens 4x the weight bytes, and the front and finalize
were L2-bound on it (docs/design/kimi_k3_kernels.md section 4.2).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .common import VEC_BYTES, WARP, ld_act_v4, ld_fresh_v4, ld_weight_v4

WARPS_PER_CTA = 8
MMA_ROWS = 16  # weight rows per warp: the MMA's m
TILE_TOKENS = 8  # tokens per MMA: its n
K_CHUNK = 32  # k per 16-byte load of one lane (two k16 MMA steps)
MAX_MMA_TOKENS = 64


def chunks_in_flight(mt: int) -> int:
    """K chunks whose weight loads a warp issues before the first of their MMAs, for token tile mt (the front may
    choose otherwise: moe.front_chunks_in_flight). 3 measured fastest at 32 and 64 tokens (the block 3-9% faster
    than with 2); at 16 tokens the launches other than the front did not care. Not monotonic in registers; the
    chunk order changes too, and with it, presumably (not measured), how the CTAs on an SM meet in L1 on x."""
    return 2 if mt <= 16 else 3


def uses_tensor_cores(mt: int) -> bool:
    """Token tiles above 8 run on the tensor cores (mt is then a multiple of 8: 16, 32 or 64)."""
    return mt > TILE_TOKENS


def check_mma(rows: int, k: int, what: str) -> None:
    if rows % MMA_ROWS:
        raise ValueError(f"{what}: {rows} rows is not a multiple of {MMA_ROWS} (one MMA tile of rows per CTA)")
    if k % K_CHUNK:
        raise ValueError(f"{what}: K={k} is not a multiple of {K_CHUNK} (one 16-byte load per lane and row)")


def k_groups(row_tiles: int) -> int:
    """Warps that split K for one row tile when a CTA owns row_tiles tiles of 16 rows."""
    if row_tiles < 1 or WARPS_PER_CTA % row_tiles:
        raise ValueError(f"mma: {row_tiles} row tiles per CTA do not divide its {WARPS_PER_CTA} warps")
    return WARPS_PER_CTA // row_tiles


def scratch_bytes(mt: int) -> int:
    return WARPS_PER_CTA * mt * MMA_ROWS * 4


def alloc_tile_scratch(smem, mt: int):
    """[warp, token, row] fp32 partial sums of a CTA's 16 rows x mt tokens."""
    return smem.allocate_tensor(
        Float32,
        cute.make_layout((WARPS_PER_CTA, mt, MMA_ROWS), stride=(mt * MMA_ROWS, MMA_ROWS, 1)),
        byte_alignment=16,
    )


def mma_16816(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, operands: str = "bf16"):
    """D = A @ B + C for one m16n8k16 tile: A, B as packed pairs of `operands` ("bf16" or "f16"), C and D fp32 (PTX
    fragment layout)."""
    return cute.arch.inline_ptx(
        f"mma.sync.aligned.m16n8k16.row.col.f32.{operands}.{operands}.f32 "
        "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, {{$r6}, {$r7}, {$r8}, {$r9}};",
        write_only_types=[Float32] * 4,
        read_only_args=[a0, a1, a2, a3, b0, b1, c0, c1, c2, c3],
    )


def zero_tiles(tiles: int):
    acc = cute.make_rmem_tensor(cute.make_layout((tiles, 4), stride=(4, 1)), Float32)
    for t in range(tiles):
        for i in range(4):
            acc[t, i] = Float32(0.0)
    return acc


def chunks_mma(acc, row_addr: Int64, row8_addr: Int64, x_addr: Int64, x_row_bytes: int, first_chunk, stride: int,
               count: int, g, q, m_count, tiles: int, hint: str, fresh: bool = False) -> None:
    """acc += the products of `count` K chunks (first_chunk, first_chunk + stride, ...): their weight loads go out
    first, then per chunk the token loads of every tile, then the MMAs (inline PTX keeps program order). fresh: x
    was written by a launch still running when this one started (ld_fresh_v4)."""
    load_act = ld_fresh_v4 if fresh else ld_act_v4
    offsets = [Int64(first_chunk + i * stride) * (K_CHUNK * 2) + Int64(q) * VEC_BYTES for i in range(count)]
    weights = [(ld_weight_v4(row_addr + off, hint), ld_weight_v4(row8_addr + off, hint)) for off in offsets]
    for i in range(count):
        wa, wb = weights[i]
        xs = []
        for t in range(tiles):
            token = cutlass.min(t * TILE_TOKENS + g, m_count - 1)  # rows past the batch reread the last one
            xs.append(load_act(x_addr + Int64(token) * x_row_bytes + offsets[i]))
        for t in range(tiles):
            for s in range(2):
                d = mma_16816(wa[2 * s], wb[2 * s], wa[2 * s + 1], wb[2 * s + 1], xs[t][2 * s], xs[t][2 * s + 1],
                                   acc[t, 0], acc[t, 1], acc[t, 2], acc[t, 3])
                for c in range(4):
                    acc[t, c] = d[c]


@cute.jit
def mma_segment(
    acc: cute.Tensor,
    row_addr: Int64,
    row8_addr: Int64,
    x_addr: Int64,
    part: Int32,
    lane: Int32,
    m_count: Int32,
    k: cutlass.Constexpr,
    tiles: cutlass.Constexpr,
    hint: cutlass.Constexpr,
    fresh: cutlass.Constexpr = False,
    in_flight: cutlass.Constexpr = 0,
    splits: cutlass.Constexpr = WARPS_PER_CTA,
):
    """acc += this warp's share (chunks c = part mod splits) of rows (g, g+8) at byte addresses row_addr / row8_addr
    (K values each) times tokens 0 .. 8*tiles - 1 of x (rows of K bf16 at x_addr; fresh: as chunks_mma says),
    in_flight chunks at a time (0: chunks_in_flight's choice). splits: the warps sharing these rows' K (k_groups),
    part: this warp's place among them."""
    g = lane // 4
    q = lane % 4
    chunks: cutlass.Constexpr = k // K_CHUNK
    per_warp: cutlass.Constexpr = chunks // splits
    batch: cutlass.Constexpr = in_flight if in_flight else chunks_in_flight(tiles * TILE_TOKENS)
    groups: cutlass.Constexpr = per_warp // batch
    step: cutlass.Constexpr = batch * splits
    for i in cutlass.range(groups, unroll=1):
        chunks_mma(acc, row_addr, row8_addr, x_addr, k * 2, part + i * step, splits, batch,
                   g, q, m_count, tiles, hint, fresh)
    if cutlass.const_expr(per_warp % batch != 0):
        chunks_mma(acc, row_addr, row8_addr, x_addr, k * 2, part + groups * step, splits,
                   per_warp % batch, g, q, m_count, tiles, hint, fresh)
    if cutlass.const_expr(chunks % splits != 0):
        if part < chunks % splits:
            chunks_mma(acc, row_addr, row8_addr, x_addr, k * 2, part + per_warp * splits, splits, 1,
                       g, q, m_count, tiles, hint, fresh)


@cute.jit
def reduce_tiles(acc: cute.Tensor, scratch: cute.Tensor, tidx: Int32, tiles: cutlass.Constexpr,
                 row_tiles: cutlass.Constexpr = 1):
    """Sum the C fragments of the warps that share a row tile (all 8 where the CTA owns one: k_groups); afterwards
    scratch[r * k_groups(row_tiles), token, row] holds the CTA's total for (row tile r, row, token). Every thread of
    the CTA must call it (it synchronizes)."""
    warp = tidx // WARP
    lane = tidx % WARP
    g = lane // 4
    q = lane % 4
    for t in cutlass.range_constexpr(tiles):
        token = t * TILE_TOKENS + 2 * q
        scratch[warp, token, g] = acc[t, 0]
        scratch[warp, token + 1, g] = acc[t, 1]
        scratch[warp, token, g + 8] = acc[t, 2]
        scratch[warp, token + 1, g + 8] = acc[t, 3]
    cute.arch.sync_threads()
    splits: cutlass.Constexpr = k_groups(row_tiles)
    per_tile: cutlass.Constexpr = tiles * TILE_TOKENS * MMA_ROWS
    outputs: cutlass.Constexpr = row_tiles * per_tile
    for o in cutlass.range_constexpr((outputs + WARPS_PER_CTA * WARP - 1) // (WARPS_PER_CTA * WARP)):
        idx = tidx + o * WARPS_PER_CTA * WARP
        if idx < outputs:
            first = (idx // per_tile) * splits
            token = idx % per_tile // MMA_ROWS
            row = idx % MMA_ROWS
            total = scratch[first, token, row]
            for w in cutlass.range_constexpr(1, splits):
                total = total + scratch[first + w, token, row]
            scratch[first, token, row] = total  # only this thread reads or writes (tile, token, row) in this pass
    cute.arch.sync_threads()


@cute.jit
def mma_rows_part(
    x: cute.Tensor,
    w: cute.Tensor,
    y: cute.Tensor,
    scratch: cute.Tensor,
    cta: Int32,
    tidx: Int32,
    m_count: Int32,
    k: cutlass.Constexpr,
    mt: cutlass.Constexpr,
    hint: cutlass.Constexpr,
    in_flight: cutlass.Constexpr = 0,
    fresh: cutlass.Constexpr = False,
    row_tiles: cutlass.Constexpr = 1,
):
    """CTA `cta` of y = x @ w^T on the tensor cores: rows 16*R*cta .. 16*R*(cta + 1) - 1 for every token, R =
    row_tiles (in_flight and fresh: as mma_segment)."""
    tiles: cutlass.Constexpr = mt // TILE_TOKENS
    splits: cutlass.Constexpr = k_groups(row_tiles)
    lane = tidx % WARP
    warp = tidx // WARP
    row0 = cta * (MMA_ROWS * row_tiles)
    row_addr = w.iterator.toint() + Int64(row0 + warp // splits * MMA_ROWS + lane // 4) * (k * 2)
    acc = zero_tiles(tiles)
    mma_segment(acc, row_addr, row_addr + Int64(8 * k * 2), x.iterator.toint(), warp % splits, lane, m_count, k,
                tiles, hint, fresh, in_flight, splits)
    reduce_tiles(acc, scratch, tidx, tiles, row_tiles)
    store_rows(scratch, y, row0, tidx, m_count, mt, row_tiles)


@cute.jit
def store_rows(scratch: cute.Tensor, y: cute.Tensor, row0: Int32, tidx: Int32, m_count: Int32, mt: cutlass.Constexpr,
               row_tiles: cutlass.Constexpr = 1):
    """y[token, row0 + 16*t + r] = reduce_tiles' total of (row tile t, row r, token), for the batch's tokens
    (consecutive threads, rows)."""
    splits: cutlass.Constexpr = k_groups(row_tiles)
    per_tile: cutlass.Constexpr = mt * MMA_ROWS
    outputs: cutlass.Constexpr = row_tiles * per_tile
    for o in cutlass.range_constexpr((outputs + WARPS_PER_CTA * WARP - 1) // (WARPS_PER_CTA * WARP)):
        idx = tidx + o * WARPS_PER_CTA * WARP
        row_tile = idx // per_tile
        token = idx % per_tile // MMA_ROWS
        row = idx % MMA_ROWS
        if idx < outputs and token < m_count:
            y[token, row0 + row_tile * MMA_ROWS + row] = scratch[row_tile * splits, token, row].to(y.element_type)
