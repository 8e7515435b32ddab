"""Block AttnRes for a decode batch in one launch: fold this layer's input into the block's prefix, snapshot a
completed block, and mix the depth sources into the sublayer's normed input (`reference.attn_res.attn_res_mix`
after `reference.layers.pre_attention` / `pre_mlp`):

  prefix   keep it, add the previous sublayer's output to it, or start a new block with that output; rounded to
           bf16 as the stream stores it, and written back when it changed
  block    with write_block >= 0, the prefix also becomes blocks[:, write_block]
  score    logit_s = <source_s * res_norm, res_proj> / rms(source_s) for the n completed blocks and the prefix
  mix      softmax over the n + 1 logits, the raw sources mixed by it (fp32)
  out      rms_norm(mix) * out_norm, bf16 (the attention's or the MoE's input)

Why a kernel of its own: the stock-like Triton kernel runs one program per token that takes the n + 1 sources one
after the other (a DRAM round trip and two block reductions each): 11.5-15 us per launch on the H200 (torch profiler,
layer 90, TP8, M = 1 and 64) for 129 KB per token, twice per layer. Here a token is one CTA whose thread t owns hidden
columns 8t..8t+7 of every source (7168 columns: 28 warps), so all of a token's bytes are in flight at once, each
thread's loads issued together; the 2(n + 1) sums a source's score needs meet in two exchanges (a warp
reduce-scatter, then one shared-memory pass that every warp repeats, so the softmax needs no second barrier), and
the output's RMS in one more. The stream, written by the launches before, is read after griddepcontrol.wait; the
weights (res_norm, res_proj, out_norm) are issued before it in the source, but ptxas puts the wait first (SASS).
On the H200 at 9c83758: correct (tests/kimi_k3_path/kernels/test_attn_res_gpu.py, 37 passed); in the layer it took
10.6 us (TP8) and 8.4 us (TP16) off the KDA+MoE layer at M = 1, half the predicted 16-22; alone 6.5-6.7 us at one
token on an H100 (bench.py --breakdown, eager), for 129 KB: one SM's worth of loads and three barriers.

Clusters (CLUSTER CTAs per token; measured in docs/design/kimi_k3_kernels.md section 12): CTA r of a token's thread
block cluster owns the r-th share of the columns (7168 / 4: 224 threads), so the token's loads come from 4 SMs; the
two row-wide sums (the scores' 2(n + 1), then the output's sum of squares) go through distributed shared memory:
each CTA pushes its sums into every CTA's inbox by st.async, counted on that CTA's mbarrier (one per round), and
waits on its own (cluster_sum). The cluster meets once, to know every mbarrier initialized: arrive at the start,
wait once the stream's loads are issued. Before, each sum was a cluster barrier (arrive + wait) with a third before
exit: each arrive's release fence (MEMBAR.ALL.GPU) and each wait's L1 invalidation were on the chain, and the stream
stores had to wait behind the last arrive. Measured (H100, a chain of 16 launches in one CUDA graph, L2-hot,
n = 8): one token 3.84 -> 2.41 us a launch (one CTA of 896 threads: 5.7), 16 tokens 4.61 -> 3.01; and since then the
cluster beats one CTA per token at every batch (32 tokens 4.30 against 5.82, 64: 4.97 against 6.04), where the
barrier form lost 2.5-3 us per site at 64 in the step: clusters at every batch.

Bytes (`attn_res_bytes`) per token: the n + 1 bf16 sources, the input, the prefix and block writes, the output; the
three weight vectors once. 129 KB at n = 8 (layer 90): a floor of 0.03 us per token, so at any M <= 64 the launch is
latency-bound (load round trip, two barriers); what it must beat is the Triton kernel's per-source round trips.
"""

from __future__ import annotations

from enum import Enum

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float32, Int32, Int64

from .common import (
    LOWEST,
    VEC_BYTES,
    WARP,
    after_all_loads,
    bf16_words_to_f32,
    bits_to_f32,
    f32_to_bf16_words,
    lane_butterfly,
    lane_group_sum,
    lane_reduce_scatter,
    ld_act_v4,
    ld_fresh_v4,
    ld_shared_b32,
    mbarrier_try_wait,
    select_f32,
    st_async_cluster_f32,
    st_global_v4_b32,
    tree_sum,
)
from .router import MAX_TOKENS

