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
two row-wide sums (the scores' 2(n + 1), then the output's sum of squares) go through distributed shared memory: each
CTA writes its sums to its shared memory, the cluster meets at a barrier, every thread reads the sums of every CTA
(mapa + ld.shared::cluster). A third cluster barrier keeps every CTA resident until the others have read its shared
memory; the global stores (prefix, block, output) come after that barrier's arrive, whose release (MEMBAR.ALL.GPU)
would otherwise wait for them. Predicted: 6.5 us -> 3-4 at one token (a quarter of the loads per SM, cluster barriers
~0.5 us each); the step gained ~1-2.5 us per site (H100, TP8, one token), 1.5-2 us up to 16 tokens, and lost 2.5-3 us
per site at 64: dispatch.attention_forms clusters up to 16 tokens, one CTA per token above.

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
    f32_to_bf16_words,
    lane_butterfly,
    lane_group_sum,
    lane_reduce_scatter,
    ld_act_v4,
    ld_cluster_f32,
    ld_fresh_v4,
    select_f32,
    st_global_v4_b32,
    st_shared_f32,
)
from .dispatch import attention_forms
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
        """The warps' reduce-scatter results and squares, then the CTA's sums that the cluster reads."""
        return (self.warps * 2 * MAX_SOURCES + self.warps + 2 * MAX_SOURCES + 1) * 4 + 64

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
        cta_sums = smem.allocate_tensor(Float32, cute.make_layout(2 * MAX_SOURCES + 1), byte_alignment=16)
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
        # The prefix (and block) writes: at once in one CTA per token; in a cluster after its last barrier, whose
        # arrive waits for this thread's outstanding global stores (MEMBAR.ALL.GPU in its SASS).
        stream_writes = []
        sources = [load(block_base + b * row_bytes) for b in range(self.blocks)]
        if cutlass.const_expr(self.prefix is Prefix.KEEP):
            sources.append(load(prefix.iterator.toint() + token))
        else:
            given = bf16_words_to_f32(load(delta.iterator.toint() + token))
            if cutlass.const_expr(self.prefix is Prefix.ADD):
                old = bf16_words_to_f32(load(prefix.iterator.toint() + token))
                given = [a + b for a, b in zip(old, given)]
            # The stream is bf16: score and mix the prefix as it is stored.
            words = f32_to_bf16_words(given)
            sources.append(words)
            stream_writes.append((prefix.iterator.toint() + token, words))
            if cutlass.const_expr(self.write_block >= 0):
                stream_writes.append((block_base + self.write_block * row_bytes, words))
        if cutlass.const_expr(self.cluster == 1):
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
        total = Float32(0.0)
        for w in cutlass.range_constexpr(self.warps):
            total = total + partial[w * 2 * MAX_SOURCES + lane]
        if cutlass.const_expr(self.cluster > 1):
            total = self.cluster_sum((cta_sums.iterator + lane).toint(), total, warp == 0)
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
            row_sq = self.cluster_sum((cta_sums.iterator + 2 * MAX_SOURCES).toint(), row_sq, tidx == 0)
        rstd = cute.math.rsqrt(row_sq * Float32(1.0 / self.hidden) + Float32(self.out_eps))
        if cutlass.const_expr(self.cluster > 1):
            cute.arch.cluster_arrive()  # our shared memory was read for the last time: the cluster may exit
            for address, words in stream_writes:
                store(address, words)
        store(out.iterator.toint() + token,
              f32_to_bf16_words([v * rstd * g for v, g in zip(mixed, bf16_words_to_f32(gamma_words))]))
        if cutlass.const_expr(self.cluster > 1):
            cute.arch.cluster_wait()  # no CTA leaves while another may still read its shared memory

    @cute.jit
    def cluster_sum(self, address: Int32, value: Float32, writer) -> Float32:
        """The sum over the token's cluster of `value` (this CTA's; the writers hold it): a writer stores it at shared
        `address`, the cluster meets at a barrier (release / acquire: the stores are visible after it), and each
        thread reads that address in every CTA of the cluster (ld.shared::cluster). Every thread calls it."""
        if writer:
            st_shared_f32(address, value)
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        total = Float32(0.0)
        for r in cutlass.range_constexpr(self.cluster):
            total = total + ld_cluster_f32(address, Int32(r))
        return total


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
    token (default: CLUSTER where dispatch.attention_forms clusters the batch, else 1; at most one per 16-byte vector
    of a row)."""
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
        cluster = min(CLUSTER, hidden // BF16_PER_VEC) if attention_forms(m).attn_res_clustered else 1
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
