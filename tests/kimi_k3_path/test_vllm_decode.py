"""The decode executor inside vLLM's Kimi K3 forward, on CPU with the real vllm package: vLLM's own
`KimiK3ForConditionalGeneration.forward`, under a vLLM forward context with real attention-metadata classes and
caches in vLLM's layouts, routes a pure-decode step through the plugin's `PathDecode` (reference ops on CPU), and
prefill, mixed, oversized and pipeline-stage steps to its stock forward, counting every decision.

What cannot run here, and so is not compared end to end: vLLM's stock forward of this model on CPU. Its KDA core
(fla Triton kernels), MLA decode (the CPU MLA backend calls vllm._C, absent from this CUDA build), AttnRes (a Triton
kernel or vllm._C) and MXFP4 experts (no CPU backend: Marlin is CUDA, EMULATION needs amd-quark) have no CPU
implementation in this install. What can be compared is compared: every vLLM module of the loaded model that runs
on CPU (the projections, the dense and shared-expert SiTU MLPs, the router gate, the latent down/norm/up) against
the corresponding piece of the specialized path on the re-laid-out weights (SiTU through SituAndMul.forward_native:
its default dispatch calls a vllm._C op), and the whole specialized step against the reference layers composed
directly."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the real vllm package is not installed (the [vllm] extra)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402
from vllm.model_executor.layers.attention.mla_attention import (  # noqa: E402
    MLACommonDecodeMetadata,
    MLACommonMetadata,
)
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first  # noqa: E402
from vllm.models.kimi_k3.nvidia.kda_metadata import KimiK3KDAMetadata  # noqa: E402

from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import break_fp4_bytes  # noqa: E402

from kimi_k3_path.reference import (  # noqa: E402
    KdaDenseLayerWeights,
    KdaState,
    LayerPosition,
    PagedLatentCache,
    ResidualStream,
    attn_res_mix,
    dense_mlp,
    kda_dense_layer,
    kda_moe_layer,
    mla_moe_layer,
    mxfp4_unpack,
    rel_err,
    rms_norm,
    shared_experts,
)
from kimi_k3_path.vllm_decode import PathDecode, VllmStockLayers, layer_name  # noqa: E402

SLOTS, PAGES, PAGE = 6, 12, 16


def _is_kda(layer):
    return hasattr(layer.self_attn, "in_proj_qkvgfab")


def _bind_caches(lm, gen):
    """Random state in vLLM's layouts: per KDA layer (conv, recurrent) slots, per MLA layer a paged latent cache."""
    t = lm.config
    for layer in lm.model.layers:
        attn = layer.self_attn
        if _is_kda(layer):
            conv_shape, ssm_shape = attn.get_state_shape()[:2]
            attn.kv_cache = (torch.randn(SLOTS, *conv_shape, generator=gen).to(torch.bfloat16),
                             0.1 * torch.randn(SLOTS, *ssm_shape, generator=gen))
        else:
            attn.kv_cache = torch.randn(PAGES, PAGE, t.kv_lora_rank + t.qk_rope_head_dim,
                                        generator=gen).to(torch.bfloat16)


