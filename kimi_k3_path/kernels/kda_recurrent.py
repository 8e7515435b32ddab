"""The KDA decode step's per-head middle for one TP rank, in one launch (checked on the GPU by
tests/kimi_k3_path/kernels/test_kda_recurrent_gpu.py; timed in the layer: docs/design/kimi_k3_kernels.md section 10).
Per (sequence, head), as kimi_k3_path.reference.kda.kda_recurrent_step computes it:

  1 conv    the width-4 causal depthwise conv of this head's q, k and v channels over the bf16 conv state
            [slot, 3*proj, 3] (oldest first) and the new input (in_proj's q|k|v), then SiLU; the shifted window
            is written back into the slot;
  2 norm    q = l2norm(q) * D^-0.5, k = l2norm(k);
  3 gate    exp(g), g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias)), per channel, with f_b folded in:
            g_raw = f_a @ W_fb[head's rows]^T, fp32 accumulate (f_a: in_proj's D-wide slice);
  4 state   the gated delta rule on the fp32 state S [slot, h, D_v, D_k] in place: S <- S diag(exp g);
            v' = beta (v - S k); S <- S + v' k^T; o = S q (= S_decayed q + v' (k.q)); beta = sigmoid(beta_raw);
  5 out     gated RMSNorm over the head's D_v: o * rsqrt(mean o^2 + eps) * o_norm * sigmoid(g_out), bf16 [M, proj].

The in_proj and o_proj GEMVs are not in this launch: it reads in_proj's output row as the reference splits it
(q|k|v|g_out|f_a|beta_raw) and writes o_proj's input. f_b (1536 x 128 at TP8, 393 KB) is folded in: each CTA
copies its head's 128 rows (32 KB) into shared memory by cp.async before griddepcontrol.wait (the weights do not
depend on the launch before), and warps 4-7, idle while warps 0-2 run the conv, take one channel's 128-long dot
each. That removes a cuBLAS launch (3.0 us at TP8, M=1, in bench_dense) from the layer's chain, and lets in_proj's
launch hand over to this one by programmatic dependent launch. Each thread reads only the row it copied (no
barrier), its 16-byte vectors in an order rotated by its channel so that the 8 threads of a shared-memory phase hit
distinct banks.

State addressing: as vLLM's mamba cache, an int32 slot per sequence into a pool of states, any order; a slot outside
[0, pool) (vLLM pads with -1) touches no state and gets a zero output row. The host wrapper rejects out-of-range and
duplicate slots unless told not to read them (check_slots=False: no host synchronization, for CUDA graphs).

Bytes (`kda_recurrent_bytes`): the fp32 state, 64 KB per (sequence, head) read once and written once, is 76% of
them at M=1 (f_b's 393 KB at TP8 is most of the rest) and 95% at M=64 (the rest: the bf16 conv state read and
written, inputs, taps). Floors at 4.3 TB/s: TP8 (12 heads) M=1 2.08 MB 0.48 us, M=64 105.6 MB 24.6 us; TP16 (6 heads)
M=1 1.04 MB 0.24 us, M=64 52.8 MB 12.3 us.

Mapping: one CTA per (sequence, head), grid (heads, M), of 8 or 16 warps (WARP_FORMS; dispatch.attention_forms
picks by batch size). Warp w owns R = 128 / warps consecutive state rows (16 or 8), a row being 512 contiguous bytes =
one 16-byte load per lane (lane l holds columns 4l..4l+3), so the whole 64 KB is in flight at once in 4R registers
per thread and never leaves them between its load and its store. Why so:
- Each row's S k and S q are dots over D_k, i.e. over the warp's lanes, and the update is row-wise: no exchange
  between warps except the RMSNorm's sum over D_v (one CTA barrier through a float per warp).
- The 2R row sums a warp needs (S k and S q of its rows) are one reduce-scatter (common.lane_reduce_scatter: 31
  shuffles at R = 16, 16 at R = 8) instead of 2R butterflies; v' is then broadcast back row by row.
- Everything in_proj does not write is loaded before griddepcontrol.wait (the launch may start early behind
  in_proj), as weak loads so that ptxas keeps them ahead of the wait and the barrier: the state rows, the conv taps
  and history (warps 0-2), the f_b rows (cp.async) and gate vectors (the upper half of the warps), o_norm. After the
  wait, conv and norms (warps 0-2, 4 channels per lane) and the decay (the upper half: 1 thread a channel at 8 warps,
  2 at 16) run while the state is in flight.
- M=1 has only 12 (TP8) or 6 (TP16) CTAs: latency-bound. ncu (H100, TP8, one token, 8 warps): 8.3 us, each CTA
  resident ~5.8 us, issuing an instruction every ~11 cycles per warp with 2 warps per scheduler (~970 instructions
  per warp): the per-warp chain, not the bytes, is the launch's time. 16 warps halve each warp's rows, its
  reduce-scatter and its stores, and double the gate threads; 80 registers, 1 CTA per SM.
- At many sequences, 8 warps keep 2 CTAs and ~128 KB per SM outstanding (<= 128 registers; 768 CTAs at TP8 M=64,
  384 at TP16), well above what DRAM's rate times its latency needs (~35 KB per SM).
"""

