"""Router in one launch: fp32 logits of x [M, H] against the router weight [E, H], sigmoid, + correction bias for
selection only, top-k, renormalized weights; and the expert plan the grouped expert kernels read.

Every CTA computes the logits of 8 experts for all tokens; the last CTA to finish (a device-scope counter that it
resets for the next launch, so CUDA-graph replays need no host work) selects the top-k for every token, one warp per
token, and groups the (token, slot) pairs by expert:
  - ties: equal keys go to the lower expert index (the reference's stable descending sort);
  - NaN: a NaN key ranks below every number and is taken only when fewer than k numbers remain;
  - plan: active experts in ascending index order; each one's pairs p = token*k + slot in ascending token order,
    so the plan, and therefore the expert kernels' reading order, is deterministic.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .common import DEFAULT_WEIGHT_LOAD, LOWEST, NEG_INF, WARP, lane_group_sum, ld_coherent_f32, sigmoid
from .gemv import BF16_PER_VEC, SCRATCH_BYTES, WARPS_PER_CTA, alloc_scratch, check_k, dot_slice, split_k_reduce, zero_acc

MAX_TOKENS = 64  # the plan stores token sets as 64-bit masks (two 32-bit words)
ROUTER_SPLIT = 8  # one expert row per CTA, its K split over the 8 warps: 896 CTAs stream the 12.8 MB weight


def router_smem_bytes(experts: int, top_k: int) -> int:
    return (3 * experts + MAX_TOKENS * top_k + 4) * 4 + SCRATCH_BYTES


def alloc_router_smem(smem, experts: int, top_k: int):
    """(mask_lo, mask_hi, slot_of, chosen, flag): the last CTA's selection and plan state."""
    return (
        smem.allocate_tensor(Int32, cute.make_layout(experts), byte_alignment=16),
        smem.allocate_tensor(Int32, cute.make_layout(experts), byte_alignment=16),
        smem.allocate_tensor(Int32, cute.make_layout(experts), byte_alignment=16),
        smem.allocate_tensor(Int32, cute.make_layout(MAX_TOKENS * top_k), byte_alignment=16),
        smem.allocate_tensor(Int32, cute.make_layout(4), byte_alignment=16),
    )


def check_router(experts: int, hidden: int, top_k: int) -> None:
    if experts % WARP:
        raise ValueError(f"RouterTopK: experts={experts} is not a multiple of {WARP} (experts per lane in top-k)")
    if not 0 < top_k <= WARP:
        raise ValueError(f"RouterTopK: top_k={top_k} must be in 1..{WARP} (one lane per selected expert)")
    check_k(hidden, ROUTER_SPLIT, "RouterTopK")


@cute.jit
def router_part(
    x: cute.Tensor,
    w: cute.Tensor,
    bias: cute.Tensor,
    logits: cute.Tensor,
    counter: cute.Tensor,
    ids: cute.Tensor,
    weights: cute.Tensor,
    n_active: cute.Tensor,
    slot_expert: cute.Tensor,
    slot_count: cute.Tensor,
    slot_pairs: cute.Tensor,
    state,
    scratch: cute.Tensor,
    cta: Int32,
    tidx: Int32,
    m_count: Int32,
    experts: cutlass.Constexpr,
    hidden: cutlass.Constexpr,
    top_k: cutlass.Constexpr,
    scaling: cutlass.Constexpr,
    mt: cutlass.Constexpr,
):
    """CTA `cta` (of `experts` router CTAs) of the router: the logits of expert `cta` for every token; the last
    router CTA to finish then selects and plans for all tokens."""
    mask_lo, mask_hi, slot_of, chosen, flag = state
    lane = tidx % WARP
    warp = tidx // WARP
    n_vec: cutlass.Constexpr = hidden // BF16_PER_VEC // ROUTER_SPLIT
    row_addr = w.iterator.toint() + Int64(cta) * (hidden * 2)
    for m_first in cutlass.range(0, m_count, mt, unroll=1):
        acc = zero_acc(1, mt)
        dot_slice(acc, row_addr, row_addr, x.iterator.toint(), warp * n_vec, lane, m_first, m_count,
                  0, 1, hidden, n_vec, mt, DEFAULT_WEIGHT_LOAD)
        split_k_reduce(acc, scratch, warp, lane, ROUTER_SPLIT, 1, mt)
        if tidx == 0:
            for mi in cutlass.range_constexpr(mt):
                if m_first + mi < m_count:
                    logits[m_first + mi, cta] = acc[0, mi]

    # Publish the logits, then count this CTA in; the last one to arrive owns the selection. The barrier makes the
    # CTA's writes visible to thread 0, whose device-scope release fence (cumulative) then covers them all.
    cute.arch.sync_threads()
    if tidx == 0:
        cute.arch.fence_acq_rel_gpu()
        arrived = cute.arch.atomic_add(counter.iterator, Int32(1), scope="gpu")
        flag[0] = Int32(0)
        if arrived == experts - 1:
            flag[0] = Int32(1)
            counter[0] = Int32(0)
    cute.arch.sync_threads()
    if flag[0] == 1:
        cute.arch.fence_acq_rel_gpu()
        for e in cutlass.range(tidx, experts, WARPS_PER_CTA * WARP):
            mask_lo[e] = Int32(0)
            mask_hi[e] = Int32(0)
        cute.arch.sync_threads()
        select_top_k(logits, bias, ids, weights, mask_lo, mask_hi, chosen, lane, warp, m_count, experts, top_k, scaling)
        cute.arch.sync_threads()
        if warp == 0:
            number_active(mask_lo, mask_hi, slot_of, n_active, slot_expert, slot_count, lane, experts)
        cute.arch.sync_threads()
        for p in cutlass.range(tidx, m_count * top_k, WARPS_PER_CTA * WARP):
            m = p // top_k
            e = chosen[p]
            # Rank of token m among the tokens that chose e = set bits of the mask below bit m.
            below_lo = mask_lo[e] & ((Int32(1) << cutlass.min(m, 31)) - 1)
            if m >= 32:
                below_lo = mask_lo[e]
            below_hi = Int32(0)
            if m > 32:
                below_hi = mask_hi[e] & ((Int32(1) << (m - 32)) - 1)
            rank = cute.arch.popc(below_lo) + cute.arch.popc(below_hi)
            slot_pairs[slot_of[e], rank] = p


