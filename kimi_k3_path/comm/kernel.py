"""The one-shot all-reduce (`oneshot.py`) as a CuTe DSL kernel for sm_90a.

One launch runs `rank_program` for R ranks (R = 1 in service, one process per GPU; R = W in the loop-back test,
where W buffers on one GPU stand for W GPUs). CTA (c, j) is chunk c of rank first_rank + j:

1. every thread reads the chunk's call count from its own buffer (epoch = count + 1, parity = epoch & 1);
2. it loads 16-byte vectors of x[j, :M, chunk c] and stores each into slot (parity, rank) of every rank's buffer
   (plain st.global.v4: the stores to peers go over NVLink, posted, no round trip);
3. after a CTA barrier, thread t < W releases flag (parity, rank, c) := epoch in rank (rank + 1 + t) % W's buffer
   with st.release.sys (the barrier puts every thread's stores before it; the release makes them visible first);
4. thread t < W spins with ld.acquire.sys on flag (parity, t, c) of its own buffer until it holds epoch; a CTA
   barrier hands what the acquires made visible to every thread;
5. every thread sums its vectors' W slots in rank order with add.rn.f32 from rank 0's value and rounds once
   (cvt.rn.bf16x2.f32): oneshot.reference_sum, bit for bit. The slots are read with ld.global.cg (from L2, which the
   peers' NVLink stores update; never a stale L1 line);
6. thread 0 stores the count (epoch): the next launch on this stream reads it.

Peers' buffer addresses come as an int64 array [R, W] (ptrs[j, q]: rank q's buffer as rank first_rank + j maps it:
a CUDA IPC mapping in service, the same device allocation in the loop-back). Spin-waits need every CTA of the
ranks it waits for running: in service each rank's CTAs wait only for other GPUs' CTAs, which run whatever this GPU
does; the loop-back launch must fit co-resident (R x chunks CTAs <= the 132 SMs: one CTA per SM always fits).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from kimi_k3_path.kernels.common import BF16_PER_VEC, VEC_BYTES, bf16x2_to_f32, ld_act_v4, ld_coherent_i32

from .oneshot import BF16_BYTES, FLAG_BYTES, Layout

THREADS = 256
H200_SMS = 132


def st_global_v4(addr: Int64, words) -> None:
    cute.arch.inline_ptx("st.global.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[addr, *words])


def ld_l2_v4(addr: Int64):
    """16 bytes from L2 (.cg): data a peer stored over NVLink during this launch."""
    return cute.arch.inline_ptx("ld.global.cg.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
                                write_only_types=[Int32] * 4, read_only_args=[addr])


def st_release_sys(addr: Int64, value: Int32) -> None:
    """A system-scope release store: this thread's (and, through a CTA barrier, the CTA's) earlier stores, to any
    GPU's memory, are visible to whoever acquires `value` at addr."""
    cute.arch.inline_ptx("st.release.sys.global.b32 [{$r0}], {$r1};", read_only_args=[addr, value])


def ld_acquire_sys(addr: Int64) -> Int32:
    return cute.arch.inline_ptx("ld.acquire.sys.global.b32 {$w0}, [{$r0}];", write_only_types=[Int32],
                                read_only_args=[addr])


