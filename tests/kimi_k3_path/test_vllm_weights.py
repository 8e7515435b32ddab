"""The specialized path's weights as vLLM loads them: a tiny checkpoint in Kimi K3's safetensors naming and packing,
loaded by vLLM's real loader into vLLM's own Kimi K3 model on CPU (tiny_vllm.py says what is patched to build it),
re-laid out by the plugin once loading ends; every re-laid-out tensor is checked against the checkpoint's values,
decoded here (MXFP4 by this file's own decoder), not through the code under test."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the real vllm package is not installed (the [vllm] extra)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from kimi_k3_path.reference import (  # noqa: E402
    KdaDenseLayerWeights,
    KdaMoeLayerWeights,
    MlaMoeLayerWeights,
    mxfp4_unpack,
)
from kimi_k3_path.vllm_decode import PathDecode  # noqa: E402
from kimi_k3_path.vllm_weights import LayoutError, moe_weights  # noqa: E402

from tiny_vllm import MOE_INTERMEDIATE, decode_mxfp4  # noqa: E402


def _cat(ckpt, names):
    return torch.cat([ckpt[n] for n in names], dim=0)


def _same(relaid, expected, what):
    assert tuple(relaid.shape) == tuple(expected.shape), f"{what}: {tuple(relaid.shape)} != {tuple(expected.shape)}"
    assert torch.equal(relaid.float(), expected.float()), f"{what}: values differ"


def _check_norms(w, ckpt, p):
    _same(w.norms.attn.res_norm, ckpt[p + "self_attention_res_norm.weight"], p + "attn res_norm")
    _same(w.norms.attn.res_proj, ckpt[p + "self_attention_res_proj.weight"][0], p + "attn res_proj")
    _same(w.norms.attn.out_norm, ckpt[p + "input_layernorm.weight"], p + "input_layernorm")
    _same(w.norms.mlp.res_norm, ckpt[p + "mlp_res_norm.weight"], p + "mlp res_norm")
    _same(w.norms.mlp.res_proj, ckpt[p + "mlp_res_proj.weight"][0], p + "mlp res_proj")
    _same(w.norms.mlp.out_norm, ckpt[p + "post_attention_layernorm.weight"], p + "post_attention_layernorm")


def _check_kda(k, ckpt, a):
    # Merged in vLLM's order, with f_a (replicated) before the narrow beta rows.
    _same(k.in_proj, _cat(ckpt, [a + f"{n}_proj.weight" for n in ("q", "k", "v", "g", "f_a", "b")]), a + "in_proj")
    _same(k.conv, _cat(ckpt, [a + f"{n}_conv1d.weight" for n in ("q", "k", "v")])[:, 0, :], a + "conv")
    for mine, theirs in (("f_b", "f_b_proj.weight"), ("a_log", "A_log"), ("dt_bias", "dt_bias"),
                         ("o_norm", "o_norm.weight"), ("o_proj", "o_proj.weight")):
        _same(getattr(k, mine), ckpt[a + theirs], a + theirs)


def _check_mla(m, ckpt, a):
    _same(m.qkv_a, _cat(ckpt, [a + n for n in ("q_a_proj.weight", "kv_a_proj_with_mqa.weight", "g_proj.weight")]),
          a + "qkv_a")
    for mine, theirs in (("q_a_norm", "q_a_layernorm"), ("kv_a_norm", "kv_a_layernorm"), ("q_b", "q_b_proj"),
                         ("kv_b", "kv_b_proj"), ("o_proj", "o_proj")):
        _same(getattr(m, mine), ckpt[a + theirs + ".weight"], a + theirs)


def _check_moe(w, ckpt, m, experts):
    _same(w.router, ckpt[m + "gate.weight"], m + "gate")
    assert w.router_bias.dtype == torch.float32
    _same(w.router_bias, ckpt[m + "gate.e_score_correction_bias"], m + "e_score_correction_bias")
    _same(w.down, ckpt[m + "routed_expert_down_proj.weight"], m + "down")
    _same(w.latent_norm, ckpt[m + "routed_expert_norm.weight"], m + "latent_norm")
    _same(w.up, ckpt[m + "routed_expert_up_proj.weight"], m + "up")
    _same(w.shared13, _cat(ckpt, [m + "shared_experts.gate_proj.weight", m + "shared_experts.up_proj.weight"]),
          m + "shared13")
    _same(w.shared2, ckpt[m + "shared_experts.down_proj.weight"], m + "shared2")
    for e in range(experts):
        x = m + f"experts.{e}."
        packed13 = _cat(ckpt, [x + "w1.weight_packed", x + "w3.weight_packed"])
        scales13 = _cat(ckpt, [x + "w1.weight_scale", x + "w3.weight_scale"]).view(torch.uint8)
        # The bytes as the checkpoint stores them (gate rows then up rows), without the backend's padding...
        assert torch.equal(w.w13_packed[e], packed13) and torch.equal(w.w13_scales[e], scales13), x + "w13 bytes"
        assert torch.equal(w.w2_packed[e], ckpt[x + "w2.weight_packed"]), x + "w2 bytes"
        assert torch.equal(w.w2_scales[e], ckpt[x + "w2.weight_scale"].view(torch.uint8)), x + "w2 scales"
        # ... and the values they decode to: this file's decoder on the checkpoint, the reference's on the re-layout.
        expected13 = torch.cat([decode_mxfp4(ckpt[x + p + ".weight_packed"], ckpt[x + p + ".weight_scale"].view(torch.uint8))
                                for p in ("w1", "w3")])
        assert torch.equal(mxfp4_unpack(w.w13_packed[e], w.w13_scales[e]).double(), expected13), x + "w13 values"
        expected2 = decode_mxfp4(ckpt[x + "w2.weight_packed"], ckpt[x + "w2.weight_scale"].view(torch.uint8))
        assert torch.equal(mxfp4_unpack(w.w2_packed[e], w.w2_scales[e]).double(), expected2), x + "w2 values"


def test_every_relaid_tensor_is_the_checkpoints_value(tiny_k3):
    lm = tiny_k3.model.language_model
    decode = lm.specialized_decode
    assert isinstance(decode, PathDecode), "an admitted deployment installs the decode executor once loaded"
    ckpt, t = tiny_k3.checkpoint, tiny_k3.vllm_config.model_config.hf_text_config
    weights = decode.weights
    assert len(weights.layers) == t.num_hidden_layers
    kinds = []
    for layer, w in enumerate(weights.layers):
        p = f"language_model.layers.{layer}."
        _check_norms(w, ckpt, p)
        if isinstance(w, KdaDenseLayerWeights):
            _check_kda(w.kda, ckpt, p + "self_attn.")
            _same(w.mlp.gate_up, _cat(ckpt, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]), p + "gate_up")
            _same(w.mlp.down, ckpt[p + "mlp.down_proj.weight"], p + "down")
            kinds.append("kda_dense")
            continue
        if isinstance(w, KdaMoeLayerWeights):
            _check_kda(w.kda, ckpt, p + "self_attn.")
            kinds.append("kda_moe")
        else:
            assert isinstance(w, MlaMoeLayerWeights)
            _check_mla(w.mla, ckpt, p + "self_attn.")
            kinds.append("mla_moe")
        _check_moe(w.moe, ckpt, p + "block_sparse_moe.", t.num_experts)
    assert kinds == ["kda_dense", "kda_moe", "kda_moe", "mla_moe", "kda_moe", "kda_moe", "kda_moe", "mla_moe"]
    _same(weights.final.res_norm, ckpt["language_model.model.output_attn_res_norm.weight"], "output_attn_res_norm")
    _same(weights.final.res_proj, ckpt["language_model.model.output_attn_res_proj.weight"][0], "output_attn_res_proj")
    assert weights.final.out_norm is None


def test_the_loaded_experts_carry_backend_padding_the_relayout_drops(tiny_k3):
    """What makes the re-layout more than a view here: Marlin's rounding pads the intermediate (480 -> 512 rows per
    half, the up half starting at 512) and the latent (128 -> 256 columns)."""
    routed = tiny_k3.model.language_model.model.layers[1].block_sparse_moe.experts.routed_experts
    assert tuple(routed.w13_weight.shape) == (32, 2 * 512, 256 // 2)
    assert tuple(routed.w2_weight.shape) == (32, 256, 512 // 2)
    assert not routed.w13_weight[:, MOE_INTERMEDIATE:512].any() and not routed.w2_weight[:, 128:].any()
    w = tiny_k3.model.language_model.specialized_decode.weights.layers[1].moe
    assert tuple(w.w13_packed.shape) == (32, 2 * MOE_INTERMEDIATE, 64) and tuple(w.w2_packed.shape) == (32, 128, 240)


def test_a_parameter_of_the_wrong_shape_is_named(tiny_k3):
    decode = tiny_k3.model.language_model.specialized_decode
    moe = tiny_k3.model.language_model.model.layers[2].block_sparse_moe
    wrong = pytest.MonkeyPatch()
    try:
        wrong.setattr(moe.gate, "e_score_correction_bias", torch.nn.Parameter(torch.zeros(31), requires_grad=False))
        with pytest.raises(LayoutError, match=r"gate.e_score_correction_bias: shape \(31,\), expected \(32,\)"):
            moe_weights(moe, decode.dims)
    finally:
        wrong.undo()


def test_the_layout_checks_name_what_is_wrong(monkeypatch):
    """The re-layout's checks on their own: a dtype, a tensor too small for its per-rank shape, expert rows that
    cannot hold gate and up halves; an unpadded w13 is a view of the loaded tensor, not a copy."""
    from types import SimpleNamespace

    from kimi_k3_path import vllm_weights
    from kimi_k3_path.vllm_weights import _at_least, _check, _w13, layer_weights, model_weights

    with pytest.raises(LayoutError, match=r"w: dtype torch.float32, expected torch.uint8"):
        _check(torch.zeros(2, 3), "w", (2, 3), torch.uint8)
    with pytest.raises(LayoutError, match=r"w: shape \(2, 3\) cannot hold the per-rank shape \(2, 4\)"):
        _at_least(torch.zeros(2, 3), "w", (2, 4))
    with pytest.raises(LayoutError, match="w13: 6 rows cannot hold gate and up halves of 4 rows each"):
        _w13(torch.zeros(1, 6, 8), "w13", 4, 8)
    unpadded = torch.arange(2 * 8 * 4).reshape(2, 8, 4)
    assert _w13(unpadded, "w13", 4, 4).data_ptr() == unpadded.data_ptr()
    padded = _w13(torch.arange(2 * 12 * 4).reshape(2, 12, 4), "w13", 4, 4)
    assert padded[:, 4:].tolist() == torch.arange(2 * 12 * 4).reshape(2, 12, 4)[:, 6:10].tolist()

    monkeypatch.setattr(vllm_weights, "layer_norms", lambda layer, eps: None)  # the norms are checked elsewhere
    mla_dense = SimpleNamespace(layer_idx=5, is_moe_layer=False, self_attn=SimpleNamespace())
    with pytest.raises(LayoutError, match="layer 5: a dense MLP after MLA"):
        layer_weights(mla_dense, SimpleNamespace(moe=SimpleNamespace(eps=1e-5, hidden=8)), 16)
    with pytest.raises(LayoutError, match="starts at layer 3: pipeline stages are not supported"):
        model_weights(SimpleNamespace(start_layer=3), None, 16)