@cute.jit
def select_top_k(
    logits, bias, ids, weights, mask_lo, mask_hi, chosen, lane, warp, m_count,
    experts: cutlass.Constexpr, top_k: cutlass.Constexpr, scaling: cutlass.Constexpr,
):
    """One warp per token: top-k of sigmoid(logit) + bias over E experts (E/32 per lane), ties to the lower
    index; renormalized weights; the token's bit in each chosen expert's mask."""
    per_lane: cutlass.Constexpr = experts // WARP
    keys = cute.make_rmem_tensor(per_lane, Float32)
    scores = cute.make_rmem_tensor(per_lane, Float32)
    for m in cutlass.range(warp, m_count, WARPS_PER_CTA):
        row_addr = logits.iterator.toint() + Int64(m) * (experts * 4)
        for j in cutlass.range_constexpr(per_lane):
            e = lane + j * WARP
            score = sigmoid(ld_coherent_f32(row_addr + Int64(e) * 4))
            key = score + bias[e]
            if key != key:
                key = Float32(LOWEST)  # NaN ranks below every number
            scores[j] = score
            keys[j] = key
        my_id = Int32(0)
        my_score = Float32(0.0)
        for r in cutlass.range(top_k, unroll=1):
            best = keys[0]
            best_j = Int32(0)
            best_score = scores[0]
            for j in cutlass.range_constexpr(1, per_lane):
                if keys[j] > best:  # strict: the lower index wins a tie within the lane
                    best = keys[j]
                    best_j = Int32(j)
                    best_score = scores[j]
            best_e = lane + best_j * WARP
            for offset in (16, 8, 4, 2, 1):
                other = cute.arch.shuffle_sync_bfly(best, offset)
                other_e = cute.arch.shuffle_sync_bfly(best_e, offset)
                other_score = cute.arch.shuffle_sync_bfly(best_score, offset)
                if other > best or (other == best and other_e < best_e):
                    best = other
                    best_e = other_e
                    best_score = other_score
            if lane == best_e % WARP:
                for j in cutlass.range_constexpr(per_lane):
                    if best_e // WARP == j:
                        keys[j] = Float32(NEG_INF)  # taken: below every untaken key, NaN ones included
            if lane == r:
                my_id = best_e
                my_score = best_score
        if lane >= top_k:
            my_score = Float32(0.0)
        total = lane_group_sum(my_score, WARP)
        if lane < top_k:
            ids[m, lane] = my_id
            weights[m, lane] = my_score / total * Float32(scaling)
            chosen[m * top_k + lane] = my_id
            if m < 32:
                cute.arch.atomic_or((mask_lo.iterator + my_id), Int32(1) << m, scope="cta")
            else:
                cute.arch.atomic_or((mask_hi.iterator + my_id), Int32(1) << (m - 32), scope="cta")