def add_rn(a: Float32, b: Float32) -> Float32:
    """a + b in fp32, round-to-nearest-even, never contracted or reassociated (the rank order is the contract)."""
    return cute.arch.inline_ptx("add.rn.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Float32], read_only_args=[a, b])


def pack_bf16x2(lo: Float32, hi: Float32) -> Int32:
    """(lo, hi) rounded to bf16 (nearest even) and packed, lo in the low half (cvt puts its first source high)."""
    return cute.arch.inline_ptx("cvt.rn.bf16x2.f32 {$w0}, {$r1}, {$r0};", write_only_types=[Int32],
                                read_only_args=[lo, hi])


def sum_slots(addr: Int64, slot_bytes: Int64, world: int) -> list:
    """The 8 bf16 values at addr in each of `world` slots slot_bytes apart, summed in slot order in fp32 from slot
    0's value and rounded once: four packed bf16 pairs (a plain function: traced, its loops unrolled)."""
    acc = []
    for s in range(world):
        words = ld_l2_v4(addr + Int64(s) * slot_bytes)
        for w in range(4):
            lo, hi = bf16x2_to_f32(words[w])
            if s == 0:
                acc += [lo, hi]
            else:
                acc[2 * w] = add_rn(acc[2 * w], lo)
                acc[2 * w + 1] = add_rn(acc[2 * w + 1], hi)
    return [pack_bf16x2(acc[2 * w], acc[2 * w + 1]) for w in range(4)]


class OneShotAllReduce:
    """out[j] = sum over the world of x (every rank's x[j] partial), for ranks first_rank .. first_rank + R - 1 of
    `layout` in one launch; x and out [R, M, hidden] bf16, ptrs [R, W] int64."""

    def __init__(self, layout: Layout, ranks_per_launch: int = 1):
        if ranks_per_launch not in (1, layout.world):
            raise ValueError(f"ranks_per_launch={ranks_per_launch}: 1 (one process per GPU) or the world "
                             f"{layout.world} (the loop-back)")
        if ranks_per_launch * layout.chunks > H200_SMS:
            raise ValueError(f"{ranks_per_launch} ranks x {layout.chunks} chunks = "
                             f"{ranks_per_launch * layout.chunks} CTAs: more than the {H200_SMS} SMs, so CTAs that "
                             f"spin-wait could keep the ones they wait for from starting")
        self.layout, self.ranks = layout, ranks_per_launch

    @cute.jit
    def __call__(self, ptrs: cute.Tensor, x: cute.Tensor, out: cute.Tensor, first_rank: Int32,
                 stream: cuda.CUstream):
        self.kernel(ptrs, x, out, first_rank, x.shape[1]).launch(
            grid=[self.layout.chunks, self.ranks, 1], block=[THREADS, 1, 1], stream=stream)

    @cute.kernel
    def kernel(self, ptrs: cute.Tensor, x: cute.Tensor, out: cute.Tensor, first_rank: Int32, m_count: Int32):
        lay = self.layout
        world: cutlass.Constexpr = lay.world
        hidden: cutlass.Constexpr = lay.hidden
        vecs: cutlass.Constexpr = lay.chunk_cols // BF16_PER_VEC  # 16-byte vectors per row of a chunk
        tidx, _, _ = cute.arch.thread_idx()
        chunk, j, _ = cute.arch.block_idx()
        rank = first_rank + j
        own = ptrs[j, rank]
        epoch = ld_coherent_i32(own + Int64(lay.count_offset(0) + FLAG_BYTES * chunk)) + Int32(1)
        parity = epoch & Int32(1)
        slot_bytes = Int64(lay.slot_bytes)
        row_bytes: cutlass.Constexpr = hidden * BF16_BYTES
        col_bytes = Int64(chunk) * (lay.chunk_cols * BF16_BYTES)
        x_base = x.iterator.toint() + Int64(j) * Int64(m_count) * row_bytes + col_bytes
        out_base = out.iterator.toint() + Int64(j) * Int64(m_count) * row_bytes + col_bytes
        mine = (Int64(parity) * world + Int64(rank)) * slot_bytes + col_bytes  # slot (parity, rank), this chunk
        peers = [ptrs[j, (rank + 1 + k) % world] for k in range(world)]

        # 1-2: push this rank's partial into slot (parity, rank) of every buffer.
        for item in cutlass.range(tidx, m_count * vecs, THREADS, unroll=1):
            at = Int64(item // vecs) * row_bytes + Int64(item % vecs) * VEC_BYTES
            words = ld_act_v4(x_base + at)
            for k in cutlass.range_constexpr(world):
                st_global_v4(peers[k] + mine + at, words)
        cute.arch.sync_threads()
        # 3: release this chunk's flag in every buffer; 4: acquire every rank's flag in its own.
        if tidx < world:
            dst = ptrs[j, (rank + 1 + tidx) % world]
            st_release_sys(dst + Int64(lay.flags_offset) + Int64(((parity * world + rank) * lay.chunks + chunk)
                                                                 * FLAG_BYTES), epoch)
            flag = own + Int64(lay.flags_offset) + Int64(((parity * world + tidx) * lay.chunks + chunk) * FLAG_BYTES)
            seen = ld_acquire_sys(flag)
            while seen != epoch:
                seen = ld_acquire_sys(flag)
        cute.arch.sync_threads()

        # 5: the world's slots of this chunk, summed in rank order.
        slots = own + Int64(parity) * world * slot_bytes + col_bytes
        for item in cutlass.range(tidx, m_count * vecs, THREADS, unroll=1):
            at = Int64(item // vecs) * row_bytes + Int64(item % vecs) * VEC_BYTES
            st_global_v4(out_base + at, sum_slots(slots + at, slot_bytes, world))
        # 6: every thread read the count before the barrier above.
        if tidx == 0:
            cute.arch.inline_ptx("st.global.b32 [{$r0}], {$r1};",
                                 read_only_args=[own + Int64(lay.count_offset(0) + FLAG_BYTES * chunk), epoch])


def fake_args(layout: Layout, ranks_per_launch: int = 1) -> tuple:
    """Fake arguments to compile OneShotAllReduce without a GPU (M dynamic)."""
    from cutlass import BFloat16

    from kimi_k3_path.kernels.runtime import dyn, fake, fake_stream

    m = dyn()
    shape = (ranks_per_launch, m, layout.hidden)
    return (fake(Int64, (ranks_per_launch, layout.world)), fake(BFloat16, shape), fake(BFloat16, shape), Int32(0),
            fake_stream())


def oneshot_all_reduce(layout: Layout, ptrs, x, out, first_rank: int, stream) -> None:
    """Launch the all-reduce of x [R, M, hidden] bf16 into out on `stream` for ranks first_rank .. + R - 1 of
    `layout` (R = 1, or the world for the loop-back); ptrs [R, W] int64 CUDA tensor of buffer addresses. Buffers
    start zeroed (flags and counts together) and every rank calls with the same sequence of M."""
    from kimi_k3_path.kernels.runtime import compile_cached, cu_stream, expect, to_cute

    r, m = x.shape[0], x.shape[1]
    layout.check_call(m, first_rank)
    layout.check_call(m, first_rank + r - 1)
    expect("ptrs", ptrs, (r, layout.world), "int64")
    expect("x", x, (r, m, layout.hidden), "bfloat16")
    expect("out", out, (r, m, layout.hidden), "bfloat16")
    fn = compile_cached(("oneshot_all_reduce", layout, r), lambda: (OneShotAllReduce(layout, r), fake_args(layout, r)))
    fn(to_cute(ptrs), _dynamic_rows(x), _dynamic_rows(out), Int32(first_rank), cu_stream(stream))


def _dynamic_rows(t):
    from cutlass.cute.runtime import from_dlpack

    from kimi_k3_path.kernels.runtime import ALIGN

    return from_dlpack(t, assumed_align=ALIGN).mark_compact_shape_dynamic(mode=1)
