"""Which form of each latent-MoE launch a decode batch runs: one table keyed by (TP, M), the only place the block's
variants are chosen (moe.decode_steps reads it). Every form in it was measured faster than the alternatives for its
rows on the H200 (docs/design/kimi_k3_kernels.md); the alternatives are gone from the product code (git keeps them).

Pure: no torch, no CuTe DSL, so the CPU tests check the table against the support matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

# The tensor-parallel size a rank's expert intermediate width belongs to (config.shard_shapes: 384 at TP8, 192 at
# TP16); a CPU test checks it against the config for every TP the support matrix admits.
TP_OF_EXPERT_INTERMEDIATE = {384: 8, 192: 16}
MAX_BATCH = 64  # the router's plan stores token sets as 64-bit masks (router.MAX_TOKENS)


@dataclass(frozen=True)
class MoeForms:
    """The forms of the block's four launches for one (TP, M)."""

    # M = 1: GEMM1 without the loop over a slot's further tokens (58 registers instead of 66), GEMM2 owning whole
    # latent rows (gemm2_one_token.py: no cross-CTA norm tail, which cost the block 4.4 us), the streamed finalize
    # applying the RMS (finalize_streamed.py: -1.8 us TP8, -1.5 TP16), the shared gate_up in GEMM2's grid
    # (-0.5 us TP8, -1.1 TP16). Otherwise: gemm2_mma.py + finalize_mma.py, the shared gate_up in the front.
    one_token: bool
    # GEMM1 on the CUDA cores holding each CTA's weights in registers (gemm1_held.py) rather than on the tensor cores
    # (gemm1_mma.py): faster up to 4 tokens (4.1-5.4 us off the one-token block); at 16 tokens 7-11% slower.
    gemm1_held: bool
    # The router's logits on the tensor cores (one CTA per 16 experts, x read once for all tokens): won at 16, 32
    # and 64 tokens, lost at 2 and 8.
    router_on_tensor_cores: bool
    # M = 1: the shared gate_up's CTAs before GEMM2's in its grid. Where GEMM1's CTAs are all resident at once
    # (TP16: 16 x 24 on 132 SMs x 4), SMs it leaves idle take them (1.0 us faster); where GEMM1 needs a second wave
    # (TP8: 16 x 48), GEMM2's CTAs should take the places it frees first (0.5 us faster with them last).
    shared_gate_up_first: bool = False
    # M >= 32: each GEMM2 CTA stages several 128-row tiles of w2 (gemm2_mma.gemm2_tiles_per_cta: 2 at TP8, 4 at TP16)
    # instead of one, their copies all in flight at once. GEMM2 alone 12-21% faster from 8 tokens on (H100, 64 tokens:
    # 177 -> 151 us TP8, 117 -> 95 TP16); in the block, where it starts early beside GEMM1's last CTAs, since GEMM2
    # lets the finalize in only after its MMAs: -3.2% / -6.7% (TP8 / TP16) at 32 tokens, level at 64, but +4.8% /
    # +3.7% at 16 (and +8% at 8 when measured before; bench_moe, alternating, 2 rounds; 17-31 unmeasured).
    gemm2_multi_tile: bool = False


@dataclass(frozen=True)
class DispatchRow:
    tp: int
    first_m: int
    last_m: int
    forms: MoeForms


TABLE: tuple[DispatchRow, ...] = (
    DispatchRow(8, 1, 1, MoeForms(one_token=True, gemm1_held=True, router_on_tensor_cores=False)),
    DispatchRow(16, 1, 1, MoeForms(one_token=True, gemm1_held=True, router_on_tensor_cores=False,
                                   shared_gate_up_first=True)),
    *(DispatchRow(tp, first, last, MoeForms(one_token=False, gemm1_held=held, router_on_tensor_cores=router_mma,
                                            gemm2_multi_tile=multi_tile))
      for tp in (8, 16)
      for first, last, held, router_mma, multi_tile in ((2, 4, True, False, False), (5, 15, False, False, False),
                                                        (16, 31, False, True, False),
                                                        (32, MAX_BATCH, False, True, True))),
)


def moe_forms(tp: int, m: int) -> MoeForms:
    """The forms for a decode batch of m tokens on a rank of tensor-parallel size tp; ValueError outside the table."""
    for row in TABLE:
        if row.tp == tp and row.first_m <= m <= row.last_m:
            return row.forms
    tps = sorted({row.tp for row in TABLE})
    raise ValueError(f"latent MoE kernels: no form for TP={tp}, M={m} (they serve TP {tps} and M 1..{MAX_BATCH})")


def rank_tp(expert_intermediate: int) -> int:
    """The TP a rank's weights were sharded for, from their expert intermediate width."""
    try:
        return TP_OF_EXPERT_INTERMEDIATE[expert_intermediate]
    except KeyError:
        raise ValueError(f"latent MoE kernels: expert intermediate {expert_intermediate} is not the per-rank width of "
                         f"an admitted TP ({TP_OF_EXPERT_INTERMEDIATE})") from None
