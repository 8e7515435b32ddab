"""Kimi Delta Attention (KDA), one decode step per sequence, fp32 reference of one TP rank.

Mirrors vLLM's `KimiK3DeltaAttention` decode (`kimi_k3/nvidia/kda.py` and the fla-style packed recurrent kernel):

    in_proj  x -> [q | k | v | g_out | f_a | beta_raw]   (q, k, v, g_out: heads*D each; f_a: D, replicated; beta: heads)
    f_b      f_a -> g_raw                               (heads*D, the full-rank forget gate)
    conv     depthwise causal conv (width W) over [q|k|v] with the W-1 previous inputs as state, then SiLU
    norm     q = l2norm(q) * D^-0.5, k = l2norm(k)
    gate     g = lower_bound * sigmoid(exp(A_log[h]) * (g_raw + dt_bias))  in (lower_bound, 0), per channel
    state    S[h] is [D_v, D_k]:  S <- S * exp(g)[k];  v' = beta*(v - S k);  S <- S + v' k^T;  o = S q
             i.e. S' = S diag(exp g) (I - beta k k^T) + beta v k^T
    out      gated_rms_norm(o, g_out) per head (sigmoid gate) -> o_proj
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from .norm import gated_rms_norm, l2_normalize

GATE_LOWER_BOUND_MIN = -5.0  # vLLM asserts lower_bound in [-5, 0)


@dataclass(frozen=True)
class KdaDims:
    hidden: int
    heads: int  # per rank
    head_dim: int = 128
    conv_width: int = 4
    gate_lower_bound: float = -5.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if not GATE_LOWER_BOUND_MIN <= self.gate_lower_bound < 0:
            raise ValueError(f"KdaDims: gate_lower_bound {self.gate_lower_bound} is outside [-5, 0)")
        if min(self.hidden, self.heads, self.head_dim) < 1 or self.conv_width < 2:
            raise ValueError(f"KdaDims: non-positive size in {self}")

    @property
    def proj(self) -> int:
        return self.heads * self.head_dim

    @property
    def in_proj_rows(self) -> int:
        return 4 * self.proj + self.head_dim + self.heads


@dataclass(frozen=True)
class KdaWeights:
    in_proj: torch.Tensor  # [4*proj + D + heads, hidden]: q, k, v, output gate, f_a, beta
    f_b: torch.Tensor  # [proj, D]
    conv: torch.Tensor  # [3*proj, W] depthwise taps, oldest input first
    a_log: torch.Tensor  # [heads]
    dt_bias: torch.Tensor  # [proj]
    o_norm: torch.Tensor  # [D]
    o_proj: torch.Tensor  # [hidden, proj]


@dataclass(frozen=True)
class KdaState:
    """Per-sequence decode state: conv inputs [M, 3*proj, W-1] (oldest first) and the recurrent state
    [M, heads, D_v, D_k] (fp32 in K3)."""

    conv: torch.Tensor
    recurrent: torch.Tensor


def random_kda_weights(d: KdaDims, gen: torch.Generator) -> KdaWeights:
    def lin(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, device=gen.device) / cols**0.5

    return KdaWeights(
        in_proj=lin(d.in_proj_rows, d.hidden),
        f_b=lin(d.proj, d.head_dim),
        conv=torch.randn(3 * d.proj, d.conv_width, generator=gen, device=gen.device) / d.conv_width**0.5,
        a_log=torch.randn(d.heads, generator=gen, device=gen.device) * 0.5,
        dt_bias=torch.randn(d.proj, generator=gen, device=gen.device) * 0.5,
        o_norm=1.0 + 0.1 * torch.randn(d.head_dim, generator=gen, device=gen.device),
        o_proj=lin(d.hidden, d.proj),
    )


def random_kda_state(d: KdaDims, batch: int, gen: torch.Generator) -> KdaState:
    # A state of moderate norm, as after a few hundred tokens of decay-bounded updates.
    return KdaState(
        conv=torch.randn(batch, 3 * d.proj, d.conv_width - 1, generator=gen, device=gen.device),
        recurrent=torch.randn(batch, d.heads, d.head_dim, d.head_dim, generator=gen, device=gen.device) * 0.1,
    )


def split_in_proj(projected: torch.Tensor, d: KdaDims) -> tuple[torch.Tensor, ...]:
    """[M, in_proj_rows] -> (qkv [M, 3*proj], g_out [M, proj], f_a [M, D], beta_raw [M, heads])."""
    return tuple(projected.split([3 * d.proj, d.proj, d.head_dim, d.heads], dim=-1))


def kda_gate(g_raw: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, d: KdaDims) -> torch.Tensor:
    """Log-decay per channel, [M, heads, D], bounded to (lower_bound, 0)."""
    g = g_raw.float().reshape(-1, d.heads, d.head_dim) + dt_bias.float().reshape(d.heads, d.head_dim)
    return d.gate_lower_bound * torch.sigmoid(torch.exp(a_log.float()).reshape(d.heads, 1) * g)


def conv_step(qkv: torch.Tensor, conv_state: torch.Tensor, taps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv of the new input with the stored inputs, then SiLU; returns (out, new conv state)."""
    window = torch.cat([conv_state.float(), qkv.float().unsqueeze(-1)], dim=-1)  # [M, C, W]
    out = F.silu((window * taps.float()).sum(dim=-1))
    return out, window[..., 1:]


