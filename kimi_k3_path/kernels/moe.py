"""`latent_moe_decode`: the whole latent-MoE block of one TP rank for a decode batch (M <= 64), in 4 launches on
the caller's stream, with no host synchronization and no allocation, so it can be captured in a CUDA graph:

  1 front           one grid, three CTA ranges over the same input x:                    (router, W_down, W_sh13)
                      router: logits, sigmoid + bias top-k, weights, expert plan (router.py says which CTAs)
                      down-projection x_lat = x @ W_down^T (stored fp16 for the experts)
                      shared experts' a_sh = situ_glu(x @ W_sh13^T) (one token: in GEMM2's grid instead)
  2 experts GEMM1   a[pair] = situ_glu(x_lat[t] @ w13[e]^T); y_lat = 0                    (active experts' w13)
                      (up to 4 tokens: on the CUDA cores, every weight load of a lane in flight at once and
                      held across the slot's tokens, x_lat from shared memory; experts.ExpertsGemm1Held;
                      one token: y_lat left alone)
  3 experts GEMM2   y_lat[t] += w * a[pair] @ w2[e]^T; last CTAs: normed = rms_norm(y_lat) (active experts' w2)
                      (one token: each CTA owns its rows for all slots, writes y * gamma and partial sums
                      of y^2, no last CTAs; experts.ExpertsGemm2OneToken)
                      launched while GEMM1 drains (programmatic dependent launch); one token: plus the shared
                      experts' a_sh, whose CTAs need no wait (moe.ONE_TOKEN_SHARED_IN_GEMM2)
  4 finalize        out = normed @ W_up^T + a_sh @ W_sh2^T                                 (W_up, W_sh2)
                      (one token: the W_up term times rsqrt(sum of the partial sums / L + eps))
                      launched while GEMM2 runs; waits for it before its first activation load, its first
                      weights already in flight (one token: copied into shared memory, finalize.FinalizeStreamed)

Weights are prepared once (`prepare_weights`); the workspace is allocated once per device (`MoeWorkspace`) for the
largest batch and sliced per call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
from cutlass import BFloat16, Float16, Float32, Int32

from .common import DEFAULT_WEIGHT_LOAD, WARP, ctas_per_sm_bound, kernel_fp4_bytes, traced
from .experts import (
    ONE_TOKEN_ROWS,
    experts_gemm1_situ,
    experts_gemm2_combine,
    experts_gemm2_one_token,
    held_gemm1_ctas,
)
from .finalize import finalize, finalize_streamed
from .gemv import WARPS_PER_CTA, alloc_scratch, check_k, gemv_part, token_tile
from .mma import (
    MMA_ROWS,
    alloc_tile_scratch,
    check_mma,
    chunks_in_flight,
    mma_rows_part,
    scratch_bytes,
    uses_tensor_cores,
)
from .router import (
    MAX_TOKENS,
    ROUTER_TAIL_CTAS,
    alloc_router_smem,
    check_router,
    one_token_select,
    router_ctas,
    router_part,
    router_smem_bytes,
    router_sync_words,
    unset_logits,
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
# From this many tokens the front's router logits run on the tensor cores (FrontKernel, router_mma): they won at 16,
# 32 and 64 tokens and lost at 2 and 8 (read, not measured: 56 CTAs of 16 experts each have 14 load round trips per
# warp before the top-k can start, where 896 one-expert CTAs finish early and one 8-token pass reads x once).
ROUTER_MMA_FROM_TOKENS = 16
# At one token the shared experts' gate_up runs in GEMM2's grid rather than the front's (ExpertsGemm2OneToken with
# shared_inter): its 11-22 MB stream while GEMM1 drains (block -0.5 us TP8, -1.1 TP16 when measured); a probe sets it
# False to measure the front's form.
ONE_TOKEN_SHARED_IN_GEMM2 = True
# The one-token finalize as persistent CTAs streaming their weights through shared memory with L2's evict_first
# policy (finalize.FinalizeStreamed) instead of one CTA per row pair holding them in registers (Finalize): block
# -1.8 us TP8, -1.5 TP16 when measured; a probe sets it False to measure the held form.
ONE_TOKEN_FINALIZE_STREAMED = True
# Resident CTAs per SM of the one-token GEMM1 (experts.ExpertsGemm1Held: <= 64 registers, 256 threads; a CPU test
# checks the registers).
ONE_TOKEN_GEMM1_CTAS_PER_SM = 4


def front_chunks_in_flight(mt: int, router_mma: bool) -> int:
    """K chunks in flight per warp in the front's tensor-core parts (mma.mma_segment): as mma.chunks_in_flight, but
    one with a 16-token tile when the router is on the tensor cores (16 tokens): there the front alone measured 41.8
    us with 1 against 48.7 with 2; with the router on the CUDA cores 1 lost (8 tokens) or was ~1% slower (2, 4)."""
    return 1 if router_mma and mt <= 16 else chunks_in_flight(mt)


class FrontKernel:
    """The three consumers of x in one launch: the first CTAs route, the next ones project down, the last ones compute
    the shared experts' activation. Router CTAs come first so the top-k tail overlaps the other streams. From 2
    tokens (token tile mt >= 16) the down-projection and shared CTAs run on the tensor cores (16 rows each, mma.py).
    The router's logits (fp32 sums of bf16 products) come from one CTA per expert (two at one token) on the CUDA
    cores in a tile of router_mt <= 8 tokens, or with router_mma (from ROUTER_MMA_FROM_TOKENS) from one CTA per 16
    experts on the tensor cores in the front's tile, where every CTA then reads x once for all tokens instead of once
    per 8."""

    def __init__(self, experts: int, hidden: int, latent: int, shared_inter: int, top_k: int, scaling: float, mt: int,
                 router_mt: int, router_tail_ctas: int = ROUTER_TAIL_CTAS, router_mma: bool = False,
                 shared: bool = True, trace_addr: int = 0):
        check_router(experts, hidden, top_k)
        check_shared(shared_inter, hidden, mt)
        check_k(hidden, FRONT_DOWN_SPLIT, "FrontKernel (down-projection)")
        if uses_tensor_cores(mt):
            check_mma(latent, hidden, "FrontKernel (down-projection)")
            rows_per_cta = MMA_ROWS
        else:
            rows_per_cta = WARPS_PER_CTA // FRONT_DOWN_SPLIT
        if latent % rows_per_cta:
            raise ValueError(f"FrontKernel: latent={latent} is not a multiple of {rows_per_cta}")
        self.e, self.h, self.l, self.s, self.k, self.scaling, self.mt = (
            experts, hidden, latent, shared_inter, top_k, scaling, mt)
        if router_mma and not uses_tensor_cores(mt):
            raise ValueError(f"FrontKernel: router_mma needs the tensor-core token tile (mt={mt})")
        self.router_mt, self.router_tail_ctas = router_mt, router_tail_ctas
        self.router_mma_mt = mt if router_mma else 0
        self.router_ctas = router_ctas(experts, self.router_mma_mt, router_mt)
        self.in_flight = front_chunks_in_flight(mt, router_mma) if uses_tensor_cores(mt) else 0
        self.down_ctas = latent // rows_per_cta
        self.shared_ctas = shared_ctas(shared_inter, mt) if shared else 0
        self.trace_addr = trace_addr

    def ctas(self) -> int:
        return self.router_ctas + self.down_ctas + self.shared_ctas

    def one_token(self) -> bool:
        return one_token_select(self.router_mt, self.router_mma_mt)

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
            smem=self.smem_bytes(), stream=stream, **self.occupancy_bound(),
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
            router_part(x, w_router, bias, logits, sync, ids, weights, n_active, slot_expert, slot_count,
                        slot_pairs, state, scratch, bidx, tidx, m_count, self.e, self.h, self.k, self.scaling,
                        self.router_mt, self.router_tail_ctas, self.router_mma_mt, tiles_scratch, self.in_flight)
        elif bidx < first_shared:
            if cutlass.const_expr(uses_tensor_cores(self.mt)):
                mma_rows_part(x, w_down, x_lat, tiles_scratch, bidx - first_down, tidx, m_count,
                              self.h, self.mt, DEFAULT_WEIGHT_LOAD, self.in_flight)
            else:
                gemv_part(x, w_down, x_lat, scratch, bidx - first_down, warp, lane, m_count, self.h, FRONT_DOWN_SPLIT,
                          self.mt, DEFAULT_WEIGHT_LOAD)
        else:
            if cutlass.const_expr(uses_tensor_cores(self.mt)):
                mma_shared_part(x, w_sh13, a_sh, tiles_scratch, bidx - first_shared,
                                tidx, m_count, self.s, self.h, self.mt, self.in_flight)
            else:
                shared_part(x, w_sh13, a_sh, scratch, bidx - first_shared, warp, lane, m_count, self.s,
                            self.h, self.mt)
        traced(self.trace_addr, bidx, tidx, True)


def gate_up_first(w, device) -> bool:
    """Whether GEMM2's one-token grid runs the shared gate_up's CTAs before its own: where all of GEMM1's CTAs are
    resident at once (TP16: 16 x 24 on 132 x 4 places), SMs left idle while GEMM1 runs take them; where GEMM1 needs a
    second wave (TP8: 16 x 48), GEMM2's CTAs take the places it frees first and load their weights ahead of the wait.
    Measured: TP8 0.5 us faster with them last, TP16 1.0 us faster with them first."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return held_gemm1_ctas(1, w.top_k, w.experts, w.intermediate) <= sms * ONE_TOKEN_GEMM1_CTAS_PER_SM


