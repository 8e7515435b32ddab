from __future__ import annotations

import math

import pytest
import torch

from kimi_k3_path.reference import gated_rms_norm, l2_normalize, naive, rel_err, rms_norm, situ_glu, situ_glu_packed


def test_rms_norm_matches_naive(gen):
    x = torch.randn(5, 37, generator=gen) * 3
    w = torch.randn(37, generator=gen)
    assert rel_err(rms_norm(x, w, 1e-5), naive.rms_norm(x, w, 1e-5)) < 1e-6


def test_rms_norm_output_has_unit_rms_and_eps_matters(gen):
    x = torch.randn(4, 64, generator=gen) * 7
    out = rms_norm(x, None, 0.0)
    assert torch.allclose(out.pow(2).mean(-1), torch.ones(4), rtol=1e-5)
    tiny = torch.full((1, 64), 1e-3)
    assert float(rms_norm(tiny, None, 1e-5)[0, 0]) == pytest.approx(1e-3 / math.sqrt(1e-6 + 1e-5))


def test_situ_glu_at_known_points():
    g = torch.tensor([0.0, 4.0, -4.0, 100.0, 1.0])
    u = torch.tensor([1.0, 25.0, 25.0, 1000.0, 0.0])
    out = situ_glu(g, u)
    sig = lambda v: 1 / (1 + math.exp(-v))  # noqa: E731
    expected = [
        0.0,  # gate 0 -> 0
        4 * math.tanh(1) * sig(4) * 25 * math.tanh(1),
        4 * math.tanh(-1) * sig(-4) * 25 * math.tanh(1),
        4.0 * 25.0,  # both soft caps saturate
        0.0,  # up 0 -> 0
    ]
    assert out.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-6)


def test_situ_glu_matches_naive_and_is_soft_capped(gen):
    g = torch.randn(3, 40, generator=gen) * 10
    u = torch.randn(3, 40, generator=gen) * 60
    out = situ_glu(g, u)
    assert rel_err(out, naive.situ_glu(g, u)) < 1e-6
    assert out.abs().max() < 4 * 25
    assert torch.allclose(situ_glu_packed(torch.cat([g, u], -1)), out, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="shape"):
        situ_glu(g, u[:, :3])


def test_small_inputs_approach_silu_like_product(gen):
    # Near zero tanh(z/b)*b ~ z: situ ~ g*sigmoid(g)*u (SiLU-GLU), a sanity check on beta placement.
    g = torch.randn(100, generator=gen) * 1e-2
    u = torch.randn(100, generator=gen) * 1e-2
    assert rel_err(situ_glu(g, u), g * torch.sigmoid(g) * u) < 1e-4


def test_gated_rms_norm_and_l2(gen):
    x = torch.randn(2, 3, 16, generator=gen)
    gate = torch.randn(2, 3, 16, generator=gen)
    w = torch.randn(16, generator=gen)
    assert rel_err(gated_rms_norm(x, gate, w, 1e-5), naive.rms_norm(x, w, 1e-5) * torch.sigmoid(gate.double())) < 1e-6
    n = l2_normalize(x)
    assert torch.allclose(n.norm(dim=-1), torch.ones(2, 3), atol=1e-5)


@pytest.mark.vllm
@pytest.mark.slow
def test_situ_glu_matches_vllm_situ_and_mul(gen):
    """vLLM's own SituAndMul.forward_native on CPU agrees with the reference (skipped without the [vllm] extra)."""
    pytest.importorskip("vllm", reason="the [vllm] extra is not installed")
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.activation import SituAndMul

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        op = SituAndMul(beta=4.0, linear_beta=25.0)
    x = torch.randn(4, 64, generator=gen) * 5
    assert rel_err(op.forward_native(x), situ_glu_packed(x)) < 1e-6
