from __future__ import annotations

import pytest
import torch

from kimi_k3_path.reference import (
    KdaDims,
    delta_rule_step,
    kda_decode_step,
    kda_gate,
    kda_recurrent_step,
    naive,
    random_kda_state,
    random_kda_weights,
    rel_err,
)
from kimi_k3_path.reference.kda import split_in_proj


def test_kda_step_matches_naive_matrix_form(gen, kda_dims):
    w = random_kda_weights(kda_dims, gen)
    state = random_kda_state(kda_dims, 3, gen)
    x = torch.randn(3, kda_dims.hidden, generator=gen)
    out, new = kda_decode_step(x, w, state, kda_dims)
    n_out, n_new = naive.kda_decode_step(x, w, state, kda_dims)
    assert rel_err(out, n_out) < 1e-5
    assert rel_err(new.recurrent, n_new.recurrent) < 1e-5
    assert rel_err(new.conv, n_new.conv) < 1e-6
    assert torch.equal(new.conv[..., :-1], state.conv[..., 1:])  # the window shifts by one input
    # Two steps compose: the state carries information forward.
    x2 = torch.randn(3, kda_dims.hidden, generator=gen)
    assert rel_err(kda_decode_step(x2, w, new, kda_dims)[0], naive.kda_decode_step(x2, w, n_new, kda_dims)[0]) < 1e-5


def test_recurrent_step_between_the_gemvs_is_the_decode_step(gen, kda_dims):
    """The middle that kernels/kda_recurrent.py fuses (and its GPU tests' oracle), composed with the in_proj, f_b and
    o_proj GEMVs, is the decode step, checked against the naive fp64 loops too (so not only against itself)."""
    w = random_kda_weights(kda_dims, gen)
    state = random_kda_state(kda_dims, 3, gen)
    x = torch.randn(3, kda_dims.hidden, generator=gen)
    projected = x @ w.in_proj.T
    g_raw = split_in_proj(projected, kda_dims)[2] @ w.f_b.T
    o, new = kda_recurrent_step(projected, g_raw, w, state, kda_dims)
    assert o.shape == (3, kda_dims.proj)
    out, ref_new = kda_decode_step(x, w, state, kda_dims)
    assert torch.equal(o @ w.o_proj.T, out)
    assert torch.equal(new.recurrent, ref_new.recurrent) and torch.equal(new.conv, ref_new.conv)
    n_out, n_new = naive.kda_decode_step(x, w, state, kda_dims)
    assert rel_err(o @ w.o_proj.T, n_out) < 1e-5
    assert rel_err(new.recurrent, n_new.recurrent) < 1e-5


def test_gate_is_bounded_by_the_lower_bound(gen, kda_dims):
    w = random_kda_weights(kda_dims, gen)
    g = kda_gate(torch.randn(4, kda_dims.proj, generator=gen), w.a_log, w.dt_bias, kda_dims)
    assert (g < 0).all() and (g > kda_dims.gate_lower_bound).all()
    # Huge raw gates reach the ends (in fp32 the sigmoid saturates onto them) and never pass them.
    g = kda_gate(torch.randn(4, kda_dims.proj, generator=gen) * 1e3, w.a_log, w.dt_bias, kda_dims)
    assert (g <= 0).all() and (g >= kda_dims.gate_lower_bound).all()
    assert g.min() < -4.99 and g.max() > -0.01


def test_delta_rule_is_the_published_formula(gen):
    # S' = S diag(exp g) (I - beta k k^T) + beta v k^T, with o = S' q.
    m, h, dk, dv = 2, 3, 8, 5
    s = torch.randn(m, h, dv, dk, generator=gen)
    q, k, g = (torch.randn(m, h, dk, generator=gen) for _ in range(3))
    v = torch.randn(m, h, dv, generator=gen)
    beta = torch.rand(m, h, generator=gen)
    o, new = delta_rule_step(s, q, k, v, g, beta)
    eye = torch.eye(dk)
    expected = (
        s @ torch.diag_embed(torch.exp(g)) @ (eye - beta[..., None, None] * k.unsqueeze(-1) * k.unsqueeze(-2))
        + beta[..., None, None] * v.unsqueeze(-1) * k.unsqueeze(-2)
    )
    assert rel_err(new, expected) < 1e-5
    assert rel_err(o, (expected @ q.unsqueeze(-1)).squeeze(-1)) < 1e-5


def test_delta_rule_writes_value_at_key_when_beta_is_one(gen):
    # With no decay and beta = 1, reading the written key back returns its value exactly.
    k = torch.nn.functional.normalize(torch.randn(1, 1, 16, generator=gen), dim=-1)
    v = torch.randn(1, 1, 16, generator=gen)
    s = torch.randn(1, 1, 16, 16, generator=gen)
    _, new = delta_rule_step(s, k, k, v, torch.zeros(1, 1, 16), torch.ones(1, 1))
    assert rel_err((new @ k.unsqueeze(-1)).squeeze(-1), v) < 1e-5


def test_lower_bound_is_validated():
    with pytest.raises(ValueError, match="outside"):
        KdaDims(hidden=8, heads=1, head_dim=8, gate_lower_bound=-6.0)
    with pytest.raises(ValueError, match="outside"):
        KdaDims(hidden=8, heads=1, head_dim=8, gate_lower_bound=0.0)
