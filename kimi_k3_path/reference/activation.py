"""SiTU-GLU, Kimi K3's expert activation (vLLM `SituAndMul`)."""

from __future__ import annotations

import torch

SITU_BETA = 4.0
SITU_LINEAR_BETA = 25.0


def situ_glu(gate: torch.Tensor, up: torch.Tensor, beta: float = SITU_BETA, linear_beta: float = SITU_LINEAR_BETA) -> torch.Tensor:
    """a = beta*tanh(gate/beta)*sigmoid(gate); out = a * linear_beta*tanh(up/linear_beta). Same shape as `gate`.

    Both factors are soft-capped (|a| < beta, |up part| < linear_beta), which is why K3 can run its experts in
    MXFP4 without activation overflow.
    """
    if gate.shape != up.shape:
        raise ValueError(f"situ_glu: gate shape {tuple(gate.shape)} != up shape {tuple(up.shape)}")
    g = gate.float()
    u = up.float()
    return beta * torch.tanh(g / beta) * torch.sigmoid(g) * (linear_beta * torch.tanh(u / linear_beta))


def situ_glu_packed(gate_up: torch.Tensor, beta: float = SITU_BETA, linear_beta: float = SITU_LINEAR_BETA) -> torch.Tensor:
    """SiTU-GLU of a [..., 2*I] tensor holding the gate columns, then the up columns (vLLM's merged layout)."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"situ_glu_packed: last dimension {gate_up.shape[-1]} is odd")
    gate, up = gate_up.chunk(2, dim=-1)
    return situ_glu(gate, up, beta, linear_beta)
