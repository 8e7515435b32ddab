"""The specialized path's per-layer weights, built once from the parameters vLLM's Kimi K3 model holds after loading.

vLLM 0.33 (`vllm/models/kimi_k3/nvidia/model.py`, `kda.py`, `mla.py`) holds, per TP rank:

- KDA `in_proj_qkvgfab` [q | k | v | g | f_a | beta (| zero padding to 16 rows)]: f_a is replicated (every rank
  loads it whole), the rest column-split by head; `conv1d.weight` [3*proj, 1, W]; `A_log`, `dt_bias` fp32;
  `f_b_proj`, `o_norm`, `o_proj` (row-split);
- MLA `fused_qkv_a_g_proj` [q_a | kv_a_proj_with_mqa | g]: q_a and kv_a replicated, g column-split; the q/kv
  LoRA norms, `q_b_proj`, `kv_b_proj` (per head: nope rows, then v rows), `o_proj`;
- MoE: the router `gate.weight` with its fp32 `e_score_correction_bias`, the replicated `routed_expert_down_proj`,
  `routed_expert_norm`, `routed_expert_up_proj`, the fused `shared_experts`, and the routed experts as the checkpoint
  stores them before the backend repacks them (`process_weights_after_loading`): `w13_weight` uint8
  [E, 2*I_pad, L_pad/2] with the gate (w1) rows at [0, I) and the up (w3) rows at [I_pad, I_pad+I), two E2M1 codes
  per byte, element 2i in the low nibble; `w13_weight_scale` uint8 E8M0 [E, 2*I_pad, L_pad/32]; `w2_weight`
  [E, L_pad, I_pad/2] and its scales. I_pad and L_pad are the MoE backend's rounding (Marlin, the sm_90 backend:
  I to 128, L to 256) and KimiMoE's minimum of 256 intermediate rows per rank; the padding holds zeros;
- per layer the AttnRes norms and projections, and the model's final `output_attn_res_*`.

Those are already the per-rank reference layout (`kimi_k3_path.reference`), so the re-layout is slicing: views of
the loaded parameters where nothing is padded (no copy), one copy of the w13 halves where the intermediate is.
The kernels' own layout is made from these reference weights by `kernels.moe.prepare_weights`, as for any other
`MoeWeights`. Every shape is checked against the config's per-rank dims, naming the parameter.

Reads modules by attribute only: no vllm import, so it is testable on anything shaped like vLLM's modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kimi_k3_path.reference import (
    AttnResWeights,
    DenseMlpWeights,
    KdaDenseLayerWeights,
    KdaMoeLayerWeights,
    KdaWeights,
    LayerNorms,
    MlaMoeLayerWeights,
    MlaWeights,
    MoeWeights,
)
from kimi_k3_path.reference.dims import LayerDims
from kimi_k3_path.reference.mxfp4 import MX_BLOCK

LayerWeights = KdaDenseLayerWeights | KdaMoeLayerWeights | MlaMoeLayerWeights


@dataclass(frozen=True)
class ModelWeights:
    """Every decoder layer of this rank's pipeline stage (index = vLLM layer index) and the final AttnRes mix."""

    layers: tuple[LayerWeights, ...]
    final: AttnResWeights  # output_attn_res_norm / output_attn_res_proj, no output norm


class LayoutError(ValueError):
    """A loaded parameter whose shape or dtype is not what the config's per-rank dims imply."""


