"""kernels/kda.py's host composition on CPU: in_proj and o_proj around the recurrent launch, with stand-ins for the
CuTe DSL launches (dense_decode: a bf16 matmul; the middle: the fp32 reference with f_b folded in, state updated in
place at the slots as the kernel updates it), against `reference.kda_decode_step`; in_proj's padding; and the refusal
of a bad input. The kernels themselves: test_kda_recurrent_gpu.py, test_dense_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

from kimi_k3_path.kernels import dense, kda  # noqa: E402
from kimi_k3_path.reference import (  # noqa: E402
    KdaDims,
    KdaState,
    kda_decode_step,
    kda_recurrent_step,
    random_kda_state,
    random_kda_weights,
    rel_err,
)
from kimi_k3_path.reference.kda import split_in_proj  # noqa: E402

DIMS = KdaDims(hidden=256, heads=2, head_dim=32)


def bf16_rounded(w):
    """Reference KdaWeights as the kernels hold them: the GEMM weights and conv taps rounded to bf16."""
    return type(w)(**{f: getattr(w, f).bfloat16().float() if f in ("in_proj", "f_b", "o_proj", "conv")
                      else getattr(w, f) for f in w.__dataclass_fields__})


def _reference_middle(calls):
    def launch(projected, w, slots, conv_state, state, out, stream, check_slots=True):
        calls.append(("middle", tuple(projected.shape), tuple(slots.tolist()), check_slots))
        idx = slots.long()
        # KdaKernelWeights carries the fields kda_recurrent_step reads (conv, a_log, dt_bias, o_norm) under their names;
        # the kernel reads the first in_proj_rows columns of the padded projection and folds f_b in (fp32 accumulate).
        used = projected[:, : DIMS.in_proj_rows].float()
        g_raw = split_in_proj(used, DIMS)[2] @ w.f_b.float().T
        o, new = kda_recurrent_step(used, g_raw, w, KdaState(conv_state[idx].float(), state[idx]), DIMS)
        conv_state[idx] = new.conv.to(conv_state.dtype)
        state[idx] = new.recurrent
        out.copy_(o)

    return launch


def bf16_matmul(calls):
    """A stand-in for dense.dense_decode that records ("dense", the weight's shape) in `calls`."""

    def launch(x, w, y, stream):
        calls.append(("dense", tuple(w.shape)))
        assert x.is_contiguous() and y.is_contiguous()  # as runtime.expect demands of the kernel's arguments
        y.copy_(x.float() @ w.float().T)

    return launch


def test_in_proj_is_padded_with_zero_rows_to_the_tensor_core_tile():
    w = kda.prepare_attention_weights(random_kda_weights(DIMS, torch.Generator().manual_seed(2)), DIMS, "cpu")
    rows = DIMS.in_proj_rows  # 4 * 64 + 32 + 2 = 290
    assert w.in_proj.shape == (304, DIMS.hidden) == kda.projection_shapes(DIMS)["in_proj"]
    assert torch.count_nonzero(w.in_proj[rows:]) == 0 and torch.count_nonzero(w.in_proj[:rows]) > 0
    assert [kda.padded_rows(r) for r in (1, 16, 17, 6284, 3206)] == [16, 16, 32, 6288, 3216]


@pytest.mark.parametrize("slots, gemvs", [
    ([3], [("dense", (304, 256)), ("dense", (256, 64))]),  # one token: dense.py's GEMV (dense.DENSE_MAX_TOKENS)
    ([3, 0], []),  # from two tokens: cuBLAS
])
def test_the_attention_composes_the_gemms_around_the_middle_and_updates_only_its_slots(monkeypatch, slots, gemvs):
    gen = torch.Generator().manual_seed(5)
    ref_w = random_kda_weights(DIMS, gen)
    w = kda.prepare_attention_weights(ref_w, DIMS, "cpu")
    assert w.in_proj.dtype == torch.bfloat16 and w.middle.conv.dtype == torch.bfloat16
    calls = []
    monkeypatch.setattr(kda, "kda_recurrent_decode", _reference_middle(calls))
    monkeypatch.setattr(dense, "dense_decode", bf16_matmul(calls))
    pool = random_kda_state(DIMS, 5, gen)
    conv, recurrent = pool.conv.bfloat16(), pool.recurrent.clone()
    before = (conv.clone(), recurrent.clone())
    m = len(slots)
    x = torch.randn(m, DIMS.hidden, generator=gen).bfloat16()
    out = torch.full((m, DIMS.hidden), float("nan"), dtype=torch.bfloat16)
    kda.kda_attention_decode(x, w, torch.tensor(slots, dtype=torch.int32), conv, recurrent, out, None,
                             check_slots=False)

    assert calls == gemvs[:1] + [("middle", (m, 304), tuple(slots), False)] + gemvs[1:]
    # The reference on the same bf16 weights and state: only the GEMMs' bf16 outputs differ.
    state = KdaState(before[0][slots].float(), before[1][slots])
    ref_out, ref_state = kda_decode_step(x.float(), bf16_rounded(ref_w), state, DIMS)
    assert rel_err(out, ref_out) < 2e-2  # bf16 GEMM outputs (in_proj, o_proj) against fp32
    assert rel_err(recurrent[slots], ref_state.recurrent) < 2e-2
    untouched = [s for s in range(5) if s not in slots]
    assert torch.equal(recurrent[untouched], before[1][untouched]) and torch.equal(conv[untouched], before[0][untouched])


def test_a_bad_input_is_refused_before_any_launch(monkeypatch):
    w = kda.prepare_attention_weights(random_kda_weights(DIMS, torch.Generator().manual_seed(1)), DIMS, "cpu")
    monkeypatch.setattr(kda, "kda_recurrent_decode", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr(dense, "dense_decode", lambda *a, **k: pytest.fail("launched"))
    x = torch.zeros(2, DIMS.hidden)  # fp32
    with pytest.raises(ValueError, match=r"x must be \[M, 256\] bf16, got \(2, 256\) torch.float32"):
        kda.kda_attention_decode(x, w, None, None, None, None, None)
