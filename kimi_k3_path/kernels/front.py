"""Launch 1 of the latent-MoE block: the three consumers of x [M, H] in one grid (moe.py has the whole block).

  router CTAs     logits, sigmoid + bias top-k, renormalized weights, the expert plan (router.py)
  down CTAs       x_lat = x @ W_down^T, stored fp16 for the experts
  shared CTAs     a_sh = situ_glu(x @ W_sh13^T) (one token: in GEMM2's grid instead, gemm2_one_token.py)

Router CTAs come first so that the top-k tail overlaps the other streams. From 2 tokens (token tile >= 16) the
down-projection and shared CTAs run on the tensor cores (16 rows each, mma.py).

One token: launched early (programmatic dependent launch) behind a launch that lets it in (in the layer, AttnRes), each
CTA issues its weight slice's loads, then waits (griddepcontrol.wait) for x (gemv.dot_slice); nothing it writes or
polls is touched before the wait."""

from __future__ import annotations

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass import BFloat16, Float16, Float32, Int32

from .common import DEFAULT_WEIGHT_LOAD, WARP, ctas_per_sm_bound, traced
from .gemv import WARPS_PER_CTA, alloc_scratch, check_k, gemv_part, token_tile
from .mma import (
    MMA_ROWS,
    alloc_tile_scratch,
    check_mma,
    chunks_in_flight,
    k_groups,
    mma_rows_part,
    scratch_bytes,
    uses_tensor_cores,
)
from .router import (
    MAX_TOKENS,
    ROUTER_TAIL_CTAS,
    ExpertPlan,
    RouterOutputs,
    RouterShape,
    alloc_router_smem,
    check_router,
    router_part,
    router_smem_bytes,
    router_sync_words,
)
from .shared import check_shared, mma_shared_part, shared_ctas, shared_part
from .trace import trace_address


# At least this much shared memory per front CTA, so that no more than 3 share an SM (4 x (57 + 1 reserved) KB >
# 228 KB) and L1 keeps room for x, which every CTA rereads. At M = 4 the front needs only 64 registers, and with 4 CTAs
# per SM L1 kept ~28 KB for 57 KB of x: the front took 58 us at M = 4 against 41 at M = 8 (TP8).
FRONT_MIN_SMEM_BYTES = 57 * 1024
# At one token, CTAs per SM: the launch bounds the front's registers to 64 (the down-projection needs 64; the batch
# selection took the front to 78) and its CTAs carry only the one-token selection's 9.8 KB of shared memory
# (router.one_token_select), so 4 share an SM with L1 192 KB: the front alone ~1.1 us faster than at 2 CTAs per SM
# (L1 92 KB), which needed the selection spread over the CTA's warps; 4 CTAs beside the batch selection's 45.7 KB
# (L1 ~60 KB) were ~3 us slower (kimi_k3_kernels.md §3.1).
ONE_TOKEN_FRONT_CTAS_PER_SM = 4
# Warps sharing a down-projection row in the one-token front (2 rows per CTA): 7 full 16-byte steps per warp, and the
# front alone measured 1.5-2 us faster than with 8 (kimi_k3_kernels.md §6).
FRONT_DOWN_SPLIT = 4
# From 2 tokens, tiles of 16 rows per down-projection and shared CTA (mma.py): each CTA reads all of x, M x H, from L2
# for its rows. Two measured (H100, the front alone, TP8 / TP16): 16 tokens 48.3 -> 45.7 us / 45.3 -> 42.7, 64 tokens
# 62.0 -> 59.0 / 60.7 -> 55.8; four: 74 / 73 and 98 / 92 (a quarter of the CTAs, too few bytes in flight). The
# router's CTAs keep one (their count is part of the selection's hand-off).
FRONT_ROW_TILES = 2


def front_chunks_in_flight(mt: int, router_mma: bool) -> int:
    """K chunks in flight per warp in the front's tensor-core parts (mma.mma_segment): as mma.chunks_in_flight, but
    one with a 16-token tile when the router is on the tensor cores (16 tokens): there the front alone measured 41.8
    us with 1 against 48.7 with 2; with the router on the CUDA cores 1 lost (8 tokens) or was ~1% slower (2, 4)."""
    return 1 if router_mma and mt <= 16 else chunks_in_flight(mt)


