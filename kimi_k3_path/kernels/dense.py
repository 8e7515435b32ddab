"""`dense_decode`: a dense bf16 projection of a decode batch, y[M, N] = x[M, K] @ W[N, K]^T (fp32 accumulate), in one
launch, on the row dots the MoE block's front already runs: `gemv.gemv_part` on the CUDA cores at one token (split-K
over `gemv_split(K)` warps per row: 4 warps and 2 rows per CTA for in_proj's K = 7168, as the front's down-projection
streams its 64 MB at 3.6 TB/s; one warp a row, 8 rows per CTA, for o_proj's 1536 / 768) and `mma.mma_rows_part` on the
tensor cores from 2 to 64 tokens (16 rows per CTA).

Written for the KDA attention's GEMVs, which ran on cuBLAS; `project` is what the attentions call (this GEMV at one
token, cuBLAS from two), for KDA's in_proj and o_proj and MLA's qkv_a and o_proj. Checked on the H200 by
tests/kimi_k3_path/kernels/test_dense_gpu.py and timed by benchmarks/kimi_k3/bench_dense.py (50 graph replays,
rotated copies; a pure read of the same weight in the same run as the yardstick):
- one token, TP8: in_proj (6288 x 7168, 90 MB) 22.7 us, cuBLAS 26.9, pure read 21.9 (1.04x of it); o_proj 7.6 us,
  cuBLAS 8.6, read 7.1 (1.07x). TP16: in_proj 13.0 us, cuBLAS 17.3, read 12.2 (1.07x); o_proj 6.0 us, cuBLAS 5.7.
- from two tokens the tensor-core form loses to cuBLAS (TP8 in_proj M=2 27.0 vs 26.2 us, M=64 68.0 vs 26.2): each
  16-row CTA rereads all of x from L2 (393 CTAs x 64 tokens x 14 KB at M=64), which the MoE experts' short K hides
  and a 7168-wide K does not. kda.py therefore takes this launch at one token only.

N must be a multiple of 16 for the tensor-core form (a caller pads the weight with zero rows: KDA's in_proj has 6284
rows at TP8 and 3206 at TP16) and of 2 at one token; K a multiple of 32.

Programmatic dependent launch on both sides: launched early behind the launch before (in the KDA layer: AttnRes,
or the recurrent middle before o_proj), it lets the next launch in at once (griddepcontrol.launch_dependents, which
takes effect when the last of its CTAs has started) and waits (griddepcontrol.wait) before its first load of x and
its first store; x is then read by plain loads (ld_fresh_v4), as data a launch still running at this one's start
wrote. Behind a torch or cuBLAS launch, which never triggers early, it starts as any launch would. At one token each
lane's whole weight slice is loaded before the wait (gemv.dot_slice's `wait`), so the resident CTAs stream their rows
while the launch before finishes (measured: docs/design/kimi_k3_kernels.md section 10).
"""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Int32

from .common import BF16_PER_VEC, DEFAULT_WEIGHT_LOAD, WARP
from .front import FRONT_DOWN_SPLIT
from .gemv import SCRATCH_BYTES, WARPS_PER_CTA, alloc_scratch, check_k, gemv_part, token_tile
from .mma import (
    MMA_ROWS,
    alloc_tile_scratch,
    check_mma,
    chunks_in_flight,
    mma_rows_part,
    scratch_bytes,
    uses_tensor_cores,
)
from .router import MAX_TOKENS

MAX_STEPS = 8  # 16-byte steps of a warp's K slice that gemv.dot_slice keeps in flight at once (WORDS_IN_FLIGHT / 4)


def gemv_split(k: int) -> int:
    """Warps sharing a row in the one-token form: the fewest whose K slices are whole 32-lane steps, at most MAX_STEPS
    of them, so that a lane's whole slice is loaded at once (before griddepcontrol.wait); FRONT_DOWN_SPLIT where none
    is. in_proj (K = 7168): 4 warps of 7 steps, 2 rows per CTA. o_proj (K = 1536 at TP8, 768 at TP16): one warp per
    row (6 or 3 steps), 8 rows per CTA; with 4, half or three quarters of the lanes idled on its last step, and each
    CTA held a quarter of the bytes across the wait."""
    vectors = k // BF16_PER_VEC
    for split in (1, 2, FRONT_DOWN_SPLIT):
        if k % (BF16_PER_VEC * WARP * split) == 0 and vectors // split // WARP <= MAX_STEPS:
            return split
    return FRONT_DOWN_SPLIT