def _check(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    if tuple(t.shape) != shape:
        raise LayoutError(f"{name}: shape {tuple(t.shape)}, expected {shape}")
    if dtype is not None and t.dtype != dtype:
        raise LayoutError(f"{name}: dtype {t.dtype}, expected {dtype}")
    return t


def _at_least(t: torch.Tensor, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """`t` is `shape` plus backend padding at the end of each dimension."""
    if t.dim() != len(shape) or any(have < want for have, want in zip(t.shape, shape)):
        raise LayoutError(f"{name}: shape {tuple(t.shape)} cannot hold the per-rank shape {shape}")
    return t


def layer_norms(layer: Any, eps: float) -> LayerNorms:
    """The two AttnRes sites of a KimiDecoderLayer: the mix before the attention, normed by input_layernorm, and
    the mix before the MLP, normed by post_attention_layernorm."""

    def site(res_norm: Any, res_proj: Any, out_norm: Any) -> AttnResWeights:
        hidden = out_norm.weight.shape[0]
        return AttnResWeights(
            res_norm=_check(res_norm.weight, "res_norm", (hidden,)),
            res_proj=_check(res_proj.weight, "res_proj", (1, hidden)).reshape(hidden),
            out_norm=out_norm.weight,
        )

    return LayerNorms(
        attn=site(layer.self_attention_res_norm, layer.self_attention_res_proj, layer.input_layernorm),
        mlp=site(layer.mlp_res_norm, layer.mlp_res_proj, layer.post_attention_layernorm),
        eps=eps,
    )


def kda_weights(attn: Any, d: LayerDims) -> KdaWeights:
    k = d.kda
    in_proj = _at_least(attn.in_proj_qkvgfab.weight, "in_proj_qkvgfab.weight", (k.in_proj_rows, k.hidden))
    conv = _check(attn.conv1d.weight, "conv1d.weight", (3 * k.proj, 1, k.conv_width))
    return KdaWeights(
        in_proj=in_proj[: k.in_proj_rows],  # the rows past these are alignment padding
        f_b=_check(attn.f_b_proj.weight, "f_b_proj.weight", (k.proj, k.head_dim)),
        conv=conv.reshape(3 * k.proj, k.conv_width),
        a_log=_check(attn.A_log, "A_log", (k.heads,)),
        dt_bias=_check(attn.dt_bias, "dt_bias", (k.proj,)),
        o_norm=_check(attn.o_norm.weight, "o_norm.weight", (k.head_dim,)),
        o_proj=_check(attn.o_proj.weight, "o_proj.weight", (k.hidden, k.proj)),
    )


def mla_weights(attn: Any, d: LayerDims) -> MlaWeights:
    m = d.mla
    return MlaWeights(
        qkv_a=_check(attn.fused_qkv_a_g_proj.weight, "fused_qkv_a_g_proj.weight", (m.qkv_a_rows, m.hidden)),
        q_a_norm=_check(attn.q_a_layernorm.weight, "q_a_layernorm.weight", (m.q_lora,)),
        kv_a_norm=_check(attn.kv_a_layernorm.weight, "kv_a_layernorm.weight", (m.kv_lora,)),
        q_b=_check(attn.q_b_proj.weight, "q_b_proj.weight", (m.heads * m.qk_head, m.q_lora)),
        kv_b=_check(attn.kv_b_proj.weight, "kv_b_proj.weight", (m.heads * (m.qk_nope + m.v_head), m.kv_lora)),
        o_proj=_check(attn.o_proj.weight, "o_proj.weight", (m.hidden, m.heads * m.v_head)),
    )


def _w13(t: torch.Tensor, name: str, i: int, cols: int) -> torch.Tensor:
    """[E, 2*I_pad, X] with gate rows at [0, I) and up rows at [I_pad, I_pad+I) -> [E, 2*I, cols]."""
    i_pad = t.shape[1] // 2
    if t.shape[1] % 2 or i_pad < i:
        raise LayoutError(f"{name}: {t.shape[1]} rows cannot hold gate and up halves of {i} rows each")
    if i_pad == i:
        return t[:, : 2 * i, :cols]
    return torch.cat([t[:, :i, :cols], t[:, i_pad : i_pad + i, :cols]], dim=1)


def moe_weights(moe: Any, d: LayerDims) -> MoeWeights:
    """A KimiMoE block's weights; the routed experts as loaded (checkpoint packing), without backend padding."""
    m = d.moe
    e, i, lat, h = m.experts, m.intermediate, m.latent, m.hidden
    routed = moe.experts.routed_experts
    w13 = _at_least(routed.w13_weight, "w13_weight", (e, 2 * i, lat // 2))
    w13_scale = _at_least(routed.w13_weight_scale, "w13_weight_scale", (e, 2 * i, lat // MX_BLOCK))
    w2 = _at_least(routed.w2_weight, "w2_weight", (e, lat, i // 2))
    w2_scale = _at_least(routed.w2_weight_scale, "w2_weight_scale", (e, lat, i // MX_BLOCK))
    for name, t in (("w13_weight", w13), ("w13_weight_scale", w13_scale), ("w2_weight", w2),
                    ("w2_weight_scale", w2_scale)):
        _check(t, name, tuple(t.shape), torch.uint8)  # MXFP4 codes and E8M0 exponents, as the checkpoint has them
    shared = moe.shared_experts
    return MoeWeights(
        router=_check(moe.gate.weight, "gate.weight", (e, h)),
        router_bias=_check(moe.gate.e_score_correction_bias, "gate.e_score_correction_bias", (e,), torch.float32),
        down=_check(moe.routed_expert_down_proj.weight, "routed_expert_down_proj.weight", (lat, h)),
        w13_packed=_w13(w13, "w13_weight", i, lat // 2),
        w13_scales=_w13(w13_scale, "w13_weight_scale", i, lat // MX_BLOCK),
        w2_packed=w2[:, :lat, : i // 2],
        w2_scales=w2_scale[:, :lat, : i // MX_BLOCK],
        latent_norm=_check(moe.routed_expert_norm.weight, "routed_expert_norm.weight", (lat,)),
        up=_check(moe.routed_expert_up_proj.weight, "routed_expert_up_proj.weight", (h, lat)),
        shared13=_check(shared.gate_up_proj.weight, "shared_experts.gate_up_proj.weight", (2 * m.shared_intermediate, h)),
        shared2=_check(shared.down_proj.weight, "shared_experts.down_proj.weight", (h, m.shared_intermediate)),
    )


def dense_weights(mlp: Any, hidden: int, intermediate: int) -> DenseMlpWeights:
    return DenseMlpWeights(
        gate_up=_check(mlp.gate_up_proj.weight, "mlp.gate_up_proj.weight", (2 * intermediate, hidden)),
        down=_check(mlp.down_proj.weight, "mlp.down_proj.weight", (hidden, intermediate)),
    )


def layer_weights(layer: Any, d: LayerDims, dense_intermediate: int) -> LayerWeights:
    """One KimiDecoderLayer; the error names the layer and the parameter."""
    index = layer.layer_idx
    try:
        norms = layer_norms(layer, d.moe.eps)
        is_kda = hasattr(layer.self_attn, "in_proj_qkvgfab")
        if not layer.is_moe_layer:
            if not is_kda:
                raise LayoutError("a dense MLP after MLA: Kimi K3's dense layers are KDA layers")
            return KdaDenseLayerWeights(norms, kda_weights(layer.self_attn, d),
                                        dense_weights(layer.mlp, d.moe.hidden, dense_intermediate))
        moe = moe_weights(layer.block_sparse_moe, d)
        if is_kda:
            return KdaMoeLayerWeights(norms, kda_weights(layer.self_attn, d), moe)
        return MlaMoeLayerWeights(norms, mla_weights(layer.self_attn, d), moe)
    except LayoutError as error:
        raise LayoutError(f"layer {index}: {error}") from None


def model_weights(backbone: Any, d: LayerDims, dense_intermediate: int) -> ModelWeights:
    """All layers of vLLM's `KimiLinearModel` (`backbone`) and its final AttnRes, re-laid out once."""
    if backbone.start_layer != 0:
        raise LayoutError(f"the backbone starts at layer {backbone.start_layer}: pipeline stages are not supported")
    layers = tuple(layer_weights(layer, d, dense_intermediate)
                   for layer in backbone.layers[backbone.start_layer : backbone.end_layer])
    hidden = d.moe.hidden
    final = AttnResWeights(
        res_norm=_check(backbone.output_attn_res_norm.weight, "output_attn_res_norm.weight", (hidden,)),
        res_proj=_check(backbone.output_attn_res_proj.weight, "output_attn_res_proj.weight", (1, hidden)).reshape(hidden),
        out_norm=None,
    )
    return ModelWeights(layers=layers, final=final)
