"""The end of the MLA attention in one launch (checked on the GPU by tests/kimi_k3_path/kernels/test_mla_output_gpu.py;
measured in docs/design/kimi_k3_kernels.md section 11.1). Where mla.py ran the split-KV combine (mla_attention.py's
second launch), a cuBLAS bmm for W_UV and two torch ops for the gate, per sequence m and head h:

  latent[m, h] = sum_s 2^(max_s - max) o_s / sum_s 2^(max_s - max) l_s      over the split launch's partials s
  gated[m, h*V + j] = bf16( sigmoid(gate[m, h*V + j]) * sum_d latent[m, h, d] * W_UV[h, d, j] )

gate is the qkv_a projection's last heads*V columns. The latent stays fp32 between the combine and W_UV (the torch
path rounded it to bf16, and v again before the gate): one rounding, at the end.

Grid (heads x COLUMN_CTAS, ceil(M / 4)), 8 warps: a CTA per (head, 16 of its 128 v columns) and up to SEQS_PER_CTA
sequences, launched early behind the split launch (programmatic dependent launch) and letting o_proj in at once:
  W_UV      before griddepcontrol.wait (the weight does not depend on the launches before): thread t loads its 4
            latent dims' 8 columns (4 x 16 bytes) of the CTA's 16 x 512 slice into registers.
  combine   after it, per sequence: each warp takes every 8th split, its lanes 16 of the 512 dims (four 16-byte loads
            per split); the warps' sums meet in shared memory, thread t normalizes dims 2t, 2t+1 (fp32).
  product   thread t: its 8 columns over its 4 dims for each of the CTA's sequences; the 128 dim groups' partial sums
            meet in shared memory, 4 threads per output column and sequence add them up.
  gate      the column's sum times sigmoid(gate), rounded to bf16.
Why 8 CTAs per head: one CTA per head (12 at one token, TP8) read its head's 128 KB of W_UV and the partials on one
SM each, 12.8 us of the step against 8.1 for the torch tail (H100, section 11.1). Here the combine is done by every
CTA of the head (the partials reread from L2: 8 x splits x 2 KB per head and sequence), and W_UV's 16 KB per CTA
streams while the split launch runs.
Bytes per (m, h): the partials (splits x 2 KB), the gate and the output (256 B each); W_UV's 128 KB per head once per
4 sequences (from L2 after the first CTA).
Run at one token only (dispatch.attention_forms): each CTA combines its sequences one after the other and the
head's 8 CTAs all repeat them, so from 2 tokens the combine launch with torch's W_UV and gate is faster (44 us of
share against 12 at 64 tokens, TP8; docs section 9.3).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import (
    LOWEST,
    WARP,
    bf16_words_to_f32,
    bits_to_f32,
    lane_butterfly,
    lane_group_sum,
    ld_fresh_v4,
    ld_weight_v4,
    sigmoid,
)
from .mla_attention import KV_LORA, MAX_HEADS

WARPS = 8
THREADS = WARPS * WARP
V_HEAD = 128  # Kimi K3's v_head_dim
COLUMN_CTAS = 8  # CTAs per head, each owning V_HEAD / COLUMN_CTAS columns
CTA_COLUMNS = V_HEAD // COLUMN_CTAS  # 16: two groups of 8 (one 16-byte load per latent dim)
COLUMN_GROUPS = CTA_COLUMNS // 8
DIM_GROUPS = THREADS // COLUMN_GROUPS  # 128 groups of latent dims
DIMS_PER_GROUP = KV_LORA // DIM_GROUPS  # 4: W_UV's loads per thread, all before griddepcontrol.wait
DIMS_PER_LANE = KV_LORA // WARP  # the combine: 16 fp32 per lane and split, four 16-byte loads
# Sequences per CTA: W_UV's slice is read once for them (at M = 64 / TP8, 1536 CTAs reading 25 MB from L2, where a CTA
# per sequence would read 98 MB), 4 x 8 accumulators per thread.
SEQS_PER_CTA = 4
ADDERS = THREADS // (SEQS_PER_CTA * CTA_COLUMNS)  # threads adding up one output's DIM_GROUPS partial sums: 4


SCRATCH = max(WARPS * KV_LORA, DIM_GROUPS * SEQS_PER_CTA * CTA_COLUMNS)  # fp32: the combine's sums, then the products


def smem_bytes() -> int:
    """The scratch (the combine's per-warp sums, later W_UV's per-group column sums), the warps' totals and the
    normalized latents."""
    return (SCRATCH + WARPS + SEQS_PER_CTA * KV_LORA) * 4 + 64


class MlaOutput:
    """The launch of the module docstring for `heads` heads (1..16) of v_head 128, the gate at column `gate_start`
    of the projection's rows."""

    def __init__(self, heads: int, gate_start: int):
        if not 1 <= heads <= MAX_HEADS:
            raise ValueError(f"MlaOutput: heads={heads} must be in 1..{MAX_HEADS}")
        if gate_start < 0 or gate_start % 8:
            raise ValueError(f"MlaOutput: gate_start={gate_start} must be a non-negative multiple of 8")
        self.heads, self.gate_start = heads, gate_start

    @cute.jit
    def __call__(self, part_o, part_ml, w_uv, projected, out, stream: cuda.CUstream):
        m = out.shape[0]
        splits = part_ml.shape[0] // (m * self.heads * 2)
        self.kernel(part_o, part_ml, w_uv, projected, out, m, splits).launch(
            grid=[self.heads * COLUMN_CTAS, (m + SEQS_PER_CTA - 1) // SEQS_PER_CTA, 1], block=[THREADS, 1, 1],
            smem=smem_bytes(),
            stream=stream, use_pdl=True,
        )

    @cute.kernel
    def kernel(self, part_o, part_ml, w_uv, projected, out, m_count: Int32, splits: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        cta, tile, _ = cute.arch.block_idx()
        head, chunk = cta // COLUMN_CTAS, cta % COLUMN_CTAS
        cute.arch.griddepcontrol_launch_dependents()  # o_proj's CTAs load their weights and wait for us
        smem = cutlass.memory.SmemAllocator()
        scratch = smem.allocate_tensor(Float32, cute.make_layout(SCRATCH), byte_alignment=16)
        sums = cute.make_tensor(scratch.iterator, cute.make_layout((WARPS, KV_LORA), stride=(KV_LORA, 1)))
        # The products' partial sums reuse the scratch once every latent is computed (a barrier in between).
        columns = cute.make_tensor(scratch.iterator, cute.make_layout(
            (DIM_GROUPS, SEQS_PER_CTA, CTA_COLUMNS), stride=(SEQS_PER_CTA * CTA_COLUMNS, CTA_COLUMNS, 1)))
        totals = smem.allocate_tensor(Float32, cute.make_layout(WARPS), byte_alignment=16)
        latent = smem.allocate_tensor(Float32, cute.make_layout((SEQS_PER_CTA, KV_LORA), stride=(KV_LORA, 1)),
                                      byte_alignment=16)
        # W_UV: thread t, columns 8*(t % 2) .. +7 of the CTA's 16 over latent dims 4*(t // 2) .. +3, loaded before the
        # wait (weak loads: ptxas keeps them on their side of it).
        group, dims = tidx % COLUMN_GROUPS, tidx // COLUMN_GROUPS
        first = dims * DIMS_PER_GROUP
        w_addr = (w_uv.iterator.toint() + Int64(head * KV_LORA + first) * (V_HEAD * 2)
                  + Int64(chunk * CTA_COLUMNS + 8 * group) * 2)
        held = [list(ld_weight_v4(w_addr + Int64(i) * (V_HEAD * 2), "ordered")) for i in range(DIMS_PER_GROUP)]
        cute.arch.griddepcontrol_wait()  # the split launch's partials are written
        first_seq = tile * SEQS_PER_CTA
        for s in cutlass.range_constexpr(SEQS_PER_CTA):
            if first_seq + s < m_count:  # uniform over the CTA: its barriers are reached by every thread or none
                self.combine(part_o, part_ml, sums, totals, latent, head, first_seq + s, s, splits, tidx)
            else:
                for e in cutlass.range_constexpr(KV_LORA // THREADS):
                    latent[s, tidx * (KV_LORA // THREADS) + e] = Float32(0.0)
        cute.arch.sync_threads()

        col = cute.make_rmem_tensor(cute.make_layout((SEQS_PER_CTA, 8), stride=(8, 1)), Float32)
        for s in cutlass.range_constexpr(SEQS_PER_CTA):
            for c in cutlass.range_constexpr(8):
                col[s, c] = Float32(0.0)
        for i in cutlass.range_constexpr(DIMS_PER_GROUP):
            values = bf16_words_to_f32(held[i])
            for s in cutlass.range_constexpr(SEQS_PER_CTA):
                x = latent[s, first + i]
                for c in cutlass.range_constexpr(8):
                    col[s, c] = col[s, c] + x * values[c]
        for s in cutlass.range_constexpr(SEQS_PER_CTA):
            for c in cutlass.range_constexpr(8):
                columns[dims, s, 8 * group + c] = col[s, c]
        cute.arch.sync_threads()

        # ADDERS consecutive threads per (sequence, column): each adds every ADDERS-th dim group, then a butterfly.
        output, part = tidx // ADDERS, tidx % ADDERS
        s, j = output // CTA_COLUMNS, output % CTA_COLUMNS
        v = Float32(0.0)
        for g in cutlass.range_constexpr(DIM_GROUPS // ADDERS):
            v = v + columns[g * ADDERS + part, s, j]
        v = lane_group_sum(v, ADDERS)
        if part == 0 and first_seq + s < m_count:
            column = head * V_HEAD + chunk * CTA_COLUMNS + j
            gate = projected[first_seq + s, self.gate_start + column].to(Float32)
            out[first_seq + s, column] = (v * sigmoid(gate)).to(BFloat16)

    @cute.jit
    def combine(self, part_o, part_ml, sums, totals, latent, head: Int32, m: Int32, s: cutlass.Constexpr,
                splits: Int32, tidx: Int32) -> None:
        """latent[s] = sequence m's combine for the head, as MlaSplitKv.combine_kernel over all 512 dims (every thread
        of the CTA; it synchronizes)."""
        warp, lane = tidx // WARP, tidx % WARP
        base = m * splits * self.heads + head
        best = Float32(LOWEST)
        for i in cutlass.range(lane, splits, WARP, unroll=1):
            best = cute.arch.fmax(best, part_ml[(base + i * self.heads) * 2])
        best = lane_butterfly(best, (1, 2, 4, 8, 16), cute.arch.fmax)
        acc = cute.make_rmem_tensor(cute.make_layout(DIMS_PER_LANE + 1), Float32)  # 16 dims, then the weights' sum
        for c in cutlass.range_constexpr(DIMS_PER_LANE + 1):
            acc[c] = Float32(0.0)
        o_addr = part_o.iterator.toint() + Int64(DIMS_PER_LANE * lane) * 4
        for i in cutlass.range(warp, splits, WARPS, unroll=4):
            idx = base + i * self.heads
            weight = cute.math.exp2(part_ml[idx * 2] - best, fastmath=True)
            row = o_addr + Int64(idx) * (KV_LORA * 4)
            for v in cutlass.range_constexpr(DIMS_PER_LANE // 4):
                words = ld_fresh_v4(row + v * 16)
                for c in cutlass.range_constexpr(4):
                    acc[4 * v + c] = acc[4 * v + c] + weight * bits_to_f32(words[c])
            acc[DIMS_PER_LANE] = acc[DIMS_PER_LANE] + weight * part_ml[idx * 2 + 1]
        cute.arch.sync_threads()  # the previous sequence's readers of sums and totals are done
        for c in cutlass.range_constexpr(DIMS_PER_LANE):
            sums[warp, DIMS_PER_LANE * lane + c] = acc[c]
        if lane == 0:
            totals[warp] = acc[DIMS_PER_LANE]
        cute.arch.sync_threads()
        total = Float32(0.0)
        for w in cutlass.range_constexpr(WARPS):
            total = total + totals[w]
        # total >= 1 for a non-empty sequence (the row at the maximum adds 2^0); an empty one gets 0 / 1.
        scale = Float32(1.0) / cute.arch.fmax(total, Float32(1.0))
        for e in cutlass.range_constexpr(KV_LORA // THREADS):
            d = tidx * (KV_LORA // THREADS) + e
            value = Float32(0.0)
            for w in cutlass.range_constexpr(WARPS):
                value = value + sums[w, d]
            latent[s, d] = value * scale


def mla_output(workspace, w_uv, projected, gate_start: int, out, stream) -> None:
    """MlaOutput on `stream`: out [M, heads*128] bf16 = sigmoid(projected[:, gate_start:]) * (combine(workspace's
    partials) @ W_UV per head); w_uv [heads, 512, 128] bf16, projected [M, N] bf16 (N >= gate_start + heads*128).
    Launched early behind the split launch (mla_attention.mla_split_kv), whose partials it waits for."""
    from .runtime import compile_cached, cu_stream, dyn, expect_all, fake, fake_stream, to_cute

    m, splits, heads, _ = workspace.part_o.shape
    if projected.dim() != 2 or projected.shape[1] < gate_start + heads * V_HEAD:
        raise ValueError(f"mla_output: projected {tuple(projected.shape)} has no {heads * V_HEAD} gate columns from "
                         f"{gate_start}")
    op = MlaOutput(heads, gate_start)  # validates heads and gate_start
    expect_all([
        ("workspace.part_o", workspace.part_o, (m, splits, heads, KV_LORA), "float32"),
        ("workspace.part_ml", workspace.part_ml, (m, splits, heads, 2), "float32"),
        ("w_uv", w_uv, (heads, KV_LORA, V_HEAD), "bfloat16"),
        ("projected", projected, (m, projected.shape[1]), "bfloat16"),
        ("out", out, (m, heads * V_HEAD), "bfloat16"),
    ])

    def build():
        md, n, flat_o, flat_ml = dyn(), projected.shape[1], dyn(), dyn()
        args = (fake(Float32, (flat_o,)), fake(Float32, (flat_ml,)), fake(BFloat16, (heads, KV_LORA, V_HEAD)),
                fake(BFloat16, (md, n)), fake(BFloat16, (md, heads * V_HEAD)), fake_stream())
        return op, args

    fn = compile_cached(("mla_output", heads, gate_start, projected.shape[1]), build)
    fn(to_cute(workspace.part_o.view(-1), True), to_cute(workspace.part_ml.view(-1), True), to_cute(w_uv),
       to_cute(projected, True), to_cute(out, True), cu_stream(stream))