def _metadata(lm, seq_lens, query_lens=None, state_slots=None):
    """Real vLLM metadata for a step: decode requests first (seq_lens count the token being decoded)."""
    query_lens = query_lens or [1] * len(seq_lens)
    num_decodes = sum(1 for q in query_lens if q == 1)
    tokens = sum(query_lens)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    pages_per_seq = -(-max(seq_lens) // PAGE)
    table = torch.arange(len(seq_lens) * pages_per_seq, dtype=torch.int32).reshape(len(seq_lens), -1)
    table = (PAGES - 1 - table) % PAGES  # not the identity: pages are looked up through the table
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    slot_mapping = torch.tensor([int(table[i, (n - 1) // PAGE]) * PAGE + (n - 1) % PAGE for i, n in enumerate(seq_lens)])
    slots = torch.tensor(state_slots or list(range(SLOTS - 1, SLOTS - 1 - len(seq_lens), -1)), dtype=torch.int32)
    by_layer = {}
    for layer in lm.model.layers:
        name = layer_name(layer.self_attn)
        if _is_kda(layer):
            by_layer[name] = KimiK3KDAMetadata(
                num_prefills=len(seq_lens) - num_decodes, num_prefill_tokens=tokens - num_decodes,
                num_decodes=num_decodes, num_decode_tokens=num_decodes, num_spec_decodes=0, num_spec_decode_tokens=0,
                num_actual_tokens=tokens, non_spec_state_indices_tensor=slots)
        else:
            by_layer[name] = MLACommonMetadata(
                num_reqs=len(seq_lens), max_query_len=max(query_lens), max_seq_len=max(seq_lens),
                num_actual_tokens=tokens, query_start_loc=qsl, slot_mapping=slot_mapping, num_decodes=num_decodes,
                num_decode_tokens=num_decodes, num_prefills=len(seq_lens) - num_decodes,
                decode=MLACommonDecodeMetadata(block_table=table[:num_decodes], seq_lens=seq[:num_decodes],
                                               dcp_tot_seq_lens=None))
    return by_layer


def _expected_step(decode: PathDecode, lm, ids, metadata):
    """The step from the reference layers called directly, on states read from the caches here."""
    x = lm.model.embed_tokens.weight[ids].float()
    b, dims = x.shape[0], decode.dims
    stream = ResidualStream(blocks=torch.zeros(b, lm.model.num_attn_res_blocks, x.shape[1]), prefix=x)
    delta, states = torch.zeros_like(x), {}
    for layer, w in zip(lm.model.layers, decode.weights.layers):
        md, pos = metadata[layer_name(layer.self_attn)], LayerPosition(layer.layer_idx, dims.attn_res_block)
        if _is_kda(layer):
            conv, ssm = layer.self_attn.kv_cache
            slots = md.non_spec_state_indices_tensor.long()
            window = conv[slots] if is_conv_state_dim_first() else conv[slots].transpose(1, 2)
            state = KdaState(conv=window.float(), recurrent=ssm[slots].float())
            run = kda_dense_layer if isinstance(w, KdaDenseLayerWeights) else kda_moe_layer
            args = (dims.kda,) if isinstance(w, KdaDenseLayerWeights) else (dims.kda, dims.moe)
            delta, stream, states[layer.layer_idx] = run(delta, stream, w, state, pos, *args)
        else:
            cache = PagedLatentCache(layer.self_attn.kv_cache, md.decode.block_table, md.decode.seq_lens)
            delta, stream, states[layer.layer_idx] = mla_moe_layer(delta, stream, w, cache, pos, dims.mla, dims.moe)
    final = attn_res_mix(stream.blocks, stream.prefix + delta, decode.weights.final, dims.moe.eps, 0.0)
    return final, states


def test_a_pure_decode_step_runs_the_specialized_path_inside_vllms_forward(tiny_k3):
    model, lm = tiny_k3.model, tiny_k3.model.language_model
    decode = lm.specialized_decode
    assert isinstance(decode, PathDecode) and decode.executor.specialized.name == "specialized[reference]"
    gen = torch.Generator().manual_seed(5)
    _bind_caches(lm, gen)
    seq_lens = [7, 21, 40]
    metadata = _metadata(lm, seq_lens)
    ids = torch.randint(0, lm.config.vocab_size, (3,), generator=gen)
    expected, states = _expected_step(decode, lm, ids, metadata)  # reads the caches before the step writes them
    before = {i: [c.clone() for c in (layer.self_attn.kv_cache if _is_kda(layer) else (layer.self_attn.kv_cache,))]
              for i, layer in enumerate(lm.model.layers)}

    with set_forward_context(metadata, tiny_k3.vllm_config):
        out = model(input_ids=ids, positions=torch.tensor([n - 1 for n in seq_lens]))

    assert out.dtype == torch.bfloat16 and out.shape == (3, lm.config.hidden_size)
    # Same fp32 reference ops, composed by the executor vs called directly; both rounded to bf16 at the end.
    assert rel_err(out, expected.to(torch.bfloat16)) < 1e-2
    assert rel_err(out.float(), expected) < 1e-2
    assert decode.summary() == {"specialized: decode batch inside the support matrix": 1}
    # The executor routed each of the 7 MoE layers; layer 0 (dense) is composed by PathDecode itself.
    assert sum(decode.executor.decisions.values()) == 7

    # The step wrote the new state back into vLLM's caches, and only the decoding requests' slots / rows.
    md = metadata
    for i, layer in enumerate(lm.model.layers):
        if _is_kda(layer):
            conv, ssm = layer.self_attn.kv_cache
            slots = md[layer_name(layer.self_attn)].non_spec_state_indices_tensor.long()
            window = states[i].conv if is_conv_state_dim_first() else states[i].conv.transpose(1, 2)
            assert torch.equal(conv[slots], window.to(conv.dtype)) and torch.equal(ssm[slots], states[i].recurrent)
            untouched = [s for s in range(SLOTS) if s not in slots.tolist()]
            assert torch.equal(ssm[untouched], before[i][1][untouched])
        else:
            cache = layer.self_attn.kv_cache
            changed = (cache != before[i][0]).any(-1).nonzero().tolist()
            written = [[s // PAGE, s % PAGE] for s in md[layer_name(layer.self_attn)].slot_mapping.tolist()]
            assert sorted(changed) == sorted(written)
            for page, offset in written:
                assert torch.equal(cache[page, offset], states[i].pages[page, offset].to(cache.dtype))


@pytest.mark.parametrize(
    ("seq_lens", "query_lens", "reason"),
    [([9, 30], [9, 30], "prefill batch"),
     ([5, 12], [1, 12], "mixed batch"),
     ([3] * 9, None, "decode batch of 9 exceeds max_batch 8"),  # --max-num-seqs 8
     ([4098, 3], None, "context of 4097 cached tokens exceeds max_context 4096"),  # --max-model-len 4096
     ([1, 4], None, "mixed batch")],  # a one-token prompt has no context: not a decode
)
def test_other_steps_stay_on_the_stock_forward_and_are_counted(tiny_k3, seq_lens, query_lens, reason):
    lm = tiny_k3.model.language_model
    decode = lm.specialized_decode
    decode.steps.clear()
    metadata = _metadata(lm, seq_lens, query_lens, state_slots=list(range(len(seq_lens))))
    tokens = sum(query_lens or [1] * len(seq_lens))
    with set_forward_context(metadata, tiny_k3.vllm_config):
        assert decode.plan(torch.zeros(tokens, dtype=torch.long), None) is None
    assert decode.summary() == {f"vllm-stock: {reason}": 1}


def test_pipeline_stage_inputs_and_steps_without_metadata_stay_stock(tiny_k3):
    decode = tiny_k3.model.language_model.specialized_decode
    decode.steps.clear()
    assert decode.plan(torch.zeros(2, dtype=torch.long), {"hidden_states": None}) is None
    assert decode.plan(torch.zeros(2, dtype=torch.long), None) is None  # no forward context: a profiling run
    assert decode.summary() == {"vllm-stock: pipeline-stage input": 1,
                                "vllm-stock: no attention metadata (profiling or warmup run)": 1}
    with pytest.raises(RuntimeError, match="a planned step reached the stock path"):
        VllmStockLayers().kda_moe()


def test_vllms_modules_that_run_on_cpu_agree_with_the_specialized_pieces(tiny_k3):
    """vLLM's own modules of the loaded model (bf16 weights, bf16 activations) against the specialized path's ops
    on the re-laid-out weights (fp32): to bf16 rounding, rel_err < 2e-2."""
    def situ_mlp(mlp, x):
        # KimiMLP.forward, with SituAndMul's native torch path (its default dispatch calls a vllm._C op).
        return mlp.down_proj(mlp.act_fn.forward_native(mlp.gate_up_proj(x)[0]))[0]

    lm = tiny_k3.model.language_model
    weights, eps = lm.specialized_decode.weights.layers, lm.specialized_decode.dims.moe.eps
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(4, lm.config.hidden_size, generator=gen).to(torch.bfloat16)
    checked = []
    with torch.no_grad():
        for layer, w in zip(lm.model.layers, weights):
            attn = layer.self_attn
            if _is_kda(layer):
                assert rel_err(attn.in_proj_qkvgfab(x)[0][:, : w.kda.in_proj.shape[0]], x.float() @ w.kda.in_proj.float().T) < 2e-2
                checked.append("kda.in_proj")
            else:
                assert rel_err(attn.fused_qkv_a_g_proj(x)[0], x.float() @ w.mla.qkv_a.float().T) < 2e-2
                checked.append("mla.qkv_a")
            if isinstance(w, KdaDenseLayerWeights):
                assert rel_err(situ_mlp(layer.mlp, x), dense_mlp(x, w.mlp)) < 2e-2
                checked.append("dense_mlp")
                continue
            moe = layer.block_sparse_moe
            assert rel_err(moe.gate(x)[0], x.float() @ w.moe.router.float().T) < 2e-2
            assert rel_err(situ_mlp(moe.shared_experts, x), shared_experts(x, w.moe)) < 2e-2
            lat = moe.routed_expert_down_proj(x)[0]
            assert rel_err(lat, x.float() @ w.moe.down.float().T) < 2e-2
            assert rel_err(moe.routed_output_transform(lat), rms_norm(lat, w.moe.latent_norm, eps) @ w.moe.up.float().T) < 2e-2
            checked.append("moe")
    assert checked.count("moe") == 7 and "dense_mlp" in checked


def test_vllms_fp4_decoder_reads_the_relaid_experts_as_the_reference_does(tiny_k3):
    """vLLM's own E2M1 decoder (`break_fp4_bytes`) and torch's E8M0 on the loaded expert parameters, padding and
    all, against the reference's `mxfp4_unpack` on the re-laid-out experts: the same values, bit for bit."""
    lm = tiny_k3.model.language_model
    w = lm.specialized_decode.weights.layers[3].moe  # an MLA layer's MoE
    routed = lm.model.layers[3].block_sparse_moe.experts.routed_experts
    i, lat, i_pad = w.w13_packed.shape[1] // 2, w.w2_packed.shape[1], routed.w13_weight.shape[1] // 2

    def vllm_values(packed, scales):
        codes = break_fp4_bytes(packed, torch.float32)
        return codes * scales.view(torch.float8_e8m0fnu).float().repeat_interleave(32, dim=-1)

    for e in (0, 17, 31):
        w13 = vllm_values(routed.w13_weight[e], routed.w13_weight_scale[e])
        expected = torch.cat([w13[:i, :lat], w13[i_pad : i_pad + i, :lat]])
        assert torch.equal(mxfp4_unpack(w.w13_packed[e], w.w13_scales[e]), expected)
        w2 = vllm_values(routed.w2_weight[e], routed.w2_weight_scale[e])
        assert torch.equal(mxfp4_unpack(w.w2_packed[e], w.w2_scales[e]), w2[:lat, :i])


VLLM_ATTN_RES_ON_CPU = r"""
import json, os
os.environ["TRITON_INTERPRET"] = "1"  # before Triton loads: vLLM's Triton kernels run in Triton's CPU interpreter
os.environ["CUDA_VISIBLE_DEVICES"] = ""  # vllm.triton_utils then accepts Triton without an active GPU driver
import torch
from vllm.models.kimi_k3.nvidia.ops.attn_res import attn_res
from kimi_k3_path.reference import AttnResWeights, LayerPosition, ResidualStream, attn_res_mix, rel_err
from kimi_k3_path.reference.layers import LayerNorms, pre_attention, pre_mlp

g = torch.Generator().manual_seed(7)
M, H, BLOCKS, EPS = 3, 256, 2, 1e-5
def site(out_norm=True):
    return AttnResWeights(res_norm=(1 + 0.1 * torch.randn(H, generator=g)).bfloat16(),
                          res_proj=torch.randn(H, generator=g).bfloat16(),
                          out_norm=(1 + 0.1 * torch.randn(H, generator=g)).bfloat16() if out_norm else None)
norms = LayerNorms(site(), site(), EPS)
worst = {}
def note(what, value):
    worst[what] = max(worst.get(what, 0.0), value)

for layer in (0, 3, 4, 5):  # block size 4: layer 0 and 4 write a block
    pos = LayerPosition(layer, block_size=4)
    prefix = torch.randn(M, H, generator=g).bfloat16()
    delta = None if layer == 0 else torch.randn(M, H, generator=g).bfloat16()
    blocks = torch.randn(M, BLOCKS, H, generator=g).bfloat16()
    # vLLM's KimiDecoderLayer._pre_attn_norm: the op updates the prefix and writes the block in place.
    p, b = prefix.clone(), blocks.clone()
    out = attn_res(p, delta, b, norms.attn.res_norm, norms.attn.res_proj, norms.attn.out_norm,
                   num_blocks=pos.blocks_before_attn, block_write_idx=pos.layer // 4 if pos.writes_block else -1,
                   eps=EPS, output_norm_eps=EPS)
    mixed, stream = pre_attention(torch.zeros(M, H) if delta is None else delta.float(),
                                  ResidualStream(blocks.float(), prefix.float()), norms, pos)
    note("pre_attention", rel_err(out, mixed))
    note("prefix", rel_err(p, stream.prefix))
    note("blocks", rel_err(b, stream.blocks))
    # _post_attn_norm: a block-writing layer restarts the prefix from the attention output.
    attn_out = torch.randn(M, H, generator=g).bfloat16()
    p2 = attn_out.clone() if pos.writes_block else p.clone()
    out = attn_res(p2, None if pos.writes_block else attn_out, b, norms.mlp.res_norm, norms.mlp.res_proj,
                   norms.mlp.out_norm, num_blocks=pos.blocks_before_mlp, block_write_idx=-1, eps=EPS,
                   output_norm_eps=EPS)
    mixed, stream = pre_mlp(attn_out.float(), ResidualStream(b.float(), p.float()), norms, pos)
    note("pre_mlp", rel_err(out, mixed))
# KimiLinearModel's final mix: no output norm.
final, prefix, delta = site(out_norm=False), torch.randn(M, H, generator=g).bfloat16(), torch.randn(M, H, generator=g).bfloat16()
blocks = torch.randn(M, BLOCKS, H, generator=g).bfloat16()
out = attn_res(prefix.clone(), delta, blocks, final.res_norm, final.res_proj, None, num_blocks=BLOCKS,
               block_write_idx=-1, eps=EPS, output_norm_eps=0.0)
note("final", rel_err(out, attn_res_mix(blocks.float(), prefix.float() + delta.float(), final, EPS, 0.0)))
print(json.dumps(worst))
"""


def test_vllms_attn_res_op_agrees_with_the_paths_residual_mixing():
    """vLLM's stock AttnRes op (the Triton kernel every layer runs twice, and the final mix), run by Triton's CPU
    interpreter in a fresh process, against the specialized path's `pre_attention` / `pre_mlp` / final mix: the
    mixed output and the in-place prefix and block updates agree to bf16 rounding (rel_err < 1e-2)."""
    import json
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", VLLM_ATTN_RES_ON_CPU], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-3000:]}"
    worst = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(worst) == {"pre_attention", "prefix", "blocks", "pre_mlp", "final"}
    assert max(worst.values()) < 1e-2, worst


def test_with_auto_the_plugins_model_class_leaves_vllms_decode_alone(tmp_path):
    """The registered class is vLLM's for `auto`: no executor in the slot, and vLLM's forward runs stock."""
    from tiny_vllm import build_model
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP

    from kimi_k3_path import vllm_plugin
    from kimi_k3_path.vllm_model import LatencySpecializedKimiK3

    with pytest.MonkeyPatch.context() as patch:
        for table in (MODELS_CONFIG_MAP, ModelRegistry.models):
            patch.setitem(table, "KimiK3ForConditionalGeneration", table["KimiK3ForConditionalGeneration"])
        vllm_plugin.register()
        tiny = build_model(tmp_path / "auto", torch.Generator().manual_seed(1), patch, {"kimi_k3_decode_backend": "auto"})
    assert isinstance(tiny.model, LatencySpecializedKimiK3) and tiny.model.kimi_k3_path_deployment is None
    assert tiny.model.language_model.specialized_decode is None