class FrontKernel:
    """The three consumers of x in one launch: the first CTAs route, the next ones project down, the last ones compute
    the shared experts' activation. Router CTAs come first so the top-k tail overlaps the other streams. From 2
    tokens (token tile mt >= 16) the down-projection and shared CTAs run on the tensor cores (row_tiles tiles of 16
    rows each, mma.py). The router's logits (fp32 sums of bf16 products) come from one CTA per expert (two at one
    token) on the CUDA cores in a tile of router_mt <= 8 tokens, or with router_mma (dispatch.py: from 16 tokens) from
    one CTA per 16 experts on the tensor cores in the front's tile, where every CTA then reads x once for all tokens
    instead of once per 8."""

    def __init__(self, experts: int, hidden: int, latent: int, shared_inter: int, top_k: int, scaling: float, mt: int,
                 router_mt: int, router_tail_ctas: int = ROUTER_TAIL_CTAS, router_mma: bool = False,
                 shared: bool = True, trace_addr: int = 0, row_tiles: int = FRONT_ROW_TILES):
        self.row_tiles = row_tiles if uses_tensor_cores(mt) else 1
        check_router(experts, hidden, top_k)
        check_shared(shared_inter, hidden, mt, row_tiles=self.row_tiles)
        check_k(hidden, FRONT_DOWN_SPLIT, "FrontKernel (down-projection)")
        if uses_tensor_cores(mt):
            check_mma(latent, hidden, "FrontKernel (down-projection)")
            k_groups(self.row_tiles)
            rows_per_cta = MMA_ROWS * self.row_tiles
        else:
            rows_per_cta = WARPS_PER_CTA // FRONT_DOWN_SPLIT
        if latent % rows_per_cta:
            raise ValueError(f"FrontKernel: latent={latent} is not a multiple of {rows_per_cta}")
        self.e, self.h, self.l, self.s, self.k, self.scaling, self.mt = (
            experts, hidden, latent, shared_inter, top_k, scaling, mt)
        if router_mma and not uses_tensor_cores(mt):
            raise ValueError(f"FrontKernel: router_mma needs the tensor-core token tile (mt={mt})")
        self.in_flight = front_chunks_in_flight(mt, router_mma) if uses_tensor_cores(mt) else 0
        self.router = RouterShape(experts, hidden, top_k, scaling, router_mt, router_tail_ctas,
                                  mt if router_mma else 0, self.in_flight)
        self.router_ctas = self.router.ctas
        self.down_ctas = latent // rows_per_cta
        self.shared_ctas = shared_ctas(shared_inter, mt, row_tiles=self.row_tiles) if shared else 0
        self.trace_addr = trace_addr

    def ctas(self) -> int:
        return self.router_ctas + self.down_ctas + self.shared_ctas

    def one_token(self) -> bool:
        return self.router.one_token

    def smem_bytes(self) -> int:
        if self.one_token():
            return router_smem_bytes(self.e, self.k, one_token=True)
        needed = router_smem_bytes(self.e, self.k) + (scratch_bytes(self.mt) if uses_tensor_cores(self.mt) else 0)
        return max(needed, FRONT_MIN_SMEM_BYTES)

    def occupancy_bound(self) -> dict:
        """Launch options: at one token ONE_TOKEN_FRONT_CTAS_PER_SM."""
        return ctas_per_sm_bound(ONE_TOKEN_FRONT_CTAS_PER_SM) if self.one_token() else {}

    @cute.jit
    def __call__(self, x, w_router, bias, logits, sync, ids, weights, n_active, slot_expert, slot_count,
                 slot_pairs, w_down, x_lat, w_sh13, a_sh, stream: cuda.CUstream):
        self.kernel(x, w_router, bias, logits, sync, ids, weights, n_active, slot_expert, slot_count, slot_pairs,
                    w_down, x_lat, w_sh13, a_sh, x.shape[0]).launch(
            grid=[self.ctas(), 1, 1], block=[WARPS_PER_CTA * WARP, 1, 1],
            smem=self.smem_bytes(), stream=stream, use_pdl=self.one_token(), **self.occupancy_bound(),
        )

    @cute.kernel
    def kernel(self, x, w_router, bias, logits, sync, ids, weights, n_active, slot_expert, slot_count, slot_pairs,
               w_down, x_lat, w_sh13, a_sh, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        traced(self.trace_addr, bidx, tidx, False)
        smem = cutlass.memory.SmemAllocator()
        state = alloc_router_smem(smem, self.e, self.k, self.one_token())
        scratch = alloc_scratch(smem)
        tiles_scratch = alloc_tile_scratch(smem, self.mt) if cutlass.const_expr(uses_tensor_cores(self.mt)) else None
        warp, lane = tidx // WARP, tidx % WARP
        first_down = self.router_ctas
        first_shared = self.router_ctas + self.down_ctas
        if bidx < first_down:
            router_part(x, w_router, bias, RouterOutputs(logits, sync, ids, weights),
                        ExpertPlan(n_active, slot_expert, slot_count, slot_pairs), state, scratch, tiles_scratch, bidx,
                        tidx, m_count, self.router)
        elif bidx < first_shared:
            if cutlass.const_expr(uses_tensor_cores(self.mt)):
                mma_rows_part(x, w_down, x_lat, tiles_scratch, bidx - first_down, tidx, m_count,
                              self.h, self.mt, DEFAULT_WEIGHT_LOAD, self.in_flight, False, self.row_tiles)
            else:
                gemv_part(x, w_down, x_lat, scratch, bidx - first_down, warp, lane, m_count, self.h, FRONT_DOWN_SPLIT,
                          self.mt, DEFAULT_WEIGHT_LOAD, wait=self.one_token())
        else:
            if cutlass.const_expr(uses_tensor_cores(self.mt)):
                mma_shared_part(x, w_sh13, a_sh, tiles_scratch, bidx - first_shared,
                                tidx, m_count, self.s, self.h, self.mt, self.in_flight, self.row_tiles)
            else:
                shared_part(x, w_sh13, a_sh, scratch, bidx - first_shared, warp, lane, m_count, self.s,
                            self.h, self.mt)
        traced(self.trace_addr, bidx, tidx, True)


def front(x, w, ws, m: int, stream, router_mma: bool, shared: bool) -> None:
    """Launch 1 of the block (see FrontKernel) on `stream` for a batch of m tokens (x [m, H] bf16; w: the block's
    moe.MoeKernelWeights, ws its moe.MoeWorkspace): router_mma puts the router's logits on the tensor cores (from 16
    tokens: dispatch.py); shared False leaves out the shared experts' CTAs (a_sh computed in GEMM2's grid)."""
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    e, h, lat, s, k = w.experts, w.hidden, w.latent, w.shared_intermediate, w.top_k
    expect("x", x, (m, h), "bfloat16")
    mt = token_tile(m)
    router_mt = token_tile(m, tensor_cores=False)

    def build():
        md = dyn()
        args = (
            fake(BFloat16, (md, h)), fake(BFloat16, (e, h)), fake(Float32, (e,)), fake(Float32, (md, e)),
            fake(Int32, (router_sync_words(e),)), fake(Int32, (md, k)), fake(Float32, (md, k)),
            fake(Int32, (1,)), fake(Int32, (e,)), fake(Int32, (e,)), fake(Int32, (e, MAX_TOKENS)),
            fake(BFloat16, (lat, h)), fake(Float16, (md, lat)), fake(BFloat16, (2 * s, h)), fake(BFloat16, (md, s)),
            fake_stream(),
        )
        return FrontKernel(*shape, trace_addr=trace), args

    shape = (e, h, lat, s, k, w.routed_scaling_factor, mt, router_mt, ROUTER_TAIL_CTAS, router_mma, shared)
    trace = trace_address("front", FrontKernel(*shape).ctas())
    key = ("moe_front", *shape, trace)
    fn = compile_cached(key, build)
    fn(
        to_cute(x, True), to_cute(w.router), to_cute(w.router_bias), to_cute(ws.logits[:m], True),
        to_cute(ws.router_sync), to_cute(ws.ids[:m], True), to_cute(ws.weights[:m], True),
        *(to_cute(t) for t in ws.plan), to_cute(w.down), to_cute(ws.x_lat[:m], True), to_cute(w.shared13),
        to_cute(ws.a_sh[:m], True), cu_stream(stream),
    )
