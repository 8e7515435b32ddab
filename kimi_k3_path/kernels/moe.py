"""`latent_moe_decode`: the whole latent-MoE block of one TP rank for a decode batch (M <= 64), in 4 launches on
the caller's stream, with no host synchronization and no allocation, so it can be captured in a CUDA graph. Each
launch has a form per batch size, chosen in one place (dispatch.py), each form in its own module:

  1 front      router (logits, sigmoid + bias top-k, weights, expert plan), x_lat = x @ W_down^T,
               and from 2 tokens the shared experts' a_sh = situ_glu(x @ W_sh13^T)                  front.py
  2 GEMM1      a[pair] = situ_glu(x_lat[t] @ w13[e]^T) for the active experts' w13                  gemm1_held.py (M <= 4),
                                                                                                     gemm1_mma.py
  3 GEMM2      y_lat[t] += w * a[pair] @ w2[e]^T, then the latent RMSNorm                            gemm2_mma.py,
               (one token: whole rows per CTA and partial sums of y^2, plus the shared a_sh)        gemm2_one_token.py
  4 finalize   out = normed @ W_up^T + a_sh @ W_sh2^T                                                finalize_mma.py,
               (one token: the W_up term times rsqrt(mean y^2 + eps))                              finalize_streamed.py

GEMM2 and the finalize are launched early (programmatic dependent launch): each starts while its predecessor drains,
loads what does not depend on it, and waits (griddepcontrol.wait) before its first read of its predecessor's output.
Weights are prepared once (`prepare_weights`); the workspace is allocated once per device (`MoeWorkspace`) for the
largest batch and sliced per call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .common import kernel_fp4_bytes
from .dispatch import MoeForms, moe_forms, rank_tp
from .finalize_mma import finalize_mma
from .finalize_streamed import finalize_streamed
from .front import front
from .gemm1_held import experts_gemm1_held
from .gemm1_mma import experts_gemm1_mma
from .gemm2_mma import experts_gemm2_mma
from .gemm2_one_token import ONE_TOKEN_ROWS, experts_gemm2_one_token
from .router import MAX_TOKENS, ExpertPlan, router_sync_words, unset_logits


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
        self.plan = ExpertPlan(torch.empty(1, **i32), torch.empty(e, **i32), torch.empty(e, **i32),
                                torch.empty(e, m, **i32))
        f16 = dict(device=device, dtype=torch.float16)
        self.x_lat = torch.empty(m, w.latent, **f16)  # fp16: the experts' packed f16x2 arithmetic reads it
        self.a_sh = torch.empty(m, w.shared_intermediate, **bf16)
        self.a = torch.empty(m * k, w.intermediate, **f16)
        self.y_lat = torch.empty(m, w.latent, **f32)
        self.normed = torch.empty(m, w.latent, **bf16)
        self.sq_parts = torch.empty(w.latent // ONE_TOKEN_ROWS, **f32)  # one token: GEMM2's partial sums of y^2


@dataclass(frozen=True)
class Step:
    """One launch of the block: which of the four it is (front, gemm1, gemm2, finalize), its name with the form it
    runs in, and how to launch it on a stream."""

    kind: str
    name: str
    launch: Callable[[object], None]


def decode_steps(x: torch.Tensor, w: MoeKernelWeights, ws: MoeWorkspace, out: torch.Tensor) -> list[Step]:
    """The launches of `latent_moe_decode` in order, in the forms dispatch.moe_forms gives this rank's TP and the
    batch (the bench times them one by one)."""
    m = x.shape[0]
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"latent_moe_decode: decode batch M={m} must be in 1..{MAX_TOKENS}")
    forms = moe_forms(rank_tp(w.intermediate), m)
    k = w.top_k

    def gemm1(st) -> None:
        if forms.gemm1_held:
            experts_gemm1_held(ws.x_lat[:m], w.w13_packed, w.w13_scales, ws.plan, k, ws.a[: m * k], ws.y_lat[:m], st,
                               one_token=forms.one_token)
        else:
            experts_gemm1_mma(ws.x_lat[:m], w.w13_packed, w.w13_scales, ws.plan, k, ws.a[: m * k], ws.y_lat[:m], st)

    if forms.one_token:
        return [
            Step("front", "front (router + down_proj)", lambda st: front(x, w, ws, m, st, router_mma=False, shared=False)),
            Step("gemm1", "experts_gemm1_held", gemm1),
            Step("gemm2", "experts_gemm2_one_token + shared_gate_up",
                 lambda st: experts_gemm2_one_token(ws.a[:k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:1],
                                                    w.latent_norm, ws.y_lat[:1], ws.normed[:1], ws.sq_parts, st,
                                                    (x, w.shared13, ws.a_sh[:1]), forms.shared_gate_up_first)),
            Step("finalize", "finalize_streamed (up_proj + shared down)",
                 lambda st: finalize_streamed(ws.normed[:1], w.up, ws.a_sh[:1], w.shared2, out, ws.sq_parts, w.eps,
                                              st)),
        ]
    return [
        Step("front", "front (router + down_proj + shared_gate_up)",
             lambda st: front(x, w, ws, m, st, router_mma=forms.router_on_tensor_cores, shared=True)),
        Step("gemm1", "experts_gemm1_held" if forms.gemm1_held else "experts_gemm1_mma", gemm1),
        Step("gemm2", "experts_gemm2_mma (combine + norm)",
             lambda st: experts_gemm2_mma(ws.a[: m * k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:m],
                                          ws.y_lat[:m], ws.gemm2_counter, w.latent_norm, ws.normed[:m], w.eps, st,
                                          multi_tile=forms.gemm2_multi_tile)),
        Step("finalize", "finalize_mma (up_proj + shared down)",
             lambda st: finalize_mma(ws.normed[:m], w.up, ws.a_sh[:m], w.shared2, out, st)),
    ]


def forms_for(w: MoeKernelWeights, m: int) -> MoeForms:
    """The forms decode_steps runs for these weights and a batch of m tokens (the bench states them per row)."""
    return moe_forms(rank_tp(w.intermediate), m)


def latent_moe_decode(x: torch.Tensor, w: MoeKernelWeights, ws: MoeWorkspace, out: torch.Tensor, stream) -> None:
    """out[M, H] (bf16) = the latent MoE block of this rank on x[M, H] (bf16), M in 1..64, launched on `stream`."""
    for step in decode_steps(x, w, ws, out):
        step.launch(stream)