from __future__ import annotations

from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float32, Int32, Int64

from .common import (
    VEC_BYTES,
    WARP,
    bf16x2_to_f32,
    bits_to_f32,
    cp_async_16,
    dot_bf16x8_packed,
    lane_group_sum,
    lane_reduce_scatter,
    ld_fresh_v4,
    ld_shared_v4,
    ld_weight_v4,
    select_f32,
    sigmoid,
    st_global_v4_f32,
    tree_sum,
)
from .dispatch import attention_forms
from .router import MAX_TOKENS
from .runtime import floor_us  # noqa: F401 (this module's byte floors are stated with it)

HEAD_DIM = 128  # a row of the state is one 16-byte load per lane: 4 fp32 columns x 32 lanes
CONV_WIDTH = 4
# Warps per CTA: 8 (16 rows each; S k and S q of a warp's rows are exactly 32 sums, one per lane after the
# reduce-scatter; <= 128 registers, 2 CTAs per SM) or 16 (8 rows each: half the chain per warp, which is what a CTA's
# time is at a few sequences; 1 CTA per SM). kernels/dispatch.py picks one per batch size.
WARP_FORMS = (8, 16)
COLS_PER_LANE = HEAD_DIM // WARP
L2_NORM_EPS = 1e-6  # kimi_k3_path.reference.norm.L2_NORM_EPS (under the square root)

# Shared memory: q, k, v, exp(g) of the head (fp32, HEAD_DIM each), one partial sum of o^2 per warp, then the head's
# f_b rows (bf16 [HEAD_DIM, HEAD_DIM], channel c's row copied and read by its threads of the upper half of the warps).
Q, K, V, DECAY = 0, 1, 2, 3
VECS_PER_ROW = HEAD_DIM * 2 // VEC_BYTES  # 16-byte vectors in an f_b row (and in f_a)


def kda_recurrent_bytes(m: int, heads: int, head_dim: int = HEAD_DIM, conv_width: int = CONV_WIDTH) -> dict[str, int]:
    """Bytes one launch moves from and to DRAM for a batch of m sequences (each sequence's state once; the weights
    once, however many CTAs reread them from L2)."""
    proj = heads * head_dim
    return {
        "recurrent_state": 2 * m * heads * head_dim * head_dim * 4,  # fp32, read + written
        "conv_state": 2 * m * 3 * proj * (conv_width - 1) * 2,  # bf16, read + written
        "inputs": m * (3 * proj + proj + head_dim + heads) * 2 + m * 4,  # in_proj's q|k|v, g_out, f_a, beta; slot
        # f_b bf16 (every CTA of a head rereads its rows from L2: DRAM sees them once); taps bf16; a_log, dt_bias, o_norm
        "weights": proj * head_dim * 2 + 3 * proj * conv_width * 2 + heads * 4 + proj * 4 + head_dim * 4,
        "output": m * proj * 2,
    }