BF16_PER_VEC = VEC_BYTES // 2
# One vector per thread up to 1024 threads (hidden 8192): the most loads in flight per token. At 7168 (896 threads,
# 72 registers each) ptxas keeps ~100 bytes per thread on the stack (L1): measured against 2 vectors per thread
# (448 threads, 128 registers, 240 bytes of stack) on the CPU's SASS only.
MAX_THREADS = 1024
MAX_SOURCES = 16  # a source's two sums are lanes s and MAX_SOURCES + s of the reduce-scatter (Kimi K3: <= 9)
# CTAs per token (a thread block cluster): each owns hidden / CLUSTER columns, and the two row-wide sums (the scores'
# and the output's RMS) meet in distributed shared memory (measured: docs section 12). One CTA of 896 threads per token
# took 6.5-6.7 us at one token on an H100 (bench.py --breakdown, docs section 9.1) for 129 KB.
CLUSTER = 4
MAX_CLUSTER = 8  # the portable cluster size


class Prefix(Enum):
    """What happens to the block's prefix before the mix."""

    KEEP = "keep"  # the prefix as stored (no input)
    ADD = "add"  # prefix += input (the sublayer before finished inside the block)
    REPLACE = "replace"  # prefix = input (a new block starts with the attention output)


def attn_res_bytes(m: int, hidden: int, blocks: int, prefix: Prefix, write_block: bool) -> dict[str, int]:
    """Bytes one launch moves from and to DRAM for m tokens mixing `blocks` completed blocks and the prefix."""
    row = hidden * 2
    return {
        "sources": m * (blocks + (prefix is not Prefix.REPLACE)) * row,  # the replaced prefix is not read
        "input": m * row * (prefix is not Prefix.KEEP),
        "writes": m * row * ((prefix is not Prefix.KEEP) + write_block),
        "weights": 3 * row,
        "output": m * row,
    }


