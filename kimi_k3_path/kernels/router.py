"""Router in one launch: fp32 logits of x [M, H] against the router weight [E, H], sigmoid, + correction bias for
selection only, top-k, renormalized weights; and the expert plan the grouped expert kernels read.

Every CTA computes the logits of one expert for all tokens (two at one token: router_split; in the block's front from
16 tokens: of 16 experts, on the tensor cores; front.FrontKernel); n = min(ceil(M / 8), 8) CTAs select the top-k once
all logits are in (8 tokens at a time each, one warp per token: radix select of the k-th key, then a rank sort of the
k winners), marking each token in its chosen experts' masks; the last of them to finish groups the (token, slot) pairs
by expert with all its warps. One token (one_token_select): the first CTA's warps select together and write the plan
themselves, without masks or counters. Who selects, and how it knows the logits are in:
  - CUDA-core logits: the first n CTAs. Every logit word holds LOGIT_UNSET until its CTA stores the logit (a strong
    store), and a selecting warp polls its token's words until none is unset; it then sets them back to LOGIT_UNSET
    for the next launch. No CTA counts in: the count-in (barrier, device-scope fence, atomic round trip) held each of
    the 448 one-token router CTAs ~1-2 us past its last load, 2.4 us of the front alone.
  - tensor-core logits (plain stores from mma.py's epilogue): every CTA counts in, and the last n select.
Counters and masks in `sync` are left zero, and the logits LOGIT_UNSET, for the next launch, so CUDA-graph replays need
no host work.
  - ties: equal keys go to the lower expert index (the reference's stable descending sort);
  - NaN: a NaN key ranks below every number (-inf included) and is taken only when fewer than k numbers remain,
    the lowest indices first;
  - plan: active experts in ascending index order; each one's pairs p = token*k + slot in ascending token order,
    so the plan, and therefore the expert kernels' reading order, is deterministic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .common import (
    DEFAULT_WEIGHT_LOAD,
    VEC_BYTES,
    WARP,
    arrival,
    cp_async_16,
    lane_group_sum,
    bits_to_f32,
    ld_coherent_i32,
    ld_relaxed_i32,
    sigmoid,
    wait_for_all,
)
from .gemv import (
    BF16_PER_VEC,
    MAX_TILE,
    SCRATCH_BYTES,
    WARPS_PER_CTA,
    check_k,
    dot_slice,
    split_k_reduce,
    zero_acc,
)
from .mma import MMA_ROWS, mma_rows_part

INT32_MIN = -(2**31)  # order key of a NaN router key; also the sign-bit flip between signed and unsigned order
MAX_TOKENS = 64  # the plan stores token sets as 64-bit masks (two 32-bit words)
ROUTER_SPLIT = 8  # at most 8 warps share an expert row (K split over them)
LOAD_BATCHES = 2  # a selecting CTA reads a token's E logits in this many batches of E/32/LOAD_BATCHES loads per lane
CANDIDATES = WARPS_PER_CTA * WARP  # each warp's k <= 32 winners of its current token, in index order
ONE_TOKEN_CANDIDATES = CANDIDATES + WARP  # one token: each warp's k candidates, then the final k (select_one_token)
# At most this many router CTAs select (see the module docstring for which), 8 tokens at a time each: with one CTA
# selecting for every token the front took 167 us at M=64 (TP8), with 4 or 8 CTAs 125 us; M <= 8 needs one anyway.
ROUTER_TAIL_CTAS = 8
MASKS = 4  # sync words: [0] arrivals, [1] waiters done (both tensor-core logits only), [2] selections done, [3] unused;
# then the masks
# What every logit word holds until its logit is stored: the NaN bit pattern 0xFFFFFFFF, which arithmetic never yields
# (the GPU's NaN results are 0x7FFFFFFF) and publish_logit never stores.
LOGIT_UNSET = -1


class ExpertPlan(NamedTuple):
    """The expert plan the router writes and the expert GEMMs read (int32 tensors; S = E plan slots): n_active [1]
    active experts, slot_expert [S] the expert of each slot (ascending), slot_count [S] how many tokens chose it,
    slot_pairs [S, MAX_TOKENS] their pairs p = token * k + rank (ascending token)."""

    n_active: Any
    slot_expert: Any
    slot_count: Any
    slot_pairs: Any


class RouterOutputs(NamedTuple):
    """The router's results and cross-CTA state in global memory: logits [M, E] fp32 (LOGIT_UNSET until stored; left
    so), sync [router_sync_words(E)] int32 (counters and token masks; left zero), ids [M, k] int32 and weights [M, k]
    fp32 (each token's experts by rank and their renormalized, scaled weights)."""

    logits: Any
    sync: Any
    ids: Any
    weights: Any


class RouterSmem(NamedTuple):
    """A router CTA's shared memory (alloc_router_smem): what the selecting CTAs need, and for a batch (not one
    token) the planning pass's masks, slot numbers, arrival flag and per-chunk active counts."""

    bias_s: Any
    score_rows: Any
    cand_key: Any
    cand_id: Any
    mask_lo: Any = None
    mask_hi: Any = None
    slot_of: Any = None
    flag: Any = None
    chunk_active: Any = None


@dataclass(frozen=True)
class RouterShape:
    """What a router is compiled for: E experts of hidden width H, top_k of them, the routed scaling factor; the token
    tile mt of the CUDA-core logits, or with mma_mt > 0 the tensor cores' (one CTA per 16 experts, mma_in_flight
    K chunks in flight per warp); at most tail_ctas selecting CTAs."""

    experts: int
    hidden: int
    top_k: int
    scaling: float
    mt: int
    tail_ctas: int = ROUTER_TAIL_CTAS
    mma_mt: int = 0
    mma_in_flight: int = 0

    @property
    def one_token(self) -> bool:
        return one_token_select(self.mt, self.mma_mt)

    @property
    def ctas(self) -> int:
        return router_ctas(self.experts, self.mma_mt, self.mt)


def router_sync_words(experts: int) -> int:
    """Int32 words of the router's `sync` state: counters, then each expert's 64-bit token mask (low words, high
    words)."""
    return MASKS + 2 * experts


def _words(n: int) -> int:
    return (n + 3) // 4 * 4  # every array starts 16-byte aligned


def router_smem_bytes(experts: int, top_k: int, one_token: bool = False) -> int:
    """Shared memory of a router CTA (every CTA of a launch gets the same): the selecting state, and the split-K
    scratch. One token (one_token_select): 9.8 KB at E = 896, else 45.7 KB."""
    if one_token:
        words = 2 * _words(experts) + 2 * ONE_TOKEN_CANDIDATES
    else:
        words = 4 * _words(experts) + 4 + 2 * CANDIDATES + WARPS_PER_CTA * _words(experts) + _words(experts // WARP)
    return words * 4 + SCRATCH_BYTES


def alloc_router_smem(smem, experts: int, top_k: int, one_token: bool = False):
    """The selecting CTAs' state: (bias_s, score_rows, cand_key, cand_id), and for a batch (mask_lo, mask_hi, slot_of,
    flag, chunk_active). score_rows holds each selecting warp's sigmoid scores of its current token (in shared memory
    rather than 28 more registers per thread, which would cost the streaming CTAs occupancy); one token: the token's
    row, and the candidates of every picking warp and of the final round (select_one_token). (One token with the
    bias read from global memory instead: 4.4 KB less, but 32 bytes of spills in the streaming parts under the
    front's 64-register bound.)"""
    def words(dtype, n):
        return smem.allocate_tensor(dtype, cute.make_layout(n), byte_alignment=16)

    rows, candidates = (1, ONE_TOKEN_CANDIDATES) if one_token else (WARPS_PER_CTA, CANDIDATES)
    selecting = (words(Float32, experts), words(Float32, rows * _words(experts)), words(Int32, candidates),
                 words(Int32, candidates))
    if one_token:
        return RouterSmem(*selecting)
    return RouterSmem(*selecting, words(Int32, experts), words(Int32, experts), words(Int32, experts),
                      words(Int32, 4), words(Int32, experts // WARP))


def one_token_select(mt: int, mma_mt: int) -> bool:
    """Whether a router at token tile mt selects in its one-token form: the first CTA's warps select and write the
    plan themselves (select_one_token: no token masks, counters or planning pass), with 9.8 KB of shared memory.
    Token tile 1 on the CUDA cores only ever serves a batch of one token (gemv.token_tile)."""
    return mt == 1 and mma_mt == 0


def router_split(mt: int) -> int:
    """Warps sharing an expert row (each 1/split of K) in the CUDA-core logits at token tile mt: 4 (two experts per
    CTA: 448 CTAs of 28 KB at E = 896, each lane 7 vectors of a row in flight) at tiles of 1 and 8 tokens, 8 (896 CTAs
    of 14 KB, 3.5 vectors per lane) at 2 and 4. Split 4 measured faster at 1 and 8 tokens (front alone -1.1 to -2.4
    us at one token) and slower at 2 and 4 (the front alone at 4 tokens 33.5 -> 45.4 us: not explained). 2 (four
    experts per CTA) takes the one-token front from 112 to 183 registers (one CTA per SM)."""
    return 4 if mt in (1, MAX_TILE) else ROUTER_SPLIT


def router_ctas(experts: int, mma_mt: int, mt: int) -> int:
    """CTAs that compute the logits of E experts: E * router_split(mt) / 8 on the CUDA cores (token tile mt), one
    per 16 experts on the tensor cores (mma_mt > 0)."""
    return experts // MMA_ROWS if mma_mt > 0 else experts * router_split(mt) // WARPS_PER_CTA


def check_router(experts: int, hidden: int, top_k: int) -> None:
    if experts % (WARP * LOAD_BATCHES):
        raise ValueError(f"router: experts={experts} is not a multiple of {WARP * LOAD_BATCHES} (experts per lane "
                         f"in top-k, loaded in {LOAD_BATCHES} batches)")
    if not 0 < top_k <= WARP:
        raise ValueError(f"router: top_k={top_k} must be in 1..{WARP} (one lane per selected expert)")
    check_k(hidden, ROUTER_SPLIT, "router")


def publish_logit(addr: Int64, logit: Float32) -> None:
    """Store a CUDA-core logit for the selecting warps that poll for it: a strong store (st.relaxed.gpu), and a NaN
    with the LOGIT_UNSET pattern stored as the canonical NaN (it ranks the same: below every number)."""
    cute.arch.inline_ptx(
        "{\n"
        ".reg .pred unset;\n"
        ".reg .b32 b;\n"
        "mov.b32 b, {$r1};\n"
        "setp.eq.b32 unset, b, 0xFFFFFFFF;\n"
        "selp.b32 b, 0x7FFFFFFF, b, unset;\n"
        "st.relaxed.gpu.global.b32 [{$r0}], b;\n"
        "}",
        read_only_args=[addr, logit],
    )


@cute.jit
def router_part(x: cute.Tensor, w: cute.Tensor, bias: cute.Tensor, out: RouterOutputs, plan: ExpertPlan,
                state: RouterSmem, scratch: cute.Tensor, mma_scratch, cta: Int32, tidx: Int32, m_count: Int32,
                shape: RouterShape):
    """CTA `cta` of the router CTAs: the logits of expert `cta` for every token on the CUDA cores (shape.mt tokens at a
    time), or with shape.mma_mt > 0 those of experts 16*cta .. 16*cta + 15 on the tensor cores (mma.mma_rows_part,
    mma_scratch its shared memory); up to shape.tail_ctas of the router CTAs then select (the first ones on the CUDA
    cores, the last to finish on the tensor cores: see the module docstring) and the last of those plans for all
    tokens (one token: one_token_select)."""
    experts: cutlass.Constexpr = shape.experts
    hidden: cutlass.Constexpr = shape.hidden
    mt: cutlass.Constexpr = shape.mt
    lane = tidx % WARP
    warp = tidx // WARP
    if cutlass.const_expr(shape.one_token):
        if cta == 0:
            copy_bias(bias, state.bias_s, tidx, experts)  # lands while the CTA computes its logits
    if cutlass.const_expr(shape.mma_mt > 0):
        mma_rows_part(x, w, out.logits, mma_scratch, cta, tidx, m_count, hidden, shape.mma_mt, DEFAULT_WEIGHT_LOAD,
                      shape.mma_in_flight)
    else:
        split: cutlass.Constexpr = router_split(mt)
        n_vec: cutlass.Constexpr = hidden // BF16_PER_VEC // split
        expert = cta * (WARPS_PER_CTA // split) + warp // split
        row_addr = w.iterator.toint() + Int64(expert) * (hidden * 2)
        for m_first in cutlass.range(0, m_count, mt, unroll=1):
            acc = zero_acc(1, mt)
            dot_slice(acc, [row_addr], x.iterator.toint(), (warp % split) * n_vec, lane, m_first, m_count, 0, hidden,
                      n_vec, mt, DEFAULT_WEIGHT_LOAD, wait=shape.one_token)
            split_k_reduce(acc, scratch, warp, lane, split, 1, mt)
            if lane == 0 and warp % split == 0:
                for mi in cutlass.range_constexpr(mt):
                    if m_first + mi < m_count:
                        publish_logit(out.logits.iterator.toint() + (Int64(m_first + mi) * experts + expert) * 4,
                                      acc[0, mi])

    if cutlass.const_expr(shape.one_token):
        if cta == 0:
            cute.arch.cp_async_wait_group(0)
            cute.arch.sync_threads()
            select_one_token(out, state, plan, lane, warp, shape)
    else:
        select_and_plan(bias, out, plan, state, cta, tidx, m_count, shape)


@cute.jit
def copy_bias(bias: cute.Tensor, bias_s: cute.Tensor, tidx: Int32, experts: cutlass.Constexpr):
    """All threads of the one-token selecting CTA: the correction bias into shared memory by cp.async, 16 bytes per
    thread and no registers, issued before the CTA's own logits so that it has landed when the selection starts and
    no load of it sits on the selection's chain (measured: no change from this alone). The caller waits for the
    group (cp_async_wait_group) and synchronizes before reading it."""
    for i in cutlass.range_constexpr((experts // 4 + WARPS_PER_CTA * WARP - 1) // (WARPS_PER_CTA * WARP)):
        v = tidx + i * WARPS_PER_CTA * WARP
        if v < experts // 4:
            cp_async_16(bias_s.iterator.toint() + v * VEC_BYTES, bias.iterator.toint() + Int64(v) * VEC_BYTES)
    cute.arch.cp_async_commit_group()


@cute.jit
def load_bias(bias: cute.Tensor, bias_s: cute.Tensor, tidx: Int32, experts: cutlass.Constexpr):
    """All threads of a selecting CTA: the correction bias into shared memory, unrolled so that every thread's loads
    are in flight together (one round trip, not four)."""
    for i in cutlass.range_constexpr((experts + WARPS_PER_CTA * WARP - 1) // (WARPS_PER_CTA * WARP)):
        e = tidx + i * WARPS_PER_CTA * WARP
        if e < experts:
            bias_s[e] = bias[e]
    cute.arch.sync_threads()


@cute.jit
def select_and_plan(bias, out: RouterOutputs, plan: ExpertPlan, state: RouterSmem, cta, tidx, m_count,
                    shape: RouterShape):
    """A batch's selection and plan, after a router CTA's logits: up to shape.tail_ctas CTAs select 8 tokens at a
    time each and mark each token in its chosen experts' masks; the last of them to finish plans for all tokens."""
    sync, ids = out.sync, out.ids
    mask_lo, mask_hi, slot_of, flag = state.mask_lo, state.mask_hi, state.slot_of, state.flag
    experts: cutlass.Constexpr = shape.experts
    top_k: cutlass.Constexpr = shape.top_k
    lane = tidx % WARP
    warp = tidx // WARP
    n = cutlass.min((m_count + WARPS_PER_CTA - 1) // WARPS_PER_CTA, shape.tail_ctas)
    if cutlass.const_expr(shape.mma_mt > 0):
        place = arrival(sync.iterator, flag, tidx) - (shape.ctas - n)  # the last n to count in select
    else:
        # The first n CTAs select: they poll while the others run beside them (n <= 8 of the GPU's 264+ CTA places).
        place = Int32(-1)
        if cta < n:
            place = cta
    if place >= 0:
        if cutlass.const_expr(shape.mma_mt > 0):
            wait_for_all(sync, tidx, shape.ctas, n)
        load_bias(bias, state.bias_s, tidx, experts)
        select_top_k(out, state, lane, warp, place * WARPS_PER_CTA, n * WARPS_PER_CTA, m_count, shape)
        if arrival(sync.iterator + 2, flag, tidx) == n - 1:  # every selection is in: plan, and leave sync zero
            cute.arch.fence_acq_rel_gpu()
            # All of a thread's mask words are loaded before any is used: one L2 round trip, not one per word.
            rounds: cutlass.Constexpr = (2 * experts + WARPS_PER_CTA * WARP - 1) // (WARPS_PER_CTA * WARP)
            words = []
            for i in cutlass.range_constexpr(rounds):
                e = cutlass.min(tidx + i * WARPS_PER_CTA * WARP, 2 * experts - 1)
                words.append(ld_coherent_i32(sync.iterator.toint() + Int64(MASKS + e) * 4))
            for i in cutlass.range_constexpr(rounds):
                e = tidx + i * WARPS_PER_CTA * WARP
                if e < experts:
                    mask_lo[e] = words[i]
                if e >= experts and e < 2 * experts:
                    mask_hi[e - experts] = words[i]
                if e < 2 * experts:
                    sync[MASKS + e] = Int32(0)
            if tidx == 0:
                sync[2] = Int32(0)
            cute.arch.sync_threads()
            number_active(mask_lo, mask_hi, slot_of, plan, state.chunk_active, lane, warp, experts)
            cute.arch.sync_threads()
            for p in cutlass.range(tidx, m_count * top_k, WARPS_PER_CTA * WARP):
                m = p // top_k
                e = ld_coherent_i32(ids.iterator.toint() + Int64(p) * 4)  # ids [M, k] row-major: ids[m, p % k]
                # Rank of token m among the tokens that chose e = set bits of the mask below bit m.
                below_lo = mask_lo[e] & ((Int32(1) << cutlass.min(m, 31)) - 1)
                if m >= 32:
                    below_lo = mask_lo[e]
                below_hi = Int32(0)
                if m > 32:
                    below_hi = mask_hi[e] & ((Int32(1) << (m - 32)) - 1)
                rank = cute.arch.popc(below_lo) + cute.arch.popc(below_hi)
                plan.slot_pairs[slot_of[e], rank] = p


def any_unset(words, first: int, n: int):
    """Whether any of the n words from words[first] on is still LOGIT_UNSET."""
    unset = words[first] == LOGIT_UNSET
    for j in range(first + 1, first + n):
        unset = unset | (words[j] == LOGIT_UNSET)
    return unset


def unset_logit(addr: Int64) -> None:
    """Set a logit word back to LOGIT_UNSET once read (the next launch's stores are ordered after it by the launch)."""
    cute.arch.inline_ptx("st.global.b32 [{$r0}], 0xFFFFFFFF;", read_only_args=[addr])


def order_key(key: Float32) -> Int32:
    """An int32 whose signed order is the order of the fp32 `key` (-0 == +0); NaN maps to INT32_MIN, below the key
    of every number (-inf included). Positive floats keep their bits; negative ones flip all but the sign."""
    return cute.arch.inline_ptx(
        "{\n"
        ".reg .pred neg, nan;\n"
        ".reg .b32 b, f;\n"
        ".reg .f32 z;\n"
        "add.f32 z, {$r0}, 0f00000000;\n"  # -0 + +0 = +0, every other number unchanged
        "mov.b32 b, z;\n"
        "setp.lt.s32 neg, b, 0;\n"
        "xor.b32 f, b, 0x7FFFFFFF;\n"
        "selp.b32 b, f, b, neg;\n"
        "testp.notanumber.f32 nan, {$r0};\n"
        "selp.b32 {$w0}, 0x80000000, b, nan;\n"
        "}",
        write_only_types=[Int32],
        read_only_args=[key],
    )


def warp_sum_i32(value: Int32) -> Int32:
    """Sum over the 32 lanes in one redux.sync (sm_80+), instead of 5 dependent shuffles."""
    return cute.arch.inline_ptx(
        "redux.sync.add.s32 {$w0}, {$r0}, 0xffffffff;", write_only_types=[Int32], read_only_args=[value]
    )


@cute.jit
def select_top_k(out: RouterOutputs, state: RouterSmem, lane, warp, first, step, m_count, shape: RouterShape):
    """One warp per token (tokens first + warp, then every `step`-th): top-k of sigmoid(logit) + bias over E experts
    (expert lane + 32j in lane `lane`, slot j), ties to the lower index; renormalized weights; the token's bit in each
    chosen expert's mask in `sync` (device-scope atomics: the selecting CTAs share the masks). With the logits on the
    CUDA cores it polls until none of the token's logit words is LOGIT_UNSET; either way they are LOGIT_UNSET again
    once read (for the next launch). (One token: select_one_token, with every warp of the CTA.)"""
    logits, sync = out.logits, out.sync
    score_rows, cand_key, cand_id = state.score_rows, state.cand_key, state.cand_id
    experts: cutlass.Constexpr = shape.experts
    top_k: cutlass.Constexpr = shape.top_k
    poll: cutlass.Constexpr = shape.mma_mt == 0
    per_lane: cutlass.Constexpr = experts // WARP
    keys = cute.make_rmem_tensor(per_lane, Int32)
    base = warp * WARP
    score_base = warp * _words(experts)
    for m in cutlass.range(first + warp, m_count, step):
        row_addr = logits.iterator.toint() + Int64(m) * (experts * 4) + Int64(lane) * 4
        token_keys(keys, row_addr, state.bias_s, score_rows, score_base, lane, 0, per_lane, LOAD_BATCHES, poll)
        warp_top_k(keys, keys, lane, cand_key, cand_id, base, per_lane, top_k, 0, False)
        cute.arch.sync_warp()
        rank, my_id = rank_and_weigh(out.ids, out.weights, cand_key, cand_id, score_rows, score_base, base, lane, m,
                                     top_k, shape.scaling)
        if lane < top_k:
            if m < 32:
                cute.arch.atomic_or(sync.iterator + (MASKS + my_id), Int32(1) << m, scope="gpu")
            else:
                cute.arch.atomic_or(sync.iterator + (MASKS + experts + my_id), Int32(1) << (m - 32), scope="gpu")
        cute.arch.sync_warp()  # the next token reuses this warp's candidate slots


def one_token_warps(experts: int) -> int:
    """Warps that pick candidates in select_one_token: the most (<= 8) that split the E / 32 slots of a lane evenly
    (7 at E = 896: 4 slots, 128 experts each)."""
    per_lane = experts // WARP
    return max(w for w in range(1, WARPS_PER_CTA + 1) if per_lane % w == 0)


@cute.jit
def select_one_token(out: RouterOutputs, state: RouterSmem, plan: ExpertPlan, lane, warp, shape: RouterShape):
    """Every thread of the selecting CTA, for a batch of one token: select_top_k's selection (the same keys, order,
    ties and weights), in two rounds so that one warp's serial work is short. Each of one_token_warps(E) warps takes
    its own E/32/w slots (a contiguous run of experts), polls for their logits and picks its k candidates; warp 0
    then picks the k among the w * k candidates (the top k of the whole is among them, by the same order), and writes
    the plan itself: the token's k experts in index order, one pair each (no masks or planning pass). One warp
    through all 896 experts spent ~8 us of the front's time in its sigmoids and 32 rounds over 28 keys a lane (at 4
    CTAs per SM), past the last down-projection CTA."""
    score_rows, cand_key, cand_id = state.score_rows, state.cand_key, state.cand_id
    experts: cutlass.Constexpr = shape.experts
    top_k: cutlass.Constexpr = shape.top_k
    per_lane: cutlass.Constexpr = experts // WARP
    pickers: cutlass.Constexpr = one_token_warps(experts)
    slots: cutlass.Constexpr = per_lane // pickers
    keys = cute.make_rmem_tensor(slots, Int32)
    if warp < pickers:
        row_addr = out.logits.iterator.toint() + Int64(lane) * 4
        token_keys(keys, row_addr, state.bias_s, score_rows, 0, lane, warp * slots, slots, 1, True)
        warp_top_k(keys, keys, lane, cand_key, cand_id, warp * WARP, slots, top_k, warp * slots, False)
    cute.arch.sync_threads()
    if warp == 0:
        # Candidate c of picker p sits at p * WARP + c; lane l's slot i holds candidate l + 32 i of the p * k in a
        # row (ascending expert order). The slots past them hold a pad (key INT32_MIN, id E) that loses to every
        # candidate: no key is lower, and on an equal key the lower id wins.
        finals: cutlass.Constexpr = (pickers * top_k + WARP - 1) // WARP
        keys2 = cute.make_rmem_tensor(finals, Int32)
        ids2 = cute.make_rmem_tensor(finals, Int32)
        for i in cutlass.range_constexpr(finals):
            c = lane + i * WARP
            at = (c // top_k) * WARP + c % top_k
            keys2[i] = Int32(INT32_MIN)
            ids2[i] = Int32(experts)
            if c < pickers * top_k:
                keys2[i] = cand_key[at]
                ids2[i] = cand_id[at]
        final_base = pickers * WARP
        warp_top_k(keys2, ids2, lane, cand_key, cand_id, final_base, finals, top_k, 0, True)
        cute.arch.sync_warp()
        rank, my_id = rank_and_weigh(out.ids, out.weights, cand_key, cand_id, score_rows, 0, final_base, lane, 0,
                                     top_k, shape.scaling)
        if lane < top_k:
            plan.slot_expert[lane] = my_id  # lane l holds the l-th winner in index order: plan slot l
            plan.slot_count[lane] = 1
            plan.slot_pairs[lane, 0] = rank  # pair p = token * k + rank, token 0
            if lane == 0:
                plan.n_active[0] = top_k


@cute.jit
def token_keys(keys, row_addr, bias_s, score_rows, score_base, lane, first_j, n: cutlass.Constexpr,
               batches: cutlass.Constexpr, poll: cutlass.Constexpr):
    """keys[i] = the order key of sigmoid(logit) + bias of expert lane + 32 (first_j + i), i < n, from the token's
    logit row at row_addr (+ lane * 4); its score into score_rows[score_base + expert]; its logit word LOGIT_UNSET
    again. Loads first, then the arithmetic: the sigmoid's IEEE reciprocal expands to a branch, and loads interleaved
    with it were issued one L2 round trip at a time (~14 us per token). The words land in
    keys, which take their order keys in place; in `batches` batches of loads (two keep the 28-slot selection's
    registers under the streaming part's)."""
    per_batch: cutlass.Constexpr = n // batches
    for batch in cutlass.range_constexpr(batches):
        b0: cutlass.Constexpr = batch * per_batch
        for i in cutlass.range_constexpr(b0, b0 + per_batch):
            keys[i] = ld_relaxed_i32(row_addr + (first_j + i) * WARP * 4)
        if cutlass.const_expr(poll):
            unset = cute.arch.vote_ballot_sync(any_unset(keys, b0, per_batch))
            while unset != 0:
                for i in cutlass.range_constexpr(b0, b0 + per_batch):
                    if keys[i] == LOGIT_UNSET:
                        keys[i] = ld_relaxed_i32(row_addr + (first_j + i) * WARP * 4)
                unset = cute.arch.vote_ballot_sync(any_unset(keys, b0, per_batch))
        for i in cutlass.range_constexpr(b0, b0 + per_batch):
            unset_logit(row_addr + (first_j + i) * WARP * 4)
        for i in cutlass.range_constexpr(b0, b0 + per_batch):
            e = lane + (first_j + i) * WARP
            score = sigmoid(bits_to_f32(keys[i]))
            score_rows[score_base + e] = score
            keys[i] = order_key(score + bias_s[e])


@cute.jit
def warp_top_k(keys, key_ids, lane, cand_key, cand_id, base, n: cutlass.Constexpr, top_k: cutlass.Constexpr,
               first_j, given_ids: cutlass.Constexpr):
    """The k largest of the warp's keys (keys[i] in lane l at position l + 32 i, i < n), ties to the lower position,
    into cand_key / cand_id[base ..] in position order. The id of position l + 32 i: the expert lane + 32 (first_j +
    i), or with given_ids key_ids[i].

    Radix select instead of k argmax rounds: the k-th largest order key T is found bit by bit (32 rounds of one
    compare per key and one redux.sync), the winners are the keys above T plus the lowest-position keys equal to T
    (ballots in position order), compacted in position order."""
    lane_below = cute.arch.lanemask_lt()
    # T = the largest t with #(keys >= t) >= k, built from the top bit down in unsigned space (u = s ^ INT_MIN).
    threshold_u = Int32(0)
    for b in cutlass.range(32, unroll=1):
        cand_u = threshold_u | (Int32(1) << (Int32(31) - b))
        cand = cand_u ^ Int32(INT32_MIN)
        count = Int32(0)
        for i in cutlass.range_constexpr(n):
            if keys[i] >= cand:
                count = count + 1
        if warp_sum_i32(count) >= top_k:
            threshold_u = cand_u
    threshold = threshold_u ^ Int32(INT32_MIN)
    above = Int32(0)
    for i in cutlass.range_constexpr(n):
        if keys[i] > threshold:
            above = above + 1
    need = top_k - warp_sum_i32(above)  # >= 1 keys equal to T are taken, the lowest positions first
    equal_before = Int32(0)
    taken_before = Int32(0)
    for i in cutlass.range_constexpr(n):
        equal = keys[i] == threshold
        equal_ballot = cute.arch.vote_ballot_sync(equal)
        take = keys[i] > threshold
        if equal:
            if equal_before + cute.arch.popc(equal_ballot & lane_below) < need:
                take = True
        take_ballot = cute.arch.vote_ballot_sync(take)
        if take:
            at = base + taken_before + cute.arch.popc(take_ballot & lane_below)
            cand_key[at] = keys[i]
            if cutlass.const_expr(given_ids):
                cand_id[at] = key_ids[i]
            else:
                cand_id[at] = lane + (first_j + i) * WARP
        equal_before = equal_before + cute.arch.popc(equal_ballot)
        taken_before = taken_before + cute.arch.popc(take_ballot)


@cute.jit
def rank_and_weigh(ids, weights, cand_key, cand_id, score_rows, score_base, base, lane, m,
                   top_k: cutlass.Constexpr, scaling: cutlass.Constexpr):
    """Lanes < k, winner `lane` of token m (cand_key / cand_id[base + lane], in index order): its slot is its rank
    among the k, the number of winners with a larger key, or an equal key and a lower index; ids[m, rank] and its
    renormalized weight. Returns (rank, expert) (meaningful in lanes < k)."""
    my_key = Int32(INT32_MIN)
    my_id = Int32(0)
    my_score = Float32(0.0)
    if lane < top_k:
        my_key = cand_key[base + lane]
        my_id = cand_id[base + lane]
        my_score = score_rows[score_base + my_id]
    total = lane_group_sum(my_score, WARP)  # lanes >= k add 0
    rank = Int32(0)
    if lane < top_k:
        for i in cutlass.range_constexpr(top_k):
            other = cand_key[base + i]  # the same word for every lane: a shared-memory broadcast
            if other > my_key or (other == my_key and i < lane):
                rank = rank + 1
        ids[m, rank] = my_id
        weights[m, rank] = my_score / total * Float32(scaling)
    return rank, my_id


@cute.jit
def number_active(mask_lo, mask_hi, slot_of, plan: ExpertPlan, chunk_active, lane, warp, experts: cutlass.Constexpr):
    """All warps: slots for the experts any token chose, in ascending expert order. Chunk c of 32 experts belongs
    to warp c % 8: a ballot counts its active experts, a barrier publishes the counts, and each chunk's first slot
    is the sum of the counts before it (one redux.sync)."""
    chunks: cutlass.Constexpr = experts // WARP
    for c in cutlass.range(warp, chunks, WARPS_PER_CTA, unroll=1):
        e = c * WARP + lane
        active = (mask_lo[e] | mask_hi[e]) != 0
        ballot = cute.arch.vote_ballot_sync(active)
        if lane == 0:
            chunk_active[c] = cute.arch.popc(ballot)
    cute.arch.sync_threads()
    for c in cutlass.range(warp, chunks, WARPS_PER_CTA, unroll=1):
        before = Int32(0)
        for i in cutlass.range(lane, c, WARP, unroll=1):
            before = before + chunk_active[i]
        first = warp_sum_i32(before)
        e = c * WARP + lane
        count = cute.arch.popc(mask_lo[e]) + cute.arch.popc(mask_hi[e])
        active = count > 0
        ballot = cute.arch.vote_ballot_sync(active)
        if active:
            slot = first + cute.arch.popc(ballot & cute.arch.lanemask_lt())
            slot_of[e] = slot
            plan.slot_expert[slot] = e
            plan.slot_count[slot] = count
        if c == chunks - 1 and lane == 0:
            plan.n_active[0] = first + cute.arch.popc(ballot)


def unset_logits(rows: int, experts: int, device):
    """A router logits buffer [rows, E] fp32 as the router expects it before its first launch: every word
    LOGIT_UNSET."""
    import torch

    return torch.full((rows, experts), LOGIT_UNSET, dtype=torch.int32, device=device).view(torch.float32)


def expect_plan(plan: ExpertPlan, experts: int) -> None:
    """A launcher's check of the plan tensors' shapes and dtypes (runtime.expect)."""
    from .runtime import expect

    expect("n_active", plan[0], (1,), "int32")
    expect("slot_expert", plan[1], (experts,), "int32")
    expect("slot_count", plan[2], (experts,), "int32")
    expect("slot_pairs", plan[3], (experts, MAX_TOKENS), "int32")


def fake_plan(experts: int) -> ExpertPlan:
    """The plan's fake tensors for compiling a kernel that reads it."""
    from .runtime import fake

    return ExpertPlan(fake(Int32, (1,)), fake(Int32, (experts,)), fake(Int32, (experts,)),
                      fake(Int32, (experts, MAX_TOKENS)))