def router_on_tensor_cores(m: int, tensor_cores: bool = True) -> bool:
    """Whether the front computes the router's logits on the tensor cores for a batch of m tokens."""
    return tensor_cores and uses_tensor_cores(token_tile(m, True)) and m >= ROUTER_MMA_FROM_TOKENS


def front(x, w, ws, m: int, stream, tensor_cores: bool = True, router_tail_ctas: int = ROUTER_TAIL_CTAS,
          router_mma: bool | None = None, shared: bool = True) -> None:
    """Launch 1 of the block (see FrontKernel) on `stream`; router_mma None: router_on_tensor_cores's choice; shared
    False: without the shared experts' CTAs (a_sh computed elsewhere)."""
    from .runtime import compile_cached, cu_stream, dyn, expect, fake, fake_stream, to_cute

    e, h, lat, s, k = w.experts, w.hidden, w.latent, w.shared_intermediate, w.top_k
    expect("x", x, (m, h), "bfloat16")
    mt = token_tile(m, tensor_cores)
    router_mt = token_tile(m, tensor_cores=False)
    if router_mma is None:
        router_mma = router_on_tensor_cores(m, tensor_cores)

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

    shape = (e, h, lat, s, k, w.routed_scaling_factor, mt, router_mt, router_tail_ctas, router_mma, shared)
    trace = trace_address("front", FrontKernel(*shape).ctas())
    key = ("moe_front", *shape, trace)
    fn = compile_cached(key, build)
    fn(
        to_cute(x, True), to_cute(w.router), to_cute(w.router_bias), to_cute(ws.logits[:m], True),
        to_cute(ws.router_sync), to_cute(ws.ids[:m], True), to_cute(ws.weights[:m], True),
        *(to_cute(t) for t in ws.plan), to_cute(w.down), to_cute(ws.x_lat[:m], True), to_cute(w.shared13),
        to_cute(ws.a_sh[:m], True), cu_stream(stream),
    )