def delta_rule_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One gated delta-rule update. state [M,h,Dv,Dk]; q,k,gate [M,h,Dk]; v [M,h,Dv]; beta [M,h]. Returns (o, state)."""
    decayed = state * torch.exp(gate).unsqueeze(-2)
    correction = beta.unsqueeze(-1) * (v - (decayed @ k.unsqueeze(-1)).squeeze(-1))
    new_state = decayed + correction.unsqueeze(-1) * k.unsqueeze(-2)
    return (new_state @ q.unsqueeze(-1)).squeeze(-1), new_state


def kda_recurrent_step(
    projected: torch.Tensor, g_raw: torch.Tensor, w: KdaWeights, state: KdaState, d: KdaDims
) -> tuple[torch.Tensor, KdaState]:
    """The step between the GEMVs (what kernels/kda_recurrent.py fuses): in_proj's output [M, in_proj_rows] and f_b's
    [M, proj] -> (the gated-RMSNormed attention output [M, proj], o_proj's input; new state). Pure."""
    m = projected.shape[0]
    qkv, g_out, _, beta_raw = split_in_proj(projected.float(), d)
    conv_out, conv_state = conv_step(qkv, state.conv, w.conv)
    q, k, v = (t.reshape(m, d.heads, d.head_dim) for t in conv_out.split(d.proj, dim=-1))
    q = l2_normalize(q) * d.head_dim**-0.5
    k = l2_normalize(k)
    o, recurrent = delta_rule_step(
        state.recurrent.float(), q, k, v, kda_gate(g_raw, w.a_log, w.dt_bias, d), torch.sigmoid(beta_raw)
    )
    o = gated_rms_norm(o, g_out.reshape(m, d.heads, d.head_dim), w.o_norm, d.norm_eps)
    return o.reshape(m, d.proj), replace(state, conv=conv_state, recurrent=recurrent)


def kda_decode_step(x: torch.Tensor, w: KdaWeights, state: KdaState, d: KdaDims) -> tuple[torch.Tensor, KdaState]:
    """x [M, hidden] (the AttnRes-mixed, normed input) -> (attention output [M, hidden], new state). Pure."""
    projected = x.float() @ w.in_proj.float().T
    f_a = split_in_proj(projected, d)[2]
    o, new_state = kda_recurrent_step(projected, f_a @ w.f_b.float().T, w, state, d)
    return o @ w.o_proj.float().T, new_state
