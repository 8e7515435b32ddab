from __future__ import annotations

import pytest
import torch

from kimi_k3_path.reference import (
    LayerPosition,
    attn_res_mix,
    kda_moe_layer,
    latent_moe,
    mla_decode,
    mla_moe_layer,
    naive,
    random_kda_moe_layer,
    random_kda_state,
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
    with pytest.raises(ValueError, match="dense"):
        LayerPosition(0)


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
