"""The MLA decode's split-KV attention over vLLM's paged latent cache, for one TP rank (checked on the GPU by
tests/kimi_k3_path/kernels/test_mla_attention_gpu.py; measured in docs/design/kimi_k3_kernels.md section 11).
Per sequence m and head h, as kimi_k3_path.reference.mla.mla_attend computes it:

  latent[m, h] = softmax_t(q[m, h] . row_t * scale) @ row_t[:512]     over the rows t < seq_len[m]

q [M, heads, 576] bf16 = [ql (512) | q_pe (64)] (ql = q_nope @ W_UK, computed before this launch); a row is the
576-wide bf16 [kv_c | k_pe] at position t, in page block_table[m, t // 64], row t % 64, of pages [P, 64, 576] (pages
in any order; seq_len counts the token decoded this step, whose row is already in the cache); latent [M, heads, 512]
bf16. MQA: every head of a sequence scores the same rows, so the kernel reads each row once for all heads.

Two launches on the caller's stream (no host synchronization, no allocation given a workspace: CUDA-graph
capturable):
  1 split    grid (splits, M), one CTA per (split, sequence): the split's pages, all heads; writes per head the
             running max, the sum of exp and the unnormalized latent (fp32) of its rows.
  2 combine  grid (4, heads, M), 8 warps: out = sum_s 2^(max_s - max) o_s / sum_s 2^(max_s - max) l_s over the
             splits s, a CTA per 128 latent dims of a (sequence, head), its warps taking every 8th split (the
             partials' loads side by side, not one L2 round trip per split).
The combine is a second launch rather than the last CTA of a sequence combining behind an atomic counter: no counter
state to keep zeroed between launches (a counter left non-zero by an aborted launch corrupts every later one), and
with programmatic dependent launch the combine's CTAs are resident before the split grid ends, so the second launch
costs its own ~1-2 us of work, not a launch gap. (A counter saves that launch; worth it if the M=1 rows show it.)

Splits (`choose_splits`): from (M, the longest context the batch admits, 132 SMs) on the host, fixed per batch shape:
splits = min(132 // M, pages / 2), at least 1. A CTA takes 171 KB of shared memory, so one per SM: 132 // M CTAs per
sequence fill the GPU in one wave (M=1: 132, M=8: 16, M=64: 2 per sequence), and at least 2 pages per split keep the
partials small against the rows. A split takes whole pages: split s of a sequence with n pages reads pages
[s * ceil(n / splits), ...); splits past the end write max -inf, sum 0 and a zero latent, which the combine weighs 0.

Bytes (`mla_attention_bytes`): the cache is ~all of them and does not depend on the TP (every rank reads the whole
latent cache): 1152 B per row, M * context rows. Floor = cache bytes / 4.3e12 B/s:
  context 4096:  M=1 4.72 MB 1.10 us, M=8 37.7 MB 8.78 us, M=64 302 MB 70.2 us
  context 32768: M=1 37.7 MB 8.78 us, M=8 302 MB 70.2 us, M=64 2416 MB 561.8 us
(q and out add 2.2 KB per (sequence, head); the partials, M * splits * heads * 2 KB written and read once, stay in
L2: 3.2 MB at M=1 / TP8 / 132 splits.)

Tensor cores, not CUDA cores: per row the heads take 576 + 512 multiply-adds each, 13056 at TP8 (12 heads) and 6528
at TP16. Rows arrive at 4.3e12 / 1152 = 3.7e9 per second at the floor, i.e. 48.7e12 FMA/s at TP8 and 24.4e12 at
TP16, against the H200's 33.5e12 fp32 FMA/s (132 SMs x 128 lanes x 1.98 GHz) before any bf16 unpacking or softmax:
the CUDA cores cannot reach the floor at TP8 and would need ~3/4 of their peak at TP16. On mma.sync m16n8k16 (bf16
in, fp32 accumulate) the padded 16 heads take 17408 multiply-adds per row, 65e12 per second at the floor: a fraction
of the tensor cores' rate.

Mapping (4 warps; rows of a page as the MMA's m, heads as its n: 12 heads are two n8 tiles, 6 heads one, so TP16
wastes 2 of 8 columns instead of 10 of 16):
- Pages arrive by bulk copies (the TMA engine, no registers in flight) into 2 stages of shared memory, one page per
  stage, row by row (16 rows per warp: a warp issues its lanes' copies one by one) at a stride of 1168 bytes
  (1152 + 16: the 8 row addresses of an ldmatrix fall on distinct banks); the rows past seq_len in a sequence's
  last page are not copied but zeroed (0 * NaN would otherwise reach the latent through P @ V even with P = 0). Two
  pages (147 KB) in flight per SM; ~35 KB cover DRAM's latency.
- Score: warp w takes rows 16w..16w+15 of the page and all heads over the 576 dims (36 k16 steps, two accumulator
  chains): A = the rows (ldmatrix), B = q staged once in shared memory (ldmatrix). Each lane's C fragment holds
  heads 2q, 2q+1 (+8) of rows g, g+8 (lane = 4g + q); the PV accumulators hold the same heads, so a lane's running
  max and sum serve both, and only the page's max per head and sum per head cross warps (shared memory).
- Online softmax per page in base 2 (scale * log2 e folded in): max over the page (4 warps' maxima), rescale of the
  accumulators by 2^(old - new), P = 2^(s - max) as bf16 into shared memory [head, row].
- PV: O^T [dims, heads] += V^T P^T; warp w owns dims 128w..128w+127 (8 m16 tiles): A = V^T (ldmatrix.trans of the
  same staged rows), B = P^T (32-bit shared loads). 3 CTA barriers per page (page max, P, stage release); a page is
  2.3 us of DRAM time per SM at the floor's rate.
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, Int64, Uint8

from .common import (
    LOWEST,
    NEG_INF,
    WARP,
    bits_to_f32,
    bulk_copy_to_shared,
    lane_butterfly,
    ld_fresh_v4,
    ld_shared_b32,
    ldmatrix_x2,
    ldmatrix_x4,
    select_f32,
    st_shared_v4,
)
from .mma import mma_16816
from .router import MAX_TOKENS
from .runtime import floor_us  # noqa: F401 (the module docstring's floors are stated with it)

PAGE = 64  # rows per page (vLLM's block size for this cache)
KV_LORA = 512
ROPE = 64
ROW = KV_LORA + ROPE
ROW_BYTES = ROW * 2
SMEM_ROW = ROW_BYTES + 16  # staged row stride: consecutive rows 4 banks apart, so ldmatrix's 8 rows never collide
VEC = 16  # bytes of one shared-memory row vector (ldmatrix row, st.shared.v4)
WARPS = 4
THREADS = WARPS * WARP
STAGES = 2  # pages in flight per CTA (2 x 73 KB of shared memory)
HEAD_TILE = 8  # heads per MMA n
MAX_HEADS = 16
ROWS_PER_WARP = PAGE // WARPS  # the score's m16 tile
DIMS_PER_WARP = KV_LORA // WARPS  # the PV's 8 m16 tiles
K_STEPS = ROW // 16
P_STRIDE = PAGE + 8  # bf16 per head of P in shared memory: the 8 heads of a B fragment load hit distinct banks
COMBINE_WARPS = 8  # splits summed side by side per combine CTA
COMBINE_DIMS = 128  # latent dims per combine CTA: 4 per lane, one 16-byte load per split
SMS = 132  # the H200's SMs
MIN_PAGES_PER_SPLIT = 2
LOG2E = 1.4426950408889634


def mla_attention_bytes(m: int, context: int, heads: int) -> dict[str, int]:
    """Bytes one decode step's attention moves from and to DRAM for m sequences of `context` tokens each: every
    cache row once, q and the latent output, the block table and seq_lens (partials: `mla_partial_bytes`)."""
    return {
        "cache": m * context * ROW_BYTES,
        "query": m * heads * ROW_BYTES,
        "output": m * heads * KV_LORA * 2,
        "metadata": m * (-(-context // PAGE)) * 4 + m * 4,
    }


def mla_partial_bytes(m: int, splits: int, heads: int) -> int:
    """The split launch's fp32 partials (latent, max, sum), written once and read once by the combine (L2-sized)."""
    return m * splits * heads * (KV_LORA + 2) * 4


