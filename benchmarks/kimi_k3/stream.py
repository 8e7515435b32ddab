"""A read-only stream: the most a launch that only reads N bytes can do, the yardstick for the GEMV-class criteria.

Every byte a one-token GEMV must read, and nothing else: each thread issues `in_flight` 16-byte weight loads
(common.ld_weight_v4, as the kernels do) spread across the grid for coalescing, folds them with XOR (one LOP3 per two or three
words, so arithmetic never binds; common.after_all_loads keeps the batch's loads ahead of the first), and each CTA writes one word, the XOR of everything it read, which a test checks
against the host. The grid is a run-time argument (CTAs per SM are the bench's sweep).

Chained launches model a block's dependent segments: `wait` says where a launch started early (programmatic dependent
launch, `early`) waits for its predecessor: "start" before its first load (only the launch latency is hidden), "held"
after its first batch of loads is issued (the batch is in flight across the wait, as the kernels that hold weights do).
`trigger` lets the next launch start at once.

`via` says how the bytes come in: "registers" (16-byte loads into registers, as the kernels read their weights),
"cp.async" (each thread copies its vectors into shared memory by 16-byte cp.async and reads them back from there:
no registers hold the bytes in flight), or "bulk" (one thread copies the CTA's 4 KB runs of a batch by bulk copies on
the TMA engine under one mbarrier, and every thread reads its vectors back from shared memory). Same bytes, same
order, same fold: the three differ only in the way in.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import Int32, Int64, Uint8

from kimi_k3_path.kernels.common import VEC_BYTES, WARP, after_all_loads, bulk_copy_to_shared, cp_async_16, ld_shared_v4, ld_weight_v4

THREADS = 256
WAITS = ("none", "start", "held")
VIAS = ("registers", "cp.async", "bulk")


def xor_all(words) -> Int32:
    """XOR of a list of Int32 values as a balanced tree (short dependency chains)."""
    while len(words) > 1:
        words = [words[i] ^ words[i + 1] if i + 1 < len(words) else words[i] for i in range(0, len(words), 2)]
    return words[0]


class ReadStream:
    """out[cta] = XOR of the 32-bit words CTA `cta` read of buf (Int32 [n], n a multiple of 4)."""

    def __init__(self, in_flight: int, wait: str = "none", trigger: bool = False, via: str = "registers"):
        if in_flight < 1:
            raise ValueError(f"ReadStream: in_flight={in_flight} must be at least 1")
        if wait not in WAITS:
            raise ValueError(f"ReadStream: wait={wait!r} is not one of {WAITS}")
        if via not in VIAS:
            raise ValueError(f"ReadStream: via={via!r} is not one of {VIAS}")
        self.in_flight, self.wait, self.trigger, self.via = in_flight, wait, trigger, via

    def stage_bytes(self) -> int:
        """Shared memory a batch lands in (staged reads only)."""
        return 0 if self.via == "registers" else self.in_flight * THREADS * VEC_BYTES

    def smem_bytes(self) -> int:
        # The DSL lays out the allocations one after another: the stage (128-byte aligned), the mbarrier, the partials.
        return self.stage_bytes() + (128 + 16 if self.stage_bytes() else 0) + (THREADS // WARP) * 4

    @cute.jit
    def __call__(self, buf: cute.Tensor, out: cute.Tensor, ctas: Int32, stream: cuda.CUstream):
        self.kernel(buf, out).launch(grid=[ctas, 1, 1], block=[THREADS, 1, 1], smem=self.smem_bytes(),
                                     stream=stream, use_pdl=self.wait != "none")

    @cute.kernel
    def kernel(self, buf: cute.Tensor, out: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        grid, _, _ = cute.arch.grid_dim()
        if cutlass.const_expr(self.trigger):
            cute.arch.griddepcontrol_launch_dependents()
        if cutlass.const_expr(self.wait == "start"):
            cute.arch.griddepcontrol_wait()
        threads = grid * THREADS
        me = cta * THREADS + tidx
        vectors = buf.shape[0] // (VEC_BYTES // 4)
        per_batch = threads * self.in_flight
        batches = vectors // per_batch
        base = buf.iterator.toint()
        zero = out.shape[0] >> 30  # 0 at run time, unknown to the compiler (for after_all_loads)
        acc = Int32(0)
        if cutlass.const_expr(self.via == "registers"):
            for b in cutlass.range(batches, unroll=1):
                words = []
                for u in cutlass.range_constexpr(self.in_flight):
                    v = ld_weight_v4(base + (Int64(b) * per_batch + Int64(u * threads + me)) * VEC_BYTES)
                    words.extend([v[0], v[1], v[2], v[3]])
                words[0] = after_all_loads(words[0], words, zero)  # the whole batch in flight before the first XOR
                if cutlass.const_expr(self.wait == "held"):
                    if b == 0:
                        cute.arch.griddepcontrol_wait()
                acc = acc ^ xor_all(words)
        else:
            acc = self.staged_batches(base, batches, per_batch, threads, me, cta, tidx)
        if cutlass.const_expr(self.wait == "held"):
            if batches == 0:
                cute.arch.griddepcontrol_wait()
        for i in cutlass.range(batches * per_batch + me, vectors, threads, unroll=1):
            v = ld_weight_v4(base + Int64(i) * VEC_BYTES)
            acc = acc ^ xor_all([v[0], v[1], v[2], v[3]])
        # One word per CTA: XOR across the warp, then across the warps through shared memory.
        offset = WARP // 2
        while offset >= 1:
            acc = acc ^ cute.arch.shuffle_sync_bfly(acc, offset)
            offset //= 2
        partial = cutlass.memory.SmemAllocator().allocate_tensor(Int32, cute.make_layout(THREADS // WARP),
                                                                 byte_alignment=16)
        if tidx % WARP == 0:
            partial[tidx // WARP] = acc
        cute.arch.sync_threads()
        if tidx == 0:
            total = Int32(0)
            for w in cutlass.range_constexpr(THREADS // WARP):
                total = total ^ partial[w]
            out[cta] = total


    @cute.jit
    def staged_batches(self, base: Int64, batches: Int32, per_batch: Int32, threads: Int32, me: Int32, cta: Int32,
                       tidx: Int32) -> Int32:
        """The batches through shared memory: thread t's vector u of a batch lands at (u * THREADS + t) * 16, which
        is also where a bulk copy of the CTA's u-th 4 KB run puts it."""
        smem = cutlass.memory.SmemAllocator()
        stage = smem.allocate_tensor(Uint8, cute.make_layout(self.stage_bytes()), byte_alignment=128).iterator.toint()
        barrier = smem.allocate_tensor(Int64, cute.make_layout(1), byte_alignment=8)
        if cutlass.const_expr(self.via == "bulk"):
            if tidx == 0:
                cute.arch.mbarrier_init(barrier.iterator, 1)
                cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()
        acc = Int32(0)
        for b in cutlass.range(batches, unroll=1):
            first = Int64(b) * per_batch
            if cutlass.const_expr(self.via == "cp.async"):
                for u in cutlass.range_constexpr(self.in_flight):
                    cp_async_16(stage + (u * THREADS + tidx) * VEC_BYTES,
                                base + (first + Int64(u * threads + me)) * VEC_BYTES)
                cute.arch.cp_async_commit_group()
            else:
                if tidx == 0:
                    cute.arch.mbarrier_arrive_and_expect_tx(barrier.iterator, self.stage_bytes())
                    for u in cutlass.range_constexpr(self.in_flight):
                        bulk_copy_to_shared(stage + u * THREADS * VEC_BYTES,
                                            base + (first + Int64(u * threads + cta * THREADS)) * VEC_BYTES,
                                            THREADS * VEC_BYTES, barrier.iterator.toint())
            if cutlass.const_expr(self.wait == "held"):
                if b == 0:
                    cute.arch.griddepcontrol_wait()
            if cutlass.const_expr(self.via == "cp.async"):
                cute.arch.cp_async_wait_group(0)
            else:
                cute.arch.mbarrier_wait(barrier.iterator, b % 2)
            words = []
            for u in cutlass.range_constexpr(self.in_flight):
                v = ld_shared_v4(stage + (u * THREADS + tidx) * VEC_BYTES)
                words.extend([v[0], v[1], v[2], v[3]])
            acc = acc ^ xor_all(words)
            if cutlass.const_expr(self.via == "bulk"):
                cute.arch.sync_threads()  # every thread has read the stage before thread 0 refills it
        return acc


