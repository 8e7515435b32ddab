"""The split-K row-dot core of the skinny bf16 GEMMs on the CUDA cores (y[M, N] = x[M, K] @ W[N, K]^T) that the
front (router logits, down-projection, shared gate_up) and the one-token finalize run as device functions.

Mapping: a CTA of 8 warps owns 8/split weight rows; the `split` warps of a row each take 1/split of K, their lanes
striding it in 16-byte vectors (coalesced 512 B per warp load); partial sums meet in shared memory. Splitting K
keeps thousands of warps streaming even when N is small (the router has 896 rows), and many small CTAs balance
across the 132 SMs. Tokens come in compile-time tiles of `mt` (1, 2, 4 or 8) with a run-time loop over tiles;
fp32 accumulation. Weights bypass L1 (read once); activations stay in L1 (every warp of the SM rereads them).
Batches of 2 or more tokens run on the tensor cores instead (mma.py): 16 rows per CTA, every token in one pass.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .common import (
    BF16_PER_VEC,
    VEC_BYTES,
    WARP,
    after_all_loads,
    batch_zero,
    dot_bf16x8,
    lane_group_sum,
    ld_weight_v4,
    load_bf16_tokens,
    warp_barrier,
)
from .mma import MAX_MMA_TOKENS

WARPS_PER_CTA = 8
MAX_TILE = 8  # largest token tile; shared-memory scratch holds WARPS_PER_CTA x 2 rows x MAX_TILE partials


def token_tile(m: int, tensor_cores: bool = True) -> int:
    """Compile-time token tile for a batch of m tokens: 1, 2, 4 or 8 on the CUDA cores, where a run-time loop covers
    the rest of a larger batch; with tensor_cores, batches of 2 to 64 tokens get one tile of 16, 32 or 64 (mma.py:
    measured on the H200, the tensor cores win from 2 tokens on and lose by ~2 us per GEMM at one token)."""
    if tensor_cores and 1 < m <= MAX_MMA_TOKENS:
        return 16 if m <= 16 else (32 if m <= 32 else 64)
    for mt in (1, 2, 4):
        if m <= mt:
            return mt
    return MAX_TILE


def check_k(k: int, split: int, what: str) -> None:
    if k % (BF16_PER_VEC * split):
        raise ValueError(f"{what}: K={k} is not a multiple of {BF16_PER_VEC * split} (16-byte loads, {split}-way split)")


WORDS_IN_FLIGHT = 32  # weight words (of one or two rows) a lane loads before the first FMA that uses one


def ragged(n_vec: int, step: int) -> bool:
    """Whether `step` of a K slice of n_vec vectors is its last, partial one (some lanes past the slice)."""
    return n_vec % WARP != 0 and step == n_vec // WARP


def slice_vec(first_vec: Int32, lane: Int32, n_vec: int, step: int) -> Int32:
    """The vector this lane reads at `step` of a K slice of n_vec vectors (first_vec + lane + 32 * step); on a ragged
    last step the lanes past the slice reread its last vector, which keeps the load in bounds (slice_dot drops it)."""
    vec = first_vec + lane + step * WARP
    if ragged(n_vec, step):
        vec = cutlass.min(vec, first_vec + n_vec - 1)
    return vec


def in_slice(words: list, lane: Int32, n_vec: int, step: int) -> list:
    """The words this lane loaded at `step` of a K slice of n_vec vectors, zeroed on a ragged last step for the lanes
    past the slice (slice_vec had them reread its last vector)."""
    if not ragged(n_vec, step):
        return words
    keep = (lane - n_vec % WARP) >> 31  # all ones for the lanes inside the slice, zero past it
    return [w & keep for w in words]


def load_slice(row_addrs: list, first_vec: Int32, lane: Int32, n_vec: int, steps: range, hint: str) -> list:
    """This lane's weight vectors of the rows at byte addresses row_addrs, at `steps` of a K slice: [step][row] -> 4
    words. Only loads: a launch started early can issue them before griddepcontrol.wait."""
    return [[list(ld_weight_v4(addr + Int64(slice_vec(first_vec, lane, n_vec, s)) * VEC_BYTES, hint))
             for addr in row_addrs] for s in steps]


def loaded_words(held: list) -> list:
    return [w for step in held for words in step for w in words]


def pin_first_words(held: list, zero: Int32) -> None:
    """Make the first word of every row (each row's dot is its own FMA chain) depend on `zero`, a run-time 0 that
    common.after_all_loads computed from every held word: no FMA can then start before all the loads are issued."""
    for words in held[0]:
        words[0] = words[0] | zero


def slice_dot(acc, acc_row: int, held: list, steps: range, x_addr: Int64, first_vec: Int32, lane: Int32, m_first,
              m_count, x_elems: int, n_vec: int, mt: int, fresh: bool = False) -> None:
    """acc[acc_row + r, mi] += this lane's share of the dot of held row r (load_slice, the same steps) with bf16
    token m_first + mi (rows of x_elems values; fresh: read as common.load_bf16_tokens says)."""
    for step, rows in zip(steps, held):
        vec = slice_vec(first_vec, lane, n_vec, step)
        rows = [in_slice(words, lane, n_vec, step) for words in rows]
        tokens = load_bf16_tokens(x_addr, x_elems * 2, m_first, m_count, vec, mt, fresh)
        for r, words in enumerate(rows):
            for mi in range(mt):
                acc[acc_row + r, mi] = dot_bf16x8(words, tokens[mi], acc[acc_row + r, mi])


def in_tile(addr: Int64, m_first) -> Int64:
    """addr, made to depend on the token tile that starts at m_first: plus (m_first >> 30) << 4, which is 0 for any
    batch, 16-byte aligned in any case, and unknown to the compiler. A one-token kernel's tile loop runs once, and LLVM
    would otherwise hoist a slice's loop-invariant weight loads out of it together with their bf16 -> fp32
    conversions, holding two fp32 registers per weight word across the loop: 110 registers in the one-token front
    instead of 78, 94 in the standalone GEMV at split 4 instead of 64."""
    return addr + (Int64(m_first >> 30) << 4)


def dot_slice(acc, row_addrs: list, x_addr: Int64, first_vec: Int32, lane: Int32, m_first, m_count, acc_row: int,
              x_elems: int, n_vec: int, mt: int, hint: str, fresh: bool = False, pinned: bool | None = None,
              wait: bool = False) -> None:
    """acc[acc_row + r, mi] += this lane's share of the dot of weight row r (at byte address row_addrs[r]) with bf16
    token m_first + mi (rows of x_elems values), over the n_vec 16-byte vectors starting at first_vec. The caller
    reduces across lanes and warps. Up to WORDS_IN_FLIGHT weight words are loaded at once. pinned (default: one
    token per tile, mt == 1): the first FMA waits for all of them (common.after_all_loads), since left to itself
    ptxas sank loads next to their uses, one DRAM round trip per step (the shared experts' SASS); unpinned: weak
    loads ahead of the warp's own barrier, which holds them there while each FMA waits for its own words (faster
    from 4 tokens and in the shared gate_up, slower in the one-token front). At one token the weight loads stay
    in the caller's tile loop (in_tile) and x's loads go out beside them.

    wait: the launch was started early (programmatic dependent launch) and x is its predecessor's output: the first
    batch's weight loads go out before griddepcontrol.wait, as weak loads (ptxas keeps those on their side of it,
    common.WEIGHT_LOADS["ordered"]), so that they stream while the predecessor finishes; x is read after it, fresh."""
    steps = -(-n_vec // WARP)
    fresh = fresh or wait
    in_flight = max(1, WORDS_IN_FLIGHT // (4 * len(row_addrs)))
    if mt == 1:
        row_addrs = [in_tile(addr, m_first) for addr in row_addrs]
    pin = (mt == 1) if pinned is None else pinned
    for first in range(0, steps, in_flight):
        batch = range(first, min(first + in_flight, steps))
        early = wait and first == 0
        # Weak loads where a barrier must keep them ahead of it: griddepcontrol.wait, or the unpinned batch's own
        held = load_slice(row_addrs, first_vec, lane, n_vec, batch, "ordered" if early or not pin else hint)
        if early:
            cute.arch.griddepcontrol_wait()
        if pin:
            pin_first_words(held, after_all_loads(Int32(0), loaded_words(held), batch_zero(m_count)))
            slice_dot(acc, acc_row, held, batch, x_addr, first_vec, lane, m_first, m_count, x_elems, n_vec, mt, fresh)
        else:
            # Each FMA waits for its own words only (the warp's own barrier holds the loads ahead); x by weak loads
            # after it (a .nc load, like the FMAs it feeds, could move above the barrier)
            warp_barrier()
            slice_dot(acc, acc_row, held, batch, x_addr, first_vec, lane, m_first, m_count, x_elems, n_vec, mt, True)


@cute.jit
def split_k_reduce(
    acc: cute.Tensor,
    scratch: cute.Tensor,
    warp: Int32,
    lane: Int32,
    split: cutlass.Constexpr,
    rows: cutlass.Constexpr,
    mt: cutlass.Constexpr,
):
    """Sum acc over each warp's lanes and over the `split` consecutive warps sharing a row group; lane 0 of the
    group's first warp ends with the totals. Every thread of the CTA must call it (it synchronizes)."""
    for r in cutlass.range_constexpr(rows):
        for mi in cutlass.range_constexpr(mt):
            acc[r, mi] = lane_group_sum(acc[r, mi], WARP)
    if cutlass.const_expr(split > 1):
        if lane == 0:
            for r in cutlass.range_constexpr(rows):
                for mi in cutlass.range_constexpr(mt):
                    scratch[warp, r * mt + mi] = acc[r, mi]
        cute.arch.sync_threads()
        if lane == 0 and warp % split == 0:
            for r in cutlass.range_constexpr(rows):
                for mi in cutlass.range_constexpr(mt):
                    total = Float32(0.0)
                    for p in cutlass.range_constexpr(split):
                        total = total + scratch[warp + p, r * mt + mi]
                    acc[r, mi] = total
        cute.arch.sync_threads()


