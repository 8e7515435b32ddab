"""How outputs are compared with references: one relative error, shared by the tests, the stock-like checks,
the kernels' checks and the bench."""

from __future__ import annotations

import torch


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64; raises if shapes differ, `out` is not finite, or `ref` is all zeros
    (a zero reference would make any output pass)."""
    if out.shape != ref.shape:
        raise ValueError(f"rel_err: output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out64).all():
        raise ValueError("rel_err: output has NaN or inf")
    denom = float(ref64.norm())
    if denom == 0.0:
        raise ValueError("rel_err: the reference is all zeros, so the comparison proves nothing")
    return float((out64 - ref64).norm()) / denom