def rows_per_gemv_cta(k: int) -> int:
    return WARPS_PER_CTA // gemv_split(k)


def dense_bytes(m: int, n: int, k: int) -> dict[str, int]:
    """Bytes one launch moves from and to DRAM: the weight once, x and y once."""
    return {"weight": n * k * 2, "x": m * k * 2, "y": m * n * 2}


class DenseDecode:
    """One launch of y = x @ W^T for a token tile `mt` (gemv.token_tile): see the module docstring."""

    def __init__(self, n: int, k: int, mt: int):
        if uses_tensor_cores(mt):
            check_mma(n, k, "dense_decode")
        else:
            check_k(k, gemv_split(k), "dense_decode")
            if n % rows_per_gemv_cta(k):
                raise ValueError(f"dense_decode: {n} rows is not a multiple of {rows_per_gemv_cta(k)} (rows per CTA)")
        self.n, self.k, self.mt = n, k, mt

    def ctas(self) -> int:
        return self.n // (MMA_ROWS if uses_tensor_cores(self.mt) else rows_per_gemv_cta(self.k))

    def smem_bytes(self) -> int:
        return scratch_bytes(self.mt) if uses_tensor_cores(self.mt) else SCRATCH_BYTES

    @cute.jit
    def __call__(self, x, w, y, stream: cuda.CUstream):
        self.kernel(x, w, y, x.shape[0]).launch(grid=[self.ctas(), 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1],
                                                smem=self.smem_bytes(), stream=stream, use_pdl=True)

    @cute.kernel
    def kernel(self, x, w, y, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        cute.arch.griddepcontrol_launch_dependents()
        # x is the launch before's output; y may be what it still reads: both after griddepcontrol.wait
        if cutlass.const_expr(uses_tensor_cores(self.mt)):
            cute.arch.griddepcontrol_wait()
            mma_rows_part(x, w, y, alloc_tile_scratch(smem, self.mt), bidx, tidx, m_count, self.k, self.mt,
                          DEFAULT_WEIGHT_LOAD, chunks_in_flight(self.mt), True)
        else:  # the weight slice's loads before the wait (gemv.dot_slice)
            gemv_part(x, w, y, alloc_scratch(smem), bidx, tidx // WARP, tidx % WARP, m_count, self.k,
                      gemv_split(self.k), self.mt, DEFAULT_WEIGHT_LOAD, wait=True)


def fake_args(n: int, k: int, m=None) -> tuple:
    """Fake tensors (a dynamic batch unless given) for compiling DenseDecode without a GPU."""
    from .runtime import dyn, fake, fake_stream

    m = dyn() if m is None else m
    return fake(BFloat16, (m, k)), fake(BFloat16, (n, k)), fake(BFloat16, (m, n)), fake_stream()


def dense_decode(x, w, y, stream) -> None:
    """y [M, N] bf16 = x [M, K] bf16 @ w [N, K]^T bf16 on `stream`, for a decode batch of M = 1..64."""
    from .runtime import compile_cached, cu_stream, expect_all, to_cute

    if x.dim() != 2 or w.dim() != 2:
        raise ValueError(f"dense_decode: x {tuple(x.shape)} and w {tuple(w.shape)}: expected [M, K] and [N, K]")
    (m, k), n = x.shape, w.shape[0]
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"dense_decode: decode batch M={m} must be in 1..{MAX_TOKENS}")
    mt = token_tile(m)
    op = DenseDecode(n, k, mt)  # validates the shape for this tile's form
    expect_all([("x", x, (m, k), "bfloat16"), ("w", w, (n, k), "bfloat16"), ("y", y, (m, n), "bfloat16")])
    fn = compile_cached(("dense", n, k, mt), lambda: (op, fake_args(n, k)))
    fn(to_cute(x, True), to_cute(w), to_cute(y, True), cu_stream(stream))


DENSE_MAX_TOKENS = 1  # this GEMV beats cuBLAS up to here (module docstring)


def project(x, w, y, stream) -> None:
    """y [M, N] = x [M, K] @ w [N, K]^T in bf16 on `stream` (the caller's current stream): dense_decode for
    M <= DENSE_MAX_TOKENS, cuBLAS above."""
    if x.shape[0] <= DENSE_MAX_TOKENS:
        dense_decode(x, w, y, stream)
    else:
        torch.mm(x, w.t(), out=y)
