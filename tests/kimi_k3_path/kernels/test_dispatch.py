"""The dispatch of the forms (kernels/dispatch.py): the latent-MoE table covers every admitted (TP, M) exactly once,
its TP lookup agrees with the config's shard shapes, and its choices agree with the kernels' own geometry; the
attention forms switch at their crossovers. Pure: no GPU, no DSL."""

from __future__ import annotations

import pytest

from kimi_k3_path.config import named_config, shard_shapes
from kimi_k3_path.kernels.dispatch import (
    KDA_16_WARPS_MAX_M,
    MAX_BATCH,
    MLA_FUSED_TAIL_MAX_M,
    TABLE,
    TP_OF_EXPERT_INTERMEDIATE,
    attention_forms,
    moe_forms,
    rank_tp,
)
from kimi_k3_path.support import SUPPORT_MATRIX

H200_SMS = 132


def _admitted() -> list[tuple[int, int]]:
    return [(tp, m) for tp in SUPPORT_MATRIX.tp for m in range(1, MAX_BATCH + 1)]


def test_every_admitted_tp_and_batch_has_exactly_one_row():
    for tp, m in _admitted():
        rows = [row for row in TABLE if row.tp == tp and row.first_m <= m <= row.last_m]
        assert len(rows) == 1, (tp, m, rows)
    assert SUPPORT_MATRIX.max_batch <= MAX_BATCH


def test_outside_the_table_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="no form for TP=4, M=1"):
        moe_forms(4, 1)
    with pytest.raises(ValueError, match="no form for TP=8, M=65"):
        moe_forms(8, 65)
    with pytest.raises(ValueError, match="expert intermediate 256 is not the per-rank width"):
        rank_tp(256)


def test_rank_tp_agrees_with_the_config_for_every_admitted_tp():
    config = named_config("kimi_k3")
    assert {shard_shapes(config, tp).expert_intermediate: tp for tp in SUPPORT_MATRIX.tp} == TP_OF_EXPERT_INTERMEDIATE


def test_the_forms_by_batch_size():
    for tp in SUPPORT_MATRIX.tp:
        forms = [moe_forms(tp, m) for m in range(1, MAX_BATCH + 1)]
        assert [m for m, f in enumerate(forms, 1) if f.one_token] == [1]
        assert [m for m, f in enumerate(forms, 1) if f.gemm1_held] == [1, 2, 3, 4]
        assert [m for m, f in enumerate(forms, 1) if f.router_on_tensor_cores] == list(range(16, MAX_BATCH + 1))
        assert not any(f.shared_gate_up_first for f in forms[1:])  # only the one-token grid holds the gate_up
        assert [m for m, f in enumerate(forms, 1) if f.gemm2_multi_tile] == list(range(32, MAX_BATCH + 1))


def test_the_shared_gate_up_goes_first_exactly_where_gemm1_fits_in_one_wave():
    """dispatch.MoeForms.shared_gate_up_first: first where all of the one-token GEMM1's CTAs are resident at once on
    the H200, so that SMs it leaves idle take them."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
    from kimi_k3_path.kernels.gemm1_held import ONE_TOKEN_CTAS_PER_SM, held_gemm1_ctas

    config = named_config("kimi_k3")
    t = config.text_config
    for tp in SUPPORT_MATRIX.tp:
        inter = shard_shapes(config, tp).expert_intermediate
        one_wave = held_gemm1_ctas(1, t.num_experts_per_token, t.num_experts, inter) <= H200_SMS * ONE_TOKEN_CTAS_PER_SM
        assert moe_forms(tp, 1).shared_gate_up_first == one_wave, tp


def test_the_attention_forms_by_batch_size():
    """The one-token forms of the attention halves up to their measured crossovers, the many-token forms after."""
    forms = [attention_forms(m) for m in range(1, MAX_BATCH + 1)]
    assert [m for m, f in enumerate(forms, 1) if f.kda_warps == 16] == list(range(1, KDA_16_WARPS_MAX_M + 1))
    assert {f.kda_warps for f in forms} == {8, 16}
    assert [m for m, f in enumerate(forms, 1) if f.mla_fused_tail] == list(range(1, MLA_FUSED_TAIL_MAX_M + 1))
    for m in (0, MAX_BATCH + 1):
        with pytest.raises(ValueError, match=f"no form for M={m}"):
            attention_forms(m)