def read_stream(buf, out, ctas: int, in_flight: int, stream, wait: str = "none", trigger: bool = False,
                via: str = "registers") -> None:
    """Launch ReadStream on `stream`: buf int32 [n] (n % 4 == 0, 16-byte aligned), out int32 [>= ctas]."""
    from kimi_k3_path.kernels.runtime import compile_cached, cu_stream, dyn, fake, fake_stream, to_cute

    if buf.dim() != 1 or str(buf.dtype) != "torch.int32" or buf.shape[0] % (VEC_BYTES // 4):
        raise ValueError(f"buf: expected a 1-d int32 tensor of a multiple of 4 words, got {buf.dtype} {tuple(buf.shape)}")
    if out.dim() != 1 or str(out.dtype) != "torch.int32" or out.shape[0] < ctas:
        raise ValueError(f"out: expected a 1-d int32 tensor of at least {ctas} words, got {out.dtype} {tuple(out.shape)}")
    if ctas < 1:
        raise ValueError(f"ctas={ctas} must be at least 1")

    def build():
        return ReadStream(in_flight, wait, trigger, via), (fake(Int32, (dyn(),)), fake(Int32, (dyn(),)), Int32(1),
                                                           fake_stream())

    fn = compile_cached(("read_stream", in_flight, wait, trigger, via), build)
    fn(to_cute(buf, True), to_cute(out, True), Int32(ctas), cu_stream(stream))
