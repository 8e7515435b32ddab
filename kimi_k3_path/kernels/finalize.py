"""Finalize of the latent MoE in one launch: the up-projection of the normalized latent rows and the shared experts'
down-projection, summed into the block output:

    out[M, H] = normed @ W_up^T + a_sh @ W_sh2^T      (W_up [H, L] whole or this rank's row shard)

The weighted top-k combine already happened in the GEMM2 epilogue (fp32 reductions into y_lat), and GEMM2's last
CTAs wrote normed = rms_norm(y_lat) in bf16, so this is one skinny GEMM over two K segments with one accumulator per
segment. At one token GEMM2 (experts.ExpertsGemm2OneToken) writes normed = y * gamma without the RMS, and partial
sums of y^2 per CTA (`sq_parts`): the finalize sums those and scales its W_up dot by rsqrt(sum / L + eps), a scalar
per token, so no CTA of GEMM2 has to wait for all the others. Split-K over the CTA's warps as in
gemv.py; from 2 tokens on the tensor cores (mma.py), where both segments accumulate into the same C fragments. At one
token the block runs FinalizeStreamed: persistent CTAs that stream their row pairs through shared memory
(kimi_k3_kernels.md §3.4); Finalize, holding its weights in registers across the wait, stays the A/B baseline.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, Uint8

from .common import (
    DEFAULT_WEIGHT_LOAD,
    ctas_per_sm_bound,
    VEC_BYTES,
    WARP,
    after_all_loads,
    batch_zero,
    cp_async_16,
    dot_bf16x8_packed,
    lane_group_sum,
    ld_fresh_v4,
    ld_shared_v4,
    traced,
)
from .gemv import (
    BF16_PER_VEC,
    SCRATCH_BYTES,
    WARPS_PER_CTA,
    alloc_scratch,
    check_k,
    in_slice,
    load_slice,
    loaded_words,
    pin_first_words,
    slice_dot,
    slice_vec,
    split_k_reduce,
    zero_acc,
)
from .mma import (
    MMA_ROWS,
    TILE_TOKENS,
    alloc_tile_scratch,
    check_mma,
    mma_segment,
    reduce_tiles,
    scratch_bytes,
    store_rows,
    uses_tensor_cores,
    zero_tiles,
)

FINALIZE_SPLIT = 4
# The CUDA-core finalize is compiled to fit this many CTAs per SM (ptxas register bound; 66 -> 63 registers, 8 bytes
# of stack): resident while GEMM2 runs, more of them hold their weights. 4 measured ~1 us faster than 3 in the M=1
# block at TP16, level at TP8; 5 (48 registers, 104 bytes of stack) far slower.
SIMT_MIN_CTAS_PER_SM = 4


# The streamed one-token finalize (FinalizeStreamed): persistent CTAs per SM and row pairs in flight per CTA.
# 3 x 3, 2 x 4 and 2 x 2 measured within 0.5 us of each other in the M=1 block.
STREAMED_CTAS_PER_SM = 3
STREAMED_STAGES = 3


def streamed_ctas(sms: int, ctas_per_sm: int | None = None) -> int:
    """FinalizeStreamed's grid on a GPU with `sms` SMs: every CTA resident at once."""
    return (ctas_per_sm or STREAMED_CTAS_PER_SM) * sms