def zero_acc(rows: int, mt: int):
    acc = cute.make_rmem_tensor(cute.make_layout((rows, mt), stride=(mt, 1)), Float32)
    for r in range(rows):
        for mi in range(mt):
            acc[r, mi] = Float32(0.0)
    return acc


def alloc_scratch(smem):
    return smem.allocate_tensor(
        Float32, cute.make_layout((WARPS_PER_CTA, 2 * MAX_TILE), stride=(2 * MAX_TILE, 1)), byte_alignment=16
    )


SCRATCH_BYTES = WARPS_PER_CTA * 2 * MAX_TILE * 4


@cute.jit
def gemv_part(
    x: cute.Tensor,
    w: cute.Tensor,
    y: cute.Tensor,
    scratch: cute.Tensor,
    cta: Int32,
    warp: Int32,
    lane: Int32,
    m_count: Int32,
    k: cutlass.Constexpr,
    split: cutlass.Constexpr,
    mt: cutlass.Constexpr,
    hint: cutlass.Constexpr,
    fresh: cutlass.Constexpr = False,
    wait: cutlass.Constexpr = False,
):
    """CTA `cta` of y = x @ w^T: rows cta*(8/split) .. +8/split (fresh: x was written by a launch still running when
    this one started; wait: this part waits for the launch before between its first weight loads and x's, as
    dot_slice says)."""
    part = warp % split
    row = cta * (WARPS_PER_CTA // split) + warp // split
    n_vec: cutlass.Constexpr = k // BF16_PER_VEC // split
    row_addr = w.iterator.toint() + Int64(row) * (k * 2)
    for m_first in cutlass.range(0, m_count, mt, unroll=1):
        acc = zero_acc(1, mt)
        dot_slice(acc, [row_addr], x.iterator.toint(), part * n_vec, lane, m_first, m_count, 0, k, n_vec, mt, hint,
                  fresh, wait=wait)
        split_k_reduce(acc, scratch, warp, lane, split, 1, mt)
        if lane == 0 and part == 0:
            for mi in cutlass.range_constexpr(mt):
                if m_first + mi < m_count:
                    y[m_first + mi, row] = acc[0, mi].to(y.element_type)
