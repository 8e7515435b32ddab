"""GPU correctness of a KDA layer's whole attention on the kernels (kernels/kda.py: in_proj and o_proj on dense.py,
f_b on cuBLAS, the middle on kda_recurrent.py) at the real per-rank shapes (TP8: 12 heads, in_proj 6284 rows padded to
6288; TP16: 6 heads, 3206 -> 3216), against `reference.kda_decode_step` in fp32 on the same bf16 weights and state:
random slots of a larger pool in random order, the other slots untouched bit for bit, the output poisoned with NaN.
Fresh random inputs each run (seed printed).

Tolerance 2e-2 relative per token (three bf16 GEMM outputs and the bf16 conv state against fp32, as
test_kda_attention.py's CPU composition)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.config import named_config  # noqa: E402
from kimi_k3_path.reference import KdaState, kda_decode_step, random_kda_state, random_kda_weights, rel_err  # noqa: E402
from kimi_k3_path.reference.dims import layer_dims  # noqa: E402

from test_kda_attention import bf16_rounded  # noqa: E402

TOL = 2e-2
SPARE_SLOTS = 3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 64])
@pytest.mark.parametrize("tp", [8, 16])
def test_matches_the_fp32_decode_step_and_touches_only_its_slots(tp, m, seed):
    from kimi_k3_path.kernels import kda

    d = layer_dims(named_config("kimi_k3"), tp).kda
    gen = torch.Generator().manual_seed(seed)
    ref_w = random_kda_weights(d, gen)
    w = kda.prepare_attention_weights(ref_w, d, "cuda")
    pool = random_kda_state(d, m + SPARE_SLOTS, gen)
    slots = torch.randperm(m + SPARE_SLOTS, generator=gen)[:m].to(torch.int32)
    conv, recurrent = pool.conv.bfloat16().cuda(), pool.recurrent.cuda()
    before = (conv.clone(), recurrent.clone())
    x = torch.randn(m, d.hidden, generator=gen).bfloat16()
    out = torch.full((m, d.hidden), float("nan"), dtype=torch.bfloat16, device="cuda")
    kda.kda_attention_decode(x.cuda(), w, slots.cuda(), conv, recurrent, out, torch.cuda.current_stream())
    torch.cuda.synchronize()

    idx = slots.long()
    state = KdaState(before[0][idx].float().cpu(), before[1][idx].cpu())
    ref_out, ref_state = kda_decode_step(x.float(), bf16_rounded(ref_w), state, d)
    for t in range(m):
        assert rel_err(out[t].cpu(), ref_out[t]) < TOL, f"TP{tp} M={m}: token {t}"
        assert rel_err(recurrent[idx[t]].cpu(), ref_state.recurrent[t]) < TOL, f"TP{tp} M={m}: state of token {t}"
    untouched = sorted(set(range(m + SPARE_SLOTS)) - set(slots.tolist()))
    assert torch.equal(recurrent[untouched], before[1][untouched]) and torch.equal(conv[untouched], before[0][untouched])
