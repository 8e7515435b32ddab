"""`latent_moe_decode`: the whole latent-MoE block of one TP rank for a decode batch (M <= 64), in 7 launches on
the caller's stream, with no host synchronization and no allocation, so it can be captured in a CUDA graph:

  1 router_topk            logits, sigmoid + bias top-k, weights, expert plan        (x, router weight)
  2 skinny_gemm            x_lat = x @ W_down^T                                       (x, W_down)
  3 shared_gate_up_situ    a_sh = situ_glu(x @ W_sh13^T)                              (x, W_sh13)
  4 experts_gemm1_situ     a[pair] = situ_glu(x_lat[t] @ w13[e]^T); y_lat = 0        (active experts' w13)
  5 experts_gemm2_combine  y_lat[t] += w * a[pair] @ w2[e]^T                          (active experts' w2)
  6 latent_rms_norm        normed = rms_norm(y_lat) (bf16)
  7 up_proj_shared_add     out = normed @ W_up^T + a_sh @ W_sh2^T                     (W_up, W_sh2)

Weights are prepared once (`prepare_weights`); the workspace is allocated once per device (`MoeWorkspace`) for the
largest batch and sliced per call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .experts import experts_gemm1_situ, experts_gemm2_combine
from .finalize import latent_rms_norm, up_proj_shared_add
from .gemv import skinny_gemm
from .router import MAX_TOKENS, router_topk
from .shared import shared_gate_up_situ



@dataclass(frozen=True)
class MoeKernelWeights:
    """One rank's latent-MoE weights in the layout the kernels read (see kimi_k3_path.reference.moe)."""

    router: torch.Tensor  # [E, H] bf16
    router_bias: torch.Tensor  # [E] fp32
    down: torch.Tensor  # [L, H] bf16
    w13_packed: torch.Tensor  # [E, 2I, L/2] uint8
    w13_scales: torch.Tensor  # [E, 2I, L/32] uint8
    w2_packed: torch.Tensor  # [E, L, I/2] uint8
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
    """Kernel layout on `device` from a reference `MoeWeights` (any float dtype): bf16 matrices, fp32 bias/gamma."""

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.bfloat16).contiguous()

    def f32(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.float32).contiguous()

    def u8(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device).contiguous()

    return MoeKernelWeights(
        router=bf16(ref.router), router_bias=f32(ref.router_bias), down=bf16(ref.down),
        w13_packed=u8(ref.w13_packed), w13_scales=u8(ref.w13_scales),
        w2_packed=u8(ref.w2_packed), w2_scales=u8(ref.w2_scales),
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
        self.logits = torch.empty(m, e, **f32)
        self.counter = torch.zeros(1, **i32)  # the router leaves it at zero after every launch
        self.ids = torch.empty(m, k, **i32)
        self.weights = torch.empty(m, k, **f32)
        self.plan = (torch.empty(1, **i32), torch.empty(e, **i32), torch.empty(e, **i32), torch.empty(e, m, **i32))
        self.x_lat = torch.empty(m, w.latent, **bf16)
        self.a_sh = torch.empty(m, w.shared_intermediate, **bf16)
        self.a = torch.empty(m * k, w.intermediate, **bf16)
        self.y_lat = torch.empty(m, w.latent, **f32)
        self.normed = torch.empty(m, w.latent, **bf16)


@dataclass(frozen=True)
class Step:
    """One launch of the block: its name, how to launch it on a stream, and the weight bytes it reads."""

    name: str
    launch: Callable[[object], None]
    weight_bytes: Callable[[], int]  # evaluated after a run (the experts' bytes depend on the routing)


def decode_steps(x: torch.Tensor, w: MoeKernelWeights, ws: MoeWorkspace, out: torch.Tensor) -> list[Step]:
    """The launches of `latent_moe_decode`, in order (the bench times them one by one)."""
    m = x.shape[0]
    if not 1 <= m <= MAX_TOKENS:
        raise ValueError(f"latent_moe_decode: decode batch M={m} must be in 1..{MAX_TOKENS}")
    k, e, h, lat, i, s = w.top_k, w.experts, w.hidden, w.latent, w.intermediate, w.shared_intermediate

    def active() -> int:
        return int(ws.plan[0][0])

    return [
        Step("router_topk", lambda st: router_topk(x, w.router, w.router_bias, k, w.routed_scaling_factor, ws.logits,
                                                   ws.counter, ws.ids[:m], ws.weights[:m], ws.plan, st),
             lambda: e * h * 2 + e * 4),
        Step("down_proj", lambda st: skinny_gemm(x, w.down, ws.x_lat[:m], st), lambda: lat * h * 2),
        Step("shared_gate_up_situ", lambda st: shared_gate_up_situ(x, w.shared13, ws.a_sh[:m], st),
             lambda: 2 * s * h * 2),
        Step("experts_gemm1_situ", lambda st: experts_gemm1_situ(ws.x_lat[:m], w.w13_packed, w.w13_scales, ws.plan, k,
                                                                 ws.a[: m * k], ws.y_lat[:m], st),
             lambda: active() * (2 * i * lat // 2 + 2 * i * lat // 32)),
        Step("experts_gemm2_combine", lambda st: experts_gemm2_combine(ws.a[: m * k], w.w2_packed, w.w2_scales,
                                                                       ws.plan, ws.weights[:m], ws.y_lat[:m], st),
             lambda: active() * (lat * i // 2 + lat * i // 32)),
        Step("latent_rms_norm", lambda st: latent_rms_norm(ws.y_lat[:m], w.latent_norm, ws.normed[:m], w.eps, st),
             lambda: lat * 4),
        Step("up_proj_shared_add", lambda st: up_proj_shared_add(ws.normed[:m], w.up, ws.a_sh[:m], w.shared2, out, st),
             lambda: h * lat * 2 + h * s * 2),
    ]


def latent_moe_decode(x: torch.Tensor, w: MoeKernelWeights, ws: MoeWorkspace, out: torch.Tensor, stream) -> None:
    """out[M, H] (bf16) = the latent MoE block of this rank on x[M, H] (bf16), M in 1..64, launched on `stream`."""
    for step in decode_steps(x, w, ws, out):
        step.launch(stream)


def random_weights(d, device, gen: torch.Generator):
    """A fresh random reference `MoeWeights` for dims `d`, made on `device` (a real-size rank's weights are GBs):
    bf16 matrices scaled 1/sqrt(K), MXFP4 experts with uniform random nibbles and E8M0 scales 2^-8..2^-5 (the
    range real expert weights land in), fp32 correction bias and latent-norm gamma."""
    from kimi_k3_path.reference import MoeWeights

    def lin(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) / shape[-1] ** 0.5).to(torch.bfloat16)

    def mx(*shape: int) -> tuple[torch.Tensor, torch.Tensor]:
        packed = torch.randint(0, 256, (*shape[:-1], shape[-1] // 2), generator=gen, device=device, dtype=torch.uint8)
        scales = torch.randint(119, 123, (*shape[:-1], shape[-1] // 32), generator=gen, device=device, dtype=torch.uint8)
        return packed, scales

    w13_packed, w13_scales = mx(d.experts, 2 * d.intermediate, d.latent)
    w2_packed, w2_scales = mx(d.experts, d.latent, d.intermediate)
    return MoeWeights(
        router=lin(d.experts, d.hidden),
        router_bias=torch.randn(d.experts, generator=gen, device=device) * 0.01,
        down=lin(d.latent, d.hidden),
        w13_packed=w13_packed, w13_scales=w13_scales, w2_packed=w2_packed, w2_scales=w2_scales,
        latent_norm=1.0 + 0.1 * torch.randn(d.latent, generator=gen, device=device),
        up=lin(d.hidden, d.latent),
        shared13=lin(2 * d.shared_intermediate, d.hidden),
        shared2=lin(d.hidden, d.shared_intermediate),
    )
