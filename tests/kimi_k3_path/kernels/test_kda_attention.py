"""kernels/kda.py's host composition on CPU: in_proj, f_b and o_proj around the recurrent launch, with a stand-in
for that launch (the fp32 reference middle, state updated in place at the slots as the kernel updates it), against
`reference.kda_decode_step`; and its refusal of a bad input. The kernel itself: test_kda_recurrent_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

from kimi_k3_path.kernels import kda  # noqa: E402
from kimi_k3_path.reference import (  # noqa: E402
    KdaDims,
    KdaState,
    kda_decode_step,
    kda_recurrent_step,
    random_kda_state,
    random_kda_weights,
    rel_err,
)

DIMS = KdaDims(hidden=256, heads=2, head_dim=32)


def _reference_middle(calls):
    def launch(projected, g_raw, w, slots, conv_state, state, out, stream, check_slots=True):
        calls.append((tuple(slots.tolist()), check_slots))
        idx = slots.long()
        # KdaKernelWeights carries the fields kda_recurrent_step reads (conv, a_log, dt_bias, o_norm) under their names.
        o, new = kda_recurrent_step(projected, g_raw, w, KdaState(conv_state[idx].float(), state[idx]), DIMS)
        conv_state[idx] = new.conv.to(conv_state.dtype)
        state[idx] = new.recurrent
        out.copy_(o)

    return launch


def test_the_attention_composes_the_gemms_around_the_middle_and_updates_only_its_slots(monkeypatch):
    gen = torch.Generator().manual_seed(5)
    ref_w = random_kda_weights(DIMS, gen)
    w = kda.prepare_attention_weights(ref_w, DIMS, "cpu")
    assert w.in_proj.dtype == torch.bfloat16 and w.middle.conv.dtype == torch.bfloat16
    calls = []
    monkeypatch.setattr(kda, "kda_recurrent_decode", _reference_middle(calls))
    pool = random_kda_state(DIMS, 5, gen)
    conv, recurrent = pool.conv.bfloat16(), pool.recurrent.clone()
    before = (conv.clone(), recurrent.clone())
    slots = torch.tensor([3, 0], dtype=torch.int32)
    x = torch.randn(2, DIMS.hidden, generator=gen).bfloat16()
    out = torch.full((2, DIMS.hidden), float("nan"), dtype=torch.bfloat16)
    kda.kda_attention_decode(x, w, slots, conv, recurrent, out, None, check_slots=False)

    assert calls == [((3, 0), False)]
    # The reference on the same bf16 weights and state: only the GEMMs' bf16 outputs differ.
    rounded = type(ref_w)(**{f: getattr(ref_w, f).bfloat16().float() if f in ("in_proj", "f_b", "o_proj", "conv")
                             else getattr(ref_w, f) for f in ref_w.__dataclass_fields__})
    state = KdaState(before[0][[3, 0]].float(), before[1][[3, 0]])
    ref_out, ref_state = kda_decode_step(x.float(), rounded, state, DIMS)
    assert rel_err(out, ref_out) < 2e-2  # bf16 GEMM outputs (in_proj, f_b, o_proj) against fp32
    assert rel_err(recurrent[[3, 0]], ref_state.recurrent) < 2e-2
    untouched = [1, 2, 4]
    assert torch.equal(recurrent[untouched], before[1][untouched]) and torch.equal(conv[untouched], before[0][untouched])


def test_a_bad_input_is_refused_before_any_launch(monkeypatch):
    w = kda.prepare_attention_weights(random_kda_weights(DIMS, torch.Generator().manual_seed(1)), DIMS, "cpu")
    monkeypatch.setattr(kda, "kda_recurrent_decode", lambda *a, **k: pytest.fail("launched"))
    x = torch.zeros(2, DIMS.hidden)  # fp32
    with pytest.raises(ValueError, match=r"x must be \[M, 256\] bf16, got \(2, 256\) torch.float32"):
        kda.kda_attention_decode(x, w, None, None, None, None, None)
