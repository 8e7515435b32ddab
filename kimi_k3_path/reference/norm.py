"""Normalizations used by the Kimi K3 decode path (fp32 references)."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, computed in fp32."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return normed if weight is None else normed * weight.float()


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """KDA's output norm (fla FusedRMSNormGated, activation "sigmoid"): rms_norm(x) * weight * sigmoid(gate)."""
    return rms_norm(x, weight, eps) * torch.sigmoid(gate.float())


# The KDA kernels add 1e-6 under the square root (not a max with eps): q / sqrt(sum(q^2) + 1e-6).
L2_NORM_EPS = 1e-6


def l2_normalize(x: torch.Tensor, eps: float = L2_NORM_EPS) -> torch.Tensor:
    x32 = x.float()
    return x32 / torch.sqrt(x32.pow(2).sum(dim=-1, keepdim=True) + eps)
