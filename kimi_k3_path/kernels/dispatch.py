"""Which form of each launch a decode batch runs, the only place the variants are chosen: for the latent-MoE block one
table keyed by (TP, M) (moe.decode_steps reads it), every form in it measured faster than the alternatives for its
rows on the H200; for the attention halves `attention_forms(M)`, its crossovers measured on an H100
(docs/design/kimi_k3_kernels.md). The MoE block's alternatives are gone from the product code (git keeps them).

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


@dataclass(frozen=True)
class AttentionForms:
    """The batch-dependent forms of the attention halves' launches for one decode batch size. Each one-token form
    runs up to the last batch where it measured faster in the layer's CUDA graph (H100, TP8, `bench.py --breakdown
    graph`, the launch's share of the step against the other form's launches; docs/design/kimi_k3_kernels.md
    section 9.3). AttnRes has one form since its cluster exchange went to st.async (attn_res.py): clusters won at
    every batch, 1 to 64 tokens."""

    # The KDA middle's warps per CTA (kda_recurrent.WARP_FORMS): 16 halve each warp's chain, which is the launch's
    # time at a few sequences (one token: 9.5 -> 7.3 us of share at TP8, 8.3 -> 6.5 at TP16; 8 tokens: 8.9 -> 8.6,
    # 6.8 -> 6.4); 8 keep two CTAs per SM where there are many (64 tokens; 9-63 unmeasured).
    kda_warps: int
    # MLA: the split-KV combine, W_UV and the output gate in one launch (mla_output.py) rather than the combine
    # launch and three torch ops. Its 8 CTAs per head each repeat the combine, one sequence after another: 8.1 ->
    # 5.6 us at one token, but 9.6 -> 10.6 at 2, 10.0 -> 24.4 at 4, 12.2 -> 44.1 at 64 (TP8).
    mla_fused_tail: bool


# The largest batch each one-token form runs at.
KDA_16_WARPS_MAX_M = 8
MLA_FUSED_TAIL_MAX_M = 1


def attention_forms(m: int) -> AttentionForms:
    """The attention forms for a decode batch of m tokens; ValueError outside 1..MAX_BATCH."""
    if not 1 <= m <= MAX_BATCH:
        raise ValueError(f"attention kernels: no form for M={m} (they serve M 1..{MAX_BATCH})")
    return AttentionForms(kda_warps=16 if m <= KDA_16_WARPS_MAX_M else 8,
                          mla_fused_tail=m <= MLA_FUSED_TAIL_MAX_M)