def choose_splits(m: int, max_seq_len: int, sms: int = SMS) -> int:
    """Splits per sequence for a batch of m sequences of at most max_seq_len tokens (host-side, fixed per shape):
    one wave of one CTA per SM, at least MIN_PAGES_PER_SPLIT pages per split."""
    if not 1 <= m <= MAX_TOKENS or max_seq_len < 1:
        raise ValueError(f"choose_splits: M={m} must be in 1..{MAX_TOKENS} and max_seq_len={max_seq_len} positive")
    pages = -(-max_seq_len // PAGE)
    return max(1, min(sms // m, -(-pages // MIN_PAGES_PER_SPLIT)))


def _add(a: Float32, b: Float32) -> Float32:
    return a + b


class MlaSplitKv:
    """The split and combine launches of the module docstring, for `heads` heads (1..16) and softmax scale `scale`."""

    def __init__(self, heads: int, scale: float):
        if not 1 <= heads <= MAX_HEADS:
            raise ValueError(f"MlaSplitKv: heads={heads} must be in 1..{MAX_HEADS} (at most two n8 tiles of heads; "
                             "K3 has 12 per rank at TP8, 6 at TP16)")
        if not scale > 0.0:
            raise ValueError(f"MlaSplitKv: scale={scale} must be positive")
        self.heads, self.scale = heads, scale
        self.head_tiles = -(-heads // HEAD_TILE)
        self.q_rows = HEAD_TILE * self.head_tiles
        self.scale_log2 = scale * LOG2E

    def smem_bytes(self) -> int:
        return (STAGES * PAGE * SMEM_ROW + self.q_rows * SMEM_ROW + self.q_rows * P_STRIDE * 2
                + 2 * WARPS * self.q_rows * 4 + (STAGES + 1) * 8 + 4 * 128)

    def launch_split(self, q, pages, table, seq_lens, part_o, part_ml, stream) -> Int32:
        """The split launch (traced inside a jit entry point); returns the split count."""
        m = q.shape[0]
        width = table.shape[0] // m  # the flattened block table's pages per sequence
        splits = part_ml.shape[0] // (m * self.heads * 2)
        self.split_kernel(q, pages, table, seq_lens, part_o, part_ml, width, splits).launch(
            grid=[splits, m, 1], block=[THREADS, 1, 1], smem=self.smem_bytes(), stream=stream, use_pdl=True,
        )
        return splits

    @cute.jit
    def split_only(self, q, pages, table, seq_lens, part_o, part_ml, stream: cuda.CUstream):
        """The split launch alone: the partials for a launch of its own to combine (mla_output.py)."""
        self.launch_split(q, pages, table, seq_lens, part_o, part_ml, stream)

    @cute.jit
    def __call__(self, q, pages, table, seq_lens, part_o, part_ml, out, stream: cuda.CUstream):
        m = q.shape[0]
        splits = self.launch_split(q, pages, table, seq_lens, part_o, part_ml, stream)
        self.combine_kernel(part_o, part_ml, out, splits).launch(
            grid=[KV_LORA // COMBINE_DIMS, self.heads, m], block=[COMBINE_WARPS * WARP, 1, 1],
            smem=COMBINE_WARPS * (COMBINE_DIMS + 1) * 4 + 64, stream=stream, use_pdl=True,
        )

    @cute.jit
    def zero_rows(self, base: Int32, first, rows, tidx: Int32) -> None:
        """Zero staged rows first .. first + rows - 1 at shared address base (the CTA's threads together)."""
        per_row = ROW_BYTES // VEC
        for idx in cutlass.range(tidx, rows * per_row, THREADS, unroll=1):
            st_shared_v4(base + (first + idx // per_row) * SMEM_ROW + (idx % per_row) * VEC, [Int32(0)] * 4)

    @cute.jit
    def expect_page(self, bar, page: Int32, seq_len: Int32) -> None:
        """One thread, before any copy of the fill is issued (a barrier in between): the bytes of page `page`'s
        valid rows are what mbarrier `bar`'s next phase waits for."""
        cute.arch.mbarrier_arrive_and_expect_tx(bar, cutlass.min(PAGE, seq_len - page * PAGE) * ROW_BYTES)

    @cute.jit
    def copy_page(self, pages, table, stage: Int32, bar, m: Int32, width: Int32, page: Int32, seq_len: Int32,
                  warp: Int32, lane: Int32) -> None:
        """Every warp: the bulk copies of its 16 rows of the sequence's page `page` (the valid ones) into the stage
        at shared address `stage`, counted on mbarrier `bar`. Spread over the 4 warps because a warp issues its
        lanes' copies one after another."""
        valid = cutlass.min(PAGE, seq_len - page * PAGE)
        row = warp * ROWS_PER_WARP + lane
        if lane < ROWS_PER_WARP:
            if row < valid:
                src = pages.iterator.toint() + Int64(table[m * width + page]) * (PAGE * ROW_BYTES)
                bulk_copy_to_shared(stage + row * SMEM_ROW, src + Int64(row) * ROW_BYTES, ROW_BYTES, bar.toint())

    def scores(self, stage: Int32, q_s: Int32, warp: Int32, lane: Int32) -> list:
        """S^T of the warp's 16 rows x the padded heads over all 576 dims: per head tile the 4 C values (rows g,
        g+8 x heads 2q, 2q+1), two accumulator chains (even and odd k steps) summed at the end."""
        r, i = lane % 8, lane // 8
        a_row = stage + (warp * ROWS_PER_WARP + r + 8 * (i & 1)) * SMEM_ROW + 8 * (i >> 1) * 2
        b_row = q_s + r * SMEM_ROW + 8 * (i & 1) * 2
        acc = cute.make_rmem_tensor(cute.make_layout((2, self.head_tiles, 4), stride=(4 * self.head_tiles, 4, 1)),
                                    Float32)
        for chain in range(2):
            for j in range(self.head_tiles):
                for c in range(4):
                    acc[chain, j, c] = Float32(0.0)
        for k in range(K_STEPS):
            a = ldmatrix_x4(a_row + k * 32)
            for j in range(self.head_tiles):
                b = ldmatrix_x2(b_row + j * HEAD_TILE * SMEM_ROW + k * 32)
                d = mma_16816(a[0], a[1], a[2], a[3], b[0], b[1], acc[k % 2, j, 0], acc[k % 2, j, 1],
                              acc[k % 2, j, 2], acc[k % 2, j, 3])
                for c in range(4):
                    acc[k % 2, j, c] = d[c]
        return [[acc[0, j, c] + acc[1, j, c] for c in range(4)] for j in range(self.head_tiles)]

    def pv(self, acc, stage: Int32, p_s: Int32, warp: Int32, lane: Int32) -> None:
        """acc (O^T of the warp's 128 dims x the padded heads) += V^T P^T over the page's 64 rows."""
        g, q = lane // 4, lane % 4
        r, i = lane % 8, lane // 8
        v_row = stage + (r + 8 * (i >> 1)) * SMEM_ROW + (warp * DIMS_PER_WARP + 8 * (i & 1)) * 2
        for k in range(PAGE // 16):
            bs = []
            for j in range(self.head_tiles):
                addr = p_s + ((j * HEAD_TILE + g) * P_STRIDE + 16 * k + 2 * q) * 2
                bs.append((ld_shared_b32(addr), ld_shared_b32(addr + 16)))  # rows 2q, 2q+1 and 2q+8, 2q+9
            for mt in range(DIMS_PER_WARP // 16):
                a = ldmatrix_x4(v_row + 16 * k * SMEM_ROW + mt * 32, trans=True)
                for j in range(self.head_tiles):
                    d = mma_16816(a[0], a[1], a[2], a[3], bs[j][0], bs[j][1], acc[mt, j, 0], acc[mt, j, 1],
                                  acc[mt, j, 2], acc[mt, j, 3])
                    for c in range(4):
                        acc[mt, j, c] = d[c]

    @cute.kernel
    def split_kernel(self, q, pages, table, seq_lens, part_o, part_ml, width: Int32, splits: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        split, m, _ = cute.arch.block_idx()
        warp, lane = tidx // WARP, tidx % WARP
        g, qd = lane // 4, lane % 4
        cute.arch.griddepcontrol_launch_dependents()  # the combine's CTAs take their places and wait for us
        smem = cutlass.memory.SmemAllocator()
        stages = smem.allocate_tensor(Uint8, cute.make_layout(STAGES * PAGE * SMEM_ROW), byte_alignment=128)
        q_stage = smem.allocate_tensor(Uint8, cute.make_layout(self.q_rows * SMEM_ROW), byte_alignment=128)
        p_tile = smem.allocate_tensor(BFloat16, cute.make_layout((self.q_rows, P_STRIDE), stride=(P_STRIDE, 1)),
                                      byte_alignment=16)
        # [0, warp, head]: the warp's max over the page's rows; [1, warp, head]: its sum of 2^(s - max).
        red = smem.allocate_tensor(Float32, cute.make_layout((2, WARPS, self.q_rows),
                                                             stride=(WARPS * self.q_rows, self.q_rows, 1)),
                                   byte_alignment=16)
        bars = smem.allocate_tensor(Int64, cute.make_layout(STAGES + 1), byte_alignment=8)
        stage0, q_s, p_s = stages.iterator.toint(), q_stage.iterator.toint(), p_tile.iterator.toint()
        q_bar = bars.iterator + STAGES
        if tidx == 0:
            for s in cutlass.range_constexpr(STAGES + 1):
                cute.arch.mbarrier_init(bars.iterator + s, 1)
            cute.arch.mbarrier_init_fence()
        self.zero_rows(q_s, self.heads, self.q_rows - self.heads, tidx)  # padding heads score 0, never stored
        cute.arch.sync_threads()

        cute.arch.griddepcontrol_wait()  # q and this step's cache rows are written by the launches before
        seq_len = cutlass.min(seq_lens[m], width * PAGE)  # never past the block table's width
        n_pages = (seq_len + PAGE - 1) // PAGE
        per = (n_pages + splits - 1) // splits
        first = split * per
        count = cutlass.max(cutlass.min(n_pages - first, per), 0)
        if tidx == 0:
            cute.arch.mbarrier_arrive_and_expect_tx(q_bar, self.heads * ROW_BYTES)
            for s in cutlass.range_constexpr(STAGES):
                if s < count:
                    self.expect_page(bars.iterator + s, first + s, seq_len)
        cute.arch.sync_threads()
        if tidx < self.heads:
            q_row = q.iterator.toint() + Int64(m * self.heads + tidx) * ROW_BYTES
            bulk_copy_to_shared(q_s + tidx * SMEM_ROW, q_row, ROW_BYTES, q_bar.toint())
        for s in cutlass.range_constexpr(STAGES):
            if s < count:
                self.copy_page(pages, table, stage0 + s * PAGE * SMEM_ROW, bars.iterator + s, m, width, first + s,
                               seq_len, warp, lane)

        acc = cute.make_rmem_tensor(cute.make_layout((DIMS_PER_WARP // 16, self.head_tiles, 4),
                                                     stride=(4 * self.head_tiles, 4, 1)), Float32)
        for mt in cutlass.range_constexpr(DIMS_PER_WARP // 16):
            for j in cutlass.range_constexpr(self.head_tiles):
                for c in cutlass.range_constexpr(4):
                    acc[mt, j, c] = Float32(0.0)
        # This lane's heads 8j + 2qd + e: running max (base 2, scaled) and sum of 2^(s - max).
        run = cute.make_rmem_tensor(cute.make_layout((2, self.head_tiles, 2), stride=(2 * self.head_tiles, 2, 1)),
                                    Float32)
        for j in cutlass.range_constexpr(self.head_tiles):
            for e in cutlass.range_constexpr(2):
                run[0, j, e] = Float32(NEG_INF)
                run[1, j, e] = Float32(0.0)
        cute.arch.mbarrier_wait(q_bar, 0)

        for i in cutlass.range(count, unroll=1):
            s_idx = i % STAGES
            stage = stage0 + s_idx * (PAGE * SMEM_ROW)
            page = first + i
            valid = cutlass.min(PAGE, seq_len - page * PAGE)
            cute.arch.mbarrier_wait(bars.iterator + s_idx, (i // STAGES) % 2)
            if valid < PAGE:  # the sequence's last page: its rows past seq_len were not copied
                self.zero_rows(stage, valid, PAGE - valid, tidx)
                cute.arch.sync_threads()

            s = self.scores(stage, q_s, warp, lane)
            x = []
            for j in cutlass.range_constexpr(self.head_tiles):
                xs = []
                for c in cutlass.range_constexpr(4):
                    row = warp * ROWS_PER_WARP + g + 8 * (c // 2)
                    dead = (valid - 1 - row) >> 31  # -1 past seq_len, else 0
                    xs.append(select_f32(dead, Float32(NEG_INF), s[j][c] * Float32(self.scale_log2)))
                x.append(xs)
            for j in cutlass.range_constexpr(self.head_tiles):
                for e in cutlass.range_constexpr(2):
                    mx = lane_butterfly(cute.arch.fmax(x[j][e], x[j][e + 2]), (4, 8, 16), cute.arch.fmax)
                    if g == 0:
                        red[0, warp, j * HEAD_TILE + 2 * qd + e] = mx
            cute.arch.sync_threads()

            alpha = []
            for j in cutlass.range_constexpr(self.head_tiles):
                alphas = []
                for e in cutlass.range_constexpr(2):
                    head = j * HEAD_TILE + 2 * qd + e
                    new = run[0, j, e]
                    for w in cutlass.range_constexpr(WARPS):
                        new = cute.arch.fmax(new, red[0, w, head])
                    # 0 on the first page (the old max is -inf)
                    alphas.append(cute.math.exp2(run[0, j, e] - new, fastmath=True))
                    run[0, j, e] = new
                    p_lo = cute.math.exp2(x[j][e] - new, fastmath=True)  # row g (0 past seq_len)
                    p_hi = cute.math.exp2(x[j][e + 2] - new, fastmath=True)  # row g + 8
                    row = warp * ROWS_PER_WARP + g
                    p_tile[head, row] = p_lo.to(BFloat16)
                    p_tile[head, row + 8] = p_hi.to(BFloat16)
                    total = lane_butterfly(p_lo + p_hi, (4, 8, 16), _add)
                    if g == 0:
                        red[1, warp, head] = total
                alpha.append(alphas)
            cute.arch.sync_threads()

            for j in cutlass.range_constexpr(self.head_tiles):
                for e in cutlass.range_constexpr(2):
                    head = j * HEAD_TILE + 2 * qd + e
                    total = run[1, j, e] * alpha[j][e]
                    for w in cutlass.range_constexpr(WARPS):
                        total = total + red[1, w, head]
                    run[1, j, e] = total
                for mt in cutlass.range_constexpr(DIMS_PER_WARP // 16):
                    for c in cutlass.range_constexpr(4):
                        acc[mt, j, c] = acc[mt, j, c] * alpha[j][c % 2]
            self.pv(acc, stage, p_s, warp, lane)
            if i + STAGES < count:
                if tidx == 0:  # every thread has seen this phase of the stage's barrier complete (2 barriers ago)
                    self.expect_page(bars.iterator + s_idx, page + STAGES, seq_len)
            cute.arch.sync_threads()  # the stage, P and red are free again
            if i + STAGES < count:
                self.copy_page(pages, table, stage, bars.iterator + s_idx, m, width, page + STAGES, seq_len, warp,
                               lane)

        # Partials of (sequence, split, head): an empty split writes max -inf, sum 0 and zeros.
        part = (m * splits + split) * self.heads
        for j in cutlass.range_constexpr(self.head_tiles):
            for e in cutlass.range_constexpr(2):
                head = j * HEAD_TILE + 2 * qd + e
                if head < self.heads:
                    if tidx < 4:  # warp 0, g = 0: one lane per head
                        part_ml[(part + head) * 2] = run[0, j, e]
                        part_ml[(part + head) * 2 + 1] = run[1, j, e]
                    for mt in cutlass.range_constexpr(DIMS_PER_WARP // 16):
                        for half in cutlass.range_constexpr(2):
                            dim = warp * DIMS_PER_WARP + mt * 16 + g + 8 * half
                            part_o[(part + head) * KV_LORA + dim] = acc[mt, j, 2 * half + e]

    @cute.kernel
    def combine_kernel(self, part_o, part_ml, out, splits: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        chunk, head, m = cute.arch.block_idx()
        warp, lane = tidx // WARP, tidx % WARP
        smem = cutlass.memory.SmemAllocator()
        sums = smem.allocate_tensor(Float32, cute.make_layout((COMBINE_WARPS, COMBINE_DIMS), stride=(COMBINE_DIMS, 1)),
                                    byte_alignment=16)
        totals = smem.allocate_tensor(Float32, cute.make_layout(COMBINE_WARPS), byte_alignment=16)
        cute.arch.griddepcontrol_wait()  # the split grid's partials are written
        base = m * splits * self.heads + head
        # The maximum over the splits (each warp alone: lanes take every 32nd split). Finite: an empty sequence
        # (every maximum -inf) then weighs every split 2^-inf = 0.
        best = Float32(LOWEST)
        for s in cutlass.range(lane, splits, WARP, unroll=1):
            best = cute.arch.fmax(best, part_ml[(base + s * self.heads) * 2])
        best = lane_butterfly(best, (1, 2, 4, 8, 16), cute.arch.fmax)
        # Warp w sums splits w, w + 8, ...; lane l its 4 dims 4l .. 4l + 3 of the CTA's 128 (one 16-byte load).
        acc = cute.make_rmem_tensor(cute.make_layout(5), Float32)  # 4 dims, then the sum of the weighted sums
        for c in cutlass.range_constexpr(5):
            acc[c] = Float32(0.0)
        o_addr = part_o.iterator.toint() + Int64(chunk * COMBINE_DIMS + 4 * lane) * 4
        for s in cutlass.range(warp, splits, COMBINE_WARPS, unroll=4):
            idx = base + s * self.heads
            weight = cute.math.exp2(part_ml[idx * 2] - best, fastmath=True)
            words = ld_fresh_v4(o_addr + Int64(idx) * (KV_LORA * 4))
            for c in cutlass.range_constexpr(4):
                acc[c] = acc[c] + weight * bits_to_f32(words[c])
            acc[4] = acc[4] + weight * part_ml[idx * 2 + 1]
        for c in cutlass.range_constexpr(4):
            sums[warp, 4 * lane + c] = acc[c]
        if lane == 0:
            totals[warp] = acc[4]
        cute.arch.sync_threads()
        if tidx < COMBINE_DIMS:
            latent = Float32(0.0)
            total = Float32(0.0)
            for w in cutlass.range_constexpr(COMBINE_WARPS):
                latent = latent + sums[w, tidx]
                total = total + totals[w]
            # total >= 1 for a non-empty sequence (the row at the maximum adds 2^0); an empty one gets 0 / 1.
            out[m, head, chunk * COMBINE_DIMS + tidx] = (latent / cute.arch.fmax(total, Float32(1.0))).to(BFloat16)


@dataclass(frozen=True)
class MlaWorkspace:
    """The split launch's partials for a batch shape: part_o [M, splits, heads, 512] and part_ml [M, splits, heads,
    2] (max, sum), fp32. Allocate once per (M, splits) for CUDA graphs (`mla_workspace`)."""

    part_o: torch.Tensor
    part_ml: torch.Tensor

    @property
    def splits(self) -> int:
        return self.part_o.shape[1]


def mla_workspace(m: int, heads: int, splits: int, device) -> MlaWorkspace:
    return MlaWorkspace(torch.empty(m, splits, heads, KV_LORA, dtype=torch.float32, device=device),
                        torch.empty(m, splits, heads, 2, dtype=torch.float32, device=device))


def check_cache_inputs(seq_lens: list[int], block_table: list[list[int]], num_pages: int) -> None:
    """Raise ValueError unless every sequence has 1 .. width * 64 tokens and its used pages are in [0, num_pages)."""
    width = len(block_table[0])
    bad = [n for n in seq_lens if not 1 <= n <= width * PAGE]
    if bad:
        raise ValueError(f"mla_attention_decode: seq_lens {bad} outside 1..{width * PAGE} (a block table of {width} "
                         f"pages of {PAGE} rows)")
    for i, n in enumerate(seq_lens):
        used = block_table[i][: -(-n // PAGE)]
        wrong = [p for p in used if not 0 <= p < num_pages]
        if wrong:
            raise ValueError(f"mla_attention_decode: sequence {i} uses pages {wrong} outside [0, {num_pages})")


def fake_args(heads: int, combine: bool = True) -> tuple:
    """Fake tensors (dynamic batch, page pool, block table width and splits) for compiling MlaSplitKv without a GPU
    (combine False: for split_only, no output)."""
    from .runtime import dyn, fake, fake_stream

    m = dyn()
    out = (fake(BFloat16, (m, heads, KV_LORA)),) if combine else ()
    return (fake(BFloat16, (m, heads, ROW)), fake(BFloat16, (dyn(), PAGE, ROW)), fake(Int32, (dyn(),)),
            fake(Int32, (m,)), fake(Float32, (dyn(),)), fake(Float32, (dyn(),)), *out, fake_stream())


def mla_attention_decode(q, pages, block_table, seq_lens, out, stream, scale: float,
                         workspace: MlaWorkspace | None = None, check_inputs: bool = True,
                         max_seq_len: int | None = None) -> None:
    """The split-KV attention (module docstring) on `stream`: q [M, heads, 576] bf16, pages [P, 64, 576] bf16,
    block_table [M, W] int32, seq_lens [M] int32 (1..64*W), out [M, heads, 512] bf16. workspace: partials for
    choose_splits(M, max_seq_len or 64*W) splits unless given (then its splits are used; allocate it once for CUDA
    graphs). The split count only shapes the work: any count gives the same attention.
    check_inputs reads seq_lens and block_table on the host (a synchronization) to reject lengths outside the table
    and pages outside the pool; pass False under CUDA graph capture (the kernel clamps lengths to the table width and
    gives a length-0 sequence a zero row; a page outside the pool is then the caller's to exclude)."""
    from .runtime import cu_stream, to_cute

    workspace, fn = _prepared(q, pages, block_table, seq_lens, scale, workspace, check_inputs, max_seq_len, out)
    fn(*_split_args(q, pages, block_table, seq_lens, workspace), to_cute(out, True), cu_stream(stream))


def mla_split_kv(q, pages, block_table, seq_lens, stream, scale: float, workspace: MlaWorkspace | None = None,
                 check_inputs: bool = True, max_seq_len: int | None = None) -> MlaWorkspace:
    """The split launch alone, as mla_attention_decode takes its arguments: the partials go into the returned
    workspace (`workspace` when given) for a launch of the caller's to combine (mla_output.mla_output)."""
    from .runtime import cu_stream

    workspace, fn = _prepared(q, pages, block_table, seq_lens, scale, workspace, check_inputs, max_seq_len, None)
    fn(*_split_args(q, pages, block_table, seq_lens, workspace), cu_stream(stream))
    return workspace


def _split_args(q, pages, block_table, seq_lens, workspace: MlaWorkspace) -> tuple:
    """The split launch's arguments as both entry points pass them (the table and the partials flattened)."""
    from .runtime import to_cute

    return (to_cute(q, True), to_cute(pages, True), to_cute(block_table.view(-1), True), to_cute(seq_lens, True),
            to_cute(workspace.part_o.view(-1), True), to_cute(workspace.part_ml.view(-1), True))


def _prepared(q, pages, block_table, seq_lens, scale: float, workspace: MlaWorkspace | None, check_inputs: bool,
              max_seq_len: int | None, out):
    """The checks both entry points make, the workspace (allocated when None) and the compiled launches: the split
    and the combine into `out`, or with out None the split alone."""
    from .runtime import compile_cached, expect_all

    if q.dim() != 3 or pages.dim() != 3 or block_table.dim() != 2:
        raise ValueError(f"mla_attention_decode: q {tuple(q.shape)}, pages {tuple(pages.shape)}, block_table "
                         f"{tuple(block_table.shape)}: expected [M, heads, {ROW}], [P, {PAGE}, {ROW}], [M, W]")
    m, heads = q.shape[0], q.shape[1]
    op = MlaSplitKv(heads, scale)  # validates heads and scale
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"mla_attention_decode: decode batch M={m} must be in 1..{MAX_TOKENS}")
    if pages.shape[1] != PAGE:
        raise ValueError(f"mla_attention_decode: page size {pages.shape[1]}; the kernel is written for {PAGE} rows "
                         "per page")
    num_pages, width = pages.shape[0], block_table.shape[1]
    if width < 1:
        raise ValueError("mla_attention_decode: the block table has no pages")
    splits = workspace.splits if workspace is not None else choose_splits(m, max_seq_len or width * PAGE)
    specs = [
        ("q", q, (m, heads, ROW), "bfloat16"),
        ("pages", pages, (num_pages, PAGE, ROW), "bfloat16"),
        ("block_table", block_table, (m, width), "int32"),
        ("seq_lens", seq_lens, (m,), "int32"),
    ]
    if out is not None:
        specs.append(("out", out, (m, heads, KV_LORA), "bfloat16"))
    if workspace is not None:
        specs += [("workspace.part_o", workspace.part_o, (m, splits, heads, KV_LORA), "float32"),
                  ("workspace.part_ml", workspace.part_ml, (m, splits, heads, 2), "float32")]
    expect_all(specs)
    if check_inputs:
        check_cache_inputs(seq_lens.tolist(), block_table.tolist(), num_pages)
    if workspace is None:
        workspace = mla_workspace(m, heads, splits, q.device)

    combine = out is not None

    def build():
        return (op if combine else op.split_only), fake_args(heads, combine)

    return workspace, compile_cached(("mla_attention", heads, scale, combine), build)