@dataclass(frozen=True)
class MoeKernelWeights:
    """One rank's latent-MoE weights in the layout the kernels read (see kimi_k3_path.reference.moe)."""

    router: torch.Tensor  # [E, H] bf16
    router_bias: torch.Tensor  # [E] fp32
    down: torch.Tensor  # [L, H] bf16
    w13_packed: torch.Tensor  # [E, 2I, L/2] uint8, E2M1 pairs as common.kernel_fp4_bytes lays them out
    w13_scales: torch.Tensor  # [E, 2I, L/32] uint8
    w2_packed: torch.Tensor  # [E, L, I/2] uint8, likewise
    w2_scales: torch.Tensor  # [E, L, I/32] uint8
    latent_norm: torch.Tensor  # [L] fp32
    up: torch.Tensor  # [H, L] bf16
    shared13: torch.Tensor  # [2*Ish, H] bf16
    shared2: torch.Tensor  # [H, Ish] bf16
    top_k: int
    routed_scaling_factor: float
    eps: float

    @property
    def experts(self) -> int:
        return self.router.shape[0]

    @property
    def hidden(self) -> int:
        return self.router.shape[1]

    @property
    def latent(self) -> int:
        return self.down.shape[0]

    @property
    def intermediate(self) -> int:
        return self.w13_packed.shape[1] // 2

    @property
    def shared_intermediate(self) -> int:
        return self.shared2.shape[1]

    def weight_bytes(self) -> dict[str, int]:
        """Bytes of each weight tensor (whole tensors; the experts' share actually read depends on routing)."""
        return {name: t.numel() * t.element_size() for name, t in self._tensors().items()}

    def _tensors(self) -> dict[str, torch.Tensor]:
        names = ("router", "router_bias", "down", "w13_packed", "w13_scales", "w2_packed", "w2_scales",
                 "latent_norm", "up", "shared13", "shared2")
        return {n: getattr(self, n) for n in names}


