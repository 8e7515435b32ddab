"""One-token GEMV that streams its weights through a shared-memory ring filled by bulk copies (TMA engine):

    y[n] = W0[n, :] . x0  (+ W1[n, :] . x1)          bf16 weights and activations, fp32 sums, one token

Why: the register-fed GEMVs (gemv.py) issue every load of a CTA at its start, wait, reduce and exit; at one token
they move ~3 TB/s against the 4.3 TB/s the copy reaches, and streaming from registers within long-lived CTAs was
worse (v6: bytes in flight capped by registers). Here each CTA is persistent (the grid fills the SMs) and owns a
contiguous range of rows; one thread keeps `stages` rows of weights in flight with cp.async.bulk into a ring of
shared-memory stages, so the bytes in flight cost no registers and never drop between rows.

A stage holds one output row: its W0 row followed by its W1 row (a second segment lets the finalize add the shared
experts' down-projection in the same pass). The 8 warps split the stage's 16-byte vectors (thread t takes vectors
t, t+256, ...), each holding its slice of x in registers for the whole kernel; a warp's partial of row i goes to
shared memory, and the CTA sums the 8 partials of all its rows at the end. Thread 0 doubles as the producer: after
its warp has used stage s it waits for the other warps to release s (an mbarrier), then refills it with row i+stages.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import BF16_PER_VEC, VEC_BYTES, WARP, bf16x2_to_f32, dot_bf16x8, lane_group_sum, ld_act_v4

WARPS_PER_CTA = 8
THREADS = WARPS_PER_CTA * WARP
RING_BYTES = 112 * 1024  # weight bytes in flight per CTA (Little's law: ~11 MB over the GPU covers loaded-DRAM latency)
DEFAULT_CTAS_PER_SM = 1
MAX_STAGES = 16


def ld_shared_v4(addr: Int32):
    return cute.arch.inline_ptx(
        "ld.shared.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
        write_only_types=[Int32] * 4,
        read_only_args=[addr],
    )


def bulk_copy_to_shared(dst: Int32, src: Int64, nbytes: Int32, full_barrier: Int32) -> None:
    """Copy nbytes (a multiple of 16) from global `src` to shared `dst` on the TMA engine; the copy's bytes count
    towards the transaction count of the mbarrier at shared address `full_barrier`."""
    cute.arch.inline_ptx(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{$r0}], [{$r1}], {$r2}, [{$r3}];",
        read_only_args=[dst, src, nbytes, full_barrier],
    )


def stages_for(row_bytes: int, ring_bytes: int = RING_BYTES) -> int:
    """Rows the ring holds: as many as fit in ring_bytes, 2 to MAX_STAGES (the prologue is unrolled per stage)."""
    return min(MAX_STAGES, max(2, ring_bytes // row_bytes))


def check_stream(n: int, k0: int, k1: int, ctas: int) -> None:
    for what, k in (("K0", k0), ("K1", k1)):
        if k % BF16_PER_VEC:
            raise ValueError(f"StreamGemv: {what}={k} is not a multiple of {BF16_PER_VEC} (16-byte bulk copies)")
    if k0 <= 0 or n <= 0 or ctas <= 0:
        raise ValueError(f"StreamGemv: N={n}, K0={k0} and the grid of {ctas} CTAs must be positive")


class StreamGemv:
    """y [1, N] = x0 [1, K0] @ W0 [N, K0]^T (+ x1 [1, K1] @ W1 [N, K1]^T when K1 > 0); y's dtype is the caller's
    (bf16 or fp16). `ctas` persistent CTAs (a multiple of the SM count), each with a ring of `stages` stages of
    `rows` output rows."""

    def __init__(self, n: int, k0: int, k1: int, ctas: int, rows: int = 1, stages: int | None = None):
        check_stream(n, k0, k1, ctas)
        self.n, self.k0, self.k1, self.ctas, self.rows = n, k0, k1, ctas, rows
        self.stage_bytes = rows * (k0 + k1) * 2
        self.stages = stages or stages_for(self.stage_bytes)
        most_rows = -(-n // ctas)  # of any CTA
        self.rows_max = -(-most_rows // rows) * rows  # rounded up to whole stages

    def smem_bytes(self) -> int:
        return self.stages * self.stage_bytes + 2 * self.stages * 8 + self.rows_max * WARPS_PER_CTA * 4 + 256

    @cute.jit
    def __call__(self, x0: cute.Tensor, w0: cute.Tensor, x1: cute.Tensor, w1: cute.Tensor, y: cute.Tensor,
                 stream: cuda.CUstream):
        self.kernel(x0, w0, x1, w1, y).launch(
            grid=[self.ctas, 1, 1], block=[THREADS, 1, 1], smem=self.smem_bytes(), stream=stream
        )

    @cute.kernel
    def kernel(self, x0: cute.Tensor, w0: cute.Tensor, x1: cute.Tensor, w1: cute.Tensor, y: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        ring = smem.allocate_tensor(cutlass.Uint8, cute.make_layout(self.stages * self.stage_bytes), byte_alignment=128)
        bars = smem.allocate_tensor(Int64, cute.make_layout(2 * self.stages), byte_alignment=8)  # full, then empty
        partial = smem.allocate_tensor(Float32, cute.make_layout((self.rows_max, WARPS_PER_CTA),
                                                                 stride=(WARPS_PER_CTA, 1)), byte_alignment=16)
        stream_rows(x0, w0, x1, w1, y, ring, bars, partial, cta, tidx, self.n, self.k0, self.k1, self.ctas,
                    self.rows, self.stages)


@cute.jit
def stream_rows(
    x0: cute.Tensor,
    w0: cute.Tensor,
    x1: cute.Tensor,
    w1: cute.Tensor,
    y: cute.Tensor,
    ring: cute.Tensor,
    bars: cute.Tensor,
    partial: cute.Tensor,
    cta: Int32,
    tidx: Int32,
    n: cutlass.Constexpr,
    k0: cutlass.Constexpr,
    k1: cutlass.Constexpr,
    ctas: cutlass.Constexpr,
    rows: cutlass.Constexpr,
    stages: cutlass.Constexpr,
):
    """CTA `cta` of `ctas`: rows [cta*n//ctas, (cta+1)*n//ctas) of y, `rows` per stage of `ring` (see module doc).
    A stage is [its rows of W0][its rows of W1], each block contiguous in global memory: one bulk copy per block."""
    warp, lane = tidx // WARP, tidx % WARP
    stage_bytes: cutlass.Constexpr = rows * (k0 + k1) * 2
    seg0_vecs: cutlass.Constexpr = k0 // BF16_PER_VEC
    vecs: cutlass.Constexpr = (k0 + k1) // BF16_PER_VEC
    per_thread: cutlass.Constexpr = (vecs + THREADS - 1) // THREADS
    row_begin = cta * n // ctas
    count = (cta + 1) * n // ctas - row_begin
    groups = (count + rows - 1) // rows
    ring_addr = ring.iterator.toint()
    full_addr = bars.iterator.toint()

    if tidx == 0:
        for s in cutlass.range_constexpr(stages):
            cute.arch.mbarrier_init(bars.iterator + s, 1)
            cute.arch.mbarrier_init(bars.iterator + (stages + s), WARPS_PER_CTA)
        cute.arch.mbarrier_init_fence()
    cute.arch.sync_threads()

    w0_addr = w0.iterator.toint()
    w1_addr = w1.iterator.toint()
    if tidx == 0:
        # Fill the ring before touching x: the weights do not depend on the previous launch.
        for s in cutlass.range_constexpr(stages):
            if s < groups:
                fill_stage(ring_addr, full_addr, bars, w0_addr, w1_addr, row_begin, count, s, s, k0, k1, rows)

    # This thread's x vectors as fp32 (zero past the row, so those products vanish without a branch), held for the
    # whole kernel, and where each of them sits in a stage: base + r * stride for the stage's row r.
    xs = []
    bases = []
    strides = []
    for j in cutlass.range_constexpr(per_thread):
        v = cutlass.min(tidx + j * THREADS, vecs - 1)
        keep = Float32(1.0)
        if tidx + j * THREADS >= vecs:
            keep = Float32(0.0)
        addr = x0.iterator.toint() + Int64(v) * VEC_BYTES
        base = v * VEC_BYTES
        stride = Int32(k0 * 2)
        if cutlass.const_expr(k1 > 0):
            if v >= seg0_vecs:
                addr = x1.iterator.toint() + Int64(v - seg0_vecs) * VEC_BYTES
                base = rows * k0 * 2 + (v - seg0_vecs) * VEC_BYTES
                stride = Int32(k1 * 2)
        words = ld_act_v4(addr)
        vals = []
        for q in cutlass.range_constexpr(4):
            lo, hi = bf16x2_to_f32(words[q])
            vals.append(lo * keep)
            vals.append(hi * keep)
        xs.append(vals)
        bases.append(base)
        strides.append(stride)

    for g in cutlass.range(groups, unroll=1):
        s = g % stages
        phase = (g // stages) % 2
        cute.arch.mbarrier_wait(bars.iterator + s, phase)
        stage_addr = ring_addr + s * stage_bytes
        # Rows past the CTA's last one hold stale bytes in a short final stage: summed, never stored.
        accs = [Float32(0.0)] * rows
        for j in cutlass.range_constexpr(per_thread):
            for r in cutlass.range_constexpr(rows):
                accs[r] = dot_bf16x8(ld_shared_v4(stage_addr + bases[j] + r * strides[j]), xs[j], accs[r])
        for r in cutlass.range_constexpr(rows):
            accs[r] = lane_group_sum(accs[r], WARP)
        if lane == 0:
            for r in cutlass.range_constexpr(rows):
                partial[g * rows + r, warp] = accs[r]
            cute.arch.mbarrier_arrive(bars.iterator + (stages + s))
        if tidx == 0:
            if g + stages < groups:
                cute.arch.mbarrier_wait(bars.iterator + (stages + s), phase)
                fill_stage(ring_addr, full_addr, bars, w0_addr, w1_addr, row_begin, count, g + stages, s, k0, k1,
                           rows)

    cute.arch.sync_threads()
    for r in cutlass.range(tidx, count, THREADS, unroll=1):
        total = Float32(0.0)
        for w in cutlass.range_constexpr(WARPS_PER_CTA):
            total = total + partial[r, w]
        y[0, row_begin + r] = total.to(y.element_type)


@cute.jit
def fill_stage(ring_addr: Int32, full_addr: Int32, bars: cute.Tensor, w0_addr: Int64, w1_addr: Int64,
               row_begin: Int32, count: Int32, g: Int32, s: Int32, k0: cutlass.Constexpr, k1: cutlass.Constexpr,
               rows: cutlass.Constexpr):
    """Thread 0: start the bulk copies of the CTA's row group g (up to `rows` rows of W0, then of W1) into stage s."""
    stage_bytes: cutlass.Constexpr = rows * (k0 + k1) * 2
    first = row_begin + g * rows
    here = cutlass.min(rows, count - g * rows)
    cute.arch.mbarrier_arrive_and_expect_tx(bars.iterator + s, here * ((k0 + k1) * 2))
    dst = ring_addr + s * stage_bytes
    bar = full_addr + s * 8
    bulk_copy_to_shared(dst, w0_addr + Int64(first) * (k0 * 2), here * (k0 * 2), bar)
    if cutlass.const_expr(k1 > 0):
        bulk_copy_to_shared(dst + rows * k0 * 2, w1_addr + Int64(first) * (k1 * 2), here * (k1 * 2), bar)


def sm_count() -> int:
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _compile_stream(n: int, k0: int, k1: int, ctas: int, rows: int, stages: int | None, y_dtype):
    from .runtime import compile_cached, fake, fake_stream

    def build():
        k1_shape = k1 or k0  # without a second segment, x0 and w0 are passed again and never read as such
        args = (fake(BFloat16, (1, k0)), fake(BFloat16, (n, k0)), fake(BFloat16, (1, k1_shape)),
                fake(BFloat16, (n, k1_shape)), fake(y_dtype, (1, n)), fake_stream())
        return StreamGemv(n, k0, k1, ctas, rows, stages), args

    return compile_cached(("stream_gemv", n, k0, k1, ctas, rows, stages, y_dtype), build)


def stream_gemv(x0, w0, out, stream, x1=None, w1=None, ctas_per_sm: int = DEFAULT_CTAS_PER_SM,
                rows: int = 1, stages: int | None = None) -> None:
    """out[1, N] = x0 @ w0^T (+ x1 @ w1^T): one token, bf16 weights and activations, out bf16 or fp16."""
    from cutlass import Float16

    from .runtime import cu_stream, expect, to_cute

    n, k0 = w0.shape
    expect("x0", x0, (1, k0), "bfloat16")
    expect("w0", w0, (n, k0), "bfloat16")
    if (x1 is None) != (w1 is None):
        raise ValueError("stream_gemv: pass both x1 and w1 (the second segment) or neither")
    if w1 is not None:
        k1 = w1.shape[1]
        expect("x1", x1, (1, k1), "bfloat16")
        expect("w1", w1, (n, k1), "bfloat16")
    else:
        k1, x1, w1 = 0, x0, w0
    dtype = str(out.dtype)
    if dtype not in ("torch.bfloat16", "torch.float16"):
        raise ValueError(f"out: expected dtype bfloat16 or float16, got {out.dtype}")
    expect("out", out, (1, n), dtype.removeprefix("torch."))
    y_dtype = BFloat16 if dtype == "torch.bfloat16" else Float16
    fn = _compile_stream(n, k0, k1, sm_count() * ctas_per_sm, rows, stages, y_dtype)
    fn(to_cute(x0), to_cute(w0), to_cute(x1), to_cute(w1), to_cute(out), cu_stream(stream))