class KdaRecurrent:
    """One CTA (`warps` warps: WARP_FORMS) per (sequence, head); see the module docstring."""

    def __init__(self, heads: int, head_dim: int, conv_width: int, gate_lower_bound: float, norm_eps: float,
                 warps: int = 8):
        if head_dim != HEAD_DIM:
            raise ValueError(f"KdaRecurrent: head_dim={head_dim}; the kernel is written for {HEAD_DIM} (a state row "
                             "is one 16-byte load per lane)")
        if conv_width != CONV_WIDTH:
            raise ValueError(f"KdaRecurrent: conv_width={conv_width}; the kernel is written for {CONV_WIDTH}")
        if heads < 1:
            raise ValueError(f"KdaRecurrent: heads={heads} must be at least 1")
        if not -5.0 <= gate_lower_bound < 0.0 or norm_eps <= 0.0:
            raise ValueError(f"KdaRecurrent: gate_lower_bound={gate_lower_bound} must be in [-5, 0) and "
                             f"norm_eps={norm_eps} positive")
        if warps not in WARP_FORMS:
            raise ValueError(f"KdaRecurrent: warps={warps}; the forms are {WARP_FORMS}")
        self.heads, self.d, self.lb, self.eps = heads, head_dim, gate_lower_bound, norm_eps
        self.proj = heads * head_dim
        self.warps = warps
        self.rows = head_dim // warps  # state rows per warp
        # The upper half of the warps computes the decay: `per_channel` threads a channel, each `gate_vecs` of its
        # f_b row's 16-byte vectors.
        self.gate_warp = warps // 2
        self.per_channel = warps * WARP // 2 // head_dim
        self.gate_vecs = VECS_PER_ROW // self.per_channel

    def smem_bytes(self) -> int:
        return 4 * self.d * 4 + 128 + self.warps * 4 + 128 + self.d * self.d * 2 + 16

    @cute.jit
    def __call__(self, projected, f_b, conv_taps, a_log, dt_bias, o_norm, slots, conv_state, state, out,
                 stream: cuda.CUstream):
        self.kernel(projected, f_b, conv_taps, a_log, dt_bias, o_norm, slots, conv_state, state, out,
                    state.shape[0]).launch(
            grid=[self.heads, projected.shape[0], 1], block=[self.warps * WARP, 1, 1], smem=self.smem_bytes(),
            stream=stream, use_pdl=True,
        )

    def row_address(self, state, slot: Int32, head: Int32, row, lane: Int32) -> Int64:
        """Byte address of this lane's 4 columns of state row `row` of (slot, head)."""
        return (state.iterator.toint() + (Int64(slot) * self.heads + Int64(head)) * (self.d * self.d * 4)
                + Int64(row * self.d + COLS_PER_LANE * lane) * 4)

    def load_rows(self, state, slot: Int32, head: Int32, warp: Int32, lane: Int32) -> list:
        """The lane's 16-byte vector of each of the warp's rows, as 4 raw words each (weak loads: they stay ahead of
        griddepcontrol.wait and bar.sync, so all 64 KB of the CTA is in flight before the conv starts)."""
        return [list(ld_weight_v4(self.row_address(state, slot, head, warp * self.rows + j, lane), "ordered"))
                for j in range(self.rows)]

    def load_conv(self, conv_taps, conv_state, slot: Int32, head: Int32, part: Int32, lane: Int32):
        """Warp `part`'s (0 q, 1 k, 2 v) conv inputs that in_proj does not write, loaded before griddepcontrol.wait
        (weak loads: ptxas keeps them on their side of it): this lane's 4 channels' taps (32 contiguous bytes, bf16
        [channel, W]; every CTA of the head rereads them) and their last W - 1 inputs from the conv state."""
        first = part * self.proj + head * self.d + COLS_PER_LANE * lane
        taps_addr = conv_taps.iterator.toint() + Int64(first) * (CONV_WIDTH * 2)
        taps = list(ld_weight_v4(taps_addr, "ordered")) + list(ld_weight_v4(taps_addr + VEC_BYTES, "ordered"))
        history = [[conv_state[slot, first + c, t] for t in range(CONV_WIDTH - 1)] for c in range(COLS_PER_LANE)]
        return taps, history

    def conv_channels(self, projected, conv_state, vecs, m: Int32, slot: Int32, head: Int32, part: Int32,
                      lane: Int32, taps: list, history: list) -> None:
        """Warp `part`: this lane's 4 channels of the head through the conv and SiLU (load_conv's taps and history
        and in_proj's new input), the window shifted back into the conv state; q and k L2-normalized over the warp
        (q also times D^-0.5) into vecs."""
        first = part * self.proj + head * self.d + COLS_PER_LANE * lane
        channels = [first + c for c in range(COLS_PER_LANE)]
        # Every load before the first store: a store to the conv state may alias a later channel's load for all
        # the compiler knows, which would otherwise put one round trip per channel on the chain.
        windows = [history[c] + [projected[m, ch]] for c, ch in enumerate(channels)]
        outs = []
        for c, window in enumerate(windows):
            t0, t1 = bf16x2_to_f32(taps[2 * c])
            t2, t3 = bf16x2_to_f32(taps[2 * c + 1])
            acc = (t0 * window[0].to(Float32) + t1 * window[1].to(Float32) + t2 * window[2].to(Float32)
                   + t3 * window[3].to(Float32))
            outs.append(acc * sigmoid(acc))
        for ch, window in zip(channels, windows):
            for t in range(CONV_WIDTH - 1):
                conv_state[slot, ch, t] = window[t + 1]
        squares = Float32(0.0)
        for c in range(COLS_PER_LANE):
            squares = squares + outs[c] * outs[c]
        norm = cute.math.rsqrt(lane_group_sum(squares, WARP) + Float32(L2_NORM_EPS))
        scale = select_f32(part - V, norm, Float32(1.0))  # v is not normalized
        scale = select_f32(part - Q, scale, scale * Float32(self.d ** -0.5))
        for c in range(COLS_PER_LANE):
            vecs[part * self.d + COLS_PER_LANE * lane + c] = outs[c] * scale

    def copy_gate_row(self, f_b, row_smem: Int32, head: Int32, channel: Int32, half: Int32) -> None:
        """cp.async this thread's gate_vecs vectors (from vector half * gate_vecs) of f_b's row of the head's
        `channel` to the same place of its shared row: one commit group."""
        first = half * self.gate_vecs
        src = f_b.iterator.toint() + Int64(head * self.d + channel) * (self.d * 2) + Int64(first) * VEC_BYTES
        for v in range(self.gate_vecs):
            cp_async_16(row_smem + (first + v) * VEC_BYTES, src + v * VEC_BYTES)
        cute.arch.cp_async_commit_group()

    def decay_channel(self, projected, row_smem: Int32, bias: Float32, a_log: Float32, m: Int32, channel: Int32,
                      half: Int32) -> Float32:
        """exp(g) of one channel: g_raw = f_a . (its f_b row, copied by its per_channel threads, each
        taking the vectors it copied), then g = lower_bound * sigmoid(exp(A_log) * (g_raw + dt_bias))."""
        f_a = projected.iterator.toint() + (Int64(m) * projected.shape[1] + 4 * self.proj) * 2
        cute.arch.cp_async_wait_group(0)
        # Rotated by the thread's place among the gate threads: a shared-memory phase's 8 threads on distinct banks.
        rotation = channel * self.per_channel + half
        g_raw = Float32(0.0)
        for v in range(self.gate_vecs):
            at = (half * self.gate_vecs + ((rotation + v) & (self.gate_vecs - 1))) * VEC_BYTES
            g_raw = dot_bf16x8_packed(ld_shared_v4(row_smem + at), ld_fresh_v4(f_a + at), g_raw)
        g_raw = lane_group_sum(g_raw, self.per_channel)  # a channel's threads are adjacent lanes
        return cute.math.exp(Float32(self.lb) * sigmoid(cute.math.exp(a_log) * (g_raw + bias)))

    def beta_and_gate(self, projected, m: Int32, head: Int32, row: Int32) -> tuple:
        """in_proj's raw beta of the head and output gate of state row `row` (bf16; used after the barrier)."""
        return projected[m, 4 * self.proj + self.d + head], projected[m, 3 * self.proj + head * self.d + row]

    def update_rows(self, rows: list, vecs, state, slot: Int32, head: Int32, warp: Int32, lane: Int32,
                    beta: Float32) -> Float32:
        """The delta rule on the warp's `self.rows` rows (in registers), each stored back once. Returns o of row
        rows * warp + lane % rows (every lane)."""
        col = COLS_PER_LANE * lane
        q = [vecs[Q * self.d + col + c] for c in range(COLS_PER_LANE)]
        k = [vecs[K * self.d + col + c] for c in range(COLS_PER_LANE)]
        decay = [vecs[DECAY * self.d + col + c] for c in range(COLS_PER_LANE)]
        kq = Float32(0.0)
        for c in range(COLS_PER_LANE):
            kq = kq + k[c] * q[c]
        kq = lane_group_sum(kq, WARP)
        decayed, sk_parts, sq_parts = [], [], []
        for words in rows:
            s = [bits_to_f32(words[c]) * decay[c] for c in range(COLS_PER_LANE)]
            sk, sq = Float32(0.0), Float32(0.0)
            for c in range(COLS_PER_LANE):
                sk = sk + s[c] * k[c]
                sq = sq + s[c] * q[c]
            decayed.append(s)
            sk_parts.append(sk)
            sq_parts.append(sq)
        # Lane l gets row l % rows's S k where l % (2 rows) < rows, its S q otherwise; each takes the other by one
        # shuffle.
        mine = lane_reduce_scatter(sk_parts + sq_parts, lane)
        theirs = cute.arch.shuffle_sync_bfly(mine, self.rows)
        upper = lane & self.rows
        sk = select_f32(upper, theirs, mine)
        sq = select_f32(upper, mine, theirs)
        row = warp * self.rows + (lane & (self.rows - 1))
        v_new = beta * (vecs[V * self.d + row] - sk)
        o = sq + v_new * kq
        for j, s in enumerate(decayed):
            vj = cute.arch.shuffle_sync(v_new, j)
            st_global_v4_f32(self.row_address(state, slot, head, warp * self.rows + j, lane),
                             [s[c] + vj * k[c] for c in range(COLS_PER_LANE)])
        return o

    @cute.kernel
    def kernel(self, projected, f_b, conv_taps, a_log, dt_bias, o_norm, slots, conv_state, state, out,
               pool: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        head, m, _ = cute.arch.block_idx()
        warp, lane = tidx // WARP, tidx % WARP
        smem = cutlass.memory.SmemAllocator()
        vecs = smem.allocate_tensor(Float32, cute.make_layout(4 * self.d), byte_alignment=128)
        partial = smem.allocate_tensor(Float32, cute.make_layout(self.warps), byte_alignment=16)
        gate_rows = smem.allocate_tensor(BFloat16, cute.make_layout(self.d * self.d), byte_alignment=128)
        gate_thread = tidx - self.gate_warp * WARP  # of the gate warps' threads
        channel, half = gate_thread // self.per_channel, gate_thread % self.per_channel
        row_smem = gate_rows.iterator.toint() + channel * (self.d * 2)
        row = warp * self.rows + (lane & (self.rows - 1))  # the state row whose output this lane writes (lanes < rows)
        slot = slots[m]
        cute.arch.griddepcontrol_launch_dependents()  # o_proj's launch (dense.py) takes its places and waits for us
        if slot >= 0 and slot < pool:
            # Everything in_proj does not write is loaded before griddepcontrol.wait: the state rows, the conv taps
            # and history, f_b's rows, the gate's and the norm's vectors.
            rows = self.load_rows(state, slot, head, warp, lane)
            norm_weight = o_norm[row]
            # in_proj's beta and output gate for this thread, loaded by every branch as soon as its wait is over:
            # loaded after the branches (the gate after the last barrier) they were L2 round trips on the chain.
            beta_raw, gate_raw = BFloat16(0.0), BFloat16(0.0)
            if warp < DECAY:
                taps, history = self.load_conv(conv_taps, conv_state, slot, head, warp, lane)
                cute.arch.griddepcontrol_wait()  # in_proj's output is written from here on
                beta_raw, gate_raw = self.beta_and_gate(projected, m, head, row)
                self.conv_channels(projected, conv_state, vecs, m, slot, head, warp, lane, taps, history)
            elif warp >= self.gate_warp:
                self.copy_gate_row(f_b, row_smem, head, channel, half)
                bias, log_a = dt_bias[head * self.d + channel], a_log[head]
                cute.arch.griddepcontrol_wait()
                beta_raw, gate_raw = self.beta_and_gate(projected, m, head, row)
                decay = self.decay_channel(projected, row_smem, bias, log_a, m, channel, half)
                if half == 0:
                    vecs[DECAY * self.d + channel] = decay
            else:
                cute.arch.griddepcontrol_wait()
                beta_raw, gate_raw = self.beta_and_gate(projected, m, head, row)
            beta = sigmoid(beta_raw.to(Float32))
            cute.arch.sync_threads()
            o = self.update_rows(rows, vecs, state, slot, head, warp, lane, beta)
            squares = lane_group_sum(o * o, self.rows)  # the other lane groups repeat lanes 0..rows-1's rows
            if lane == 0:
                partial[warp] = squares
            gated = o * norm_weight * sigmoid(gate_raw.to(Float32))  # before the barrier: only rstd comes after it
            cute.arch.sync_threads()
            total = tree_sum([partial[w] for w in range(self.warps)])
            rstd = cute.math.rsqrt(total / Float32(self.d) + Float32(self.eps))
            if lane < self.rows:
                out[m, head * self.d + row] = (gated * rstd).to(BFloat16)
        else:
            cute.arch.griddepcontrol_wait()  # a predecessor may still read `out`
            if tidx < self.d:
                out[m, head * self.d + tidx] = BFloat16(0.0)


@dataclass(frozen=True)
class KdaKernelWeights:
    """One rank's weights of the KDA middle, as the kernel reads them (kimi_k3_path.reference.kda.KdaWeights)."""

    f_b: torch.Tensor  # [proj, D] bf16, the forget gate's up-projection (folded into the launch)
    conv: torch.Tensor  # [3*proj, W] bf16 depthwise taps, oldest input first (the checkpoint's dtype)
    a_log: torch.Tensor  # [heads] fp32
    dt_bias: torch.Tensor  # [proj] fp32
    o_norm: torch.Tensor  # [D] fp32
    gate_lower_bound: float
    norm_eps: float

    @property
    def heads(self) -> int:
        return self.a_log.shape[0]

    @property
    def head_dim(self) -> int:
        return self.o_norm.shape[0]

    @property
    def conv_width(self) -> int:
        return self.conv.shape[1]


def prepare_kda_weights(ref, d, device) -> KdaKernelWeights:
    """The kernel's copy of a reference KdaWeights `ref` for KdaDims `d`: bf16 f_b and taps, fp32 vectors, on
    `device`."""
    return KdaKernelWeights(
        f_b=ref.f_b.to(device=device, dtype=torch.bfloat16).contiguous(),
        conv=ref.conv.to(device=device, dtype=torch.bfloat16).contiguous(),
        a_log=ref.a_log.to(device=device, dtype=torch.float32).contiguous(),
        dt_bias=ref.dt_bias.to(device=device, dtype=torch.float32).contiguous(),
        o_norm=ref.o_norm.to(device=device, dtype=torch.float32).contiguous(),
        gate_lower_bound=d.gate_lower_bound, norm_eps=d.norm_eps,
    )


def check_slot_indices(slots: list[int], pool: int) -> None:
    """Raise ValueError unless every slot is in [0, pool) and no two sequences share one (a shared slot would be
    updated by two CTAs at once)."""
    bad = [s for s in slots if not 0 <= s < pool]
    if bad:
        raise ValueError(f"kda_recurrent_decode: state slots {bad} are outside the pool [0, {pool})")
    seen, dup = set(), []
    for s in slots:
        if s in seen:
            dup.append(s)
        seen.add(s)
    if dup:
        raise ValueError(f"kda_recurrent_decode: state slots {sorted(set(dup))} are used by more than one sequence")


def projected_columns(heads: int, head_dim: int) -> int:
    """in_proj's outputs the middle reads per token: q, k, v and the output gate of every head, f_a, beta."""
    return 4 * heads * head_dim + head_dim + heads


ROW_ALIGN = VEC_BYTES // 2  # projected's rows start on 16 bytes: f_a is read in 16-byte vectors


def aligned_columns(heads: int, head_dim: int) -> int:
    """The narrowest row of `projected` the launch takes: projected_columns rounded up to ROW_ALIGN."""
    return -(-projected_columns(heads, head_dim) // ROW_ALIGN) * ROW_ALIGN


def fake_args(heads: int, head_dim: int = HEAD_DIM, conv_width: int = CONV_WIDTH, m=None, pool=None,
              columns: int | None = None) -> tuple:
    """Fake tensors (dynamic batch and pool unless given) for compiling KdaRecurrent without a GPU; `columns` is the
    row length of `projected` (default aligned_columns; kda.py's padded in_proj output may be wider)."""
    from .runtime import dyn, fake, fake_stream

    m = dyn() if m is None else m
    pool = dyn() if pool is None else pool
    proj = heads * head_dim
    columns = aligned_columns(heads, head_dim) if columns is None else columns
    return (fake(BFloat16, (m, columns)), fake(BFloat16, (proj, head_dim)), fake(BFloat16, (3 * proj, conv_width)),
            fake(Float32, (heads,)), fake(Float32, (proj,)), fake(Float32, (head_dim,)), fake(Int32, (m,)),
            fake(BFloat16, (pool, 3 * proj, conv_width - 1)), fake(Float32, (pool, heads, head_dim, head_dim)),
            fake(BFloat16, (m, proj)), fake_stream())


def kda_recurrent_decode(projected, w, slots, conv_state, state, out, stream, check_slots: bool = True,
                         warps: int | None = None) -> None:
    """The KDA middle (module docstring) for a decode batch of M = 1..64 sequences on `stream`:
    projected [M, C] bf16 (in_proj's output: C >= projected_columns and a multiple of ROW_ALIGN, the columns past
    projected_columns unread, so a padded in_proj output goes in whole), w: KdaKernelWeights (f_b among them),
    slots [M] int32 into the pools conv_state [P, 3*proj, W-1] bf16 and state [P, heads, D, D] fp32 (updated in
    place), out [M, proj] bf16 (o_proj's input). check_slots reads `slots` on the host (a synchronization) to reject
    out-of-range and duplicate slots; pass False under CUDA graph capture (the kernel skips out-of-range ones; a
    duplicate is then the caller's to exclude). warps: the CTA's form (WARP_FORMS; default
    dispatch.attention_forms's for the batch)."""
    from .runtime import compile_cached, cu_stream, expect_all, to_cute

    heads, d, width = w.heads, w.head_dim, w.conv_width
    m, proj, pool = projected.shape[0], heads * d, state.shape[0]
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"kda_recurrent_decode: decode batch M={m} must be in 1..{MAX_TOKENS}")
    warps = attention_forms(m).kda_warps if warps is None else warps
    op = KdaRecurrent(heads, d, width, w.gate_lower_bound, w.norm_eps, warps)  # validates the dims and the form
    columns = max(projected.shape[-1], aligned_columns(heads, d))  # fewer is reported by expect_all below
    if columns % ROW_ALIGN:
        raise ValueError(f"kda_recurrent_decode: projected has {columns} columns, not a multiple of {ROW_ALIGN} (its rows "
                         "must start on 16 bytes: pad in_proj's rows, as kda.padded_rows does)")
    expect_all([
        ("projected", projected, (m, columns), "bfloat16"),
        ("f_b", w.f_b, (proj, d), "bfloat16"),
        ("conv_taps", w.conv, (3 * proj, width), "bfloat16"),
        ("a_log", w.a_log, (heads,), "float32"),
        ("dt_bias", w.dt_bias, (proj,), "float32"),
        ("o_norm", w.o_norm, (d,), "float32"),
        ("slots", slots, (m,), "int32"),
        ("conv_state", conv_state, (pool, 3 * proj, width - 1), "bfloat16"),
        ("state", state, (pool, heads, d, d), "float32"),
        ("out", out, (m, proj), "bfloat16"),
    ])
    if check_slots:
        check_slot_indices(slots.tolist(), pool)

    def build():
        return op, fake_args(heads, d, width, columns=columns)

    fn = compile_cached(("kda_recurrent", heads, d, width, columns, w.gate_lower_bound, w.norm_eps, warps), build)
    fn(to_cute(projected, True), to_cute(w.f_b), to_cute(w.conv), to_cute(w.a_log), to_cute(w.dt_bias),
       to_cute(w.o_norm), to_cute(slots, True), to_cute(conv_state, True), to_cute(state, True),
       to_cute(out, True), cu_stream(stream))
