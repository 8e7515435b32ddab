"""Routed experts on the tensor cores (from 2 tokens, GEMM1 from 5; one token and GEMM1 up to 4 tokens run
experts.py's CUDA-core forms: experts.on_tensor_cores, holds_gemm1_weights): the two launches of experts.py (GEMM1 +
SiTU-GLU; GEMM2 + weighted combine + latent-norm tail), grouped by the same router plan, with mma.sync m16n8k16 (fp16
in, fp32 out).

A warp owns 16 weight rows of its slot's expert (GEMM1: a slice of their K groups, GEMM2: all of K) and the tokens
that chose it, one tile of 8 at a time (a slot holds
1 to 64 tokens; at M = 64 most hold one or two, and the MMA's idle columns cost nothing that matters: the expert's
bytes are the bound; a slot of more than 8 tokens rereads its rows, from L2, once per further tile). For each MXFP4
group of 32 k (one E8M0 scale per row), lane (g, q) loads the 4-byte word q of rows g and g + 8 (elements 8q ..
8q+7) and converts them to f16x2 pairs times 2^-6 (common.fp4x8_to_f16x2), and loads the same 8 k of its token g in
fp16, paired alike (pair_like_fp4x8): pairs 0, 1 feed one k16 step and pairs 2, 3 the next, a permutation of k that
A and B share. The scale belongs to a (row, group), so each group's two steps go into a fresh fp32 tile that is
scaled per row (rows g and g + 8 have their own scales) into the accumulator: exact for every E8M0 scale, where
folding scales into fp16 weights could overflow. From 2 tokens the weight words and scales come from a copy of the
CTA's rows in shared memory (bulk copies, one round trip per CTA); at one token straight from global memory.

C fragment of token tile t: lane (g, q) holds rows (g, g + 8) x slot columns (8t + 2q, 8t + 2q + 1).
GEMM1: MMA row g is gate row j0 + g and row g + 8 the up row I + j0 + g, so each lane holds gate and up of the same
(column, token) and applies SiTU-GLU in registers; a[pair, j0 + g] is stored fp16.
GEMM2: MMA rows are latent rows; each result times the pair's routing weight goes into y_lat with one fp32
reduction, and the last CTAs normalize, one token each (norm_tail.norm_tail).

GEMM2 is launched early (programmatic dependent launch): GEMM1 lets it start at once (griddepcontrol.launch_dependents),
so its CTAs take the room GEMM1's finishing CTAs free, read the plan (and, staged, start their weight copies), and
wait (griddepcontrol.wait) for GEMM1's results only before they read a or touch y_lat (measured 2-3% faster at 2 and
8 tokens with staged weights, 1.6% at one token with direct ones).
At one token and for short rows (TP16's 6 groups) each lane of GEMM2 holds all its weight words and scales in
registers, loaded before the wait (HeldWeights), and after the wait the CTA copies the token tile's rows of a into
shared memory in one round trip (stage_token_tile), from where the lanes read their fragments.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32, Int64, Uint8

from .common import (
    FP4_GROUP,
    VEC_BYTES,
    WARP,
    after_all_loads,
    bulk_copy_to_shared,
    e8m0_scale_times_64,
    expect_bulk_bytes,
    fp4x8_to_f16x2,
    ld_act_v4,
    ld_fresh_v4,
    ld_shared_b32,
    ld_shared_u8,
    ld_shared_v4,
    ld_u8,
    ld_weight_b32,
    pair_like_fp4x8,
    prefetch_l1,
    red_add_f32,
    situ_glu,
    st_shared_v4,
)
from .norm_tail import NORM_TAIL_CTAS, TAIL_SMEM_BYTES, alloc_tail_smem, norm_tail, zero_y_lat
from .mma import MMA_ROWS, TILE_TOKENS, alloc_tile_scratch, mma_16816, reduce_tiles, scratch_bytes, zero_tiles

WARPS_PER_CTA = 8
# MXFP4 groups whose weight words, scales and activations are loaded together before their MMAs (common.after_all_loads
# keeps ptxas from splitting a batch into one round trip per group). Weights from DRAM (one token): more than 4
# groups in flight cost occupancy (registers), but a short row (TP16's 6 groups) goes in one batch: 12.8 us against
# 17.4 as 4 + 2 (kimi_k3_kernels.md §6).
# Weights staged in shared memory (from 2 tokens): GEMM2 takes the largest equal batches of at most 4 (at TP16 as
# 3 + 3: 48 registers, where 4 + 2 needs 122).
GEMM1_GROUPS_IN_FLIGHT = 4
GEMM2_GROUPS_IN_FLIGHT = 4
ONE_BATCH_GROUPS = 6
# Held weights (one token, GEMM2): the token tile's activations come from shared memory two groups at a time: 64
# registers at TP8 (4 CTAs per SM), where 3 took 70 and 6 took 74 (cuobjdump -res-usage).
HELD_READS_IN_FLIGHT = 2
# Held weights pay off for short rows only: at M=1 they won at TP16 (6 groups) and lost at TP8 (12 groups; ncu: the
# held CTAs stay active longer, a longer chain per CTA, not bandwidth).
HOLD_MAX_GROUPS = 6
GEMM1_COLUMNS = MMA_ROWS // 2  # a's columns per warp: 8 gate rows + the 8 matching up rows
GEMM2_ROWS = WARPS_PER_CTA * MMA_ROWS  # latent rows per GEMM2 CTA
# Staged (from 2 tokens): GEMM1 stages its 16 rows 16 bytes apart beyond their length: the 8 rows g of one MMA
# read word q of the same group, and unpadded rows of 1792 bytes would put all 8 in one bank. GEMM2's 128 rows go
# unpadded, one bulk copy per warp's 16 contiguous rows (192 or 96 bytes each: a 4- or 2-way conflict on a few
# loads): a bulk copy whose operands differ across lanes is issued once per lane in a loop, so one copy per row
# would serialize 16 copies in each warp.
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
    staged: cutlass.Constexpr,
    fresh: cutlass.Constexpr,
):
    """acc += `count` MXFP4 groups from first_group of rows g / g + 8 (packed rows at w_g / w_g8, scale rows at s_g /
    s_g8: shared-memory addresses if staged, else global) times one token tile's activations (x_row: this lane's
    token row, global; `fresh`: written by a launch that was still running when this one started). Loads first, then
    the math (zero: a run-time 0 for common.after_all_loads)."""
    load_word = ld_shared_b32 if staged else ld_weight_b32
    load_scale = ld_shared_u8 if staged else ld_u8
    load_act = ld_fresh_v4 if fresh else ld_act_v4
    frags = []
    for i in cutlass.range_constexpr(count):
        group = first_group + i
        words = (load_word(w_g + group * VEC_BYTES + q * 4), load_word(w_g8 + group * VEC_BYTES + q * 4))
        scales = (load_scale(s_g + group), load_scale(s_g8 + group))
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
    staged: cutlass.Constexpr,
    fresh: cutlass.Constexpr = False,
):
    """acc += groups first_group .. first_group + groups - 1, `in_flight` groups' loads at a time."""
    batches: cutlass.Constexpr = groups // in_flight
    for b in cutlass.range(batches, unroll=1):
        groups_mma(acc, x_row, w_g, w_g8, s_g, s_g8, first_group + b * in_flight, q, zero, in_flight, staged, fresh)
    if cutlass.const_expr(groups % in_flight != 0):
        groups_mma(acc, x_row, w_g, w_g8, s_g, s_g8, first_group + batches * in_flight, q, zero, groups % in_flight,
                   staged, fresh)


