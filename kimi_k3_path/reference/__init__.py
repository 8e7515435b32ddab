"""fp32 torch references of every Kimi K3 decode op (CPU), the naive fp64 cross-checks (`naive`), and the
stock-like GPU op sequence the specialized path is measured against (`stock`, needs CUDA + Triton)."""

from __future__ import annotations

from .activation import SITU_BETA, SITU_LINEAR_BETA, situ_glu, situ_glu_packed
from .attn_res import MAX_SOURCES, AttnResWeights, attn_res_mix, random_attn_res_weights
from .kda import (
    KdaDims,
    KdaState,
    KdaWeights,
    conv_step,
    delta_rule_step,
    kda_decode_step,
    kda_gate,
    kda_recurrent_step,
    random_kda_state,
    random_kda_weights,
)
from .layers import (
    ATTN_RES_BLOCK,
    DenseMlpWeights,
    KdaDenseLayerWeights,
    KdaMoeLayerWeights,
    LayerNorms,
    LayerPosition,
    MlaMoeLayerWeights,
    ResidualStream,
    dense_mlp,
    kda_dense_layer,
    kda_moe_layer,
    mla_moe_layer,
    random_dense_mlp_weights,
    random_kda_moe_layer,
    random_layer_norms,
    random_mla_moe_layer,
    random_residual_stream,
)
from .mla import (
    MlaDims,
    MlaWeights,
    PagedLatentCache,
    mla_attend,
    mla_decode,
    mla_decode_unabsorbed,
    random_mla_weights,
    random_paged_cache,
)
from .moe import (
    MoeDims,
    MoeWeights,
    latent_moe,
    random_moe_weights,
    random_mxfp4,
    route,
    routed_experts,
    select_experts,
    shared_experts,
)
from .compare import rel_err
from .mxfp4 import E2M1_MAGNITUDES, MX_BLOCK, e2m1_table, mxfp4_pack, mxfp4_unpack
from .norm import gated_rms_norm, l2_normalize, rms_norm

__all__ = [
    "ATTN_RES_BLOCK", "E2M1_MAGNITUDES", "MAX_SOURCES", "MX_BLOCK", "SITU_BETA", "SITU_LINEAR_BETA",
    "AttnResWeights", "DenseMlpWeights", "KdaDenseLayerWeights", "KdaDims", "KdaMoeLayerWeights", "KdaState", "KdaWeights", "LayerNorms", "LayerPosition",
    "MlaDims", "MlaMoeLayerWeights", "MlaWeights", "MoeDims", "MoeWeights", "PagedLatentCache", "ResidualStream",
    "attn_res_mix", "conv_step", "dense_mlp", "delta_rule_step", "e2m1_table", "gated_rms_norm", "kda_decode_step", "kda_gate", "kda_recurrent_step",
    "kda_dense_layer", "kda_moe_layer", "l2_normalize", "latent_moe", "mla_attend", "mla_decode", "mla_decode_unabsorbed", "mla_moe_layer",
    "mxfp4_pack", "mxfp4_unpack", "random_attn_res_weights", "random_dense_mlp_weights", "random_kda_moe_layer", "random_kda_state",
    "random_kda_weights", "random_layer_norms", "random_mla_moe_layer", "random_mla_weights", "random_moe_weights", "random_mxfp4",
    "random_paged_cache", "random_residual_stream", "rel_err", "rms_norm", "route", "routed_experts", "select_experts", "shared_experts",
    "situ_glu", "situ_glu_packed",
]