@cute.jit
def number_active(mask_lo, mask_hi, slot_of, n_active, slot_expert, slot_count, lane, experts: cutlass.Constexpr):
    """Warp 0: slots for the experts any token chose, in ascending expert order (ballot + prefix count)."""
    base = Int32(0)
    for c in cutlass.range_constexpr(experts // WARP):
        e = c * WARP + lane
        count = cute.arch.popc(mask_lo[e]) + cute.arch.popc(mask_hi[e])
        active = count > 0
        ballot = cute.arch.vote_ballot_sync(active)
        slot = base + cute.arch.popc(ballot & cute.arch.lanemask_lt())
        if active:
            slot_of[e] = slot
            slot_expert[slot] = e
            slot_count[slot] = count
        base = base + cute.arch.popc(ballot)
    if lane == 0:
        n_active[0] = base


class RouterTopK:
    """Logits, top-k and expert plan in one launch of E CTAs. Tensors (M dynamic, S = E plan slots):
    x [M, H] bf16, w [E, H] bf16, bias [E] fp32, logits [M, E] fp32 (scratch), counter [1] int32 (zero before the
    first launch; left zero), ids [M, k] int32, weights [M, k] fp32, n_active [1] int32, slot_expert [S] int32,
    slot_count [S] int32, slot_pairs [S, MAX_TOKENS] int32."""

    def __init__(self, experts: int, hidden: int, top_k: int, scaling: float, mt: int):
        check_router(experts, hidden, top_k)
        self.e, self.h, self.k, self.scaling, self.mt = experts, hidden, top_k, scaling, mt

    @cute.jit
    def __call__(
        self, x, w, bias, logits, counter, ids, weights, n_active, slot_expert, slot_count, slot_pairs,
        stream: cuda.CUstream,
    ):
        self.kernel(
            x, w, bias, logits, counter, ids, weights, n_active, slot_expert, slot_count, slot_pairs, x.shape[0]
        ).launch(
            grid=[self.e, 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], smem=router_smem_bytes(self.e, self.k),
            stream=stream,
        )

    @cute.kernel
    def kernel(self, x, w, bias, logits, counter, ids, weights, n_active, slot_expert, slot_count, slot_pairs,
               m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        state = alloc_router_smem(smem, self.e, self.k)
        scratch = alloc_scratch(smem)
        router_part(x, w, bias, logits, counter, ids, weights, n_active, slot_expert, slot_count, slot_pairs,
                    state, scratch, bidx, tidx, m_count, self.e, self.h, self.k, self.scaling, self.mt)


def router_topk(x, w, bias, top_k: int, scaling: float, logits, counter, ids, weights, plan, stream) -> None:
    """Launch the router on `stream`. x [M, H] bf16 (M <= 64), w [E, H] bf16, bias [E] fp32; scratch logits
    [>=M, E] fp32 and counter [1] int32 (zero once; the kernel leaves it zero); outputs ids [M, k] int32,
    weights [M, k] fp32 and plan = (n_active [1], slot_expert [E], slot_count [E], slot_pairs [E, 64]) int32."""
    from cutlass import BFloat16, Int32

    from .gemv import token_tile
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    m, hidden = x.shape
    experts = w.shape[0]
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"router_topk: batch M={m} must be in 1..{MAX_TOKENS}")
    expect("x", x, (m, hidden), "bfloat16")
    expect("w", w, (experts, hidden), "bfloat16")
    expect("bias", bias, (experts,), "float32")
    logits = logits[:m]
    expect("logits", logits, (m, experts), "float32")
    expect("counter", counter, (1,), "int32")
    expect("ids", ids, (m, top_k), "int32")
    expect("weights", weights, (m, top_k), "float32")
    n_active, slot_expert, slot_count, slot_pairs = plan
    expect("n_active", n_active, (1,), "int32")
    expect("slot_expert", slot_expert, (experts,), "int32")
    expect("slot_count", slot_count, (experts,), "int32")
    expect("slot_pairs", slot_pairs, (experts, MAX_TOKENS), "int32")
    mt = token_tile(m)

    def build():
        md = dyn()
        args = (
            fake(BFloat16, (md, hidden)),
            fake(BFloat16, (experts, hidden)),
            fake(Float32, (experts,)),
            fake(Float32, (md, experts)),
            fake(Int32, (1,)),
            fake(Int32, (md, top_k)),
            fake(Float32, (md, top_k)),
            fake(Int32, (1,)),
            fake(Int32, (experts,)),
            fake(Int32, (experts,)),
            fake(Int32, (experts, MAX_TOKENS)),
            fake_stream(),
        )
        return RouterTopK(experts, hidden, top_k, scaling, mt), args

    fn = compile_cached(("router_topk", experts, hidden, top_k, scaling, mt), build)
    fn(
        to_cute(x, True), to_cute(w), to_cute(bias), to_cute(logits, True), to_cute(counter),
        to_cute(ids, True), to_cute(weights, True), *(to_cute(t) for t in plan), cu_stream(stream),
    )
