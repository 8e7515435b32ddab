"""`mla_norms_insert`: the MLA attention's step between qkv_a and q_b in one launch (`kernels/mla.py` ran it as torch's
two `F.rms_norm`, each a copy of its column slice and a fused kernel, a `cat` and an `index_copy_`: 4-6 launches):

  q_c      = rms_norm(projected[:, :q_lora]) * q_a_norm                      -> q_c [M, q_lora] (q_b's input)
  kv_c     = rms_norm(projected[:, q_lora:q_lora + kv_lora]) * kv_a_norm    -> pages row `slot`, columns :kv_lora
  k_pe     = projected[:, q_lora + kv_lora:][:rope] (unnormed)               -> pages row `slot`, columns kv_lora:

One CTA per token; thread t owns 16-byte vector t of the q, kv and pe columns laid end to end (1536 + 512 + 64 columns:
264 threads of 9 warps), so every load of a token is in flight at once. Each norm's sum of squares is masked to its
segment, summed per warp, and the warps' sums meet in shared memory (one barrier). fp32 arithmetic, bf16 results, as
torch's fused RMSNorm on bf16 input. The row is addressed by vLLM's slot mapping (page * page_size + offset, int64),
one per token: each row is written exactly once and nothing else in the pages is touched.

Programmatic dependent launch: behind qkv_a on dense.py (which lets the next launch in at its start) the CTAs start
early, load the two norm weights and wait (griddepcontrol.wait) before reading projected.

Bytes per token: the 2112 projected columns read, q_c and the 576-wide row written (~8.5 KB), the norm weights once:
latency-bound at any M <= 64; what it removes is the torch launches.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import (
    BF16_PER_VEC,
    VEC_BYTES,
    WARP,
    bf16_words_to_f32,
    f32_to_bf16_words,
    lane_group_sum,
    ld_act_v4,
    ld_fresh_v4,
    select_f32,
    st_global_v4_b32,
)
from .router import MAX_TOKENS

SEGMENTS = 2  # the two normed segments, q and kv (pe is copied)


class MlaNormsInsert:
    """One CTA per token (module docstring)."""

    def __init__(self, q_lora: int, kv_lora: int, rope: int, projected_cols: int, row: int, eps: float):
        for name, width in (("q_lora", q_lora), ("kv_lora", kv_lora), ("rope", rope)):
            if width <= 0 or width % BF16_PER_VEC:
                raise ValueError(f"MlaNormsInsert: {name}={width} must be a positive multiple of {BF16_PER_VEC}")
        if projected_cols < q_lora + kv_lora + rope:
            raise ValueError(f"MlaNormsInsert: projected has {projected_cols} columns, fewer than q_lora + kv_lora + "
                             f"rope = {q_lora + kv_lora + rope}")
        if projected_cols % BF16_PER_VEC:
            raise ValueError(f"MlaNormsInsert: projected's {projected_cols} columns are not 16-byte rows")
        if row != kv_lora + rope:
            raise ValueError(f"MlaNormsInsert: a cache row of {row} is not kv_lora + rope = {kv_lora + rope}")
        if eps <= 0.0:
            raise ValueError(f"MlaNormsInsert: eps={eps} must be positive")
        self.q_lora, self.kv_lora, self.rope, self.cols, self.row, self.eps = (
            q_lora, kv_lora, rope, projected_cols, row, eps)
        self.q_vecs, self.kv_vecs, self.pe_vecs = (w // BF16_PER_VEC for w in (q_lora, kv_lora, rope))
        self.warps = -(-(self.q_vecs + self.kv_vecs + self.pe_vecs) // WARP)

    @cute.jit
    def __call__(self, projected, q_a_norm, kv_a_norm, pages, slots, q_c, stream: cuda.CUstream):
        self.kernel(projected, q_a_norm, kv_a_norm, pages, slots, q_c).launch(
            grid=[projected.shape[0], 1, 1], block=[self.warps * WARP, 1, 1],
            smem=self.warps * SEGMENTS * 4 + 64, stream=stream, use_pdl=True,
        )

    @cute.kernel
    def kernel(self, projected, q_a_norm, kv_a_norm, pages, slots, q_c):
        tidx, _, _ = cute.arch.thread_idx()
        m, _, _ = cute.arch.block_idx()
        warp, lane = tidx // WARP, tidx % WARP
        smem = cutlass.memory.SmemAllocator()
        sums = smem.allocate_tensor(Float32, cute.make_layout(self.warps * SEGMENTS), byte_alignment=16)
        kv_first = self.q_vecs
        pe_first = self.q_vecs + self.kv_vecs
        in_q = (tidx - kv_first) >> 31  # all ones for the q vectors
        in_kv = ((kv_first - 1 - tidx) >> 31) & ((tidx - pe_first) >> 31)
        in_pe = ((pe_first - 1 - tidx) >> 31) & ((tidx - pe_first - self.pe_vecs) >> 31)
        # Threads past the last vector reread it and store nothing.
        vec = cutlass.min(tidx, pe_first + self.pe_vecs - 1)
        # This thread's norm weight vector: q_a_norm's, kv_a_norm's, or (pe, past the end) one it multiplies by nothing.
        gamma_addr = q_a_norm.iterator.toint() + Int64(cutlass.min(vec, kv_first - 1)) * VEC_BYTES
        if vec >= kv_first:
            gamma_addr = kv_a_norm.iterator.toint() + Int64(cutlass.min(vec - kv_first, self.kv_vecs - 1)) * VEC_BYTES
        gamma = list(ld_act_v4(gamma_addr))
        cute.arch.griddepcontrol_wait()  # projected is qkv_a's output

        token = Int64(m)
        words = list(ld_fresh_v4(projected.iterator.toint() + (token * self.cols + Int64(vec) * BF16_PER_VEC) * 2))
        values = bf16_words_to_f32(words)
        sq = Float32(0.0)
        for v in values:
            sq = sq + v * v
        q_part = lane_group_sum(select_f32(in_q, sq, Float32(0.0)), WARP)
        kv_part = lane_group_sum(select_f32(in_kv, sq, Float32(0.0)), WARP)
        if lane == 0:
            sums[warp * SEGMENTS] = q_part
            sums[warp * SEGMENTS + 1] = kv_part
        cute.arch.sync_threads()
        segment = in_kv & 1  # 0: q (and the unnormed pe), 1: kv
        total = Float32(0.0)
        for w in cutlass.range_constexpr(self.warps):
            total = total + sums[w * SEGMENTS + segment]
        inv_width = select_f32(in_kv, Float32(1.0 / self.kv_lora), Float32(1.0 / self.q_lora))
        rstd = cute.math.rsqrt(total * inv_width + Float32(self.eps))
        normed = f32_to_bf16_words([v * rstd * g for v, g in zip(values, bf16_words_to_f32(gamma))])

        st_global_v4_b32(in_q, q_c.iterator.toint() + (token * self.q_lora + Int64(vec) * BF16_PER_VEC) * 2, normed)
        row = pages.iterator.toint() + slots[m] * (self.row * 2)
        st_global_v4_b32(in_kv, row + Int64(vec - kv_first) * VEC_BYTES, normed)
        st_global_v4_b32(in_pe, row + Int64(vec - kv_first) * VEC_BYTES, words)


def fake_args(q_lora: int, kv_lora: int, projected_cols: int, row: int, page: int) -> tuple:
    """Fake tensors (dynamic batch and page pool) for compiling MlaNormsInsert without a GPU."""
    from .runtime import dyn, fake, fake_stream

    m = dyn()
    return (fake(BFloat16, (m, projected_cols)), fake(BFloat16, (q_lora,)), fake(BFloat16, (kv_lora,)),
            fake(BFloat16, (dyn(), page, row)), fake(Int64, (m,)), fake(BFloat16, (m, q_lora)), fake_stream())


def mla_norms_insert(projected, q_a_norm, kv_a_norm, eps: float, rope: int, pages, slots, q_c, stream) -> None:
    """q_c [M, q_lora] bf16 = rms_norm(projected[:, :q_lora]) * q_a_norm, and each token's cache row
    [rms_norm(kv part) * kv_a_norm | k_pe] written into pages [P, page, kv_lora + rope] bf16 at slots [M] int64, from
    projected [M, N] bf16 (qkv_a's output: q_lora, kv_lora and rope columns first); on `stream`, M = 1..64. The slots
    are not read on the host: mla.mla_decode checks them (check_inputs) before."""
    from .runtime import compile_cached, cu_stream, expect_all, to_cute

    if projected.dim() != 2 or pages.dim() != 3:
        raise ValueError(f"mla_norms_insert: projected {tuple(projected.shape)} and pages {tuple(pages.shape)}: "
                         "expected [M, N] and [P, page, row]")
    (m, cols), (q_lora,), (kv_lora,) = projected.shape, q_a_norm.shape, kv_a_norm.shape
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"mla_norms_insert: decode batch M={m} must be in 1..{MAX_TOKENS}")
    op = MlaNormsInsert(q_lora, kv_lora, rope, cols, pages.shape[2], eps)  # validates the widths
    expect_all([
        ("projected", projected, (m, cols), "bfloat16"),
        ("q_a_norm", q_a_norm, (q_lora,), "bfloat16"),
        ("kv_a_norm", kv_a_norm, (kv_lora,), "bfloat16"),
        ("pages", pages, tuple(pages.shape), "bfloat16"),
        ("slots", slots, (m,), "int64"),
        ("q_c", q_c, (m, q_lora), "bfloat16"),
    ])
    page = pages.shape[1]
    fn = compile_cached(("mla_norms", q_lora, kv_lora, rope, cols, pages.shape[2], page, eps),
                        lambda: (op, fake_args(q_lora, kv_lora, cols, pages.shape[2], page)))
    fn(to_cute(projected, True), to_cute(q_a_norm), to_cute(kv_a_norm), to_cute(pages, True), to_cute(slots, True),
       to_cute(q_c, True), cu_stream(stream))
