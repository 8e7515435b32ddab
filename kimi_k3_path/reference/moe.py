"""Latent MoE of Kimi K3, fp32 reference of one TP rank.

Agreed layout (per rank): router [E, H] with fp32 correction bias; W_down [L, H]; experts in MXFP4 in the latent
space, w13 [E, 2I, L] (gate rows then up rows) and w2 [E, L, I]; latent RMSNorm; W_up [H, L]; the two shared
experts fused as W_sh13 [2*Ish, H] and W_sh2 [H, Ish] on the original hidden state.

    scores  = sigmoid(x @ router^T)                    (fp32)
    chosen  = top_k(scores + bias), ties to the lower expert index
    weights = scores[chosen] / sum(scores[chosen]) * routed_scaling_factor
    y_lat   = sum_k weights_k * situ_glu(split(x_lat @ w13[e_k]^T)) @ w2[e_k]^T,   x_lat = x @ W_down^T
    out     = rms_norm(y_lat) @ W_up^T + situ_glu(split(x @ W_sh13^T)) @ W_sh2^T

At TP>1, y_lat and the shared output are partial sums over this rank's intermediate shard (the all-reduce
belongs to the communication path); per-rank functions compute exactly the per-rank work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .activation import situ_glu_packed
from .mxfp4 import E2M1_MAGNITUDES, E8M0_BIAS, MX_BLOCK, mxfp4_unpack
from .norm import rms_norm


@dataclass(frozen=True)
class MoeDims:
    hidden: int
    latent: int
    experts: int
    top_k: int
    intermediate: int  # per rank
    shared_intermediate: int  # per rank, both shared experts fused
    routed_scaling_factor: float = 1.0
    eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("latent", "intermediate"):
            if getattr(self, name) % MX_BLOCK:
                raise ValueError(f"MoeDims: {name}={getattr(self, name)} is not a multiple of {MX_BLOCK} (MXFP4 groups)")
        if not 0 < self.top_k <= self.experts:
            raise ValueError(f"MoeDims: top_k={self.top_k} must be in 1..experts={self.experts}")


@dataclass(frozen=True)
class MoeWeights:
    router: torch.Tensor  # [E, H]
    router_bias: torch.Tensor  # [E] fp32 correction bias (selection only)
    down: torch.Tensor  # [L, H]
    w13_packed: torch.Tensor  # uint8 [E, 2I, L/2]
    w13_scales: torch.Tensor  # uint8 [E, 2I, L/32]
    w2_packed: torch.Tensor  # uint8 [E, L, I/2]
    w2_scales: torch.Tensor  # uint8 [E, L, I/32]
    latent_norm: torch.Tensor  # [L]
    up: torch.Tensor  # [H, L]
    shared13: torch.Tensor  # [2*Ish, H]
    shared2: torch.Tensor  # [H, Ish]


# Mean square of the 16 E2M1 values when every nibble is equally likely.
_E2M1_MEAN_SQUARE = sum(v * v for v in E2M1_MAGNITUDES) / len(E2M1_MAGNITUDES)


def random_mxfp4(shape: tuple[int, ...], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random MXFP4 weights [..., K] on gen.device: uniform nibbles (valid codes by construction, so no fp32
    master copy is needed even at full size) and E8M0 scales around 1/sqrt(K) / rms(E2M1), +-1 binade."""
    k = shape[-1]
    if k % MX_BLOCK:
        raise ValueError(f"random_mxfp4: K={k} is not a multiple of {MX_BLOCK}")
    center = E8M0_BIAS + round(math.log2(1.0 / (math.sqrt(_E2M1_MEAN_SQUARE) * math.sqrt(k))))
    packed = torch.randint(0, 256, (*shape[:-1], k // 2), generator=gen, device=gen.device, dtype=torch.uint8)
    scales = torch.randint(center - 1, center + 2, (*shape[:-1], k // MX_BLOCK), generator=gen, device=gen.device, dtype=torch.uint8)
    return packed, scales


def random_moe_weights(d: MoeDims, gen: torch.Generator) -> MoeWeights:
    """Matrices scaled 1/sqrt(fan_in) and random MXFP4 experts, all on gen.device. The matrices hold
    bf16-representable values (as a bf16 checkpoint does) in fp32: every path then computes with the same weights,
    and the fp32 reference differs from a bf16 path only by its arithmetic, not by a rounding of the router that
    flips expert choices whose keys are 2e-4 apart (seen on the H200)."""

    def lin(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=gen.device) / shape[-1] ** 0.5).to(torch.bfloat16).float()

    w13_packed, w13_scales = random_mxfp4((d.experts, 2 * d.intermediate, d.latent), gen)
    w2_packed, w2_scales = random_mxfp4((d.experts, d.latent, d.intermediate), gen)
    return MoeWeights(
        router=lin(d.experts, d.hidden),
        router_bias=torch.randn(d.experts, generator=gen, device=gen.device) * 0.1,
        down=lin(d.latent, d.hidden),
        w13_packed=w13_packed,
        w13_scales=w13_scales,
        w2_packed=w2_packed,
        w2_scales=w2_scales,
        latent_norm=1.0 + 0.1 * torch.randn(d.latent, generator=gen, device=gen.device),
        up=lin(d.hidden, d.latent),
        shared13=lin(2 * d.shared_intermediate, d.hidden),
        shared2=lin(d.hidden, d.shared_intermediate),
    )


def select_experts(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """From router logits [M, E]: (expert ids [M, k] int64 in selection order, combine weights [M, k] fp32)."""
    scores = torch.sigmoid(logits.float())
    # A stable descending sort keeps equal keys in index order: ties go to the lower expert index.
    ids = torch.sort(scores + bias.float(), dim=-1, descending=True, stable=True).indices[:, :top_k]
    chosen = scores.gather(-1, ids)
    return ids, chosen / chosen.sum(dim=-1, keepdim=True) * scaling


def route(x: torch.Tensor, w: MoeWeights, d: MoeDims) -> tuple[torch.Tensor, torch.Tensor]:
    return select_experts(x.float() @ w.router.float().T, w.router_bias, d.top_k, d.routed_scaling_factor)


def routed_experts(x_lat: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, w: MoeWeights) -> torch.Tensor:
    """y_lat [M, L]: the weighted sum of the selected experts' outputs on the latent input x_lat [M, L]."""
    y = torch.zeros(x_lat.shape[0], x_lat.shape[1], device=x_lat.device)
    for e in ids.unique().tolist():
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        w13 = mxfp4_unpack(w.w13_packed[e], w.w13_scales[e])
        w2 = mxfp4_unpack(w.w2_packed[e], w.w2_scales[e])
        out = situ_glu_packed(x_lat[tokens].float() @ w13.T) @ w2.T
        y.index_add_(0, tokens, out * weights[tokens, slots].unsqueeze(-1))
    return y


def shared_experts(x: torch.Tensor, w: MoeWeights) -> torch.Tensor:
    return situ_glu_packed(x.float() @ w.shared13.float().T) @ w.shared2.float().T


def latent_moe(x: torch.Tensor, w: MoeWeights, d: MoeDims) -> torch.Tensor:
    """x [M, H] (the AttnRes-mixed, normed input) -> [M, H]."""
    ids, weights = route(x, w, d)
    y_lat = routed_experts(x.float() @ w.down.float().T, ids, weights, w)
    return rms_norm(y_lat, w.latent_norm, d.eps) @ w.up.float().T + shared_experts(x, w)