class AttnResMix:
    """`cluster` CTAs per token, CTA r owning the r-th share of the vectors and its thread t the share's vectors t,
    t + threads, ... (see the module docstring); with cluster > 1 the CTAs of a token form a thread block cluster."""

    def __init__(self, hidden: int, blocks: int, prefix: Prefix, write_block: int, eps: float, out_eps: float,
                 cluster: int = 1):
        if hidden % BF16_PER_VEC or hidden < BF16_PER_VEC:
            raise ValueError(f"AttnResMix: hidden={hidden} must be a positive multiple of {BF16_PER_VEC} (16-byte "
                             "vectors)")
        if not 0 <= blocks < MAX_SOURCES:
            raise ValueError(f"AttnResMix: {blocks} completed blocks; at most {MAX_SOURCES - 1}")
        if write_block >= 0 and write_block < blocks:
            raise ValueError(f"AttnResMix: write_block={write_block} is one of the {blocks} blocks being mixed")
        if eps <= 0.0 or out_eps <= 0.0:
            raise ValueError(f"AttnResMix: eps={eps} and out_eps={out_eps} must be positive")
        if not 1 <= cluster <= MAX_CLUSTER or cluster > hidden // BF16_PER_VEC:
            raise ValueError(f"AttnResMix: cluster={cluster} must be in 1..{MAX_CLUSTER} and at most the "
                             f"{hidden // BF16_PER_VEC} vectors of a row")
        self.hidden, self.blocks, self.prefix, self.write_block = hidden, blocks, prefix, write_block
        self.eps, self.out_eps, self.cluster = eps, out_eps, cluster
        self.vecs = hidden // BF16_PER_VEC
        self.cta_vecs = -(-self.vecs // cluster)  # vectors per CTA (the last CTA may own fewer)
        self.per_thread = -(-self.cta_vecs // MAX_THREADS)
        self.warps = -(-self.cta_vecs // (self.per_thread * WARP))
        self.threads = self.warps * WARP

    def smem_bytes(self) -> int:
        """The warps' reduce-scatter results and squares, the cluster's inbox, its two mbarriers."""
        return (self.warps * 2 * MAX_SOURCES + self.warps + self.cluster * (2 * MAX_SOURCES + 1)) * 4 + 2 * 8 + 64

    @cute.jit
    def __call__(self, prefix, delta, blocks, res_norm, res_proj, out_norm, out, stream: cuda.CUstream):
        launch = self.kernel(prefix, delta, blocks, res_norm, res_proj, out_norm, out)
        if cutlass.const_expr(self.cluster > 1):
            launch.launch(grid=[self.cluster, prefix.shape[0], 1], block=[self.threads, 1, 1],
                          cluster=[self.cluster, 1, 1], smem=self.smem_bytes(), stream=stream, use_pdl=True)
        else:
            launch.launch(grid=[1, prefix.shape[0], 1], block=[self.threads, 1, 1], smem=self.smem_bytes(),
                          stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, prefix, delta, blocks, res_norm, res_proj, out_norm, out):
        tidx, _, _ = cute.arch.thread_idx()
        rank, m, _ = cute.arch.block_idx()  # rank: the CTA's place in its token's cluster (the grid's x is one cluster)
        warp, lane = tidx // WARP, tidx % WARP
        smem = cutlass.memory.SmemAllocator()
        partial = smem.allocate_tensor(Float32, cute.make_layout(self.warps * 2 * MAX_SOURCES), byte_alignment=16)
        squares = smem.allocate_tensor(Float32, cute.make_layout(self.warps), byte_alignment=16)
        # The cluster's exchange: rank r's 2 * MAX_SOURCES score sums, then its output sum of squares, each round
        # completing an mbarrier of its own (cluster_sum).
        inbox = smem.allocate_tensor(Float32, cute.make_layout(self.cluster * (2 * MAX_SOURCES + 1)), byte_alignment=16)
        arrived = smem.allocate_tensor(Int64, cute.make_layout(2), byte_alignment=8)
        if cutlass.const_expr(self.cluster > 1):
            if tidx == 0:
                for r in cutlass.range_constexpr(2):
                    cute.arch.mbarrier_init(arrived.iterator + r, 1)
                cute.arch.mbarrier_init_fence()
                cute.arch.mbarrier_arrive_and_expect_tx(arrived.iterator, self.cluster * 2 * MAX_SOURCES * 4)
                cute.arch.mbarrier_arrive_and_expect_tx(arrived.iterator + 1, self.cluster * 4)
            # Peers may send once every CTA's mbarriers are initialized: the matching wait comes once the stream's
            # loads are issued, so this barrier's latency hides behind theirs.
            cute.arch.cluster_arrive_relaxed()
        # Thread t owns vectors first + t, first + t + threads, ... of the CTA's share; past its end (hidden not a
        # multiple of the shares) it rereads the row's last vector and counts nothing.
        first = rank * self.cta_vecs
        owned = cutlass.min(self.cta_vecs, self.vecs - first)
        active = [(tidx + i * self.threads - owned) >> 31 for i in range(self.per_thread)]  # -1: owned, 0: past
        cols = [Int64(cutlass.min(first + tidx + i * self.threads, self.vecs - 1)) * VEC_BYTES
                for i in range(self.per_thread)]
        row_bytes = self.hidden * 2

        def load(base: Int64, fresh: bool = True) -> list:
            words = []
            for col in cols:
                words += list(ld_fresh_v4(base + col) if fresh else ld_act_v4(base + col))
            return words

        def store(base: Int64, words: list) -> None:
            for i, col in enumerate(cols):
                st_global_v4_b32(active[i], base + col, words[4 * i : 4 * i + 4])

        # Sources stay packed bf16 (4 registers per vector, unpacked where used).
        norm_words = load(res_norm.iterator.toint(), fresh=False)
        proj_words = load(res_proj.iterator.toint(), fresh=False)
        gamma_words = load(out_norm.iterator.toint(), fresh=False)
        cute.arch.griddepcontrol_launch_dependents()  # the next launch (e.g. in_proj, dense.py) waits for us
        cute.arch.griddepcontrol_wait()  # the stream and the input are the previous launches' outputs

        token = Int64(m) * row_bytes
        block_base = blocks.iterator.toint() + Int64(m) * (blocks.shape[1] * row_bytes)
        stream_writes = []  # the prefix (and block) writes
        sources = [load(block_base + b * row_bytes) for b in range(self.blocks)]
        if cutlass.const_expr(self.prefix is not Prefix.REPLACE):
            stored = load(prefix.iterator.toint() + token)
        if cutlass.const_expr(self.prefix is not Prefix.KEEP):
            given_words = load(delta.iterator.toint() + token)
        if cutlass.const_expr(self.cluster > 1):
            cute.arch.cluster_wait()  # while the loads are in flight: every peer's mbarriers are initialized
        if cutlass.const_expr(self.prefix is Prefix.KEEP):
            sources.append(stored)
        else:
            given = bf16_words_to_f32(given_words)
            if cutlass.const_expr(self.prefix is Prefix.ADD):
                given = [a + b for a, b in zip(bf16_words_to_f32(stored), given)]
            # The stream is bf16: score and mix the prefix as it is stored.
            words = f32_to_bf16_words(given)
            sources.append(words)
            stream_writes.append((prefix.iterator.toint() + token, words))
            if cutlass.const_expr(self.write_block >= 0):
                stream_writes.append((block_base + self.write_block * row_bytes, words))
        for address, words in stream_writes:
            store(address, words)
        count = len(sources)

        # Lane s of the reduce-scatter gets source s's sum of squares, lane MAX_SOURCES + s its dot with the query.
        query = [a * b for a, b in zip(bf16_words_to_f32(norm_words), bf16_words_to_f32(proj_words))]
        sums = [Float32(0.0)] * (2 * MAX_SOURCES)
        for s, words in enumerate(sources):
            values = bf16_words_to_f32(words)
            for i in cutlass.range_constexpr(self.per_thread):
                sq, dot = Float32(0.0), Float32(0.0)
                for j in cutlass.range_constexpr(i * BF16_PER_VEC, (i + 1) * BF16_PER_VEC):
                    sq = sq + values[j] * values[j]
                    dot = dot + values[j] * query[j]
                sums[s] = sums[s] + select_f32(active[i], sq, Float32(0.0))
                sums[MAX_SOURCES + s] = sums[MAX_SOURCES + s] + select_f32(active[i], dot, Float32(0.0))
        # Written at a lane that also depends on out_norm's words: ptxas would otherwise sink that load to its use
        # at the very end, one more round trip on the chain (common.after_all_loads).
        slot = after_all_loads(lane, gamma_words, m >> 7)
        partial[warp * 2 * MAX_SOURCES + slot] = lane_reduce_scatter(sums, lane)
        cute.arch.sync_threads()
        total = tree_sum([partial[w * 2 * MAX_SOURCES + lane] for w in range(self.warps)])
        if cutlass.const_expr(self.cluster > 1):
            total = self.cluster_sum(inbox.iterator.toint(), arrived.iterator.toint(), rank, 2 * MAX_SOURCES, lane,
                                     total, warp == 0)
        dot = cute.arch.shuffle_sync_down(total, MAX_SOURCES)
        logit = dot * cute.math.rsqrt(total * Float32(1.0 / self.hidden) + Float32(self.eps))
        in_use = (lane - count) >> 31
        logit = select_f32(in_use, logit, Float32(LOWEST))
        best = lane_butterfly(logit, (1, 2, 4, 8, 16), cute.arch.fmax)
        weight = select_f32(in_use, cute.math.exp(logit - best), Float32(0.0))
        weight = weight * cute.arch.rcp_approx(lane_group_sum(weight, WARP))

        mixed = [Float32(0.0)] * (BF16_PER_VEC * self.per_thread)
        for s, words in enumerate(sources):
            p = cute.arch.shuffle_sync(weight, s)
            mixed = [acc + p * v for acc, v in zip(mixed, bf16_words_to_f32(words))]
        sq = Float32(0.0)
        for i in cutlass.range_constexpr(self.per_thread):
            part = Float32(0.0)
            for v in mixed[i * BF16_PER_VEC : (i + 1) * BF16_PER_VEC]:
                part = part + v * v
            sq = sq + select_f32(active[i], part, Float32(0.0))
        sq = lane_group_sum(sq, WARP)
        if lane == 0:
            squares[warp] = sq
        cute.arch.sync_threads()
        warp_sq = Float32(0.0)
        if lane < self.warps:
            warp_sq = squares[lane]
        row_sq = lane_group_sum(warp_sq, WARP)
        if cutlass.const_expr(self.cluster > 1):
            row_sq = self.cluster_sum((inbox.iterator + self.cluster * 2 * MAX_SOURCES).toint(),
                                      (arrived.iterator + 1).toint(), rank, 1, Int32(0), row_sq, tidx == 0)
        rstd = cute.math.rsqrt(row_sq * Float32(1.0 / self.hidden) + Float32(self.out_eps))
        store(out.iterator.toint() + token,
              f32_to_bf16_words([v * rstd * g for v, g in zip(mixed, bf16_words_to_f32(gamma_words))]))

    @cute.jit
    def cluster_sum(self, inbox: Int32, arrived: Int32, rank: Int32, slots: cutlass.Constexpr, slot: Int32,
                    value: Float32, writer) -> Float32:
        """The sum over the token's cluster of `value` at `slot` (< slots) of this round: each writer pushes its
        CTA's value into slot rank * slots + slot of every CTA's `inbox` (shared addresses) by st.async, counted on
        that CTA's mbarrier `arrived`, and every thread waits for its own CTA's mbarrier, then adds what came in.
        No cluster barrier on the chain (their release fence, MEMBAR.ALL.GPU, and the acquire's L1 invalidation were
        in each of the three the cluster met at before), and no CTA may leave early: each one exits only after
        everything sent to it arrived. Every thread calls it, after the cluster_wait that follows the kernel's setup."""
        if writer:
            for r in cutlass.range_constexpr(self.cluster):
                st_async_cluster_f32(inbox + (rank * slots + slot) * 4, value, arrived, Int32(r))
        done = mbarrier_try_wait(arrived, Int32(0))
        while done == 0:
            done = mbarrier_try_wait(arrived, Int32(0))
        return tree_sum([bits_to_f32(ld_shared_b32(inbox + (r * slots + slot) * 4)) for r in range(self.cluster)])


def fake_args(hidden: int, max_blocks: int, m=None) -> tuple:
    """Fake tensors (a dynamic batch unless given) for compiling AttnResMix without a GPU."""
    from .runtime import dyn, fake, fake_stream

    m = dyn() if m is None else m
    row = fake(BFloat16, (m, hidden))
    return (row, fake(BFloat16, (m, hidden)), fake(BFloat16, (m, max_blocks, hidden)),
            fake(BFloat16, (hidden,)), fake(BFloat16, (hidden,)), fake(BFloat16, (hidden,)),
            fake(BFloat16, (m, hidden)), fake_stream())


def attn_res_decode(prefix, delta, blocks, num_blocks: int, write_block: int, res_norm, res_proj, out_norm, out,
                    eps: float, out_eps: float, stream, replace_prefix: bool = False,
                    cluster: int | None = None) -> None:
    """The AttnRes site (module docstring) on `stream` for M = 1..64 tokens: prefix [M, H] bf16 (updated in place
    unless delta is None), delta [M, H] bf16 or None, blocks [M, B, H] bf16 (blocks[:, write_block] written when
    write_block >= 0), mixing blocks[:, :num_blocks] and the prefix with res_norm, res_proj, out_norm [H] bf16 into
    out [M, H] bf16. replace_prefix: the prefix becomes delta instead of prefix + delta. The arguments of
    benchmarks/kimi_k3/stock.attn_res, which this replaces, plus out, stream and replace_prefix. cluster: CTAs per
    token (default CLUSTER; at most one per 16-byte vector of a row; 1: one CTA per token, no cluster)."""
    from .runtime import compile_cached, cu_stream, expect_all, to_cute

    if prefix.dim() != 2 or blocks.dim() != 3:
        raise ValueError(f"attn_res_decode: prefix {tuple(prefix.shape)} and blocks {tuple(blocks.shape)}: expected "
                         "[M, H] and [M, B, H]")
    m, hidden = prefix.shape
    max_blocks = blocks.shape[1]
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"attn_res_decode: decode batch M={m} must be in 1..{MAX_TOKENS}")
    if num_blocks > max_blocks or write_block >= max_blocks:
        raise ValueError(f"attn_res_decode: num_blocks={num_blocks} / write_block={write_block} outside the "
                         f"{max_blocks} blocks of the stream")
    if replace_prefix and delta is None:
        raise ValueError("attn_res_decode: replace_prefix needs delta (the new block's first output)")
    mode = Prefix.KEEP if delta is None else (Prefix.REPLACE if replace_prefix else Prefix.ADD)
    if cluster is None:
        cluster = min(CLUSTER, hidden // BF16_PER_VEC)
    op = AttnResMix(hidden, num_blocks, mode, write_block, eps, out_eps, cluster)  # validates the rest
    given = prefix if delta is None else delta
    expect_all([
        ("prefix", prefix, (m, hidden), "bfloat16"),
        ("delta", given, (m, hidden), "bfloat16"),
        ("blocks", blocks, (m, max_blocks, hidden), "bfloat16"),
        ("res_norm", res_norm, (hidden,), "bfloat16"),
        ("res_proj", res_proj, (hidden,), "bfloat16"),
        ("out_norm", out_norm, (hidden,), "bfloat16"),
        ("out", out, (m, hidden), "bfloat16"),
    ])

    def build():
        return op, fake_args(hidden, max_blocks)

    fn = compile_cached(("attn_res", hidden, max_blocks, num_blocks, mode, write_block, eps, out_eps, cluster), build)
    fn(to_cute(prefix, True), to_cute(given, True), to_cute(blocks, True), to_cute(res_norm), to_cute(res_proj),
       to_cute(out_norm), to_cute(out, True), cu_stream(stream))
