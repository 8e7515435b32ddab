"""Device helpers shared by the latent-MoE kernels (traced inline into each @cute.kernel).

Everything here is plain PTX the sm_90a target has: vector loads with cache hints, bf16 and MXFP4 unpacking, lane-group
reductions, the SiTU-GLU activation. The CUDA-core parts serve one-token bf16 GEMMs, the router and the held GEMM1;
the rest runs on mma.sync (mma.py, fp4_mma.py).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .trace import RECORD_BYTES

WARP = 32
VEC_BYTES = 16  # one 128-bit load per lane: 8 bf16, 4 fp32 or 32 fp4 values
SMEM_CARVEOUT_DEFAULT = -1  # CU_SHAREDMEM_CARVEOUT_DEFAULT: no preference
BF16_PER_VEC = 8
FP4_GROUP = 32  # MXFP4 values per E8M0 scale; exactly one 16-byte vector of packed nibbles
SITU_BETA = 4.0
SITU_LINEAR_BETA = 25.0
NEG_INF = float("-inf")
LOWEST = -3.4028234663852886e38


def ctas_per_sm_bound(ctas: int) -> dict:
    """Launch options that bound a kernel's registers so that `ctas` CTAs fit on an SM (nvvm.minctasm), with an
    explicit (default) carveout: with a CTA-per-SM bound the DSL would otherwise query the device for it while
    compiling, which fails on a machine without a GPU (CI)."""
    return {"min_blocks_per_mp": ctas, "preferred_smem_carveout": SMEM_CARVEOUT_DEFAULT}


# Cache hints for weight loads (read once per step): the bench compares them on the down-projection.
WEIGHT_LOADS = {
    "no_allocate": "ld.global.nc.L1::no_allocate.v4.b32",
    "no_allocate_l2_256": "ld.global.nc.L1::no_allocate.L2::256B.v4.b32",
    "evict_first": "ld.global.nc.L1::evict_first.v4.b32",
    "plain": "ld.global.nc.v4.b32",
    # Not .nc: ptxas keeps a weak load on its side of a bar.sync or griddepcontrol.wait (another thread could have
    # written the address before it), so loads issued ahead of one stay there without a pin on their values;
    # bar.warp.sync does not hold them (common.warp_barrier does). kimi_k3_kernels.md §5.
    "ordered": "ld.global.L1::no_allocate.v4.b32",
}
DEFAULT_WEIGHT_LOAD = "no_allocate"


def ld_weight_v4(addr: Int64, hint: str = DEFAULT_WEIGHT_LOAD):
    """16 bytes of a weight that is read once per step: by default bypass L1 so it does not evict activations."""
    return cute.arch.inline_ptx(
        WEIGHT_LOADS[hint] + " {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
        write_only_types=[Int32] * 4,
        read_only_args=[addr],
    )


def ld_act_v4(addr: Int64):
    """16 bytes of an activation written by an earlier launch; many warps reread it, so keep it in L1."""
    return cute.arch.inline_ptx(
        "ld.global.nc.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
        write_only_types=[Int32] * 4,
        read_only_args=[addr],
    )


def ld_fresh_v4(addr: Int64):
    """16 bytes that a launch still running when this one started wrote (read after griddepcontrol.wait, in a launch
    started early by programmatic dependent launch): a plain load, since the read-only path of ld_act_v4 (.nc) is
    only defined for data that stays unchanged for the whole launch."""
    return cute.arch.inline_ptx(
        "ld.global.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
        write_only_types=[Int32] * 4,
        read_only_args=[addr],
    )


def after_all_loads(value: Int32, loaded, zero: Int32) -> Int32:
    """`value`, unchanged, but computed from every register in `loaded` (zero: 0 at run time, unknown to the compiler).
    ptxas sinks each load next to its first use to save registers, which turns a batch of loads meant to be in flight
    together into one DRAM round trip per use (seen in the SASS of the experts kernels). Feeding the batch's first
    use through this keeps every load of the batch ahead of it; one instruction of a vector load needs one register."""
    folded = loaded[0]
    for v in loaded[1:]:
        folded = folded ^ v
    return value | (folded & zero)


def warp_barrier() -> None:
    """A barrier of this warp alone (named barrier 1 + warp, 32 threads; id 0 is the CTA's). Unlike bar.warp.sync,
    which ptxas drops, a bar.sync keeps weak loads issued before it on its side without waiting for their data."""
    cute.arch.barrier(barrier_id=1 + cute.arch.warp_idx(), number_of_threads=32)


def batch_zero(m_count: Int32) -> Int32:
    """0 for every decode batch (1 <= m_count <= 64), for after_all_loads, and unknown to the compiler even inside a
    loop over the batch: there LLVM knows m_count > 0, folds m_count >> 31 to 0, and drops the pin with it."""
    return m_count >> 7


def ld_u8(addr: Int64, ordered: bool = False) -> Int32:
    """One byte (a scale); ordered: a weak load, kept ahead of a later bar.sync as WEIGHT_LOADS["ordered"]."""
    op = "ld.global.u8" if ordered else "ld.global.nc.u8"
    return cute.arch.inline_ptx(op + " {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[addr])


def prefetch_l1(addr: Int64) -> None:
    """Bring the 128-byte line at addr into this SM's L1 (no registers, nothing to wait for)."""
    cute.arch.inline_ptx("prefetch.global.L1 [{$r0}];", read_only_args=[addr])


def ld_shared_b32(addr: Int32) -> Int32:
    return cute.arch.inline_ptx("ld.shared.b32 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[addr])


def ld_shared_v4(addr: Int32):
    return cute.arch.inline_ptx(
        "ld.shared.v4.b32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];", write_only_types=[Int32] * 4, read_only_args=[addr]
    )


def st_shared_v4(addr: Int32, words) -> None:
    cute.arch.inline_ptx("st.shared.v4.b32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[addr, *words])


def st_shared_f32(addr: Int32, value: Float32) -> None:
    cute.arch.inline_ptx("st.shared.f32 [{$r0}], {$r1};", read_only_args=[addr, value])


def ld_cluster_f32(addr: Int32, rank: Int32) -> Float32:
    """The fp32 at shared address `addr` of the thread block cluster's CTA `rank` (mapa, then ld.shared::cluster)."""
    return cute.arch.inline_ptx(
        "{ .reg .b32 remote; mapa.shared::cluster.u32 remote, {$r0}, {$r1}; ld.shared::cluster.f32 {$w0}, [remote]; }",
        write_only_types=[Float32],
        read_only_args=[addr, rank],
    )


def st_async_cluster_f32(addr: Int32, value: Float32, barrier: Int32, rank: Int32) -> None:
    """Store `value` at shared address `addr` of the cluster's CTA `rank` (st.async: no fence, nothing to wait for
    here), counting its 4 bytes towards the transaction bytes of that CTA's mbarrier at shared address `barrier`."""
    cute.arch.inline_ptx(
        "{ .reg .b32 to, bar; mapa.shared::cluster.u32 to, {$r0}, {$r3}; mapa.shared::cluster.u32 bar, {$r2}, {$r3}; "
        "st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [to], {$r1}, [bar]; }",
        read_only_args=[addr, value, barrier, rank],
    )


def mbarrier_try_wait(barrier: Int32, parity: Int32) -> Int32:
    """1 once the mbarrier at shared address `barrier` has completed the phase of `parity`, else 0 (after the
    hardware's own time-limited wait). What peers' st.async wrote into this CTA's shared memory and counted on it is
    visible after it, as CUTLASS's cluster barriers wait (the default acquire at CTA scope: no L1 invalidation, which
    the cluster-scope acquire adds, CCTL.IVALL, for global data this wait does not guard)."""
    return cute.arch.inline_ptx(
        "{ .reg .pred done; mbarrier.try_wait.parity.shared::cta.b64 done, [{$r0}], {$r1}; "
        "selp.b32 {$w0}, 1, 0, done; }",
        write_only_types=[Int32],
        read_only_args=[barrier, parity],
    )


def ld_shared_u8(addr: Int32) -> Int32:
    return cute.arch.inline_ptx("ld.shared.u8 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[addr])


def ldmatrix_x4(addr: Int32, trans: bool = False):
    """Four 8x8 bf16 matrices from shared memory, one 16-byte row per address: lanes 8i..8i+7 give matrix i's rows.
    Lane 4g+q gets word i = (row g, columns 2q, 2q+1) of matrix i, or with trans (rows 2q, 2q+1, column g): the
    mma.sync operand fragments (trans: of a matrix stored with the contraction index along the rows)."""
    op = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" if trans else "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
    return cute.arch.inline_ptx(op + " {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];", write_only_types=[Int32] * 4,
                                read_only_args=[addr])


def ldmatrix_x2(addr: Int32):
    """ldmatrix_x4 for two matrices (lanes 0..15 give the row addresses)."""
    return cute.arch.inline_ptx("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{$w0}, {$w1}}, [{$r0}];",
                                write_only_types=[Int32] * 2, read_only_args=[addr])


def cp_async_16(dst: Int32, src: Int64, evict_first: bool = False) -> None:
    """Copy 16 bytes from global `src` to shared `dst` without registers (L2 only: .cg), completed by
    cute.arch.cp_async_commit_group / cp_async_wait_group. evict_first: the line gets L2's evict_first policy, for
    weights read once per step. Without it, 62 MB of such copies in the finalize pushed out of L2 what the next
    launch reads and slowed it by ~1.4 us, where ld_weight_v4's loads of the same bytes did not."""
    if evict_first:
        cute.arch.inline_ptx("{ .reg .b64 policy; createpolicy.fractional.L2::evict_first.b64 policy, 1.0; "
                             "cp.async.cg.shared.global.L2::cache_hint [{$r0}], [{$r1}], 16, policy; }",
                             read_only_args=[dst, src])
    else:
        cute.arch.inline_ptx("cp.async.cg.shared.global [{$r0}], [{$r1}], 16;", read_only_args=[dst, src])


def bulk_copy_to_shared(dst: Int32, src: Int64, nbytes, barrier: Int32) -> None:
    """Copy nbytes (a multiple of 16; both addresses 16-byte aligned) from global `src` to shared `dst` on the TMA
    engine: no registers hold the bytes in flight. They count towards the transaction bytes of the mbarrier at shared
    address `barrier`, which completes its phase when all expected bytes have landed."""
    cute.arch.inline_ptx(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{$r0}], [{$r1}], {$r2}, [{$r3}];",
        read_only_args=[dst, src, Int32(nbytes), barrier],
    )


@cute.jit
def expect_bulk_bytes(barrier: cute.Tensor, tidx: Int32, nbytes: cutlass.Constexpr, stages: cutlass.Constexpr = 1):
    """Single-use mbarriers (`stages` Int64s in shared memory), each completing when nbytes of bulk copies have landed
    on it. Every thread of the CTA calls this before any thread issues one of those copies (it synchronizes);
    afterwards wait on stage j with cute.arch.mbarrier_wait(barrier.iterator + j, 0)."""
    if tidx == 0:
        for j in cutlass.range_constexpr(stages):
            cute.arch.mbarrier_init(barrier.iterator + j, 1)
        cute.arch.mbarrier_init_fence()
        for j in cutlass.range_constexpr(stages):
            cute.arch.mbarrier_arrive_and_expect_tx(barrier.iterator + j, nbytes)
    cute.arch.sync_threads()


def ld_coherent_f32(addr: Int64) -> Float32:
    """A value another CTA of the same launch wrote: read it from L2, never from a stale L1 line."""
    return cute.arch.inline_ptx("ld.global.cg.f32 {$w0}, [{$r0}];", write_only_types=[Float32], read_only_args=[addr])


@cute.jit
def arrival(counter, order: cute.Tensor, tidx: Int32) -> Int32:
    """This CTA's place (0, 1, ...) among the CTAs that count in on the Int32 at pointer `counter`, once its results
    are written: the barrier makes the CTA's writes visible to thread 0, whose device-scope release fence (fences are
    cumulative) then covers them all before its atomic; order: one Int32 of shared memory that broadcasts the place.
    Whoever reads what the others wrote takes an acquire fence first (wait_for_all does)."""
    cute.arch.sync_threads()
    if tidx == 0:
        cute.arch.fence_acq_rel_gpu()
        order[0] = cute.arch.atomic_add(counter, Int32(1), scope="gpu")
    cute.arch.sync_threads()
    return order[0]


@cute.jit
def wait_for_all(counters: cute.Tensor, tidx: Int32, ctas: Int32, waiters: Int32):
    """One of `waiters` CTAs that arrived last on counters[0] (arrival): wait until all `ctas` have arrived, then count
    out on counters[1]; the last waiter to count out resets both for the next launch. Waiting is safe because at
    most waiters - 1 CTAs are unfinished when the first waiter starts, and they fit on the GPU beside the waiters.
    Every thread of the CTA calls it; afterwards what all `ctas` wrote before arriving is visible to all of them."""
    if tidx == 0:
        seen = ld_acquire_i32(counters.iterator.toint())
        while seen < ctas:
            seen = ld_acquire_i32(counters.iterator.toint())
        if cute.arch.atomic_add(counters.iterator + 1, Int32(1), scope="gpu") == waiters - 1:
            counters[0] = Int32(0)
            counters[1] = Int32(0)
    cute.arch.sync_threads()
    cute.arch.fence_acq_rel_gpu()


def ld_coherent_i32(addr: Int64) -> Int32:
    """ld_coherent_f32 for an Int32."""
    return cute.arch.inline_ptx("ld.global.cg.b32 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[addr])


def ld_relaxed_i32(addr: Int64) -> Int32:
    """A device-scope relaxed load (strong, from L2): a poll of a word another CTA of the same launch stores with a
    strong store, which it sees once written."""
    return cute.arch.inline_ptx(
        "ld.relaxed.gpu.global.b32 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[addr]
    )


def bits_to_f32(word: Int32) -> Float32:
    return cute.arch.inline_ptx("mov.b32 {$w0}, {$r0};", write_only_types=[Float32], read_only_args=[word])


def ld_acquire_i32(addr: Int64) -> Int32:
    """A device-scope acquire load: what the writers released before their update of addr is visible after it."""
    return cute.arch.inline_ptx(
        "ld.acquire.gpu.global.b32 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[addr]
    )


def red_add_f32(addr: Int64, value: Float32) -> None:
    cute.arch.inline_ptx("red.global.add.f32 [{$r0}], {$r1};", read_only_args=[addr, value])


def bf16x2_to_f32(word: Int32):
    """(low, high) halves of a packed bf16 pair as fp32 (exact: bf16 is the top half of an fp32)."""
    return cute.arch.inline_ptx(
        "{ shl.b32 {$w0}, {$r0}, 16; and.b32 {$w1}, {$r0}, 0xffff0000; }",
        write_only_types=[Float32, Float32],
        read_only_args=[word],
    )


def bf16_words_to_f32(words) -> list:
    """The fp32 values of packed bf16 pairs, in order (bf16x2_to_f32 of each word)."""
    values = []
    for word in words:
        low, high = bf16x2_to_f32(word)
        values += [low, high]
    return values


def kernel_fp4_bytes(packed):
    """Packed E2M1 bytes (an int or a uint8 tensor) from the reference layout (element 2i in the low nibble of byte i,
    element 2i+1 in the high one; nibbles s|e1|e0|m) to the kernels' (moe.prepare_weights applies it; every kernel
    decodes through _FP4X8_TO_F16X2_PTX). Element 2i sits at bits 7|4|3|2, which is already the E4M3 byte
    s|0 0 e1 e0|m 0 0 below (one AND for four of them), and element 2i+1 at bits 5|6|1|0, two shifts from that form:
    5 bit operations per 8 values instead of 7 (the decode is issue-bound in the one-token experts)."""
    return (((packed & 0x08) << 4) | ((packed & 0x07) << 2)  # element 2i: s -> 7, e1 e0 m -> 4 3 2
            | ((packed & 0x80) >> 2) | (packed & 0x40) | ((packed & 0x30) >> 4))  # 2i+1: s -> 5, e1 -> 6, e0 m -> 1 0


# E2M1 nibbles of {$r0} (8 values in kernel_fp4_bytes' layout) -> f16x2 pairs p0..p3 = elements (0, 2), (4, 6),
# (1, 3), (5, 7), each value times 2^-6. Each nibble s|e1 e0|m becomes an FP8 E4M3 byte s|0 0 e1 e0|m 0 0, whose value
# is exactly the E2M1 value times 2^-6 (subnormals included), and Hopper converts E4M3 pairs to f16x2 in one
# instruction.
_FP4X8_TO_F16X2_PTX = (
    ".reg .b32 lo, hi, t, p0, p1, p2, p3;\n"
    ".reg .b16 a0, a1, a2, a3;\n"
    "and.b32 lo, {$r0}, 0x9C9C9C9C;\n"
    "shl.b32 hi, {$r0}, 2;\n"
    "and.b32 hi, hi, 0x8C8C8C8C;\n"
    "shr.b32 t, {$r0}, 2;\n"
    "and.b32 t, t, 0x10101010;\n"
    "or.b32 hi, hi, t;\n"
    "mov.b32 {a0, a1}, lo;\n"
    "mov.b32 {a2, a3}, hi;\n"
    "cvt.rn.f16x2.e4m3x2 p0, a0;\n"
    "cvt.rn.f16x2.e4m3x2 p1, a1;\n"
    "cvt.rn.f16x2.e4m3x2 p2, a2;\n"
    "cvt.rn.f16x2.e4m3x2 p3, a3;\n"
)


def fp4x8_fma_f16x2_paired(word: Int32, q0: Int32, q1: Int32, q2: Int32, q3: Int32, acc0: Int32, acc1: Int32):
    """(acc0, acc1) + products of eight E2M1 values (a word in kernel_fp4_bytes' layout) with eight fp16
    activations already paired as the conversion pairs the nibbles (q0..q3 from pair_like_fp4x8), in packed f16x2
    arithmetic: 4 conversions and 4 HFMA2 for 8 values. Activations reused across many weight words are paired once
    where they are staged (14% fewer instructions in the one-token experts). The products carry a 2^-6 that
    the group scale undoes (e8m0_scale_times_64)."""
    return cute.arch.inline_ptx(
        "{\n"
        + _FP4X8_TO_F16X2_PTX
        + ".reg .b32 s0, s1;\n"
        "mov.b32 s0, {$r5};\n"
        "mov.b32 s1, {$r6};\n"
        "fma.rn.f16x2 s0, p0, {$r1}, s0;\n"
        "fma.rn.f16x2 s1, p1, {$r2}, s1;\n"
        "fma.rn.f16x2 s0, p2, {$r3}, s0;\n"
        "fma.rn.f16x2 s1, p3, {$r4}, s1;\n"
        "mov.b32 {$w0}, s0;\n"
        "mov.b32 {$w1}, s1;\n"
        "}",
        write_only_types=[Int32, Int32],
        read_only_args=[word, q0, q1, q2, q3, acc0, acc1],
    )


def fp4x8_to_f16x2(word: Int32):
    """The eight E2M1 values of `word` (kernel_fp4_bytes' layout) as four f16x2 pairs, elements (0, 2), (4, 6), (1, 3),
    (5, 7), times 2^-6."""
    return cute.arch.inline_ptx(
        "{\n" + _FP4X8_TO_F16X2_PTX
        + "mov.b32 {$w0}, p0;\nmov.b32 {$w1}, p1;\nmov.b32 {$w2}, p2;\nmov.b32 {$w3}, p3;\n}",
        write_only_types=[Int32] * 4,
        read_only_args=[word],
    )


def pair_like_fp4x8(x01: Int32, x23: Int32, x45: Int32, x67: Int32):
    """Eight fp16 values (four packed pairs in element order) regrouped as fp4x8_to_f16x2 pairs its elements:
    (0, 2), (4, 6), (1, 3), (5, 7)."""
    return cute.arch.inline_ptx(
        "prmt.b32 {$w0}, {$r0}, {$r1}, 0x5410;\n"
        "prmt.b32 {$w1}, {$r2}, {$r3}, 0x5410;\n"
        "prmt.b32 {$w2}, {$r0}, {$r1}, 0x7632;\n"
        "prmt.b32 {$w3}, {$r2}, {$r3}, 0x7632;",
        write_only_types=[Int32] * 4,
        read_only_args=[x01, x23, x45, x67],
    )


def ld_weight_b32(addr: Int64) -> Int32:
    """4 bytes of a weight read once per step (bypassing L1, as ld_weight_v4)."""
    return cute.arch.inline_ptx(
        "ld.global.nc.L1::no_allocate.b32 {$w0}, [{$r0}];", write_only_types=[Int32], read_only_args=[addr]
    )


def f16x2_add_sum_f32(acc0: Int32, acc1: Int32) -> Float32:
    """The four fp16 lanes of two packed accumulators summed in fp32, the two added as f16x2 first: one HADD2, two
    conversions and one add instead of four conversions and three adds (each fp16 lane sums 16 products of a group)."""
    return cute.arch.inline_ptx(
        "{\n"
        ".reg .b32 t;\n"
        ".reg .b16 l, h;\n"
        ".reg .f32 f0, f1;\n"
        "add.rn.f16x2 t, {$r0}, {$r1};\n"
        "mov.b32 {l, h}, t;\n"
        "cvt.f32.f16 f0, l;\n"
        "cvt.f32.f16 f1, h;\n"
        "add.f32 {$w0}, f0, f1;\n"
        "}",
        write_only_types=[Float32],
        read_only_args=[acc0, acc1],
    )


def fp4_group_dot_shared(packed, x_addr: Int32, quarter_stride: int = VEC_BYTES) -> Float32:
    """Unscaled dot (times 2^-6) of one MXFP4 group (4 words of packed nibbles) with 32 fp16 activations in shared
    memory at x_addr, the group's four 16-byte quarters `quarter_stride` bytes apart and each stored paired like the
    weights (pair_like_fp4x8): packed f16x2 products within the group, the two accumulators added as f16x2, fp32 from
    the group sum on."""
    acc0 = Int32(0)
    acc1 = Int32(0)
    for q in range(4):
        xw = ld_shared_v4(x_addr + q * quarter_stride)
        acc0, acc1 = fp4x8_fma_f16x2_paired(packed[q], xw[0], xw[1], xw[2], xw[3], acc0, acc1)
    return f16x2_add_sum_f32(acc0, acc1)


def e8m0_scale_times_64(s: Int32) -> Float32:
    """2^(s-127) * 2^6 as fp32 (the 2^6 undoes the fp4x8 conversions' offset). Exact for s in 0..248; 255 is E8M0 NaN."""
    return cute.arch.inline_ptx(
        "{ .reg .b32 t; add.s32 t, {$r0}, 6; shl.b32 {$w0}, t, 23; }",
        write_only_types=[Float32],
        read_only_args=[s],
    )


def dot_bf16x8(words, xs, acc: Float32) -> Float32:
    """acc + sum of 8 products: `words` four packed bf16 pairs (weights), `xs` eight fp32 values."""
    for j in range(4):
        lo, hi = bf16x2_to_f32(words[j])
        acc = acc + lo * xs[2 * j] + hi * xs[2 * j + 1]
    return acc


def dot_bf16x8_packed(words, x_words, acc: Float32) -> Float32:
    """acc + sum of 8 products: `words` and `x_words` four packed bf16 pairs each (x kept packed: half the
    registers of dot_bf16x8's fp32 values)."""
    for j in range(4):
        w_lo, w_hi = bf16x2_to_f32(words[j])
        x_lo, x_hi = bf16x2_to_f32(x_words[j])
        acc = acc + w_lo * x_lo + w_hi * x_hi
    return acc


def lane_group_sum(value: Float32, lanes: int) -> Float32:
    """Sum over aligned groups of `lanes` consecutive lanes (a power of two <= 32); every lane gets its group's sum."""
    offset = lanes // 2
    while offset >= 1:
        value = value + cute.arch.shuffle_sync_bfly(value, offset)
        offset //= 2
    return value


def tree_sum(values: list):
    """The sum of `values` in a tree: log2(n) dependent adds on a latency chain where a running sum has n - 1."""
    while len(values) > 1:
        values = [a + b for a, b in zip(values[::2], values[1::2])] + values[len(values) - len(values) % 2 :]
    return values[0]


def lane_butterfly(value: Float32, offsets, combine) -> Float32:
    """value combined (combine(a, b): a sum, cute.arch.fmax, ...) over the lanes that differ only in the bits of
    `offsets`; every lane gets its group's result. E.g. offsets (4, 8, 16): over g of the mma fragments' lane 4g+q."""
    for offset in offsets:
        value = combine(value, cute.arch.shuffle_sync_bfly(value, offset))
    return value


def st_global_v4_f32(addr: Int64, values) -> None:
    """Store four fp32 values (16 bytes) at global addr."""
    cute.arch.inline_ptx("st.global.v4.f32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};", read_only_args=[addr, *values])


def st_global_v4_b32(take: Int32, addr: Int64, words) -> None:
    """Store four 32-bit words (16 bytes, e.g. 8 packed bf16) at global addr where take != 0 (a predicated store: no
    branch around it)."""
    cute.arch.inline_ptx(
        "{ .reg .pred p; setp.ne.s32 p, {$r0}, 0; @p st.global.v4.b32 [{$r1}], {{$r2}, {$r3}, {$r4}, {$r5}}; }",
        read_only_args=[take, addr, *words],
    )


def pack_bf16x2(low: Float32, high: Float32) -> Int32:
    """Two fp32 values rounded to bf16 (nearest even) in one word, `low` in the low half (bf16x2_to_f32's inverse)."""
    return cute.arch.inline_ptx("cvt.rn.bf16x2.f32 {$w0}, {$r0}, {$r1};", write_only_types=[Int32],
                                read_only_args=[high, low])


def f32_to_bf16_words(values) -> list:
    """Consecutive fp32 pairs packed as bf16 words (bf16_words_to_f32's inverse, rounding to nearest even)."""
    return [pack_bf16x2(values[2 * i], values[2 * i + 1]) for i in range(len(values) // 2)]


def select_f32(take_first: Int32, first: Float32, second: Float32) -> Float32:
    """first where take_first != 0, else second: a selp, exact for every value (NaN and Inf included), where an
    arithmetic blend (second + t * (first - second)) would let a NaN in one operand through into the other."""
    return cute.arch.inline_ptx(
        "{ .reg .pred p; setp.ne.s32 p, {$r0}, 0; selp.f32 {$w0}, {$r1}, {$r2}, p; }",
        write_only_types=[Float32],
        read_only_args=[take_first, first, second],
    )


def lane_reduce_scatter(values: list, lane: Int32) -> Float32:
    """Given n values per lane (n a power of two <= WARP), lane l gets the sum over the warp of values[l % n]:
    recursive halving, n - 1 shuffles (31 where 32 separate butterfly sums take 160), then a butterfly over the
    lanes holding the same index (log2(WARP / n) shuffles). At the halving step of offset h each lane keeps the half
    of its values whose index has its bit h (lane & h) and sends the other half to lane ^ h, which keeps that one."""
    n = len(values)
    if not 1 <= n <= WARP or n & (n - 1):
        raise ValueError(f"lane_reduce_scatter: expected a power of two up to {WARP} values, got {n}")
    half = n // 2
    while half >= 1:
        upper = lane & half
        kept = []
        for i in range(half):
            low, high = values[i], values[i + half]
            sent = select_f32(upper, low, high)
            kept.append(select_f32(upper, high, low) + cute.arch.shuffle_sync_bfly(sent, half))
        values = kept
        half //= 2
    return lane_butterfly(values[0], tuple(1 << b for b in range(n.bit_length() - 1, WARP.bit_length() - 1)),
                          lambda a, b: a + b)


def sigmoid(x: Float32) -> Float32:
    return Float32(1.0) / (Float32(1.0) + cute.math.exp(-x))


def situ_glu(gate: Float32, up: Float32) -> Float32:
    """4*tanh(g/4)*sigmoid(g) * 25*tanh(u/25), the same formula as kimi_k3_path.reference.situ_glu."""
    soft_gate = Float32(SITU_BETA) * cute.math.tanh(gate * Float32(1.0 / SITU_BETA)) * sigmoid(gate)
    return soft_gate * Float32(SITU_LINEAR_BETA) * cute.math.tanh(up * Float32(1.0 / SITU_LINEAR_BETA))


def load_bf16_tokens(x_addr: Int64, row_stride_bytes, m_first, m_count, vec: Int32, mt: int, fresh: bool = False):
    """For `mt` tokens starting at m_first, the 8 bf16 values of vector `vec` as fp32 (rows past m_count reread
    the last valid row, so every load stays in bounds; the caller drops those results). fresh: x was written by a
    launch still running when this one started (ld_fresh_v4)."""
    load_act = ld_fresh_v4 if fresh else ld_act_v4
    rows = []
    for mi in range(mt):
        m = cutlass.min(m_first + mi, m_count - 1)
        words = load_act(x_addr + Int64(m) * row_stride_bytes + Int64(vec) * VEC_BYTES)
        vals = []
        for j in range(4):
            lo, hi = bf16x2_to_f32(words[j])
            vals.append(lo)
            vals.append(hi)
        rows.append(vals)
    return rows


def trace_cta(record: Int64, end: bool) -> None:
    """kernels/trace.py's probe, by one thread, into the CTA's int64 record at byte address `record`: the global
    nanosecond timer into word 0 (start) or 1 (end), the SM's cycle counter into word 3 or 4 (cycles over nanoseconds
    give the SM clock while the CTA lived), and with the start the SM it runs on into word 2. Callers put a CTA
    barrier before the end probe, so that the timer is read after every warp's work."""
    cute.arch.inline_ptx("st.global.u64 [{$r0}], {$r1};", read_only_args=[record + (8 if end else 0),
                                                                           cute.arch.globaltimer()])
    cute.arch.inline_ptx("st.global.u64 [{$r0}], {$r1};", read_only_args=[record + (32 if end else 24),
                                                                           cute.arch.clock64()])
    if not end:
        cute.arch.inline_ptx("st.global.u64 [{$r0}], {$r1};", read_only_args=[record + 16, Int64(cute.arch.smid())])


@cute.jit
def traced(trace_addr: cutlass.Constexpr, cta: Int32, tidx: Int32, end: cutlass.Constexpr) -> None:
    """trace_cta for CTA `cta` (its linear index in the grid) by thread 0, if the kernel was compiled with a trace
    buffer (trace_addr != 0; otherwise nothing is emitted); the end probe synchronizes the CTA first."""
    if cutlass.const_expr(trace_addr != 0):
        if cutlass.const_expr(end):
            cute.arch.sync_threads()
        if tidx == 0:
            trace_cta(Int64(trace_addr) + Int64(cta) * RECORD_BYTES, end)
