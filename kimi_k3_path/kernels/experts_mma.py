"""Routed experts on the tensor cores (every batch size, unless turned off): the two launches of experts.py (GEMM1 + SiTU-GLU; GEMM2 +
weighted combine + latent-norm tail), grouped by the same router plan, with mma.sync m16n8k16 (fp16 in, fp32 out).

A warp owns 16 weight rows of its slot's expert (GEMM1: a slice of their K groups, GEMM2: all of K) and the tokens
that chose it, one tile of 8 at a time (a slot holds
1 to 64 tokens; at M = 64 most hold one or two, and the MMA's idle columns cost nothing that matters: the expert's
bytes are the bound; a slot of more than 8 tokens rereads its rows, from L2, once per further tile). For each MXFP4
group of 32 k (one E8M0 scale per row), lane (g, q) loads the 4-byte word q of rows g and g + 8 (elements 8q ..
8q+7) and converts them to f16x2 pairs times 2^-6 (common.fp4x8_to_f16x2), and loads the same 8 k of its token g in
fp16, paired alike (pair_like_fp4x8): pairs 0, 1 feed one k16 step and pairs 2, 3 the next, a permutation of k that
A and B share. The scale belongs to a (row, group), so each group's two steps go into a fresh fp32 tile that is
scaled per row (rows g and g + 8 have their own scales) into the accumulator: exact for every E8M0 scale, where
folding scales into fp16 weights could overflow.

C fragment of token tile t: lane (g, q) holds rows (g, g + 8) x slot columns (8t + 2q, 8t + 2q + 1).
GEMM1: MMA row g is gate row j0 + g and row g + 8 the up row I + j0 + g, so each lane holds gate and up of the same
(column, token) and applies SiTU-GLU in registers; a[pair, j0 + g] is stored fp16.
GEMM2: MMA rows are latent rows; each result times the pair's routing weight goes into y_lat with one fp32
reduction, and the last CTA normalizes (experts.norm_tail).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32, Int64

from .common import (
    FP4_GROUP,
    VEC_BYTES,
    WARP,
    after_all_loads,
    e8m0_scale_times_64,
    fp4x8_to_f16x2,
    ld_act_v4,
    ld_u8,
    ld_weight_b32,
    pair_like_fp4x8,
    red_add_f32,
    situ_glu,
)
from .experts import TAIL_SMEM_BYTES, alloc_tail_smem, norm_tail, zero_y_lat
from .mma import MMA_ROWS, TILE_TOKENS, alloc_tile_scratch, mma_16816, reduce_tiles, scratch_bytes, zero_tiles

WARPS_PER_CTA = 8
# MXFP4 groups whose weight words, scales and activations are in flight together (common.after_all_loads keeps
# ptxas from splitting a batch into one round trip per group). Measured in one run (v8, TP8 M=1): GEMM1 with 4
# 17.2 us, with 7 20.1 (registers cost occupancy); GEMM2 with 4 of its 12 groups 14.3 us, 6 16.6, 12 23.3; but at
# TP16 (6 groups) 4 + 2 took 17.4 us and all 6 at once 12.8: a short row goes in one batch.
GEMM1_GROUPS_IN_FLIGHT = 4
GEMM2_GROUPS_IN_FLIGHT = 4
ONE_BATCH_GROUPS = 6
GEMM1_COLUMNS = MMA_ROWS // 2  # a's columns per warp: 8 gate rows + the 8 matching up rows


def token_row(slot_pairs, slot, count, column, top_k: int, by_token: bool, base: Int64, row_bytes: int, q) -> Int64:
    """Byte address of this lane's 16-byte piece of the first group of slot column `column`'s activation row:
    x_lat[pair // k] (by_token) or a[pair]. Columns past the slot's count reread its last pair (results dropped)."""
    pair = slot_pairs[slot, cutlass.min(column, count - 1)]
    row = pair // top_k if by_token else pair
    return base + Int64(row) * row_bytes + Int64(q) * VEC_BYTES


@cute.jit
def groups_mma(
    acc: cute.Tensor,
    x_row: Int64,
    w_g: Int64,
    w_g8: Int64,
    s_g: Int64,
    s_g8: Int64,
    first_group: Int32,
    q: Int32,
    zero: Int32,
    count: cutlass.Constexpr,
):
    """acc += `count` MXFP4 groups from first_group of rows g / g + 8 (packed rows at w_g / w_g8, scale rows at s_g /
    s_g8) times one token tile's activations (x_row: this lane's token row). Loads first, then the math (zero: a
    run-time 0 for common.after_all_loads)."""
    frags = []
    for i in cutlass.range_constexpr(count):
        group = Int64(first_group + i)
        words = (ld_weight_b32(w_g + group * VEC_BYTES + Int64(q) * 4),
                 ld_weight_b32(w_g8 + group * VEC_BYTES + Int64(q) * 4))
        scales = (ld_u8(s_g + group), ld_u8(s_g8 + group))
        frags.append((words, scales, ld_act_v4(x_row + group * (FP4_GROUP * 2))))
    (first_g, first_g8), first_scales, first_x = frags[0]
    first_g = after_all_loads(first_g, [v for words, scales, xw in frags for v in (*words, *scales, xw[0])], zero)
    frags[0] = ((first_g, first_g8), first_scales, first_x)
    for i in cutlass.range_constexpr(count):
        (word_g, word_g8), (scale_g, scale_g8), xw = frags[i]
        a_g = fp4x8_to_f16x2(word_g)
        a_g8 = fp4x8_to_f16x2(word_g8)
        b = pair_like_fp4x8(xw[0], xw[1], xw[2], xw[3])
        zero = Float32(0.0)
        d = mma_16816(a_g[0], a_g8[0], a_g[1], a_g8[1], b[0], b[1], zero, zero, zero, zero, "f16")
        d = mma_16816(a_g[2], a_g8[2], a_g[3], a_g8[3], b[2], b[3], d[0], d[1], d[2], d[3], "f16")
        sg = e8m0_scale_times_64(scale_g)
        sg8 = e8m0_scale_times_64(scale_g8)
        acc[0, 0] = acc[0, 0] + d[0] * sg
        acc[0, 1] = acc[0, 1] + d[1] * sg
        acc[0, 2] = acc[0, 2] + d[2] * sg8
        acc[0, 3] = acc[0, 3] + d[3] * sg8


@cute.jit
def group_span_mma(
    acc: cute.Tensor,
    x_row: Int64,
    w_g: Int64,
    w_g8: Int64,
    s_g: Int64,
    s_g8: Int64,
    first_group: Int32,
    q: Int32,
    zero: Int32,
    groups: cutlass.Constexpr,
    in_flight: cutlass.Constexpr,
):
    """acc += groups first_group .. first_group + groups - 1, `in_flight` groups' loads at a time."""
    batches: cutlass.Constexpr = groups // in_flight
    for b in cutlass.range(batches, unroll=1):
        groups_mma(acc, x_row, w_g, w_g8, s_g, s_g8, first_group + b * in_flight, q, zero, in_flight)
    if cutlass.const_expr(groups % in_flight != 0):
        groups_mma(acc, x_row, w_g, w_g8, s_g, s_g8, first_group + batches * in_flight, q, zero, groups % in_flight)


def check_mma_experts(latent: int, inter: int) -> None:
    if latent % (WARPS_PER_CTA * MMA_ROWS) or latent % (WARPS_PER_CTA * WARP):
        raise ValueError(f"experts (tensor cores): latent={latent} is not a multiple of {WARPS_PER_CTA * WARP}")
    if inter % FP4_GROUP:  # whole MXFP4 groups per w2 row; GEMM1's CTAs take 8 columns each (32 = 4 x 8)
        raise ValueError(f"experts (tensor cores): intermediate={inter} is not a multiple of {FP4_GROUP}")


class ExpertsGemm1SituMma:
    """ExpertsGemm1Situ (same tensors and results) on the tensor cores. CTA (slot, tile) computes a's columns
    8*tile .. 8*tile + 7 of the slot's pairs: MMA rows g are gate rows j0 + g, rows g + 8 the matching up rows. Its 8
    warps split the K groups (14 each at L = 3584) and meet in shared memory, so even one token keeps 8 warps per 16
    rows streaming; threads (token, column) then apply SiTU-GLU to the totals."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, in_flight: int = GEMM1_GROUPS_IN_FLIGHT):
        check_mma_experts(latent, inter)  # latent % 256 == 0: the 8 warps get whole, equal shares of the K groups
        self.e, self.l, self.i, self.k, self.in_flight = experts, latent, inter, top_k, in_flight

    @cute.jit
    def __call__(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, stream: cuda.CUstream):
        m = x_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m).launch(
            grid=[slots, self.i // GEMM1_COLUMNS, 1], block=[WARPS_PER_CTA * WARP, 1, 1],
            smem=scratch_bytes(TILE_TOKENS), stream=stream,
        )

    @cute.kernel
    def kernel(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        scratch = alloc_tile_scratch(cutlass.memory.SmemAllocator(), TILE_TOKENS)
        zero_y_lat(y_lat, (tile * grid_x + slot) * WARPS_PER_CTA * WARP + tidx, grid_x * grid_y * WARPS_PER_CTA * WARP,
                   m_count, self.l)
        if slot < n_active[0]:
            warp, lane = tidx // WARP, tidx % WARP
            g, q = lane // 4, lane % 4
            j0 = tile * GEMM1_COLUMNS
            expert = slot_expert[slot]
            count = slot_count[slot]
            n_tiles = (count + TILE_TOKENS - 1) // TILE_TOKENS
            gate_row = Int64(expert) * (2 * self.i) + Int64(j0 + g)
            up_row = gate_row + Int64(self.i)
            packed: cutlass.Constexpr = self.l // 2
            groups: cutlass.Constexpr = self.l // FP4_GROUP
            per_warp: cutlass.Constexpr = groups // WARPS_PER_CTA
            for t in cutlass.range(n_tiles, unroll=1):
                x_row = token_row(slot_pairs, slot, count, t * TILE_TOKENS + g, self.k, True, x_lat.iterator.toint(),
                                  self.l * 2, q)
                acc = zero_tiles(1)
                group_span_mma(acc, x_row, w13.iterator.toint() + gate_row * packed,
                               w13.iterator.toint() + up_row * packed, s13.iterator.toint() + gate_row * groups,
                               s13.iterator.toint() + up_row * groups, warp * per_warp, q, m_count >> 31, per_warp,
                               self.in_flight)
                reduce_tiles(acc, scratch, tidx, 1)
                if tidx < TILE_TOKENS * GEMM1_COLUMNS:
                    token, j = tidx // GEMM1_COLUMNS, tidx % GEMM1_COLUMNS
                    column = t * TILE_TOKENS + token
                    if column < count:
                        gate, up = scratch[0, token, j], scratch[0, token, j + GEMM1_COLUMNS]
                        a[slot_pairs[slot, column], j0 + j] = situ_glu(gate, up).to(Float16)
                cute.arch.sync_threads()  # the next tile's reduce_tiles overwrites scratch


class ExpertsGemm2CombineMma:
    """ExpertsGemm2Combine (same tensors and results) on the tensor cores; CTA (slot, tile) computes latent rows
    128*tile .. +127 of the slot's pairs, 16 per warp."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, eps: float,
                 in_flight: int = GEMM2_GROUPS_IN_FLIGHT):
        check_mma_experts(latent, inter)
        groups = inter // FP4_GROUP
        if groups <= ONE_BATCH_GROUPS:
            in_flight = groups
        self.e, self.l, self.i, self.k, self.eps, self.in_flight = experts, latent, inter, top_k, eps, in_flight

    @cute.jit
    def __call__(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma,
                 normed, stream: cuda.CUstream):
        m = y_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma, normed,
                    m).launch(
            grid=[slots, self.l // (WARPS_PER_CTA * MMA_ROWS), 1], block=[WARPS_PER_CTA * WARP, 1, 1],
            smem=TAIL_SMEM_BYTES, stream=stream,
        )

    @cute.kernel
    def kernel(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma, normed,
               m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        flag, partial = alloc_tail_smem(cutlass.memory.SmemAllocator())
        if slot < n_active[0]:
            lane = tidx % WARP
            g, q = lane // 4, lane % 4
            r0 = (tile * WARPS_PER_CTA + tidx // WARP) * MMA_ROWS
            expert = slot_expert[slot]
            count = slot_count[slot]
            n_tiles = (count + TILE_TOKENS - 1) // TILE_TOKENS
            row = Int64(expert) * self.l + Int64(r0 + g)
            packed: cutlass.Constexpr = self.i // 2
            groups: cutlass.Constexpr = self.i // FP4_GROUP
            y_addr = y_lat.iterator.toint()
            for t in cutlass.range(n_tiles, unroll=1):
                x_row = token_row(slot_pairs, slot, count, t * TILE_TOKENS + g, self.k, False, a.iterator.toint(),
                                  self.i * 2, q)
                acc = zero_tiles(1)
                group_span_mma(acc, x_row, w2.iterator.toint() + row * packed, w2.iterator.toint() + (row + 8) * packed,
                               s2.iterator.toint() + row * groups, s2.iterator.toint() + (row + 8) * groups, Int32(0), q,
                               m_count >> 31, groups, self.in_flight)
                for c in cutlass.range_constexpr(2):
                    column = t * TILE_TOKENS + 2 * q + c
                    if column < count:
                        pair = slot_pairs[slot, column]
                        token = pair // self.k
                        weight = topk_w[token, pair % self.k]
                        out_row = Int64(token) * self.l + Int64(r0 + g)
                        red_add_f32(y_addr + out_row * 4, acc[0, c] * weight)
                        red_add_f32(y_addr + (out_row + 8) * 4, acc[0, 2 + c] * weight)

        norm_tail(y_lat, gamma, normed, counter, flag, partial, tidx, m_count, grid_x * grid_y, self.l, self.eps)

