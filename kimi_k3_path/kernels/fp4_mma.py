"""MXFP4 (W4A16) products on the tensor cores, the device functions both tensor-core expert GEMMs share
(gemm1_mma.py, gemm2_mma.py): mma.sync m16n8k16, fp16 in, fp32 out.

A warp owns 16 weight rows of its slot's expert and the tokens that chose it, one tile of 8 at a time (a slot holds
1 to 64 tokens; at M = 64 most hold one or two, and the MMA's idle columns cost nothing that matters: the expert's
bytes are the bound; a slot of more than 8 tokens rereads its rows, from L2, once per further tile). The CTA's rows
and their scales are first copied into shared memory (bulk copies, one round trip per CTA). For each MXFP4 group of
32 k (one E8M0 scale per row), lane (g, q) reads the 4-byte word q of rows g and g + 8 (elements 8q .. 8q+7) and
converts them to f16x2 pairs times 2^-6 (common.fp4x8_to_f16x2), and loads the same 8 k of its token g in fp16,
paired alike (pair_like_fp4x8): pairs 0, 1 feed one k16 step and pairs 2, 3 the next, a permutation of k that A and B
share. The scale belongs to a (row, group), so each group's two steps go into a fresh fp32 tile that is scaled per
row (rows g and g + 8 have their own scales) into the accumulator: exact for every E8M0 scale, where folding scales
into fp16 weights could overflow.

C fragment of token tile t: lane (g, q) holds rows (g, g + 8) x slot columns (8t + 2q, 8t + 2q + 1).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .common import (
    FP4_GROUP,
    VEC_BYTES,
    WARP,
    after_all_loads,
    e8m0_scale_times_64,
    fp4x8_to_f16x2,
    ld_act_v4,
    ld_fresh_v4,
    ld_shared_b32,
    ld_shared_u8,
    pair_like_fp4x8,
    prefetch_l1,
)
from .mma import MMA_ROWS, mma_16816

WARPS_PER_CTA = 8
# MXFP4 groups whose weight words, scales and activations are loaded together before their MMAs (common.after_all_loads
# keeps ptxas from splitting a batch into one round trip per group): GEMM2 takes the largest equal batches of at most
# 4 (at TP16 as 3 + 3: 48 registers, where 4 + 2 needs 122).
GEMM1_GROUPS_IN_FLIGHT = 4
GEMM2_GROUPS_IN_FLIGHT = 4
GEMM1_COLUMNS = MMA_ROWS // 2  # a's columns per warp: 8 gate rows + the 8 matching up rows
GEMM2_ROWS = WARPS_PER_CTA * MMA_ROWS  # latent rows per GEMM2 CTA
# GEMM1 stages its 16 rows 16 bytes apart beyond their length: the 8 rows g of one MMA read word q of the same group,
# and unpadded rows of 1792 bytes would put all 8 in one bank. GEMM2's 128 rows go unpadded, one bulk copy per warp's
# 16 contiguous rows (192 or 96 bytes each: a 4- or 2-way conflict on a few loads): a bulk copy whose operands differ
# across lanes is issued once per lane in a loop, so one copy per row would serialize 16 copies in each warp.
ROW_PAD = 16
SMEM_SLACK = 256  # alignment of the staging buffer and its barrier


def prefetch_activations(x_row: Int64, q, first_group, groups: int) -> None:
    """Before the weights land: pull into L1 the lines of this lane's token row that the warp's `groups` MXFP4 groups
    from first_group will read (x_row as token_row returns it), the warp's 4 lanes q sharing them out, so the pinned
    activation batches after the wait hit L1 instead of paying one L2 round trip each."""
    start = x_row - Int64(q) * VEC_BYTES + Int64(first_group) * (FP4_GROUP * 2)
    lines = -(-groups * FP4_GROUP * 2 // 128)
    for i in range(-(-lines // 4)):
        prefetch_l1(start + Int64(cutlass.min(q + 4 * i, lines - 1)) * 128)


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
    w_g,
    w_g8,
    s_g,
    s_g8,
    first_group: Int32,
    q: Int32,
    zero: Int32,
    count: cutlass.Constexpr,
    fresh: cutlass.Constexpr,
):
    """acc += `count` MXFP4 groups from first_group of rows g / g + 8 (packed rows at w_g / w_g8, scale rows at s_g /
    s_g8: shared-memory addresses) times one token tile's activations (x_row: this lane's
    token row, global; `fresh`: written by a launch that was still running when this one started). Loads first, then
    the math (zero: a run-time 0 for common.after_all_loads)."""
    load_act = ld_fresh_v4 if fresh else ld_act_v4
    frags = []
    for i in cutlass.range_constexpr(count):
        group = first_group + i
        words = (ld_shared_b32(w_g + group * VEC_BYTES + q * 4), ld_shared_b32(w_g8 + group * VEC_BYTES + q * 4))
        scales = (ld_shared_u8(s_g + group), ld_shared_u8(s_g8 + group))
        frags.append((words, scales, load_act(x_row + Int64(group) * (FP4_GROUP * 2))))
    (first_g, first_g8), first_scales, first_x = frags[0]
    first_g = after_all_loads(first_g, [v for words, scales, xw in frags for v in (*words, *scales, xw[0])], zero)
    frags[0] = ((first_g, first_g8), first_scales, first_x)
    for i in cutlass.range_constexpr(count):
        words, scales, xw = frags[i]
        group_mma(acc, words, scales, xw)


def group_mma(acc: cute.Tensor, words, scales, xw) -> None:
    """acc += one MXFP4 group: `words` (rows g, g + 8: 8 packed E2M1 each), their E8M0 `scales`, and this lane's
    16 bytes of the token tile's activations `xw`; two k16 MMA steps into a fresh tile, scaled per row."""
    (word_g, word_g8), (scale_g, scale_g8) = words, scales
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
    w_g,
    w_g8,
    s_g,
    s_g8,
    first_group: Int32,
    q: Int32,
    zero: Int32,
    groups: cutlass.Constexpr,
    in_flight: cutlass.Constexpr,
    fresh: cutlass.Constexpr = False,
):
    """acc += groups first_group .. first_group + groups - 1, `in_flight` groups' loads at a time."""
    batches: cutlass.Constexpr = groups // in_flight
    for b in cutlass.range(batches, unroll=1):
        groups_mma(acc, x_row, w_g, w_g8, s_g, s_g8, first_group + b * in_flight, q, zero, in_flight, fresh)
    if cutlass.const_expr(groups % in_flight != 0):
        groups_mma(acc, x_row, w_g, w_g8, s_g, s_g8, first_group + batches * in_flight, q, zero, groups % in_flight,
                   fresh)


def check_mma_experts(latent: int, inter: int) -> None:
    if latent % (WARPS_PER_CTA * MMA_ROWS) or latent % (WARPS_PER_CTA * WARP):
        raise ValueError(f"experts (tensor cores): latent={latent} is not a multiple of {WARPS_PER_CTA * WARP}")
    if inter % FP4_GROUP:  # whole MXFP4 groups per w2 row; GEMM1's CTAs take 8 columns each (32 = 4 x 8)
        raise ValueError(f"experts (tensor cores): intermediate={inter} is not a multiple of {FP4_GROUP}")

