"""`kda_attention_decode`: the attention of a KDA layer for one TP rank and a decode batch (M <= 64), on the caller's
stream, as `reference.kda_decode_step` computes it:

  in_proj   projected = x @ W_in^T (q, k, v, output gate, f_a, beta)        `project`
  middle    f_b (g_raw = f_a @ W_fb^T, the full-rank forget gate), conv +     kda_recurrent.py (one CuTe DSL launch)
            SiLU, L2 norms, decay, gated delta rule on the state in place,
            gated RMSNorm
  o_proj    out = core @ W_o^T                                               `project`

Three launches where the stock path has six (its f_b, conv, recurrent step and gated norm are four). dense.project
runs dense.py's GEMV at one token and cuBLAS from two: on the H200 (bench_dense, TP8, 50 graph replays) dense.py's
one-token form read in_proj's 90 MB in 22.7 us against cuBLAS's 26.9 (a pure read of the same bytes: 21.9), while its
tensor-core form rereads x in every 16-row CTA and lost from 2 tokens on (in_proj at M=64: 68.0 us, cuBLAS 26.2).
in_proj's weight is held padded with zero rows to dense.py's tile (6284 -> 6288 rows at TP8, 3206 -> 3216 at TP16);
the middle reads the first columns of the padded output. The state is addressed by slot, as vLLM's mamba cache is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .dense import project
from .kda_recurrent import KdaKernelWeights, kda_recurrent_decode, prepare_kda_weights
from .mma import MMA_ROWS


def padded_rows(rows: int) -> int:
    """A projection's rows rounded up to dense_decode's tensor-core tile (zero rows, whose outputs nobody reads)."""
    return -(-rows // MMA_ROWS) * MMA_ROWS


def projection_shapes(d) -> dict[str, tuple[int, int]]:
    """(N, K) of each GEMV of a KDA layer with reference.dims.KdaDims d, as the kernels hold the weights."""
    return {"in_proj": (padded_rows(d.in_proj_rows), d.hidden), "f_b": (d.proj, d.head_dim), "o_proj": (d.hidden, d.proj)}


@dataclass(frozen=True)
class KdaAttentionWeights:
    in_proj: torch.Tensor  # [padded_rows(4*proj + D + heads), hidden] bf16, the padding rows zero
    o_proj: torch.Tensor  # [hidden, proj] bf16
    middle: KdaKernelWeights  # f_b among them


def prepare_attention_weights(ref, d, device) -> KdaAttentionWeights:
    """The kernels' copy of a reference `KdaWeights` for `KdaDims` d, on `device`."""

    def bf16(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.bfloat16).contiguous()

    rows = ref.in_proj.shape[0]
    in_proj = torch.zeros(padded_rows(rows), ref.in_proj.shape[1], device=device, dtype=torch.bfloat16)
    in_proj[:rows] = ref.in_proj
    return KdaAttentionWeights(in_proj, bf16(ref.o_proj), prepare_kda_weights(ref, d, device))


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
    m = x.shape[0]
    with torch.cuda.stream(stream):  # torch's allocations and cuBLAS on the stream the CuTe launches take
        projected = torch.empty(m, w.in_proj.shape[0], device=x.device, dtype=torch.bfloat16)
        project(x, w.in_proj, projected, stream)
        core = torch.empty(m, proj, device=x.device, dtype=torch.bfloat16)
        kda_recurrent_decode(projected, w.middle, slots, conv_state, state, core, stream, check_slots)
        project(core, w.o_proj, out, stream)

