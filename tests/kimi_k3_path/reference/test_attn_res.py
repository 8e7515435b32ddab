from __future__ import annotations

import pytest
import torch

from kimi_k3_path.reference import AttnResWeights, attn_res_mix, naive, random_attn_res_weights, rel_err, rms_norm


@pytest.mark.parametrize("n_blocks", [0, 1, 8])
def test_attn_res_matches_naive(gen, n_blocks):
    w = random_attn_res_weights(40, gen)
    blocks = torch.randn(3, n_blocks, 40, generator=gen) * 2
    prefix = torch.randn(3, 40, generator=gen)
    out = attn_res_mix(blocks, prefix, w, 1e-5, 1e-5)
    assert rel_err(out, naive.attn_res_mix(blocks, prefix, w, 1e-5, 1e-5)) < 1e-5


def test_single_source_is_the_normed_prefix(gen):
    # With only the prefix the softmax is exactly one (vLLM's num_blocks == 0 shortcut).
    w = random_attn_res_weights(32, gen)
    prefix = torch.randn(2, 32, generator=gen)
    out = attn_res_mix(torch.empty(2, 0, 32), prefix, w, 1e-5, 1e-5)
    assert rel_err(out, rms_norm(prefix, w.out_norm, 1e-5)) < 1e-6


def test_scores_use_normed_keys_but_mix_raw_sources(gen):
    # Scaling one source leaves its score unchanged (RMS-normed key) but scales its share of the mix.
    h = 32
    proj = torch.zeros(h)
    proj[0] = 1.0
    w = AttnResWeights(res_norm=torch.ones(h), res_proj=proj * 1e-9, out_norm=torch.ones(h))  # ~uniform softmax
    a = torch.randn(1, 1, h, generator=gen)
    b = torch.randn(1, h, generator=gen)
    mixed_before_norm = (a[:, 0] * 10 + b) / 2
    out = attn_res_mix(a * 10, b, w, 0.0, 0.0)
    assert rel_err(out, rms_norm(mixed_before_norm, None, 0.0)) < 1e-5


def test_rejects_too_many_sources_and_bad_shapes(gen):
    w = random_attn_res_weights(16, gen)
    with pytest.raises(ValueError, match="at most 9"):
        attn_res_mix(torch.randn(1, 9, 16), torch.randn(1, 16), w, 1e-5, 1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        attn_res_mix(torch.randn(1, 2, 16), torch.randn(2, 16), w, 1e-5, 1e-5)
