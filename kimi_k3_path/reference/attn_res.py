"""Block Attention Residuals (AttnRes): each sublayer's input is a softmax mix over the depth sources.

Semantics follow vLLM's `kimi_k3/nvidia/ops/attn_res.py` and `KimiDecoderLayer`: the sources are the completed
blocks (one residual snapshot per 12 layers) plus the running prefix sum of the current block. Each source is
scored by <rms_norm(source) * res_norm_weight, res_proj>; the softmax of the scores mixes the *raw* sources; the
mix then goes through the sublayer's own RMSNorm (input_layernorm / post_attention_layernorm).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .norm import rms_norm

MAX_SOURCES = 9  # 93 layers in blocks of 12 give at most 8 completed blocks, plus the prefix


@dataclass(frozen=True)
class AttnResWeights:
    """One AttnRes site (before attention or before the MLP) of one layer."""

    res_norm: torch.Tensor  # [H] weight of the RMSNorm applied to each source for scoring
    res_proj: torch.Tensor  # [H] the learned query vector (a Linear(H, 1) weight, squeezed)
    # [H] the sublayer's RMSNorm weight applied to the mix; None for the model's final mix (vLLM's
    # output_attn_res), which returns the raw mix for the final norm to normalize.
    out_norm: torch.Tensor | None


def attn_res_mix(
    blocks: torch.Tensor, prefix: torch.Tensor, w: AttnResWeights, eps: float, out_eps: float
) -> torch.Tensor:
    """Mix `blocks` [M, n, H] (the n completed blocks in use, n >= 0) and `prefix` [M, H]; returns [M, H] fp32."""
    if blocks.dim() != 3 or prefix.dim() != 2 or blocks.shape[0] != prefix.shape[0] or blocks.shape[2] != prefix.shape[1]:
        raise ValueError(f"attn_res_mix: blocks {tuple(blocks.shape)} and prefix {tuple(prefix.shape)} do not fit [M,n,H], [M,H]")
    if blocks.shape[1] + 1 > MAX_SOURCES:
        raise ValueError(f"attn_res_mix: {blocks.shape[1] + 1} sources, Kimi K3 has at most {MAX_SOURCES}")
    sources = torch.cat([blocks.float(), prefix.float().unsqueeze(1)], dim=1)  # [M, n+1, H]
    logits = (rms_norm(sources, w.res_norm, eps) * w.res_proj.float()).sum(dim=-1)  # [M, n+1]
    mixed = (torch.softmax(logits, dim=-1).unsqueeze(-1) * sources).sum(dim=1)
    return mixed if w.out_norm is None else rms_norm(mixed, w.out_norm, out_eps)


def random_attn_res_weights(hidden: int, gen: torch.Generator) -> AttnResWeights:
    def around_one() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(hidden, generator=gen, device=gen.device)

    # A unit-norm query spreads the softmax over the sources instead of picking one.
    proj = torch.randn(hidden, generator=gen, device=gen.device)
    return AttnResWeights(res_norm=around_one(), res_proj=proj / proj.norm() * 2.0, out_norm=around_one())
