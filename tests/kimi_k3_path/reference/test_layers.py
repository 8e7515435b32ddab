from __future__ import annotations

import pytest
import torch

from kimi_k3_path.reference import (
    AttnResWeights,
    KdaDenseLayerWeights,
    LayerPosition,
    MoeDims,
    ResidualStream,
    attn_res_mix,
    kda_dense_layer,
    kda_moe_layer,
    latent_moe,
    mla_decode,
    mla_moe_layer,
    naive,
    random_dense_mlp_weights,
    random_kda_moe_layer,
    random_kda_state,
    random_kda_weights,
    random_mla_moe_layer,
    random_paged_cache,
    random_residual_stream,
    rel_err,
)


def test_layer_position_block_bookkeeping():
    inner = LayerPosition(90)  # 1-based 91: 8 completed blocks, so 9 sources
    assert (inner.writes_block, inner.blocks_before_attn, inner.blocks_before_mlp) == (False, 8, 8)
    first_of_block = LayerPosition(12)
    assert (first_of_block.writes_block, first_of_block.blocks_before_attn, first_of_block.blocks_before_mlp) == (True, 1, 2)
    # Layer 0, the dense layer, writes block 0 before its attention and mixes only its own prefix there.
    dense = LayerPosition(0)
    assert (dense.writes_block, dense.blocks_before_attn, dense.blocks_before_mlp) == (True, 0, 1)
    with pytest.raises(ValueError, match="negative"):
        LayerPosition(-1)


@pytest.mark.parametrize("layer", [12, 90])
def test_kda_moe_layer_composes_the_naive_ops(gen, kda_dims, moe_dims, layer):
    pos = LayerPosition(layer)
    w = random_kda_moe_layer(kda_dims, moe_dims, gen)
    state = random_kda_state(kda_dims, 2, gen)
    stream = random_residual_stream(2, moe_dims.hidden, 8, gen)
    delta = torch.randn(2, moe_dims.hidden, generator=gen)
    out, new_stream, _ = kda_moe_layer(delta, stream, w, state, pos, kda_dims, moe_dims)

    # The same layer from naive pieces, with the block bookkeeping spelled out.
    prefix = stream.prefix.double() + delta.double()
    blocks = stream.blocks.double().clone()
    if pos.writes_block:
        blocks[:, layer // 12] = prefix
    h = naive.attn_res_mix(blocks[:, : pos.blocks_before_attn], prefix, w.norms.attn, 1e-5, 1e-5)
    attn, _ = naive.kda_decode_step(h.float(), w.kda, state, kda_dims)
    prefix = attn if pos.writes_block else prefix + attn
    h = naive.attn_res_mix(blocks[:, : pos.blocks_before_mlp], prefix, w.norms.mlp, 1e-5, 1e-5)
    expected = naive.latent_moe(h.float(), w.moe, moe_dims)
    assert rel_err(out, expected) < 1e-4
    assert rel_err(new_stream.prefix, prefix) < 1e-5
    assert rel_err(new_stream.blocks, blocks) < 1e-6


def test_mla_moe_layer_equals_its_reference_pieces(gen, mla_dims, moe_dims):
    pos = LayerPosition(91)
    w = random_mla_moe_layer(mla_dims, moe_dims, gen)
    cache = random_paged_cache(mla_dims, [3, 9], page_size=4, gen=gen)
    stream = random_residual_stream(2, moe_dims.hidden, 8, gen)
    delta = torch.randn(2, moe_dims.hidden, generator=gen)
    out, new_stream, new_cache = mla_moe_layer(delta, stream, w, cache, pos, mla_dims, moe_dims)
    prefix = stream.prefix + delta
    h = attn_res_mix(stream.blocks, prefix, w.norms.attn, 1e-5, 1e-5)
    attn, expected_cache = mla_decode(h, w.mla, cache, mla_dims)
    h = attn_res_mix(stream.blocks, prefix + attn, w.norms.mlp, 1e-5, 1e-5)
    assert rel_err(out, latent_moe(h, w.moe, moe_dims)) < 1e-6
    assert torch.equal(new_cache.pages, expected_cache.pages)
    assert rel_err(new_stream.prefix, prefix + attn) < 1e-6
    # The references are pure: the inputs were not modified.
    assert not torch.equal(cache.pages, new_cache.pages)


def test_the_dense_first_layer_composes_the_naive_ops(gen, kda_dims):
    """Layer 0 as vLLM runs it: the embeddings are the prefix, there is no delta, block 0 is written first."""
    hidden, inter = kda_dims.hidden, 64
    w = KdaDenseLayerWeights(
        norms=random_kda_moe_layer(kda_dims, MoeDims(hidden, 32, 4, 2, 32, 32), gen).norms,
        kda=random_kda_weights(kda_dims, gen),
        mlp=random_dense_mlp_weights(hidden, inter, gen),
    )
    state = random_kda_state(kda_dims, 2, gen)
    embeddings = torch.randn(2, hidden, generator=gen)
    stream = ResidualStream(blocks=torch.zeros(2, 3, hidden), prefix=embeddings)
    out, new_stream, _ = kda_dense_layer(torch.zeros(2, hidden), stream, w, state, LayerPosition(0, 4), kda_dims)

    h = naive.rms_norm(embeddings, w.norms.attn.out_norm, 1e-5)  # one source: the softmax weight is 1
    attn, _ = naive.kda_decode_step(h.float(), w.kda, state, kda_dims)
    h = naive.attn_res_mix(embeddings.unsqueeze(1), attn, w.norms.mlp, 1e-5, 1e-5)
    gate_up = h @ w.mlp.gate_up.double().T
    expected = naive.situ_glu(gate_up[:, :inter], gate_up[:, inter:]) @ w.mlp.down.double().T
    assert rel_err(out, expected) < 1e-5
    assert torch.equal(new_stream.blocks[:, 0], embeddings) and not new_stream.blocks[:, 1:].any()
    assert rel_err(new_stream.prefix, attn) < 1e-5


def test_a_mix_without_an_output_norm_is_the_raw_softmax_mix(gen):
    """The model's final AttnRes (vLLM output_attn_res_*) has no output norm: the final norm comes after it."""
    blocks, prefix = torch.randn(3, 2, 16, generator=gen), torch.randn(3, 16, generator=gen)
    w = AttnResWeights(res_norm=torch.rand(16, generator=gen) + 0.5, res_proj=torch.randn(16, generator=gen),
                       out_norm=None)
    sources = torch.cat([blocks, prefix.unsqueeze(1)], dim=1).double()
    normed = sources * torch.rsqrt(sources.pow(2).mean(-1, keepdim=True) + 1e-5) * w.res_norm.double()
    p = torch.softmax((normed * w.res_proj.double()).sum(-1), dim=-1)
    assert rel_err(attn_res_mix(blocks, prefix, w, 1e-5, 0.0), (p.unsqueeze(-1) * sources).sum(1)) < 1e-6
