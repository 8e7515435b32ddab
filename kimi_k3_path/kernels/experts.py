"""Routed experts in MXFP4 (W4A16): packed E2M1 weights with E8M0 scales per 32, dequantized in registers.

Grouped by the router's plan: CTA (slot, tile) works on the slot's expert only, loads its weight tile once into
registers, then loops over the tokens that chose that expert, so each active expert's weights are read once per
step however many tokens chose it. CTAs of unused slots (slot >= n_active) exit at once.

Activations are fp16 (x_lat from the front kernel, a from GEMM1): E2M1 values convert exactly to fp16 pairs in one
instruction, and the products run as packed f16x2 FMAs within each 32-value group (fp32 across groups). fp16 needs
|x_lat| < 65504 (|a| < 100 holds by SiTU's soft caps).

GEMM1 + SiTU: a half-warp per weight row, the two half-warps of a warp on gate row j and up row I+j, so the
activation a[pair, j] = situ_glu(gate, up) is formed in registers. a is stored fp16 per (token, slot) pair.
Up to 4 tokens GEMM1 holds each CTA's weights in registers (ExpertsGemm1Held); at one token GEMM2 has its own form
(ExpertsGemm2OneToken; moe.one_token_experts).
GEMM2 + combine: `lanes` lanes per row of w2; each row's result times the pair's routing weight is added with one
fp32 reduction into y_lat[token] (zeroed by GEMM1 of the same step). The last CTAs to finish (one per token;
self-resetting device counters) apply the latent RMSNorm, normed[t] = y_lat[t] * rsqrt(mean(y_lat[t]^2)
+ eps) * gamma, in bf16 for the finalize GEMM: the norm needs whole rows, which only exist once every CTA is done.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32, Int64, Uint8

from .common import (
    FP4_GROUP,
    VEC_BYTES,
    WARP,
    after_all_loads,
    e8m0_scale_times_64,
    f16x2_add_sum_f32,
    f16x2_pair_sum_f32,
    fp4x8_fma_f16x2,
    fp4x8_fma_f16x2_paired,
    lane_group_sum,
    ld_act_v4,
    ld_fresh_v4,
    ld_shared_v4,
    ld_u8,
    ld_weight_v4,
    pair_like_fp4x8,
    red_add_f32,
    situ_glu,
    st_shared_v4,
    traced,
)
from .gemv import SCRATCH_BYTES, alloc_scratch
from .norm_tail import NORM_TAIL_CTAS, TAIL_SMEM_BYTES, alloc_tail_smem, norm_tail, zero_y_lat
from .shared import ONE_TOKEN_SHARED_SPLIT, check_shared, shared_ctas, shared_part
from .trace import trace_address

WARPS_PER_CTA = 8
GEMM1_LANES_PER_ROW = 16


def group_dot(packed, x_addr, load_act=ld_act_v4, quarter_stride: int = VEC_BYTES, paired: bool = False) -> Float32:
    """Unscaled dot (times 2^-6) of one MXFP4 group (4 words of packed nibbles) with 32 fp16 activations at x_addr
    (a global address for ld_act_v4, a shared one for ld_shared_v4; the group's four 16-byte quarters
    `quarter_stride` bytes apart): packed f16x2 products within the group, fp32 from the group sum on.
    paired: each quarter was stored paired like the weights (pair_like_fp4x8), and the group's two accumulators are
    added as f16x2 before fp32; otherwise each quarter is in element order, and two accumulators of 8 terms each."""
    acc0 = Int32(0)
    acc1 = Int32(0)
    fma = fp4x8_fma_f16x2_paired if paired else fp4x8_fma_f16x2
    for q in range(4):
        xw = load_act(x_addr + q * quarter_stride)
        acc0, acc1 = fma(packed[q], xw[0], xw[1], xw[2], xw[3], acc0, acc1)
    return f16x2_add_sum_f32(acc0, acc1) if paired else f16x2_pair_sum_f32(acc0, acc1)


def lanes_per_row(groups: int) -> int:
    """Lanes sharing one w2 row: the most (<= 32) that split its MXFP4 groups evenly."""
    for lanes in (32, 16, 8, 4, 2, 1):
        if groups % lanes == 0:
            return lanes
    return 1


class ExpertsGemm1Situ:
    """a[p, j] = situ_glu(x_lat[t] . w13[e, j], x_lat[t] . w13[e, I + j]) for every planned pair p = t*k + slot.
    Tensors: x_lat [M, L] fp16, w13 [E, 2I, L/2] uint8, s13 [E, 2I, L/32] uint8, plan (n_active [1],
    slot_expert [S], slot_count [S], slot_pairs [S, 64]) int32, a [M*k, I] fp16, y_lat [M, L] fp32 (zeroed here)."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int):
        groups = latent // FP4_GROUP
        if latent % FP4_GROUP or groups % GEMM1_LANES_PER_ROW:
            raise ValueError(f"ExpertsGemm1Situ: latent={latent} must be a multiple of {FP4_GROUP * GEMM1_LANES_PER_ROW}")
        if inter % WARPS_PER_CTA:
            raise ValueError(f"ExpertsGemm1Situ: intermediate={inter} is not a multiple of {WARPS_PER_CTA}")
        self.e, self.l, self.i, self.k = experts, latent, inter, top_k
        self.groups_per_lane = groups // GEMM1_LANES_PER_ROW

    @cute.jit
    def __call__(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, stream: cuda.CUstream):
        m = x_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m).launch(
            grid=[slots, self.i // WARPS_PER_CTA, 1], block=[WARPS_PER_CTA * WARP, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        zero_y_lat(y_lat, (tile * grid_x + slot) * WARPS_PER_CTA * WARP + tidx, grid_x * grid_y * WARPS_PER_CTA * WARP,
                   m_count, self.l)

        if slot < n_active[0]:
            lane = tidx % WARP
            sub = lane % GEMM1_LANES_PER_ROW
            j = tile * WARPS_PER_CTA + tidx // WARP
            row = (lane // GEMM1_LANES_PER_ROW) * self.i + j  # gate row j, or up row I + j
            expert = slot_expert[slot]
            count = slot_count[slot]
            row_bytes: cutlass.Constexpr = self.l // 2
            row_addr = w13.iterator.toint() + (Int64(expert) * (2 * self.i) + Int64(row)) * row_bytes
            scale_addr = s13.iterator.toint() + (Int64(expert) * (2 * self.i) + Int64(row)) * (self.l // FP4_GROUP)
            packed = []
            scales = []
            for gi in cutlass.range_constexpr(self.groups_per_lane):
                g = sub + gi * GEMM1_LANES_PER_ROW
                packed.append(ld_weight_v4(row_addr + Int64(g) * VEC_BYTES))
                scales.append(e8m0_scale_times_64(ld_u8(scale_addr + Int64(g))))
            for idx in cutlass.range(count, unroll=1):
                pair = slot_pairs[slot, idx]
                token = pair // self.k
                x_addr = x_lat.iterator.toint() + Int64(token) * (self.l * 2)
                acc = Float32(0.0)
                for gi in cutlass.range_constexpr(self.groups_per_lane):
                    g = sub + gi * GEMM1_LANES_PER_ROW
                    acc = acc + group_dot(packed[gi], x_addr + Int64(g) * (FP4_GROUP * 2)) * scales[gi]
                acc = lane_group_sum(acc, GEMM1_LANES_PER_ROW)
                up = cute.arch.shuffle_sync_bfly(acc, GEMM1_LANES_PER_ROW)
                if lane == 0:
                    a[pair, j] = situ_glu(acc, up).to(Float16)


# GEMM1 holds each CTA's weights in registers (ExpertsGemm1Held) for batches of at most this many tokens; the
# tensor-core kernel (experts_mma.py) above: only up to 4 tokens did the probe and bench.py's matrix both see the held
# form win (at 16 tokens the matrix had it 7-11% slower; kimi_k3_kernels.md §6).
GEMM1_HELD_MAX_TOKENS = 4


def held_gemm1_ctas(m: int, top_k: int, experts: int, inter: int) -> int:
    """CTAs of ExpertsGemm1Held's grid for a batch of m tokens: one per (slot, 8 rows of the intermediate)."""
    return min(m * top_k, experts) * (inter // WARPS_PER_CTA)


class ExpertsGemm1Held:
    """GEMM1 + SiTU-GLU on the CUDA cores for a few tokens, every weight byte of a lane in flight at once and held
    in registers while the CTA takes its slot's tokens, their activations from shared memory. CTA (slot, tile)
    computes a[pair, 8*tile + w] with warp w: half-warp h on gate row j (h = 0) or up row I + j (h = 1), lane s of the
    half on MXFP4 groups s, s + 16, ... (all 7 at L = 3584: 16-byte loads, a half-warp reading 256 contiguous bytes
    each). While they fly, the CTA copies x_lat of the slot's first token (7 KB) into shared memory, each group's four
    16-byte quarters `groups` vectors apart so that the lanes of a half-warp, on consecutive groups, read consecutive
    vectors (no bank conflicts); then each lane's dot, a half-warp sum, one shuffle to meet gate and up. Each further
    token of the slot: a barrier, its row copied in (one round trip), a barrier, the same math. Lets GEMM2 (launched
    early) start at once.
    one_token: the batch is one token, so each slot has one pair; y_lat is left alone (GEMM2's one-token form writes
    it whole), and without the loop over further tokens the kernel needs 58 registers instead of 66 (4 CTAs per SM
    instead of 3; at one token the loop's form took 0.3-0.7 us more). Otherwise the CTAs zero y_lat for
    GEMM2's general form.
    Tensors as ExpertsGemm1Situ: x_lat [M, L] fp16, w13 [E, 2I, L/2] uint8, s13 [E, 2I, L/32] uint8, plan, a [M*k, I]
    fp16, y_lat [M, L] fp32."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, one_token: bool, trace_addr: int = 0):
        groups = latent // FP4_GROUP
        if latent % FP4_GROUP or groups % GEMM1_LANES_PER_ROW:
            raise ValueError(f"ExpertsGemm1Held: latent={latent} must be a multiple of "
                             f"{FP4_GROUP * GEMM1_LANES_PER_ROW}")
        if inter % WARPS_PER_CTA:
            raise ValueError(f"ExpertsGemm1Held: intermediate={inter} is not a multiple of {WARPS_PER_CTA}")
        self.e, self.l, self.i, self.k, self.one_token = experts, latent, inter, top_k, one_token
        self.trace_addr = trace_addr
        self.groups = groups
        self.groups_per_lane = groups // GEMM1_LANES_PER_ROW
        self.vecs = groups * 4  # 16-byte vectors of an x_lat row
        self.rounds = -(-self.vecs // (WARPS_PER_CTA * WARP))  # of them per thread

    def smem_bytes(self) -> int:
        return self.l * 2

    @cute.jit
    def __call__(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, stream: cuda.CUstream):
        m = x_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m).launch(
            grid=[slots, self.i // WARPS_PER_CTA, 1], block=[WARPS_PER_CTA * WARP, 1, 1], smem=self.smem_bytes(),
            stream=stream,
        )

    def load_row(self, x_lat, pair, tidx):
        """This thread's vectors of x_lat[pair // k] (past the row's end: its last vector again)."""
        x_addr = x_lat.iterator.toint() + Int64(pair // self.k) * (self.l * 2)
        return [ld_act_v4(x_addr + Int64(cutlass.min(tidx + r * WARPS_PER_CTA * WARP, self.vecs - 1)) * VEC_BYTES)
                for r in range(self.rounds)]

    def store_row(self, base, pieces, tidx, zero):
        """load_row's vectors into the shared-memory layout (a vector past the end lands on the last one again), each
        paired like the weights' nibbles once here rather than once per weight word in the math."""
        for r in range(self.rounds):
            v = cutlass.min(tidx + r * WARPS_PER_CTA * WARP, self.vecs - 1)
            st_shared_v4(base + zero + ((v % 4) * self.groups + v // 4) * VEC_BYTES, pair_like_fp4x8(*pieces[r]))

    def write_pair(self, base, packed, scale_bytes, sub, a, pair, j):
        """a[pair, j] from the row in shared memory and this lane's weights (every lane stores lane 0's value)."""
        acc = Float32(0.0)
        for gi in range(self.groups_per_lane):
            g = sub + gi * GEMM1_LANES_PER_ROW
            acc = acc + group_dot(packed[gi], base + g * VEC_BYTES, ld_shared_v4, self.groups * VEC_BYTES,
                                  paired=True) * e8m0_scale_times_64(scale_bytes[gi])
        gate = lane_group_sum(acc, GEMM1_LANES_PER_ROW)
        up = cute.arch.shuffle_sync_bfly(gate, GEMM1_LANES_PER_ROW)
        a[pair, j] = cute.arch.shuffle_sync(situ_glu(gate, up), 0).to(Float16)  # lane 0: gate from half 0

    @cute.kernel
    def kernel(self, x_lat, w13, s13, n_active, slot_expert, slot_count, slot_pairs, a, y_lat, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        traced(self.trace_addr, tile * grid_x + slot, tidx, False)
        cute.arch.griddepcontrol_launch_dependents()  # GEMM2 (launched early) loads its weights, then waits for us
        if cutlass.const_expr(not self.one_token):
            zero_y_lat(y_lat, (tile * grid_x + slot) * WARPS_PER_CTA * WARP + tidx,
                       grid_x * grid_y * WARPS_PER_CTA * WARP, m_count, self.l)
        # The plan's words in one round trip (an inactive slot's entries are stale, and unused): the branch depends
        # on all of them, or ptxas loads the expert and the pair only after it.
        expert = slot_expert[slot]
        pair = slot_pairs[slot, 0]
        count = Int32(1)
        if cutlass.const_expr(not self.one_token):
            count = slot_count[slot]
        active = after_all_loads(n_active[0], [expert, pair, count], slot >> 10)
        if slot < active:
            lane = tidx % WARP
            sub = lane % GEMM1_LANES_PER_ROW
            j = tile * WARPS_PER_CTA + tidx // WARP
            row = Int64(expert) * (2 * self.i) + Int64((lane // GEMM1_LANES_PER_ROW) * self.i + j)
            row_bytes: cutlass.Constexpr = self.l // 2
            row_addr = w13.iterator.toint() + row * row_bytes + Int64(sub * VEC_BYTES)
            scale_addr = s13.iterator.toint() + row * self.groups + Int64(sub)
            packed = []
            scale_bytes = []
            for gi in cutlass.range_constexpr(self.groups_per_lane):
                packed.append(list(ld_weight_v4(row_addr + Int64(gi * GEMM1_LANES_PER_ROW * VEC_BYTES), "ordered")))
                scale_bytes.append(ld_u8(scale_addr + Int64(gi * GEMM1_LANES_PER_ROW), ordered=True))
            # Kept as measured; ptxas emits nothing for it at full convergence: the copy's CTA barrier is what keeps
            # the weak loads ahead (the CPU SASS test checks it).
            cute.arch.sync_warp()
            pieces = self.load_row(x_lat, pair, tidx)
            # The row copy and the barrier wait for x_lat only, and each group's math then for its own weights (pinning
            # the weights with x made the whole CTA's math wait for its slowest warp's last bytes); the math,
            # issue-bound at 4 CTAs per SM, is GEMM1's excess over its bytes. Weak (ordered) loads stay ahead of the
            # barriers without a pin (a CPU test reads the SASS).
            zero = after_all_loads(Int32(0), [w for piece in pieces for w in piece], slot >> 10)
            base = cutlass.memory.SmemAllocator().allocate_tensor(
                Uint8, cute.make_layout(self.l * 2), byte_alignment=16).iterator.toint()
            self.store_row(base, pieces, tidx, zero)
            cute.arch.sync_threads()
            self.write_pair(base, packed, scale_bytes, sub, a, pair, j)
            if cutlass.const_expr(not self.one_token):
                for t in cutlass.range(1, count, unroll=1):
                    cute.arch.sync_threads()  # every warp is done with the previous token's row
                    later = slot_pairs[slot, t]
                    self.store_row(base, self.load_row(x_lat, later, tidx), tidx, 0)
                    cute.arch.sync_threads()
                    self.write_pair(base, packed, scale_bytes, sub, a, later, j)
        traced(self.trace_addr, tile * grid_x + slot, tidx, True)


class ExpertsGemm2Combine:
    """y_lat[t] += w[p] * (a[p] @ w2[e]^T) for every planned pair p = t*k + slot, then normed = rms_norm(y_lat).
    Tensors: a [M*k, I] fp16, w2 [E, L, I/2] uint8, s2 [E, L, I/32] uint8, plan, topk weights [M, k] fp32,
    y_lat [M, L] fp32 (accumulated with fp32 reductions), counter [2] int32 (zero; left zero), gamma [L] fp32,
    normed [M, L] bf16."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, eps: float, tail_ctas: int = NORM_TAIL_CTAS):
        if latent % (WARPS_PER_CTA * WARP):
            raise ValueError(
                f"ExpertsGemm2Combine: latent={latent} is not a multiple of {WARPS_PER_CTA * WARP} (norm-tail threads)"
            )
        if inter % FP4_GROUP:
            raise ValueError(f"ExpertsGemm2Combine: intermediate={inter} is not a multiple of {FP4_GROUP}")
        groups = inter // FP4_GROUP
        self.lanes = lanes_per_row(groups)
        self.rows_per_cta = WARPS_PER_CTA * WARP // self.lanes
        if latent % self.rows_per_cta:
            raise ValueError(f"ExpertsGemm2Combine: latent={latent} is not a multiple of {self.rows_per_cta}")
        self.e, self.l, self.i, self.k, self.eps, self.tail_ctas = experts, latent, inter, top_k, eps, tail_ctas
        self.groups_per_lane = groups // self.lanes

    @cute.jit
    def __call__(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma,
                 normed, stream: cuda.CUstream):
        m = y_lat.shape[0]
        slots = cutlass.min(m * self.k, self.e)
        self.kernel(a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma, normed,
                    m).launch(
            grid=[slots, self.l // self.rows_per_cta, 1], block=[WARPS_PER_CTA * WARP, 1, 1], smem=TAIL_SMEM_BYTES,
            stream=stream,
        )

    @cute.kernel
    def kernel(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, y_lat, counter, gamma, normed,
               m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        slot, tile, _ = cute.arch.block_idx()
        grid_x, grid_y, _ = cute.arch.grid_dim()
        flag, partial = alloc_tail_smem(cutlass.memory.SmemAllocator())
        if slot < n_active[0]:
            sub = tidx % self.lanes
            row = tile * self.rows_per_cta + tidx // self.lanes
            expert = slot_expert[slot]
            count = slot_count[slot]
            row_bytes: cutlass.Constexpr = self.i // 2
            row_addr = w2.iterator.toint() + (Int64(expert) * self.l + Int64(row)) * row_bytes
            scale_addr = s2.iterator.toint() + (Int64(expert) * self.l + Int64(row)) * (self.i // FP4_GROUP)
            packed = []
            scales = []
            for gi in cutlass.range_constexpr(self.groups_per_lane):
                g = sub + gi * self.lanes
                packed.append(ld_weight_v4(row_addr + Int64(g) * VEC_BYTES))
                scales.append(e8m0_scale_times_64(ld_u8(scale_addr + Int64(g))))
            for idx in cutlass.range(count, unroll=1):
                pair = slot_pairs[slot, idx]
                token = pair // self.k
                x_addr = a.iterator.toint() + Int64(pair) * (self.i * 2)
                acc = Float32(0.0)
                for gi in cutlass.range_constexpr(self.groups_per_lane):
                    g = sub + gi * self.lanes
                    acc = acc + group_dot(packed[gi], x_addr + Int64(g) * (FP4_GROUP * 2)) * scales[gi]
                acc = lane_group_sum(acc, self.lanes)
                if sub == 0:
                    weight = topk_w[token, pair % self.k]
                    red_add_f32(y_lat.iterator.toint() + (Int64(token) * self.l + Int64(row)) * 4, acc * weight)

        norm_tail(y_lat, gamma, normed, counter, flag, partial, tidx, m_count, grid_x * grid_y, self.l, self.eps,
                  self.tail_ctas)


# The one-token GEMM2: a warp per latent row, lane (half, slot) with half of the row's MXFP4 groups of one slot; 8 rows
# per CTA (256 threads).
ONE_TOKEN_ROWS = WARPS_PER_CTA
ONE_TOKEN_SPLIT = WARP // 16  # lanes per (row, slot), each with 1/2 of the groups


class ExpertsGemm2OneToken:
    """GEMM2 + combine for one token without reductions across CTAs: CTA `tile` owns latent rows 8*tile .. +7 for
    every slot, a warp one row: lane (half, slot) the dot of half of the slot's w2 row (groups 2g + half, all loaded
    at once) with the slot's row of a, and the row's 32 lanes meet in a warp sum. So y[row] is final inside the CTA, and
    instead of the norm tail (every CTA counting in, the last ones waiting for all and normalizing: 4.4 us of the
    one-token block) the CTA writes
        y_lat[0, row] (fp32), normed[0, row] = y[row] * gamma[row] (bf16, not yet divided by the RMS),
        sq_parts[tile] = sum of y[row]^2 over its rows,
    and the finalize (finalize_part with rms_parts) applies rsqrt(sum(sq_parts) / L + eps) to its W_up dot.
    Launched early (programmatic dependent launch) while GEMM1 drains: each thread loads its weights, then waits
    for GEMM1, then the CTA copies all k rows of a into shared memory by slot in one round trip; it lets the
    finalize start at once.
    With shared_inter (moe.decode_steps at one token), Ish / 2 more CTAs (two columns each: shared_split 4, not the
    front's 8) compute the shared experts' a_sh [1, Ish] = situ_glu(x @ w_sh13^T) as the front's shared CTAs would
    (shared.shared_part): they need neither the plan nor the wait, so their 11-22 MB stream while GEMM1 drains
    instead of ahead of it in the front, and the finalize still reads a_sh only after its wait for this grid.
    shared_first puts them before GEMM2's CTAs, which pays only where GEMM1 leaves SMs idle (moe.gate_up_first).
    In GEMM2's grid rather than the front's the block took TP8 58.7 -> 58.2 us (them last), TP16 50.8 -> 49.7 (them
    first) when measured (kimi_k3_kernels.md §3.3).
    Tensors: a [k, I] fp16, w2 [E, L, I/2] uint8, s2 [E, L, I/32] uint8, plan, topk_w [1, k] fp32, gamma [L] fp32,
    y_lat [1, L] fp32, normed [1, L] bf16, sq_parts [L/8] fp32, x [1, H] bf16, w_sh13 [2*Ish, H] bf16, a_sh [1, Ish]
    bf16 (without shared_inter: placeholders, never read)."""

    def __init__(self, experts: int, latent: int, inter: int, top_k: int, shared_inter: int = 0, hidden: int = 0,
                 shared_first: bool = False, trace_addr: int = 0, shared_split: int = ONE_TOKEN_SHARED_SPLIT):
        if shared_inter:
            check_shared(shared_inter, hidden, 1, shared_split)
        if top_k != WARP // ONE_TOKEN_SPLIT:
            raise ValueError(f"ExpertsGemm2OneToken: top_k={top_k} must be {WARP // ONE_TOKEN_SPLIT} (a row's slots "
                             f"in a warp, {ONE_TOKEN_SPLIT} lanes each)")
        if inter % (FP4_GROUP * ONE_TOKEN_SPLIT) or latent % ONE_TOKEN_ROWS:
            raise ValueError(f"ExpertsGemm2OneToken: intermediate={inter} must be a multiple of "
                             f"{FP4_GROUP * ONE_TOKEN_SPLIT} and latent={latent} of {ONE_TOKEN_ROWS}")
        self.e, self.l, self.i, self.k = experts, latent, inter, top_k
        self.groups = inter // FP4_GROUP // ONE_TOKEN_SPLIT  # per lane
        self.s, self.h, self.shared_first, self.trace_addr = shared_inter, hidden, shared_first, trace_addr
        self.shared_split = shared_split
        self.shared_ctas = shared_ctas(shared_inter, 1, shared_split) if shared_inter else 0

    def gemm2_ctas(self) -> int:
        """The CTAs that compute y_lat's rows (the shared experts' CTAs, if any, come on top)."""
        return self.l // ONE_TOKEN_ROWS

    def ctas(self) -> int:
        """The launch's grid: GEMM2's CTAs and the shared experts'."""
        return self.gemm2_ctas() + self.shared_ctas

    def smem_bytes(self) -> int:
        # The DSL lays out every allocation of the kernel one after another, the shared branch's scratch included.
        return self.k * (self.i * 2 + VEC_BYTES) + WARPS_PER_CTA * 4 + 16 + (SCRATCH_BYTES + 16 if self.s else 0)

    @cute.jit
    def __call__(self, a, w2, s2, n_active, slot_expert, slot_count, slot_pairs, topk_w, gamma, y_lat, normed,
                 sq_parts, x, w_sh13, a_sh, stream: cuda.CUstream):  # slot_count: 1 in every slot, not read
        self.kernel(a, w2, s2, n_active, slot_expert, slot_pairs, topk_w, gamma, y_lat, normed, sq_parts, x, w_sh13,
                    a_sh).launch(
            grid=[self.ctas(), 1, 1], block=[ONE_TOKEN_ROWS * WARP, 1, 1], smem=self.smem_bytes(),
            stream=stream, use_pdl=True,
        )

    @cute.kernel
    def kernel(self, a, w2, s2, n_active, slot_expert, slot_pairs, topk_w, gamma, y_lat, normed, sq_parts, x, w_sh13,
               a_sh):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        traced(self.trace_addr, bidx, tidx, False)
        cute.arch.griddepcontrol_launch_dependents()  # the finalize (launched early) waits for us before its reads
        if cutlass.const_expr(self.s == 0):
            self.gemm2_part(a, w2, s2, n_active, slot_expert, slot_pairs, topk_w, gamma, y_lat, normed, sq_parts,
                            tidx, bidx)
        else:
            first_shared = 0 if cutlass.const_expr(self.shared_first) else self.gemm2_ctas()
            first_gemm2 = self.shared_ctas if cutlass.const_expr(self.shared_first) else 0
            if bidx >= first_shared and bidx < first_shared + self.shared_ctas:
                shared_part(x, w_sh13, a_sh, alloc_scratch(cutlass.memory.SmemAllocator()), bidx - first_shared,
                            tidx // WARP, tidx % WARP, Int32(1), self.s, self.h, 1, self.shared_split)
            else:
                self.gemm2_part(a, w2, s2, n_active, slot_expert, slot_pairs, topk_w, gamma, y_lat, normed, sq_parts,
                                tidx, bidx - first_gemm2)
        traced(self.trace_addr, bidx, tidx, True)

    @cute.jit
    def gemm2_part(self, a, w2, s2, n_active, slot_expert, slot_pairs, topk_w, gamma, y_lat, normed, sq_parts, tidx,
                   tile):
        lane = tidx % WARP
        slot = lane % self.k
        half = lane // self.k
        row = tile * ONE_TOKEN_ROWS + tidx // WARP
        vecs: cutlass.Constexpr = self.i * 2 // VEC_BYTES  # of a row of a
        rounds: cutlass.Constexpr = -(-(self.k * vecs) // (ONE_TOKEN_ROWS * WARP))  # of them per thread, staging
        # The plan's words in one round trip: this lane's slot and, for the staging, the slots whose rows of `a` this
        # thread copies. An inactive slot's entries are stale (its weight is zeroed below), so they are only bounded.
        active = n_active[0]
        expert = cutlass.min(cutlass.max(slot_expert[slot], 0), self.e - 1)
        pair = slot_pairs[slot, 0] & (self.k - 1)  # k is a power of two (16); one token: pairs 0..k-1
        staged_pairs = [slot_pairs[cutlass.min(tidx + r * ONE_TOKEN_ROWS * WARP, self.k * vecs - 1) // vecs, 0]
                        & (self.k - 1) for r in range(rounds)]
        weight = topk_w[0, pair]  # the front's, complete before GEMM1 ran
        # Half h of a lane's slot takes groups 2g + h: the two halves of a slot read a 32-byte sector whole.
        row_bytes: cutlass.Constexpr = self.i // 2
        row_addr = w2.iterator.toint() + (Int64(expert) * self.l + Int64(row)) * row_bytes + Int64(half * VEC_BYTES)
        scale_addr = s2.iterator.toint() + (Int64(expert) * self.l + Int64(row)) * (self.i // FP4_GROUP) + Int64(half)
        packed = []
        scale_bytes = []
        for g in cutlass.range_constexpr(self.groups):
            packed.append(list(ld_weight_v4(row_addr + Int64(2 * g * VEC_BYTES), "ordered")))
            scale_bytes.append(ld_u8(scale_addr + Int64(2 * g), ordered=True))
        # Every weight load in flight before the wait, and the wait not waiting for them: weak loads stay ahead
        # of griddepcontrol.wait (the CPU SASS test checks it; the warp sync, as measured, compiles to nothing),
        # so only the plan's words are pinned; each group's math then waits for its own load, and a CTA that starts
        # after GEMM1 ended has its copy of a in flight beside its weights.
        cute.arch.sync_warp()
        zero = after_all_loads(Int32(0), staged_pairs, active >> 7)
        if zero == 0:
            cute.arch.griddepcontrol_wait()  # a is GEMM1's
        # All k rows of a into shared memory by slot (written by GEMM1: plain loads after the wait), one round trip,
        # paired like the weights' nibbles; rows padded by 16 bytes so that the 8 slots of a quarter-warp, reading
        # the same offset of 8 consecutive rows, fall in different banks.
        smem = cutlass.memory.SmemAllocator()
        stride: cutlass.Constexpr = self.i * 2 + VEC_BYTES
        a_rows = smem.allocate_tensor(Uint8, cute.make_layout(self.k * stride), byte_alignment=16)
        pieces = []
        for r in cutlass.range_constexpr(rounds):
            idx = cutlass.min(tidx + r * ONE_TOKEN_ROWS * WARP, self.k * vecs - 1)
            pieces.append(ld_fresh_v4(a.iterator.toint() + (Int64(staged_pairs[r]) * vecs + Int64(idx % vecs)) *
                                      VEC_BYTES))
        base = a_rows.iterator.toint()
        for r in cutlass.range_constexpr(rounds):
            idx = tidx + r * ONE_TOKEN_ROWS * WARP
            if idx < self.k * vecs:
                st_shared_v4(base + (idx // vecs) * stride + (idx % vecs) * VEC_BYTES, pair_like_fp4x8(*pieces[r]))
        cute.arch.sync_threads()
        acc = Float32(0.0)
        for g in cutlass.range_constexpr(self.groups):
            acc = acc + group_dot(packed[g], base + slot * stride + (2 * g + half) * (FP4_GROUP * 2), ld_shared_v4,
                                  paired=True) * e8m0_scale_times_64(scale_bytes[g])
        if slot >= active:
            weight = Float32(0.0)
        y = lane_group_sum(acc * weight, WARP)  # the row's slots and halves
        partial = smem.allocate_tensor(Float32, cute.make_layout(WARPS_PER_CTA), byte_alignment=16)
        if lane == 0:
            y_lat[0, row] = y
            normed[0, row] = (y * gamma[row]).to(BFloat16)
            partial[tidx // WARP] = y * y
        cute.arch.sync_threads()
        if tidx == 0:
            total = Float32(0.0)
            for w in cutlass.range_constexpr(WARPS_PER_CTA):
                total = total + partial[w]
            sq_parts[tile] = total


def experts_gemm2_one_token(a, w2, s2, plan, topk_w, gamma, y_lat, normed, sq_parts, stream, shared=None,
                            shared_first: bool = False) -> None:
    """ExpertsGemm2OneToken on `stream`: for one token, y_lat = the weighted combine of its k experts' GEMM2, normed =
    y_lat * gamma in bf16 (the RMS is applied by the finalize), sq_parts [L/8] the partial sums of y^2.
    shared: (x [1, H] bf16, w_sh13 [2*Ish, H] bf16, a_sh [1, Ish] bf16) to compute the shared experts'
    a_sh = situ_glu(x @ w_sh13^T) in the same grid, its CTAs before GEMM2's (shared_first) or after; or None."""
    from .runtime import compile_cached, cu_stream, expect, fake, fake_stream, to_cute

    experts, latent, half_i = w2.shape
    inter, top_k = half_i * 2, topk_w.shape[1]
    expect("a", a, (top_k, inter), "float16")
    expect("w2", w2, (experts, latent, inter // 2), "uint8")
    expect("s2", s2, (experts, latent, inter // FP4_GROUP), "uint8")
    _plan_shapes(plan, experts)
    expect("topk_w", topk_w, (1, top_k), "float32")
    expect("gamma", gamma, (latent,), "float32")
    expect("y_lat", y_lat, (1, latent), "float32")
    expect("normed", normed, (1, latent), "bfloat16")
    expect("sq_parts", sq_parts, (latent // ONE_TOKEN_ROWS,), "float32")
    if shared is None:
        shared_inter, hidden = 0, 8  # the kernel's shared arguments: placeholders, never read
        x = w_sh13 = a_sh = sq_parts
    else:
        x, w_sh13, a_sh = shared
        hidden, shared_inter = x.shape[1], w_sh13.shape[0] // 2
        expect("x", x, (1, hidden), "bfloat16")
        expect("w_sh13", w_sh13, (2 * shared_inter, hidden), "bfloat16")
        expect("a_sh", a_sh, (1, shared_inter), "bfloat16")
    first = bool(shared_first and shared is not None)

    def build():
        if shared is None:
            shared_args = (fake(Float32, (latent // ONE_TOKEN_ROWS,)),) * 3
        else:
            shared_args = (fake(BFloat16, (1, hidden)), fake(BFloat16, (2 * shared_inter, hidden)),
                           fake(BFloat16, (1, shared_inter)))
        args = (
            fake(Float16, (top_k, inter)), fake(Uint8, (experts, latent, inter // 2)),
            fake(Uint8, (experts, latent, inter // FP4_GROUP)), *_fake_plan(experts), fake(Float32, (1, top_k)),
            fake(Float32, (latent,)), fake(Float32, (1, latent)), fake(BFloat16, (1, latent)),
            fake(Float32, (latent // ONE_TOKEN_ROWS,)), *shared_args, fake_stream(),
        )
        return ExpertsGemm2OneToken(experts, latent, inter, top_k, shared_inter, hidden, first, trace), args

    trace = trace_address("gemm2", ExpertsGemm2OneToken(experts, latent, inter, top_k, shared_inter, hidden).ctas())
    fn = compile_cached(("experts_gemm2_one_token", experts, latent, inter, top_k, shared_inter, hidden, first, trace),
                        build)
    fn(to_cute(a), to_cute(w2), to_cute(s2), *(to_cute(t) for t in plan), to_cute(topk_w), to_cute(gamma),
       to_cute(y_lat), to_cute(normed), to_cute(sq_parts), to_cute(x), to_cute(w_sh13), to_cute(a_sh),
       cu_stream(stream))


def _plan_shapes(plan, experts: int) -> None:
    from .router import MAX_TOKENS
    from .runtime import expect

    n_active, slot_expert, slot_count, slot_pairs = plan
    expect("n_active", n_active, (1,), "int32")
    expect("slot_expert", slot_expert, (experts,), "int32")
    expect("slot_count", slot_count, (experts,), "int32")
    expect("slot_pairs", slot_pairs, (experts, MAX_TOKENS), "int32")


def _fake_plan(experts: int):
    from .router import MAX_TOKENS
    from .runtime import fake

    return (fake(Int32, (1,)), fake(Int32, (experts,)), fake(Int32, (experts,)), fake(Int32, (experts, MAX_TOKENS)))


def on_tensor_cores(m: int, tensor_cores: bool) -> bool:
    """Whether a batch of m tokens runs the experts on the tensor cores (experts_mma.py) rather than the older
    CUDA-core kernels of this module: always, if allowed (GEMM1 up to GEMM1_HELD_MAX_TOKENS runs ExpertsGemm1Held
    instead, and GEMM2 at one token ExpertsGemm2OneToken). Both GEMMs measured faster there than on
    ExpertsGemm1Situ / ExpertsGemm2Combine from one token on, GEMM1 1.4x faster above 4 tokens."""
    return tensor_cores


STAGED_FROM_TOKENS = 2


def stages_weights(m: int) -> bool:
    """Whether the tensor-core experts stage each CTA's weight rows in shared memory (bulk copies) for a batch of m
    tokens: staged, M=8 and M=64 took 10-18% less than direct loads and M=2 the same within 2%, but at one token
    the TP8 block was slower (79 us against 72.5 when measured)."""
    return m >= STAGED_FROM_TOKENS


def holds_gemm1_weights(m: int, tensor_cores: bool) -> bool:
    """Whether GEMM1 runs as ExpertsGemm1Held for a batch of m tokens: up to GEMM1_HELD_MAX_TOKENS (measured, see
    there), unless tensor_cores=False asks for the bench's comparison with every launch on the older CUDA-core
    kernels."""
    return tensor_cores and m <= GEMM1_HELD_MAX_TOKENS


def experts_gemm1_situ(
    x_lat, w13, s13, plan, top_k: int, a, y_lat, stream, tensor_cores: bool = True, one_token: bool = False,
) -> None:
    """a[M*k, I] = SiTU-GLU of each planned pair's GEMM1; zeroes y_lat [M, L] for GEMM2 unless one_token (M = 1,
    GEMM2's one-token form follows and writes y_lat whole). Launched on `stream`."""
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    m, latent = x_lat.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    if one_token and m != 1:
        raise ValueError(f"experts_gemm1_situ: one_token serves M=1, not M={m}")
    expect("x_lat", x_lat, (m, latent), "float16")
    expect("w13", w13, (experts, 2 * inter, latent // 2), "uint8")
    expect("s13", s13, (experts, 2 * inter, latent // FP4_GROUP), "uint8")
    _plan_shapes(plan, experts)
    expect("a", a, (m * top_k, inter), "float16")
    expect("y_lat", y_lat, (m, latent), "float32")

    def build():
        md, pd = dyn(), dyn()
        args = (
            fake(Float16, (md, latent)),
            fake(Uint8, (experts, 2 * inter, latent // 2)),
            fake(Uint8, (experts, 2 * inter, latent // FP4_GROUP)),
            *_fake_plan(experts),
            fake(Float16, (pd, inter)),
            fake(Float32, (md, latent)),
            fake_stream(),
        )
        if held:
            return ExpertsGemm1Held(experts, latent, inter, top_k, one_token, trace), args
        if mma:
            from .experts_mma import ExpertsGemm1SituMma

            return ExpertsGemm1SituMma(experts, latent, inter, top_k, staged), args
        return ExpertsGemm1Situ(experts, latent, inter, top_k), args

    held = one_token or holds_gemm1_weights(m, tensor_cores)
    mma = not held and on_tensor_cores(m, tensor_cores)
    staged = mma and stages_weights(m)
    trace = trace_address("gemm1", held_gemm1_ctas(m, top_k, experts, inter)) if held else 0
    key = ("experts_gemm1_situ", experts, latent, inter, top_k, held, one_token, mma, staged, trace)
    fn = compile_cached(key, build)
    fn(
        to_cute(x_lat, True), to_cute(w13), to_cute(s13), *(to_cute(t) for t in plan),
        to_cute(a, True), to_cute(y_lat, True), cu_stream(stream),
    )


def experts_gemm2_combine(
    a, w2, s2, plan, topk_w, y_lat, counter, gamma, normed, eps: float, stream,
    tensor_cores: bool = True, tail_ctas: int = NORM_TAIL_CTAS, early: bool = True,
    hold_weights: bool | None = None, early_finalize: bool = True,
) -> None:  # tail_ctas: how many of the last CTAs share the norm (norm_tail; 1 = a single last CTA for all tokens)
    """y_lat[t] += sum over t's pairs of weight * (a[pair] @ w2[e]^T) (y_lat must be zero: GEMM1 does it), then
    normed = rms_norm(y_lat, gamma, eps) in bf16. counter: int32 [2], zero before the first launch (left zero).
    On the tensor cores it is launched early (experts_mma.py; early=False: in stream order); that is correct after any
    launch, since it waits for its predecessor before reading a or y_lat. hold_weights (one token): None holds the
    weights across the wait for short rows only (experts_mma.HOLD_MAX_GROUPS); True / False force it (comparisons).
    early_finalize (tensor cores): lets the next launch (the finalize, launched early) start at once."""
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    m, latent = y_lat.shape
    experts, _, half_i = w2.shape
    inter = half_i * 2
    top_k = topk_w.shape[1]
    expect("a", a, (m * top_k, inter), "float16")
    expect("w2", w2, (experts, latent, inter // 2), "uint8")
    expect("s2", s2, (experts, latent, inter // FP4_GROUP), "uint8")
    _plan_shapes(plan, experts)
    expect("topk_w", topk_w, (m, top_k), "float32")
    expect("y_lat", y_lat, (m, latent), "float32")
    expect("counter", counter, (2,), "int32")
    expect("gamma", gamma, (latent,), "float32")
    expect("normed", normed, (m, latent), "bfloat16")

    def build():
        md, pd = dyn(), dyn()
        args = (
            fake(Float16, (pd, inter)),
            fake(Uint8, (experts, latent, inter // 2)),
            fake(Uint8, (experts, latent, inter // FP4_GROUP)),
            *_fake_plan(experts),
            fake(Float32, (md, top_k)),
            fake(Float32, (md, latent)),
            fake(Int32, (2,)),
            fake(Float32, (latent,)),
            fake(BFloat16, (md, latent)),
            fake_stream(),
        )
        if mma:
            from .experts_mma import ExpertsGemm2CombineMma

            return ExpertsGemm2CombineMma(experts, latent, inter, top_k, eps, staged, early=early,
                                          tail_ctas=tail_ctas, hold_weights=hold_weights,
                                          early_finalize=early_finalize), args
        return ExpertsGemm2Combine(experts, latent, inter, top_k, eps, tail_ctas), args

    mma = on_tensor_cores(m, tensor_cores)
    staged = mma and stages_weights(m)
    key = ("experts_gemm2_combine", experts, latent, inter, top_k, eps, mma, staged, tail_ctas, early, hold_weights,
           early_finalize)
    fn = compile_cached(key, build)
    fn(
        to_cute(a, True), to_cute(w2), to_cute(s2), *(to_cute(t) for t in plan),
        to_cute(topk_w, True), to_cute(y_lat, True), to_cute(counter), to_cute(gamma), to_cute(normed, True),
        cu_stream(stream),
    )