class HeldWeights:
    """Every MXFP4 group of one lane's two w2 rows (g, g + 8), loaded into registers from global memory at once: the
    weight words, and the scales as 4-byte words where the scale rows allow (groups % 4 == 0; one byte each
    otherwise), so that GEMM2 launched early has its weights in flight while GEMM1 still runs."""

    def __init__(self, w_g: Int64, w_g8: Int64, s_g: Int64, s_g8: Int64, q: Int32, groups: int):
        self.groups = groups
        self.words = [(ld_weight_b32(w_g + gi * VEC_BYTES + q * 4), ld_weight_b32(w_g8 + gi * VEC_BYTES + q * 4))
                      for gi in range(groups)]
        self.packed_scales = groups % 4 == 0
        if self.packed_scales:
            self.scales = [(ld_weight_b32(s_g + 4 * i), ld_weight_b32(s_g8 + 4 * i)) for i in range(groups // 4)]
        else:
            self.scales = [(ld_u8(s_g + gi), ld_u8(s_g8 + gi)) for gi in range(groups)]

    def registers(self) -> list:
        return [v for pair in self.words + self.scales for v in pair]

    def scale_pair(self, gi: int, link: Int32):
        """Group gi's two scales (link: a run-time 0 that ties their extraction to the group's batch)."""
        if not self.packed_scales:
            return tuple(s | link for s in self.scales[gi])
        shift = 8 * (gi % 4)
        return tuple(((word | link) >> shift) & 0xFF for word in self.scales[gi // 4])


def held_span_mma(acc: cute.Tensor, x_row: Int32, held: HeldWeights, zero: Int32, in_flight: int):
    """acc += every group of `held` times one token tile's activations, read from shared memory (x_row: this lane's
    piece of its column's row, as stage_token_tile lays it out) `in_flight` groups at a time. Each batch's reads
    depend on the previous batch's values, and its weights enter the math through a value that depends on its own:
    unrolled, ptxas would otherwise hoist every read, and every weight's conversion, to the top (128 registers at
    TP8 where 4 CTAs per SM need <= 64)."""
    link = Int32(0)
    for first in range(0, held.groups, in_flight):
        batch = range(first, min(first + in_flight, held.groups))
        base = x_row + link
        xs = [ld_shared_v4(base + gi * (FP4_GROUP * 2)) for gi in batch]
        link = after_all_loads(Int32(0), [v for xw in xs for v in xw], zero)  # not `zero |`: a | (b & a) folds to a
        for gi, xw in zip(batch, xs):
            words = tuple(word | link for word in held.words[gi])
            group_mma(acc, words, held.scale_pair(gi, link), xw)


TILE_ROW_PAD = 64  # the 8 rows of a staged token tile 64 bytes apart (mod 128): a quarter-warp's 16-byte reads of
# rows g and g + 1 (lanes 4g .. 4g + 7) then fall in distinct banks


def tile_row_bytes(inter: int) -> int:
    return inter * 2 + TILE_ROW_PAD


@cute.jit
def stage_token_tile(tile_smem: Int32, a: cute.Tensor, slot_pairs: cute.Tensor, slot: Int32, first_column: Int32,
                     columns: Int32, tidx: Int32, inter: cutlass.Constexpr):
    """Copy the `a` rows of slot columns first_column .. + columns - 1 (at most 8; written by GEMM1, read after the
    wait with plain loads) into shared memory, one 16-byte piece per thread and round: one round trip to L2 for the
    tile instead of one per batch of groups."""
    vecs: cutlass.Constexpr = inter * 2 // VEC_BYTES
    cute.arch.sync_threads()  # the previous tile's reads are done
    for idx in cutlass.range(tidx, columns * vecs, WARPS_PER_CTA * WARP, unroll=1):
        column, vec = idx // vecs, idx % vecs
        src = a.iterator.toint() + Int64(slot_pairs[slot, first_column + column]) * (inter * 2) + Int64(vec) * VEC_BYTES
        st_shared_v4(tile_smem + column * tile_row_bytes(inter) + vec * VEC_BYTES, ld_fresh_v4(src))
    cute.arch.sync_threads()


def check_mma_experts(latent: int, inter: int) -> None:
    if latent % (WARPS_PER_CTA * MMA_ROWS) or latent % (WARPS_PER_CTA * WARP):
        raise ValueError(f"experts (tensor cores): latent={latent} is not a multiple of {WARPS_PER_CTA * WARP}")
    if inter % FP4_GROUP:  # whole MXFP4 groups per w2 row; GEMM1's CTAs take 8 columns each (32 = 4 x 8)
        raise ValueError(f"experts (tensor cores): intermediate={inter} is not a multiple of {FP4_GROUP}")


class ExpertsGemm1SituMma:
    """ExpertsGemm1Situ (same tensors and results) on the tensor cores. CTA (slot, tile) computes a's columns
    8*tile .. 8*tile + 7 of the slot's pairs: MMA rows g are gate rows j0 + g, rows g + 8 the matching up rows. Its 8
    warps split the K groups (14 each at L = 3584) and meet in shared memory; threads (token, column) then apply
    SiTU-GLU to the totals. `staged` (from 2 tokens): the CTA's 16 packed rows and their scales (30 KB at L = 3584)
    come into shared memory by bulk copies in one round trip; otherwise each lane loads its weight words from global
    memory in pinned batches, which one token measured faster."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, staged: bool = True,
                 in_flight: int = GEMM1_GROUPS_IN_FLIGHT, early_gemm2: bool = True):
        check_mma_experts(latent, inter)  # latent % 256 == 0: the 8 warps get whole, equal shares of the K groups
        self.e, self.l, self.i, self.k, self.staged, self.in_flight = experts, latent, inter, top_k, staged, in_flight
        self.early_gemm2 = early_gemm2
        self.row_stride = latent // 2 + ROW_PAD
        self.scale_row = latent // FP4_GROUP
        self.stage_bytes = MMA_ROWS * (latent // 2 + self.scale_row)  # what the bulk copies bring

    def smem_bytes(self) -> int:
        staging = MMA_ROWS * (self.row_stride + self.scale_row) + SMEM_SLACK if self.staged else 0
        return scratch_bytes(TILE_TOKENS) + staging

    @cute.jit
    def __call__(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, stream: cuda.CUstream):
        m = x_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m).launch(
            grid=[slots, self.i // GEMM1_COLUMNS, 1], block=[WARPS_PER_CTA * WARP, 1, 1],
            smem=self.smem_bytes(), stream=stream,
        )

    @cute.kernel
    def kernel(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        if cutlass.const_expr(self.early_gemm2):
            # GEMM2 (launched early) may take the SM room this grid frees: it stages its weights, then waits for us.
            cute.arch.griddepcontrol_launch_dependents()
        smem = cutlass.memory.SmemAllocator()
        scratch = alloc_tile_scratch(smem, TILE_TOKENS)
        if cutlass.const_expr(self.staged):
            stage = smem.allocate_tensor(Uint8, cute.make_layout(MMA_ROWS * (self.row_stride + self.scale_row)),
                                         byte_alignment=128)
            barrier = smem.allocate_tensor(Int64, cute.make_layout(1), byte_alignment=8)
        zero_y_lat(y_lat, (tile * grid_x + slot) * WARPS_PER_CTA * WARP + tidx, grid_x * grid_y * WARPS_PER_CTA * WARP,
                   m_count, self.l)
        if slot < n_active[0]:
            warp, lane = tidx // WARP, tidx % WARP
            g, q = lane // 4, lane % 4
            j0 = tile * GEMM1_COLUMNS
            expert = slot_expert[slot]
            count = slot_count[slot]
            n_tiles = (count + TILE_TOKENS - 1) // TILE_TOKENS
            packed: cutlass.Constexpr = self.l // 2
            groups: cutlass.Constexpr = self.l // FP4_GROUP
            per_warp: cutlass.Constexpr = groups // WARPS_PER_CTA
            first_row = Int64(expert) * (2 * self.i) + Int64(j0)
            if cutlass.const_expr(self.staged):
                # Stage rows r < 8: gate row j0 + r; r >= 8: up row I + j0 + r - 8 (the MMA's rows g and g + 8).
                # Warp w copies gate row w (lane 0) and up row w (lane 1); lane 2 of warps 0 and 1 the scales.
                expect_bulk_bytes(barrier, tidx, self.stage_bytes)
                stage_addr = stage.iterator.toint()
                scales_addr = stage_addr + MMA_ROWS * self.row_stride
                if lane < 2:
                    row = first_row + Int64(warp + lane * self.i)
                    bulk_copy_to_shared(stage_addr + (warp + lane * 8) * self.row_stride,
                                        w13.iterator.toint() + row * packed, packed, barrier.iterator.toint())
                elif lane == 2 and warp < 2:
                    bulk_copy_to_shared(scales_addr + warp * 8 * groups,
                                        s13.iterator.toint() + (first_row + Int64(warp * self.i)) * groups,
                                        8 * groups, barrier.iterator.toint())
                prefetch_activations(token_row(slot_pairs, slot, count, g, self.k, True, x_lat.iterator.toint(),
                                               self.l * 2, q), q, warp * per_warp, per_warp)
                cute.arch.mbarrier_wait(barrier.iterator, 0)
                w_g, w_g8 = stage_addr + g * self.row_stride, stage_addr + (g + 8) * self.row_stride
                s_g, s_g8 = scales_addr + g * groups, scales_addr + (g + 8) * groups
            else:
                gate_row = first_row + Int64(g)
                up_row = gate_row + Int64(self.i)
                w_g, w_g8 = w13.iterator.toint() + gate_row * packed, w13.iterator.toint() + up_row * packed
                s_g, s_g8 = s13.iterator.toint() + gate_row * groups, s13.iterator.toint() + up_row * groups
            for t in cutlass.range(n_tiles, unroll=1):
                x_row = token_row(slot_pairs, slot, count, t * TILE_TOKENS + g, self.k, True, x_lat.iterator.toint(),
                                  self.l * 2, q)
                acc = zero_tiles(1)
                group_span_mma(acc, x_row, w_g, w_g8, s_g, s_g8, warp * per_warp, q, m_count >> 31, per_warp,
                               self.in_flight, self.staged)
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
    128*tile .. +127 of the slot's pairs, 16 per warp. `staged`: those rows of w2 and their scales come into shared
    memory by bulk copies (one round trip), as in ExpertsGemm1SituMma."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, eps: float, staged: bool = True,
                 in_flight: int = GEMM2_GROUPS_IN_FLIGHT, early: bool = True, tail_ctas: int = NORM_TAIL_CTAS,
                 hold_weights: bool | None = None, early_finalize: bool = False):
        check_mma_experts(latent, inter)
        groups = inter // FP4_GROUP
        if staged:
            in_flight = max(n for n in range(1, in_flight + 1) if groups % n == 0)
        elif groups <= ONE_BATCH_GROUPS:
            in_flight = groups
        self.e, self.l, self.i, self.k, self.eps, self.staged, self.in_flight = (
            experts, latent, inter, top_k, eps, staged, in_flight)
        self.scale_row = inter // FP4_GROUP
        self.stage_bytes = GEMM2_ROWS * (inter // 2 + self.scale_row)
        # early: launched with programmatic dependent launch while GEMM1 drains (see the module docstring).
        self.early, self.tail_ctas, self.early_finalize = early, tail_ctas, early_finalize
        # Direct and early: every weight word and scale of the lane is loaded before the wait (HeldWeights); by
        # default only for rows of at most HOLD_MAX_GROUPS groups (see there).
        if hold_weights is None:
            hold_weights = groups <= HOLD_MAX_GROUPS
        self.holds_weights = hold_weights and early and not staged

    def smem_bytes(self) -> int:
        if self.holds_weights:
            return TAIL_SMEM_BYTES + TILE_TOKENS * tile_row_bytes(self.i)
        return TAIL_SMEM_BYTES + (self.stage_bytes + SMEM_SLACK if self.staged else 0)

    @cute.jit
    def __call__(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma,
                 normed, stream: cuda.CUstream):
        m = y_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma, normed,
                    m).launch(
            grid=[slots, self.l // GEMM2_ROWS, 1], block=[WARPS_PER_CTA * WARP, 1, 1],
            smem=self.smem_bytes(), stream=stream, use_pdl=self.early,
        )

    @cute.kernel
    def kernel(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma, normed,
               m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        if cutlass.const_expr(self.early_finalize):
            cute.arch.griddepcontrol_launch_dependents()  # the finalize (launched early) waits for us before any load
        smem = cutlass.memory.SmemAllocator()
        flag, partial = alloc_tail_smem(smem)
        if cutlass.const_expr(self.staged):
            stage = smem.allocate_tensor(Uint8, cute.make_layout(self.stage_bytes), byte_alignment=128)
            barrier = smem.allocate_tensor(Int64, cute.make_layout(1), byte_alignment=8)
        if cutlass.const_expr(self.holds_weights):
            token_tile = smem.allocate_tensor(Uint8, cute.make_layout(TILE_TOKENS * tile_row_bytes(self.i)),
                                              byte_alignment=16)
        if slot < n_active[0]:
            warp, lane = tidx // WARP, tidx % WARP
            g, q = lane // 4, lane % 4
            r0 = (tile * WARPS_PER_CTA + warp) * MMA_ROWS
            expert = slot_expert[slot]
            count = slot_count[slot]
            n_tiles = (count + TILE_TOKENS - 1) // TILE_TOKENS
            packed: cutlass.Constexpr = self.i // 2
            groups: cutlass.Constexpr = self.i // FP4_GROUP
            y_addr = y_lat.iterator.toint()
            if cutlass.const_expr(self.staged):
                expect_bulk_bytes(barrier, tidx, self.stage_bytes)
                stage_addr = stage.iterator.toint()
                scales_addr = stage_addr + GEMM2_ROWS * packed
                first_row = Int64(expert) * self.l + Int64(tile * GEMM2_ROWS)
                if lane == 0:  # the warp's 16 rows, contiguous in w2
                    bulk_copy_to_shared(stage_addr + warp * MMA_ROWS * packed,
                                        w2.iterator.toint() + (first_row + Int64(warp * MMA_ROWS)) * packed,
                                        MMA_ROWS * packed, barrier.iterator.toint())
                elif lane == 1 and warp == 0:
                    bulk_copy_to_shared(scales_addr, s2.iterator.toint() + first_row * groups, GEMM2_ROWS * groups,
                                        barrier.iterator.toint())
                if cutlass.const_expr(self.early):
                    cute.arch.griddepcontrol_wait()
                prefetch_activations(token_row(slot_pairs, slot, count, g, self.k, False, a.iterator.toint(),
                                               self.i * 2, q), q, 0, groups)
                cute.arch.mbarrier_wait(barrier.iterator, 0)
                local = warp * MMA_ROWS + g  # this lane's MMA row g within the CTA's rows
                w_g, w_g8 = stage_addr + local * packed, stage_addr + (local + 8) * packed
                s_g, s_g8 = scales_addr + local * groups, scales_addr + (local + 8) * groups
            else:
                row = Int64(expert) * self.l + Int64(r0 + g)
                w_g, w_g8 = w2.iterator.toint() + row * packed, w2.iterator.toint() + (row + 8) * packed
                s_g, s_g8 = s2.iterator.toint() + row * groups, s2.iterator.toint() + (row + 8) * groups
                if cutlass.const_expr(self.holds_weights):
                    held = HeldWeights(w_g, w_g8, s_g, s_g8, q, groups)
                    # Wait once the weights have landed: a wait that depends on them keeps ptxas from sinking
                    # their loads past it, next to their first use.
                    zero = m_count >> 31
                    if after_all_loads(Int32(0), held.registers(), zero) == 0:
                        cute.arch.griddepcontrol_wait()
                elif cutlass.const_expr(self.early):
                    cute.arch.griddepcontrol_wait()
            for t in cutlass.range(n_tiles, unroll=1):
                acc = zero_tiles(1)
                if cutlass.const_expr(self.holds_weights):
                    columns = cutlass.min(count - t * TILE_TOKENS, TILE_TOKENS)
                    tile_addr = token_tile.iterator.toint()
                    stage_token_tile(tile_addr, a, slot_pairs, slot, t * TILE_TOKENS, columns, tidx, self.i)
                    x_row = tile_addr + cutlass.min(g, columns - 1) * tile_row_bytes(self.i) + q * VEC_BYTES
                    held_span_mma(acc, x_row, held, m_count >> 31, HELD_READS_IN_FLIGHT)
                else:
                    x_row = token_row(slot_pairs, slot, count, t * TILE_TOKENS + g, self.k, False,
                                      a.iterator.toint(), self.i * 2, q)
                    group_span_mma(acc, x_row, w_g, w_g8, s_g, s_g8, Int32(0), q, m_count >> 31, groups,
                                   self.in_flight, self.staged, self.early)
                for c in cutlass.range_constexpr(2):
                    column = t * TILE_TOKENS + 2 * q + c
                    if column < count:
                        pair = slot_pairs[slot, column]
                        token = pair // self.k
                        weight = topk_w[token, pair % self.k]
                        out_row = Int64(token) * self.l + Int64(r0 + g)
                        red_add_f32(y_addr + out_row * 4, acc[0, c] * weight)
                        red_add_f32(y_addr + (out_row + 8) * 4, acc[0, 2 + c] * weight)

        if cutlass.const_expr(self.early):
            cute.arch.griddepcontrol_wait()  # CTAs of empty slots too: the tail reads y_lat, which GEMM1 zeroes
        norm_tail(y_lat, gamma, normed, counter, flag, partial, tidx, m_count, grid_x * grid_y, self.l, self.eps,
                  self.tail_ctas)
