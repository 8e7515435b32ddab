from __future__ import annotations

import torch

from kimi_k3_path.reference import latent_moe, mxfp4_unpack, naive, random_moe_weights, rel_err, route, situ_glu_packed


def test_latent_moe_matches_naive(gen, moe_dims):
    w = random_moe_weights(moe_dims, gen)
    x = torch.randn(5, moe_dims.hidden, generator=gen)
    assert rel_err(latent_moe(x, w, moe_dims), naive.latent_moe(x, w, moe_dims)) < 1e-5


def test_routing_selects_by_biased_scores_weights_by_unbiased(gen, moe_dims):
    w = random_moe_weights(moe_dims, gen)
    x = torch.randn(6, moe_dims.hidden, generator=gen)
    ids, weights = route(x, w, moe_dims)
    n_ids, n_weights = naive.route(x, w, moe_dims)
    assert ids.tolist() == n_ids
    assert rel_err(weights, torch.tensor(n_weights)) < 1e-6
    assert torch.allclose(weights.sum(-1), torch.full((6,), moe_dims.routed_scaling_factor))
    assert all(len(set(row)) == moe_dims.top_k for row in ids.tolist())


def test_routing_ties_go_to_the_lower_expert_index(moe_dims):
    w = random_moe_weights(moe_dims, torch.Generator().manual_seed(0))
    # A zero router and zero bias make every expert tie: the first top_k indices win.
    tied = type(w)(**{**w.__dict__, "router": torch.zeros_like(w.router), "router_bias": torch.zeros_like(w.router_bias)})
    ids, weights = route(torch.randn(2, moe_dims.hidden), tied, moe_dims)
    assert ids.tolist() == [list(range(moe_dims.top_k))] * 2
    # Bias ties between two chosen candidates: 3 and 7 equal; 3 comes first.
    bias = torch.full((moe_dims.experts,), -1.0)
    bias[7] = bias[3] = 1.0
    ids, _ = route(torch.randn(1, moe_dims.hidden), type(w)(**{**tied.__dict__, "router_bias": bias}), moe_dims)
    assert ids[0, :2].tolist() == [3, 7]


def test_single_expert_path_by_hand(gen, moe_dims):
    # y for one token = weight * situ(x_lat @ w13^T) @ w2^T, summed over its experts, computed without helpers.
    w = random_moe_weights(moe_dims, gen)
    x = torch.randn(1, moe_dims.hidden, generator=gen)
    ids, weights = route(x, w, moe_dims)
    x_lat = x @ w.down.T
    y = sum(
        weights[0, j]
        * situ_glu_packed(x_lat @ mxfp4_unpack(w.w13_packed[e], w.w13_scales[e]).T)
        @ mxfp4_unpack(w.w2_packed[e], w.w2_scales[e]).T
        for j, e in enumerate(ids[0].tolist())
    )
    y = y * torch.rsqrt(y.pow(2).mean() + moe_dims.eps) * w.latent_norm
    shared = situ_glu_packed(x @ w.shared13.T) @ w.shared2.T
    assert rel_err(latent_moe(x, w, moe_dims), y @ w.up.T + shared) < 1e-5


def test_random_weights_are_what_a_bf16_checkpoint_holds(gen, moe_dims):
    # The kernels and the stock path read bf16 matrices; unrounded fp32 reference weights made the fp32 reference
    # pick a different 16th expert for ~1% of tokens on the H200 (keys 2e-4 apart), a harness error, not a kernel one.
    w = random_moe_weights(moe_dims, gen)
    for name in ("router", "down", "up", "shared13", "shared2"):
        matrix = getattr(w, name)
        assert matrix.dtype == torch.float32 and torch.equal(matrix, matrix.to(torch.bfloat16).float()), name
