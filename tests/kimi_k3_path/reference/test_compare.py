from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the references need the [kernels] extra")

from kimi_k3_path.reference.compare import rel_err  # noqa: E402


def test_rel_err_is_the_relative_norm_of_the_difference():
    ref = torch.randn(4, 8, dtype=torch.float64)
    noise = torch.randn(4, 8, dtype=torch.float64)
    assert rel_err(ref + 1e-3 * noise, ref) == pytest.approx(1e-3 * float(noise.norm()) / float(ref.norm()))


@pytest.mark.parametrize("out, ref, message", [
    (torch.ones(3), torch.ones(4), "shape"),
    (torch.tensor([1.0, float("nan")]), torch.ones(2), "NaN or inf"),
    (torch.ones(2), torch.zeros(2), "all zeros"),
])
def test_rel_err_refuses_comparisons_that_prove_nothing(out, ref, message):
    with pytest.raises(ValueError, match=message):
        rel_err(out, ref)
