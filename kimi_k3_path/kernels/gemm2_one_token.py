"""GEMM2 + weighted combine of the routed experts for one token (dispatch.py), without reductions across CTAs: each
CTA owns whole latent rows for every slot, so the latent RMSNorm's sum of squares leaves as per-CTA partial sums that
the finalize adds up (finalize_streamed.py), and no CTA waits for all the others (the norm tail cost the one-token
block 4.4 us). Optionally the shared experts' gate_up runs in the same grid (shared.shared_part)."""

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
    fp4_group_dot_shared,
    lane_group_sum,
    ld_fresh_v4,
    ld_u8,
    ld_weight_v4,
    pair_like_fp4x8,
    st_shared_v4,
    traced,
)
from .gemv import SCRATCH_BYTES, alloc_scratch
from .router import expect_plan, fake_plan
from .shared import ONE_TOKEN_SHARED_SPLIT, check_shared, shared_ctas, shared_part
from .trace import trace_address

WARPS_PER_CTA = 8
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
    and the finalize (finalize_streamed.py) applies rsqrt(sum(sq_parts) / L + eps) to its W_up dot.
    Launched early (programmatic dependent launch) while GEMM1 drains: each thread loads its weights, then waits
    for GEMM1, then the CTA copies all k rows of a into shared memory by slot in one round trip; it lets the
    finalize start at once.
    With shared_inter (dispatch.MoeForms.one_token), Ish / 2 more CTAs (two columns each: shared_split 4, not the
    front's 8) compute the shared experts' a_sh [1, Ish] = situ_glu(x @ w_sh13^T) as the front's shared CTAs would
    (shared.shared_part): they need neither the plan nor the wait, so their 11-22 MB stream while GEMM1 drains
    instead of ahead of it in the front, and the finalize still reads a_sh only after its wait for this grid.
    shared_first puts them before GEMM2's CTAs, which pays only where GEMM1 leaves SMs idle (dispatch.MoeForms.shared_gate_up_first).
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
            acc = acc + fp4_group_dot_shared(packed[g], base + slot * stride + (2 * g + half) * (FP4_GROUP * 2)) * \
                e8m0_scale_times_64(scale_bytes[g])
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
    expect_plan(plan, experts)
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
            fake(Uint8, (experts, latent, inter // FP4_GROUP)), *fake_plan(experts), fake(Float32, (1, top_k)),
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
