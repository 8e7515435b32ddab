"""The experts' paired weight order (CPU): prepare_weights reorders each packed MXFP4 row once so that a lane's words
of two groups sit side by side (common.paired_word_offset), and the kernels read it back with that offset."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

from kimi_k3_path.kernels.common import paired_word_offset  # noqa: E402
from kimi_k3_path.kernels.experts import pair_groups  # noqa: E402


def test_every_byte_lands_where_the_kernels_read_it():
    gen = torch.Generator().manual_seed(0)
    natural = torch.randint(0, 256, (3, 5, 12 * 16), generator=gen, dtype=torch.uint8)  # 12 groups per row
    paired = pair_groups(natural)
    assert paired.shape == natural.shape and paired.is_contiguous()
    for group in range(12):
        for q in range(4):
            for b in range(4):
                assert torch.equal(paired[..., paired_word_offset(group, q) + b], natural[..., group * 16 + q * 4 + b])
    assert not torch.equal(paired, natural)


def test_rows_of_an_odd_number_of_groups_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="not whole pairs of MXFP4 groups"):
        pair_groups(torch.zeros(2, 3 * 16, dtype=torch.uint8))


def test_prepare_weights_pairs_the_expert_rows_and_keeps_everything_else():
    from types import SimpleNamespace

    from kimi_k3_path.kernels.moe import prepare_weights, random_weights

    d = SimpleNamespace(experts=4, hidden=64, latent=128, intermediate=64, shared_intermediate=32)
    ref = random_weights(d, "cpu", torch.Generator().manual_seed(1))
    kw = prepare_weights(ref, top_k=2, routed_scaling_factor=1.0, eps=1e-5, device="cpu")
    assert torch.equal(kw.w13_packed, pair_groups(ref.w13_packed))
    assert torch.equal(kw.w2_packed, pair_groups(ref.w2_packed))
    assert torch.equal(kw.w13_scales, ref.w13_scales) and torch.equal(kw.w2_scales, ref.w2_scales)
