"""The latent MoE's finalize for one token (dispatch.py), in one launch: the up-projection of the latent rows and the
shared experts' down-projection, summed into the block output,

    out[1, H] = rsqrt(sum(sq_parts) / L + eps) * (normed @ W_up^T) + a_sh @ W_sh2^T

where GEMM2's one-token form (gemm2_one_token.py) wrote normed = y * gamma without the RMS and per-CTA partial sums
of y^2 (`sq_parts`), so that no CTA of GEMM2 had to wait for all the others: the RMS is one scalar per token, applied
here to the W_up dot. Split-K over the CTA's warps as in gemv.py (FINALIZE_SPLIT warps per row)."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64, Uint8

from .common import VEC_BYTES, WARP, cp_async_16, dot_bf16x8_packed, lane_group_sum, ld_fresh_v4, ld_shared_v4, traced
from .gemv import (
    BF16_PER_VEC,
    SCRATCH_BYTES,
    WARPS_PER_CTA,
    alloc_scratch,
    check_k,
    in_slice,
    slice_vec,
    split_k_reduce,
    zero_acc,
)

FINALIZE_SPLIT = 4  # warps sharing one output row's K
# Persistent CTAs per SM and row pairs in flight per CTA: 3 x 3, 2 x 4 and 2 x 2 measured within 0.5 us of each
# other in the M=1 block.
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


class FinalizeStreamed:
    """The one-token finalize as persistent CTAs (ctas of them, a few per SM) that stream their row pairs through
    shared memory: CTA c takes row pairs c, c + ctas, ... (4 warps per row split K), each thread copying
    its weight vectors of a pair by 16-byte cp.async into `stages` slots, so `stages - 1` pairs are in flight while it
    computes one, and no register holds a byte in flight. The first pairs are issued before griddepcontrol.wait (the
    weights do not depend on GEMM2); the lane's slices of normed and a_sh and the RMS scale are read once per CTA,
    after the wait, not once per pair. Why: a CTA that holds its weights in registers instead holds its place
    on the SM for ~2.1 us, and after its weights land its chain (activations, sums of squares, FMAs, reductions)
    leaves that place without bytes in flight: that form moved ~3.6 TB/s where a read of its bytes moves 4.0. The copies take
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
