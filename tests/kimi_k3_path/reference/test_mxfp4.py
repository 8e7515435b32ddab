from __future__ import annotations

import pytest
import torch

from kimi_k3_path.reference import E2M1_MAGNITUDES, e2m1_table, mxfp4_pack, mxfp4_unpack, naive, rel_err


def test_e2m1_table_is_the_ocp_table_decoded_from_bit_fields():
    assert E2M1_MAGNITUDES == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    table = e2m1_table()
    for nibble in range(16):
        assert float(table[nibble]) == naive.e2m1_value(nibble)


def test_e8m0_scales_are_exact_powers_of_two():
    # code 2 is 1.0, so each group decodes to its scale exactly, over the whole E8M0 range but NaN (255).
    s = torch.arange(0, 255, dtype=torch.uint8).reshape(255, 1)
    packed = torch.full((255, 16), 0x22, dtype=torch.uint8)
    out = mxfp4_unpack(packed, s)
    expected = torch.tensor([2.0 ** (int(v) - 127) for v in s.flatten()], dtype=torch.float64)
    assert torch.equal(out.double(), expected.unsqueeze(1).expand(255, 32))


def test_nibble_order_low_then_high():
    packed = torch.tensor([[0x71] + [0] * 15], dtype=torch.uint8)  # element 0 = code 1 (0.5), element 1 = code 7 (6)
    out = mxfp4_unpack(packed, torch.tensor([[127]], dtype=torch.uint8))
    assert out[0, 0] == 0.5 and out[0, 1] == 6.0 and not out[0, 2:].any()


def test_pack_matches_naive_brute_force_and_roundtrips(gen):
    w = torch.randn(3, 2, 64, generator=gen) * torch.exp2(torch.randint(-8, 8, (3, 2, 1), generator=gen).float())
    packed, scales = mxfp4_pack(w)
    assert packed.shape == (3, 2, 32) and scales.shape == (3, 2, 2)
    n_packed, n_scales = naive.mxfp4_pack(w)
    assert torch.equal(packed, n_packed) and torch.equal(scales, n_scales)
    out = mxfp4_unpack(packed, scales)
    assert torch.equal(out.double(), naive.mxfp4_unpack(packed, scales))
    # Quantizing a decoded tensor again is exact.
    again = mxfp4_pack(out)
    assert torch.equal(again[0], packed) and torch.equal(again[1], scales)
    # Per element the error is at most half the top step (1 scale unit) or, above 6, the saturation (< 2 units).
    unit = torch.exp2(scales.double() - 127).repeat_interleave(32, dim=-1)
    assert ((out.double() - w.double()).abs() <= 2 * unit).all()
    assert rel_err(out, w) < 0.25


def test_round_to_nearest_even_at_midpoints_and_saturation():
    # With scale 1 (group max 6 -> exponent 0), midpoints go to the even code and 7 saturates to 6.
    values = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -5.0] + [6.0] * 22)
    out = mxfp4_unpack(*mxfp4_pack(values))
    assert out[:10].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 0.0, -4.0]


def test_zero_group_and_bad_inputs():
    packed, scales = mxfp4_pack(torch.zeros(32))
    assert not packed.any() and scales.tolist() == [0]
    with pytest.raises(ValueError, match="multiple of the MX block"):
        mxfp4_pack(torch.ones(48))
    with pytest.raises(ValueError, match="NaN or infinite"):
        mxfp4_pack(torch.full((32,), float("inf")))
    with pytest.raises(ValueError, match="E8M0 NaN"):
        mxfp4_unpack(torch.zeros(16, dtype=torch.uint8), torch.tensor([255], dtype=torch.uint8))
    with pytest.raises(ValueError, match="scales shape"):
        mxfp4_unpack(torch.zeros(16, dtype=torch.uint8), torch.zeros(2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        mxfp4_unpack(torch.zeros(16), torch.zeros(1, dtype=torch.uint8))