def prepare_weights(ref, top_k: int, routed_scaling_factor: float, eps: float, device) -> MoeKernelWeights:
    """Kernel layout on `device` from a reference `MoeWeights` (any float dtype): bf16 matrices, fp32 bias/gamma, the
    experts' E2M1 bytes rearranged for their decode (common.kernel_fp4_bytes)."""

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.bfloat16).contiguous()

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.float32).contiguous()

    def u8(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device).contiguous()

    def fp4(t: torch.Tensor) -> torch.Tensor:
        return kernel_fp4_bytes(u8(t))

    return MoeKernelWeights(
        router=bf16(ref.router), router_bias=f32(ref.router_bias), down=bf16(ref.down),
        w13_packed=fp4(ref.w13_packed), w13_scales=u8(ref.w13_scales),
        w2_packed=fp4(ref.w2_packed), w2_scales=u8(ref.w2_scales),
        latent_norm=f32(ref.latent_norm), up=bf16(ref.up), shared13=bf16(ref.shared13), shared2=bf16(ref.shared2),
        top_k=top_k, routed_scaling_factor=routed_scaling_factor, eps=eps,
    )


class MoeWorkspace:
    """Scratch and intermediate buffers for batches up to MAX_TOKENS, allocated once (graph-safe: fixed addresses)."""

    def __init__(self, w: MoeKernelWeights, device) -> None:
        i32 = dict(device=device, dtype=torch.int32)
        f32 = dict(device=device, dtype=torch.float32)
        bf16 = dict(device=device, dtype=torch.bfloat16)
        m, e, k = MAX_TOKENS, w.experts, w.top_k
        # The router's state: logits polled for (router.LOGIT_UNSET until stored), arrival counters (and the router's
        # token masks) for the last CTAs' work; each launch leaves them so.
        self.logits = unset_logits(m, e, device)
        self.router_sync = torch.zeros(router_sync_words(e), **i32)
        self.gemm2_counter = torch.zeros(2, **i32)  # arrivals, and the norm's CTAs done waiting (norm_tail.py)
        self.ids = torch.empty(m, k, **i32)
        self.weights = torch.empty(m, k, **f32)
        self.plan = (torch.empty(1, **i32), torch.empty(e, **i32), torch.empty(e, **i32), torch.empty(e, m, **i32))
        f16 = dict(device=device, dtype=torch.float16)
        self.x_lat = torch.empty(m, w.latent, **f16)  # fp16: the experts' packed f16x2 arithmetic reads it
        self.a_sh = torch.empty(m, w.shared_intermediate, **bf16)
        self.a = torch.empty(m * k, w.intermediate, **f16)
        self.y_lat = torch.empty(m, w.latent, **f32)
        self.normed = torch.empty(m, w.latent, **bf16)
        self.sq_parts = torch.empty(w.latent // ONE_TOKEN_ROWS, **f32)  # one token: GEMM2's partial sums of y^2


@dataclass(frozen=True)
class Step:
    """One launch of the block: its name, how to launch it on a stream, and the weight bytes it reads."""

    name: str
    launch: Callable[[object], None]
    weight_bytes: Callable[[], int]  # evaluated after a run (the experts' bytes depend on the routing)


def one_token_experts(m: int) -> bool:
    """Whether the experts run in their one-token forms: GEMM1 as experts.ExpertsGemm1Held(one_token=True) (no loop
    over a slot's further tokens: 58 registers instead of 66; y_lat left alone) and GEMM2 as
    experts.ExpertsGemm2OneToken (no cross-CTA norm tail; the finalize applies the RMS). The norm tail cost the
    one-token block 4.4 us (TP8 and TP16), moving the whole norm into the finalize instead 7 us more than it saved;
    GEMM1 holding its weights took 4.1-5.4 us off the block against the tensor cores (kimi_k3_kernels.md §3.2)."""
    return m == 1


def decode_steps(
    x: torch.Tensor, w: MoeKernelWeights, ws: MoeWorkspace, out: torch.Tensor, tensor_cores: bool = True,
    one_token: bool | None = None,
) -> list[Step]:
    """The launches of `latent_moe_decode`, in order (the bench times them one by one). tensor_cores=False keeps
    every launch on the CUDA cores (the bench's same-run comparison); one_token (None: one_token_experts's choice)
    forces the experts' one-token forms on or off (comparisons)."""
    m = x.shape[0]
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"latent_moe_decode: decode batch M={m} must be in 1..{MAX_TOKENS}")
    if one_token is None:
        one_token = one_token_experts(m)
    elif one_token and m != 1:
        raise ValueError(f"decode_steps: the experts' one-token forms serve M=1, not M={m}")
    k, e, h, lat, i, s = w.top_k, w.experts, w.hidden, w.latent, w.intermediate, w.shared_intermediate

    def active() -> int:
        return int(ws.plan[0][0])

    shared_in_gemm2 = one_token and ONE_TOKEN_SHARED_IN_GEMM2
    shared_first = shared_in_gemm2 and gate_up_first(w, x.device)

    def gemm2(st) -> None:
        if one_token:
            experts_gemm2_one_token(ws.a[:k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:1], w.latent_norm,
                                    ws.y_lat[:1], ws.normed[:1], ws.sq_parts, st,
                                    (x, w.shared13, ws.a_sh[:1]) if shared_in_gemm2 else None, shared_first)
        else:
            experts_gemm2_combine(ws.a[: m * k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:m], ws.y_lat[:m],
                                  ws.gemm2_counter, w.latent_norm, ws.normed[:m], w.eps, st, tensor_cores)

    return [
        Step("front (router + down_proj)" if shared_in_gemm2 else "front (router + down_proj + shared_gate_up)",
             lambda st: front(x, w, ws, m, st, tensor_cores, shared=not shared_in_gemm2),
             lambda: e * h * 2 + e * 4 + lat * h * 2 + (0 if shared_in_gemm2 else 2 * s * h * 2)),
        Step("experts_gemm1_situ", lambda st: experts_gemm1_situ(ws.x_lat[:m], w.w13_packed, w.w13_scales, ws.plan, k,
                                                                 ws.a[: m * k], ws.y_lat[:m], st, tensor_cores,
                                                                 one_token=one_token),
             lambda: active() * (2 * i * lat // 2 + 2 * i * lat // 32)),
        Step("experts_gemm2_combine_norm" + (" + shared_gate_up" if shared_in_gemm2 else ""), gemm2,
             lambda: active() * (lat * i // 2 + lat * i // 32) + lat * 4 + (2 * s * h * 2 if shared_in_gemm2 else 0)),
        Step("finalize (up_proj + shared down)",
             (lambda st: finalize_streamed(ws.normed[:1], w.up, ws.a_sh[:1], w.shared2, out, ws.sq_parts, w.eps, st))
             if one_token and ONE_TOKEN_FINALIZE_STREAMED else
             (lambda st: finalize(ws.normed[:m], w.up, ws.a_sh[:m], w.shared2, out, st, tensor_cores,
                                  sq_parts=ws.sq_parts if one_token else None, eps=w.eps)),
             lambda: h * lat * 2 + h * s * 2),
    ]


def latent_moe_decode(x: torch.Tensor, w: MoeKernelWeights, ws: MoeWorkspace, out: torch.Tensor, stream) -> None:
    """out[M, H] (bf16) = the latent MoE block of this rank on x[M, H] (bf16), M in 1..64, launched on `stream`."""
    for step in decode_steps(x, w, ws, out):
        step.launch(stream)
