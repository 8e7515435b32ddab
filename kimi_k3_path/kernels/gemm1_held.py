"""GEMM1 + SiTU-GLU of the routed experts on the CUDA cores for batches of 1 to 4 tokens (dispatch.py), every weight
byte of a lane in flight at once and held in registers while the CTA takes its slot's tokens. Activations are fp16
(x_lat from the front): E2M1 values convert exactly to fp16 pairs in one instruction, and the products run as packed
f16x2 FMAs within each 32-value group (fp32 across groups); fp16 needs |x_lat| < 65504."""

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
    e8m0_scale_times_64,
    fp4_group_dot_shared,
    lane_group_sum,
    ld_act_v4,
    ld_u8,
    ld_weight_v4,
    pair_like_fp4x8,
    situ_glu,
    st_shared_v4,
    traced,
)
from .norm_tail import zero_y_lat
from .expert_args import expect_gemm1, fake_gemm1
from .trace import trace_address

WARPS_PER_CTA = 8
GEMM1_LANES_PER_ROW = 16
# Resident CTAs per SM at one token (<= 64 registers, 256 threads; a CPU test checks the registers): dispatch.py's
# shared_gate_up_first counts on it.
ONE_TOKEN_CTAS_PER_SM = 4


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
    Tensors: x_lat [M, L] fp16, w13 [E, 2I, L/2] uint8, s13 [E, 2I, L/32] uint8, plan (router.ExpertPlan),
    a [M*k, I] fp16, y_lat [M, L] fp32."""

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
            acc = acc + fp4_group_dot_shared(packed[gi], base + g * VEC_BYTES, self.groups * VEC_BYTES) * \
                e8m0_scale_times_64(scale_bytes[gi])
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


def experts_gemm1_held(x_lat, w13, s13, plan, top_k: int, a, y_lat, stream, one_token: bool) -> None:
    """ExpertsGemm1Held on `stream`: a[M*k, I] = SiTU-GLU of each planned pair's GEMM1; zeroes y_lat [M, L] for
    GEMM2 unless one_token (M = 1: GEMM2's one-token form writes y_lat whole)."""
    from .runtime import compile_cached, cu_stream, to_cute

    if one_token and x_lat.shape[0] != 1:
        raise ValueError(f"experts_gemm1_held: one_token serves M=1, not M={x_lat.shape[0]}")
    m, latent, experts, inter = expect_gemm1(x_lat, w13, s13, plan, top_k, a, y_lat)

    def build():
        args = fake_gemm1(experts, latent, inter)
        return ExpertsGemm1Held(experts, latent, inter, top_k, one_token, trace), args

    trace = trace_address("gemm1", held_gemm1_ctas(m, top_k, experts, inter))
    fn = compile_cached(("experts_gemm1_held", experts, latent, inter, top_k, one_token, trace), build)
    fn(to_cute(x_lat, True), to_cute(w13), to_cute(s13), *(to_cute(t) for t in plan), to_cute(a, True),
       to_cute(y_lat, True), cu_stream(stream))