@cute.jit
def rms_scale(sq_parts: cute.Tensor, lane: Int32, rms_parts: cutlass.Constexpr, latent: cutlass.Constexpr,
              eps: cutlass.Constexpr) -> Float32:
    """rsqrt(sum(sq_parts[:rms_parts]) / latent + eps), every lane of the warp reading a share of the partial sums."""
    squares = Float32(0.0)
    for i in cutlass.range_constexpr(-(-rms_parts // WARP)):
        if lane + i * WARP < rms_parts:
            squares = squares + sq_parts[lane + i * WARP]
    return cute.math.rsqrt(lane_group_sum(squares, WARP) / Float32(latent) + Float32(eps))


@cute.jit
def finalize_part(
    normed: cute.Tensor,
    w_up: cute.Tensor,
    a_sh: cute.Tensor,
    w_sh2: cute.Tensor,
    sq_parts: cute.Tensor,
    out: cute.Tensor,
    scratch: cute.Tensor,
    cta: Int32,
    warp: Int32,
    lane: Int32,
    m_count: Int32,
    latent: cutlass.Constexpr,
    inter: cutlass.Constexpr,
    mt: cutlass.Constexpr,
    early: cutlass.Constexpr,
    hold: cutlass.Constexpr,
    rms_parts: cutlass.Constexpr,
    eps: cutlass.Constexpr,
):
    """CTA `cta`: output rows 2*cta, 2*cta + 1 for every token (4 warps per row split K). Each lane loads its
    weight vectors of both segments once, for all token tiles. Launched early, the CTA waits for GEMM2 before its
    first load, or, holding its weights, after them: then the CTAs resident while GEMM2 runs have their weights in
    flight by the time normed is ready. rms_parts > 0 (one token): normed is y * gamma and the W_up dot is scaled by
    rsqrt(sum(sq_parts[:rms_parts]) / latent + eps)."""
    part = warp % FINALIZE_SPLIT
    row = cta * (WARPS_PER_CTA // FINALIZE_SPLIT) + warp // FINALIZE_SPLIT
    up_vec: cutlass.Constexpr = latent // BF16_PER_VEC // FINALIZE_SPLIT
    sh_vec: cutlass.Constexpr = inter // BF16_PER_VEC // FINALIZE_SPLIT
    up_steps: cutlass.Constexpr = range(-(-up_vec // WARP))
    sh_steps: cutlass.Constexpr = range(-(-sh_vec // WARP))
    if cutlass.const_expr(early and not hold):
        cute.arch.griddepcontrol_wait()
    up = load_slice([w_up.iterator.toint() + Int64(row) * (latent * 2)], part * up_vec, lane, up_vec, up_steps,
                    DEFAULT_WEIGHT_LOAD)
    sh = load_slice([w_sh2.iterator.toint() + Int64(row) * (inter * 2)], part * sh_vec, lane, sh_vec, sh_steps,
                    DEFAULT_WEIGHT_LOAD)
    # Every FMA (and, holding, the wait) depends on every weight word: ptxas would otherwise sink each load next to
    # its first use, past the wait.
    zero = after_all_loads(Int32(0), loaded_words(up) + loaded_words(sh), batch_zero(m_count))
    if cutlass.const_expr(hold):
        if zero == 0:
            cute.arch.griddepcontrol_wait()
    pin_first_words(up, zero)
    pin_first_words(sh, zero)
    rstd = Float32(1.0)
    if cutlass.const_expr(rms_parts > 0):
        rstd = rms_scale(sq_parts, lane, rms_parts, latent, eps)
    segments: cutlass.Constexpr = 2 if rms_parts > 0 else 1  # the W_up dot apart, to be scaled
    for m_first in cutlass.range(0, m_count, mt, unroll=1):
        acc = zero_acc(segments, mt)
        slice_dot(acc, 0, up, up_steps, normed.iterator.toint(), part * up_vec, lane, m_first, m_count, latent,
                  up_vec, mt, early)
        slice_dot(acc, segments - 1, sh, sh_steps, a_sh.iterator.toint(), part * sh_vec, lane, m_first, m_count,
                  inter, sh_vec, mt, early)
        split_k_reduce(acc, scratch, warp, lane, FINALIZE_SPLIT, segments, mt)
        if lane == 0 and part == 0:
            for mi in cutlass.range_constexpr(mt):
                if m_first + mi < m_count:
                    if cutlass.const_expr(rms_parts > 0):
                        out[m_first + mi, row] = (acc[0, mi] * rstd + acc[1, mi]).to(BFloat16)
                    else:
                        out[m_first + mi, row] = acc[0, mi].to(BFloat16)


@cute.jit
def mma_finalize_part(
    normed: cute.Tensor,
    w_up: cute.Tensor,
    a_sh: cute.Tensor,
    w_sh2: cute.Tensor,
    out: cute.Tensor,
    scratch: cute.Tensor,
    cta: Int32,
    tidx: Int32,
    m_count: Int32,
    latent: cutlass.Constexpr,
    inter: cutlass.Constexpr,
    mt: cutlass.Constexpr,
    fresh: cutlass.Constexpr,
):
    """CTA `cta`: output rows 16*cta .. +15 for every token, both K segments on the tensor cores."""
    tiles: cutlass.Constexpr = mt // TILE_TOKENS
    warp, lane = tidx // WARP, tidx % WARP
    row0 = cta * MMA_ROWS
    up_addr = w_up.iterator.toint() + Int64(row0 + lane // 4) * (latent * 2)
    sh_addr = w_sh2.iterator.toint() + Int64(row0 + lane // 4) * (inter * 2)
    acc = zero_tiles(tiles)
    mma_segment(acc, up_addr, up_addr + Int64(8 * latent * 2), normed.iterator.toint(), warp, lane, m_count, latent,
                tiles, DEFAULT_WEIGHT_LOAD, fresh)
    mma_segment(acc, sh_addr, sh_addr + Int64(8 * inter * 2), a_sh.iterator.toint(), warp, lane, m_count, inter,
                tiles, DEFAULT_WEIGHT_LOAD, fresh)
    reduce_tiles(acc, scratch, tidx, tiles)
    store_rows(scratch, out, row0, tidx, m_count, mt)


class Finalize:
    """out [M, H] bf16 = normed [M, L] @ W_up [H, L]^T + a_sh [M, Ish] @ W_sh2 [H, Ish]^T (bf16, fp32 accumulation).
    early: launched with programmatic dependent launch while GEMM2 runs (GEMM2 lets it start at once); each CTA waits
    (griddepcontrol.wait) before its first activation load and reads normed and a_sh with plain loads; with
    hold_weights (CUDA cores only) it loads its weights before the wait, otherwise nothing."""

    def __init__(self, hidden: int, latent: int, shared_inter: int, mt: int, early: bool = False,
                 hold_weights: bool = False, rms_parts: int = 0, eps: float = 0.0, trace_addr: int = 0):
        if hidden % (WARPS_PER_CTA // FINALIZE_SPLIT):
            raise ValueError(f"Finalize: hidden={hidden} is not a multiple of {WARPS_PER_CTA // FINALIZE_SPLIT}")
        check_k(latent, FINALIZE_SPLIT, "Finalize (latent)")
        check_k(shared_inter, FINALIZE_SPLIT, "Finalize (shared intermediate)")
        if uses_tensor_cores(mt):
            check_mma(hidden, latent, "Finalize (latent)")
            check_mma(hidden, shared_inter, "Finalize (shared intermediate)")
        if hold_weights and (not early or uses_tensor_cores(mt)):
            raise ValueError("Finalize: hold_weights needs early=True and the CUDA-core path (token tile 1..8)")
        if rms_parts and mt != 1:
            raise ValueError(f"Finalize: rms_parts (one token's partial sums of squares) needs token tile 1, not {mt}")
        self.h, self.l, self.s, self.mt, self.early, self.hold = hidden, latent, shared_inter, mt, early, hold_weights
        self.rms_parts, self.eps, self.trace_addr = rms_parts, eps, trace_addr

    def ctas(self) -> int:
        return self.h // (MMA_ROWS if uses_tensor_cores(self.mt) else WARPS_PER_CTA // FINALIZE_SPLIT)

    def smem_bytes(self) -> int:
        return scratch_bytes(self.mt) if uses_tensor_cores(self.mt) else SCRATCH_BYTES

    def occupancy_bound(self) -> dict:
        """Launch options of the CUDA-core finalize: SIMT_MIN_CTAS_PER_SM."""
        if uses_tensor_cores(self.mt):
            return {}
        return ctas_per_sm_bound(SIMT_MIN_CTAS_PER_SM)

    @cute.jit
    def __call__(self, normed, w_up, a_sh, w_sh2, sq_parts, out, stream: cuda.CUstream):
        self.kernel(normed, w_up, a_sh, w_sh2, sq_parts, out, normed.shape[0]).launch(
            grid=[self.ctas(), 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], smem=self.smem_bytes(), stream=stream,
            use_pdl=self.early, **self.occupancy_bound(),
        )

    @cute.kernel
    def kernel(self, normed, w_up, a_sh, w_sh2, sq_parts, out, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        traced(self.trace_addr, bidx, tidx, False)
        smem = cutlass.memory.SmemAllocator()
        if cutlass.const_expr(uses_tensor_cores(self.mt)):
            if cutlass.const_expr(self.early):
                cute.arch.griddepcontrol_wait()
            mma_finalize_part(normed, w_up, a_sh, w_sh2, out, alloc_tile_scratch(smem, self.mt), bidx, tidx, m_count,
                              self.l, self.s, self.mt, self.early)
        else:
            finalize_part(normed, w_up, a_sh, w_sh2, sq_parts, out, alloc_scratch(smem), bidx, tidx // WARP,
                          tidx % WARP, m_count, self.l, self.s, self.mt, self.early, self.hold, self.rms_parts,
                          self.eps)
        traced(self.trace_addr, bidx, tidx, True)


class FinalizeStreamed:
    """The one-token finalize as persistent CTAs (ctas of them, a few per SM) that stream their row pairs through
    shared memory: CTA c takes row pairs c, c + ctas, ... (4 warps per row split K, as Finalize), each thread copying
    its weight vectors of a pair by 16-byte cp.async into `stages` slots, so `stages - 1` pairs are in flight while it
    computes one, and no register holds a byte in flight. The first pairs are issued before griddepcontrol.wait (the
    weights do not depend on GEMM2); the lane's slices of normed and a_sh and the RMS scale are read once per CTA,
    after the wait, not once per pair. Why: a CTA of Finalize holds its place on the SM for ~2.1 us,
    and after its weights land its chain (activations, sums of squares, FMAs, reductions) leaves that place without
    bytes in flight, so the finalize's segment moves ~3.6 TB/s where a read of its bytes moves 4.0. The copies take
    L2's evict_first policy: without it the next block's front ran ~1.4 us slower behind this launch."""

    def __init__(self, hidden: int, latent: int, shared_inter: int, rms_parts: int, eps: float, ctas: int,
                 stages: int, trace_addr: int = 0):
        rows = WARPS_PER_CTA // FINALIZE_SPLIT
        if hidden % rows:
            raise ValueError(f"FinalizeStreamed: hidden={hidden} is not a multiple of {rows}")
        check_k(latent, FINALIZE_SPLIT, "FinalizeStreamed (latent)")
        check_k(shared_inter, FINALIZE_SPLIT, "FinalizeStreamed (shared intermediate)")
        if stages < 2 or ctas < 1 or rms_parts < 1:
            raise ValueError(f"FinalizeStreamed: stages={stages} must be at least 2, ctas={ctas} and "
                             f"rms_parts={rms_parts} at least 1")
        self.h, self.l, self.s, self.rms_parts, self.eps = hidden, latent, shared_inter, rms_parts, eps
        self.grid, self.stages, self.trace_addr = ctas, stages, trace_addr
        self.units = hidden // rows
        self.up_vec = latent // BF16_PER_VEC // FINALIZE_SPLIT
        self.sh_vec = shared_inter // BF16_PER_VEC // FINALIZE_SPLIT
        self.up_steps = -(-self.up_vec // WARP)
        self.sh_steps = -(-self.sh_vec // WARP)
        # Fused: a warp's up and shared vectors as one slice of fused_vec vectors (up first), wherever the shared part
        # then fills the up part's ragged last step: at TP16 (112 + 12 vectors per warp: 4 steps instead of 4 + 1) the
        # finalize alone 16.8 -> 15.5 us; at TP8 (112 + 24: 5 steps either way) the block +0.2-0.3 us, so apart there.
        self.fused_vec = self.up_vec + self.sh_vec
        self.fused_steps = -(-self.fused_vec // WARP)
        self.fused = self.fused_steps < self.up_steps + self.sh_steps
        # A thread's 16-byte steps of a row pair, in order, as (kind, step): kind "up" or "shared" says which row
        # and sum the step's vector belongs to ("mixed": either, by lane, in the fused slice's boundary step).
        if self.fused:
            self.plan = [(self.fused_kind(st), st) for st in range(self.fused_steps)]
        else:
            self.plan = [("up", st) for st in range(self.up_steps)] + [("shared", st) for st in range(self.sh_steps)]
        self.vecs = len(self.plan)  # per thread and row pair

    def ctas(self) -> int:
        return self.grid

    def stage_bytes(self) -> int:
        return self.vecs * WARPS_PER_CTA * WARP * VEC_BYTES

    def smem_bytes(self) -> int:
        # The DSL lays out the allocations one after another: the stages (128-byte aligned), then the scratch.
        return self.stages * self.stage_bytes() + 128 + SCRATCH_BYTES + 16

    @cute.jit
    def __call__(self, normed, w_up, a_sh, w_sh2, sq_parts, out, stream: cuda.CUstream):
        self.kernel(normed, w_up, a_sh, w_sh2, sq_parts, out).launch(
            grid=[self.grid, 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1], smem=self.smem_bytes(), stream=stream,
            use_pdl=True,
        )

    def row_of(self, cta: Int32, unit_index: Int32, half: Int32) -> Int32:
        """The output row of warp-half `half` in the unit_index-th row pair of CTA `cta` (pairs c, c + ctas, ...)."""
        return (cta + unit_index * self.grid) * (WARPS_PER_CTA // FINALIZE_SPLIT) + half

    def slot(self, stage_base: Int32, unit_index: Int32, v: int, tidx: Int32) -> Int32:
        """Shared address of this thread's vector v of its unit_index-th row pair (consecutive threads, consecutive
        16 bytes: no bank conflicts)."""
        return stage_base + (((unit_index % self.stages) * self.vecs + v) * (WARPS_PER_CTA * WARP) + tidx) * VEC_BYTES

    def fused_kind(self, st: int) -> str:
        """In the fused slice, whether every lane's vector at step st is an up one, a shared one, or either."""
        if (st + 1) * WARP <= self.up_vec:
            return "up"
        return "shared" if st * WARP >= self.up_vec else "mixed"

    def lane_is_up(self, lane: Int32, st: int) -> Int32:
        """1 where this lane's vector at fused step st is an up-projection one, else 0."""
        return ((lane + st * WARP - self.up_vec) >> 31) & 1

    def vector_address(self, up_base: Int64, sh_base: Int64, part: Int32, lane: Int32, kind: str, st: int) -> Int64:
        """This lane's vector at plan step (kind, st) of rows starting at up_base (latent wide) and sh_base
        (shared_inter wide). Apart, each row's slice has its own steps; fused, vector j of the warp's slice is up
        vector part * up_vec + j below up_vec, else shared vector part * sh_vec + j - up_vec. A ragged last step
        rereads its slice's last vector (slice_vec; `masked` drops it)."""
        if not self.fused:
            if kind == "up":
                return up_base + Int64(slice_vec(part * self.up_vec, lane, self.up_vec, st)) * VEC_BYTES
            return sh_base + Int64(slice_vec(part * self.sh_vec, lane, self.sh_vec, st)) * VEC_BYTES
        j = slice_vec(Int32(0), lane, self.fused_vec, st)
        up = up_base + Int64(part * self.up_vec + j) * VEC_BYTES
        sh = sh_base + Int64(part * self.sh_vec + j - self.up_vec) * VEC_BYTES
        if kind == "up":
            return up
        if kind == "shared":
            return sh
        return sh + Int64(self.lane_is_up(lane, st)) * (up - sh)

    def masked(self, words: list, lane: Int32, kind: str, st: int) -> list:
        """The words of plan step (kind, st), zero for the lanes past their slice on a ragged last step."""
        if self.fused:
            return in_slice(words, lane, self.fused_vec, st)
        return in_slice(words, lane, self.up_vec if kind == "up" else self.sh_vec, st)

    def accumulate(self, acc, words: list, x_words: list, lane: Int32, kind: str, st: int) -> None:
        """acc[0, 0] (up) or acc[1, 0] (shared) += this step's dot; a mixed step's lanes add to their own row's."""
        if kind == "up":
            acc[0, 0] = dot_bf16x8_packed(words, x_words, acc[0, 0])
        elif kind == "shared":
            acc[1, 0] = dot_bf16x8_packed(words, x_words, acc[1, 0])
        else:
            part_sum = dot_bf16x8_packed(words, x_words, Float32(0.0))
            up_part = part_sum * Float32(self.lane_is_up(lane, st))  # exact: times 1 or 0
            acc[0, 0] = acc[0, 0] + up_part
            acc[1, 0] = acc[1, 0] + (part_sum - up_part)

    @cute.jit
    def issue(self, w_up, w_sh2, stage_base: Int32, unit_index: Int32, units_here: Int32, cta: Int32, half: Int32,
              part: Int32, lane: Int32, tidx: Int32):
        """cp.async this thread's weight vectors of its unit_index-th row pair (none past its last), one commit group
        per pair either way, so that cp_async_wait_group counts pairs."""
        if unit_index < units_here:
            row = self.row_of(cta, unit_index, half)
            up_row = w_up.iterator.toint() + Int64(row) * (self.l * 2)
            sh_row = w_sh2.iterator.toint() + Int64(row) * (self.s * 2)
            for v, (kind, st) in enumerate(self.plan):
                cp_async_16(self.slot(stage_base, unit_index, v, tidx),
                            self.vector_address(up_row, sh_row, part, lane, kind, st), True)
        cute.arch.cp_async_commit_group()

    @cute.kernel
    def kernel(self, normed, w_up, a_sh, w_sh2, sq_parts, out):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        traced(self.trace_addr, cta, tidx, False)
        warp, lane = tidx // WARP, tidx % WARP
        part, half = warp % FINALIZE_SPLIT, warp // FINALIZE_SPLIT
        smem = cutlass.memory.SmemAllocator()
        stage_base = smem.allocate_tensor(Uint8, cute.make_layout(self.stages * self.stage_bytes()),
                                          byte_alignment=128).iterator.toint()
        scratch = alloc_scratch(smem)
        units_here = (self.units - cta + self.grid - 1) // self.grid
        for i in cutlass.range_constexpr(self.stages - 1):
            self.issue(w_up, w_sh2, stage_base, Int32(i), units_here, cta, half, part, lane, tidx)
        cute.arch.griddepcontrol_wait()  # GEMM2 has written normed, sq_parts and a_sh
        xs = [list(ld_fresh_v4(self.vector_address(normed.iterator.toint(), a_sh.iterator.toint(), part, lane, kind,
                                                   st))) for kind, st in self.plan]
        rstd = rms_scale(sq_parts, lane, self.rms_parts, self.l, self.eps)
        for i in cutlass.range(units_here, unroll=1):
            self.issue(w_up, w_sh2, stage_base, i + self.stages - 1, units_here, cta, half, part, lane, tidx)
            cute.arch.cp_async_wait_group(self.stages - 1)  # this thread's copies of pair i have landed
            acc = zero_acc(2, 1)
            for v, (kind, st) in enumerate(self.plan):
                words = self.masked(list(ld_shared_v4(self.slot(stage_base, i, v, tidx))), lane, kind, st)
                self.accumulate(acc, words, xs[v], lane, kind, st)
            split_k_reduce(acc, scratch, warp, lane, FINALIZE_SPLIT, 2, 1)
            if lane == 0 and part == 0:
                out[0, self.row_of(cta, i, half)] = (acc[0, 0] * rstd + acc[1, 0]).to(BFloat16)
        traced(self.trace_addr, cta, tidx, True)


def finalize_streamed(normed, w_up, a_sh, w_sh2, out, sq_parts, eps: float, stream, ctas_per_sm: int | None = None,
                      stages: int | None = None) -> None:
    """FinalizeStreamed on `stream` for one token: out [1, H] = rsqrt(sum(sq_parts) / L + eps) * (normed @ w_up^T)
    + a_sh @ w_sh2^T, launched early (it waits for its predecessor before reading normed, a_sh and sq_parts).
    ctas_per_sm and stages: STREAMED_CTAS_PER_SM and STREAMED_STAGES unless given."""
    import torch

    from .runtime import compile_cached, cu_stream, expect, fake, fake_stream, to_cute
    from .trace import trace_address

    latent, hidden, inter = normed.shape[1], w_sh2.shape[0], w_sh2.shape[1]
    expect("normed", normed, (1, latent), "bfloat16")
    expect("w_up", w_up, (hidden, latent), "bfloat16")
    expect("a_sh", a_sh, (1, inter), "bfloat16")
    expect("w_sh2", w_sh2, (hidden, inter), "bfloat16")
    expect("out", out, (1, hidden), "bfloat16")
    rms_parts = sq_parts.shape[0]
    expect("sq_parts", sq_parts, (rms_parts,), "float32")
    ctas = streamed_ctas(torch.cuda.get_device_properties(out.device).multi_processor_count, ctas_per_sm)
    stages = stages or STREAMED_STAGES
    trace = trace_address("finalize", ctas)

    def build():
        args = (fake(BFloat16, (1, latent)), fake(BFloat16, (hidden, latent)), fake(BFloat16, (1, inter)),
                fake(BFloat16, (hidden, inter)), fake(Float32, (rms_parts,)), fake(BFloat16, (1, hidden)),
                fake_stream())
        return FinalizeStreamed(hidden, latent, inter, rms_parts, eps, ctas, stages, trace), args

    fn = compile_cached(("finalize_streamed", hidden, latent, inter, rms_parts, eps, ctas, stages, trace), build)
    fn(to_cute(normed), to_cute(w_up), to_cute(a_sh), to_cute(w_sh2), to_cute(sq_parts), to_cute(out),
       cu_stream(stream))


def holds_weights(early: bool, mt: int) -> bool:
    """Whether the finalize loads its weights before it waits for GEMM2: whenever it is launched early on the CUDA
    cores (one token): the M=1 block measured 0.8-1.0 us faster than loading them after the wait."""
    return early and not uses_tensor_cores(mt)


_UNREAD: dict = {}


def _unread_f32(device):
    """A placeholder for the kernel's sq_parts argument when the RMS is already applied (never read): one per device,
    so that launches do not allocate."""
    if device not in _UNREAD:
        import torch

        _UNREAD[device] = torch.zeros(4, dtype=torch.float32, device=device)
    return _UNREAD[device]


def finalize(normed, w_up, a_sh, w_sh2, out, stream, tensor_cores: bool = True, early: bool = True,
             hold_weights: bool | None = None, sq_parts=None, eps: float = 0.0) -> None:
    """out = normed @ w_up^T + a_sh @ w_sh2^T (normed: the bf16 latent RMSNorm output GEMM2's last CTAs write).
    early: launched with programmatic dependent launch (Finalize); correct after any launch, since it waits before
    reading activations. hold_weights (None: holds_weights's choice) loads the weights before that wait.
    sq_parts (one token; fp32 [P], ExpertsGemm2OneToken's partial sums of y^2): normed is y * gamma, and the W_up
    term is scaled by rsqrt(sum(sq_parts) / L + eps)."""
    from .gemv import token_tile
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute
    from .trace import trace_address

    m, latent = normed.shape
    hidden, inter = w_sh2.shape
    expect("normed", normed, (m, latent), "bfloat16")
    expect("w_up", w_up, (hidden, latent), "bfloat16")
    expect("a_sh", a_sh, (m, inter), "bfloat16")
    expect("w_sh2", w_sh2, (hidden, inter), "bfloat16")
    expect("out", out, (m, hidden), "bfloat16")
    mt = token_tile(m, tensor_cores)
    hold = holds_weights(early, mt) if hold_weights is None else hold_weights
    rms_parts = 0
    if sq_parts is not None:
        rms_parts = sq_parts.shape[0]
        expect("sq_parts", sq_parts, (rms_parts,), "float32")
    else:
        sq_parts = _unread_f32(out.device)

    def build():
        md = dyn()
        args = (
            fake(BFloat16, (md, latent)), fake(BFloat16, (hidden, latent)), fake(BFloat16, (md, inter)),
            fake(BFloat16, (hidden, inter)), fake(Float32, (dyn(),)), fake(BFloat16, (md, hidden)), fake_stream(),
        )
        return Finalize(hidden, latent, inter, mt, early, hold, rms_parts, eps, trace), args

    trace = trace_address("finalize", Finalize(hidden, latent, inter, mt).ctas())
    fn = compile_cached(("finalize", hidden, latent, inter, mt, early, hold, rms_parts, eps, trace), build)
    fn(to_cute(normed, True), to_cute(w_up), to_cute(a_sh, True), to_cute(w_sh2), to_cute(sq_parts, True),
       to_cute(out, True), cu_stream(stream))
