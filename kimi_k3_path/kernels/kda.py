"""`kda_attention_decode`: the attention of a KDA layer for one TP rank and a decode batch (M <= 64), on the caller's
stream, as `reference.kda_decode_step` computes it:

  in_proj   projected = x @ W_in^T (q, k, v, output gate, f_a, beta)        cuBLAS (bf16)
  f_b       g_raw = f_a @ W_fb^T (the full-rank forget gate)                 cuBLAS (bf16)
  middle    conv + SiLU, L2 norms, decay, gated delta rule on the state      kda_recurrent.py (one CuTe DSL launch)
            in place, gated RMSNorm
  o_proj    out = core @ W_o^T                                               cuBLAS (bf16)

Four launches where the stock path has six (its conv, recurrent step and gated norm are three). The GEMVs stay on
cuBLAS until KDA's own GEMV launches land (issue 35); the state is addressed by slot, as vLLM's mamba cache is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .kda_recurrent import KdaKernelWeights, kda_recurrent_decode, prepare_kda_weights


@dataclass(frozen=True)
class KdaAttentionWeights:
    in_proj: torch.Tensor  # [4*proj + D + heads, hidden] bf16
    f_b: torch.Tensor  # [proj, D] bf16
    o_proj: torch.Tensor  # [hidden, proj] bf16
    middle: KdaKernelWeights


def prepare_attention_weights(ref, d, device) -> KdaAttentionWeights:
    """The kernels' copy of a reference `KdaWeights` for `KdaDims` d, on `device`."""

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.bfloat16).contiguous()

    return KdaAttentionWeights(bf16(ref.in_proj), bf16(ref.f_b), bf16(ref.o_proj), prepare_kda_weights(ref, d, device))


def kda_attention_decode(x: torch.Tensor, w: KdaAttentionWeights, slots: torch.Tensor, conv_state: torch.Tensor,
                         state: torch.Tensor, out: torch.Tensor, stream, check_slots: bool = True) -> None:
    """out [M, hidden] bf16 = the KDA attention of x [M, hidden] bf16; the sequences' states at `slots` [M] int32 of
    the pools conv_state [P, 3*proj, W-1] bf16 and state [P, heads, D, D] fp32 are updated in place. check_slots as
    for `kda_recurrent_decode` (False under CUDA graph capture)."""
    heads, d = w.middle.heads, w.middle.head_dim
    proj = heads * d
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != w.in_proj.shape[1]:
        raise ValueError(f"kda_attention_decode: x must be [M, {w.in_proj.shape[1]}] bf16, got "
                         f"{tuple(x.shape)} {x.dtype}")
    with torch.cuda.stream(stream):  # the GEMMs on the stream the CuTe launch takes
        projected = x @ w.in_proj.t()
        g_raw = projected[:, 4 * proj : 4 * proj + d] @ w.f_b.t()
        core = torch.empty(x.shape[0], proj, device=x.device, dtype=torch.bfloat16)
        kda_recurrent_decode(projected, g_raw, w.middle, slots, conv_state, state, core, stream, check_slots)
        torch.mm(core, w.o_proj.t(), out=out)

