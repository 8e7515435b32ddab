"""GPU correctness of kernels/mla_output.py against an fp64 oracle of its three steps: the
combine of the split launch's partials, W_UV per head and the sigmoid output gate, at the per-rank widths (TP8: 12
heads, TP16: 6; latent 512, v 128). Fresh random partials each run (seed printed) with empty splits among them (max
-inf, sum 0, a zero latent: what the split launch writes for a split past a sequence's pages) and a sequence whose
splits are all empty (its output must be 0); the output is poisoned with NaN before the launch; a NaN in one
sequence's partials must stay in that sequence's output.

Tolerance per output row (sequence, head; 128 values; kimi_k3_path.reference.rel_err): 1e-2. The kernel works in fp32
and rounds once, to bf16 (~2e-3); W_UV and the gate are bf16 in the oracle too.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.reference import rel_err  # noqa: E402

TOL = 1e-2
KV_LORA, V_HEAD = 512, 128
GATE_START = 1536 + 512 + 64  # qkv_a's rows before the gate at Kimi K3's widths


def oracle(part_o, part_ml, w_uv, projected, gate_start):
    """[M, heads*V] fp64: combine (max over splits clamped to a finite lowest, as the kernel), W_UV, gate."""
    m, _, heads, _ = part_o.shape
    mx, total = part_ml[..., 0].double(), part_ml[..., 1].double()
    best = mx.max(dim=1, keepdim=True).values.clamp_min(torch.finfo(torch.float32).min)
    weight = torch.exp2(mx - best)  # [M, splits, heads]; an empty split: 2^-inf = 0
    latent = (weight[..., None] * part_o.double()).sum(1) / (weight * total).sum(1).clamp_min(1.0)[..., None]
    v = torch.einsum("mhd,hdv->mhv", latent, w_uv.double()).reshape(m, heads * V_HEAD)
    gate = projected[:, gate_start:gate_start + heads * V_HEAD].double()
    return torch.sigmoid(gate) * v


def random_case(m: int, heads: int, splits: int, gen):
    """Partials as the split launch writes them: per (sequence, split, head) a running max, a sum of 2^(s - max) in
    [1, 64] and the unnormalized latent; about a quarter of the splits empty, and sequence 0 empty throughout when
    m > 1."""
    mx = torch.randn(m, splits, heads, generator=gen) * 4
    total = 1 + 63 * torch.rand(m, splits, heads, generator=gen)
    part_o = torch.randn(m, splits, heads, KV_LORA, generator=gen) * total[..., None] / 8
    empty = torch.rand(m, splits, 1, generator=gen) < 0.25
    empty[:, 0] = False  # every sequence keeps a split ...
    if m > 1:
        empty[0] = True  # ... but sequence 0, which has none
    empty = empty.expand(m, splits, heads)
    mx[empty], total[empty] = float("-inf"), 0.0
    part_o[empty] = 0.0
    part_ml = torch.stack([mx, total], dim=-1)
    w_uv = (torch.randn(heads, KV_LORA, V_HEAD, generator=gen) / KV_LORA ** 0.5).bfloat16()
    projected = (torch.randn(m, GATE_START + heads * V_HEAD + 8, generator=gen) * 2).bfloat16()
    return part_o, part_ml, w_uv, projected


def launch(part_o, part_ml, w_uv, projected):
    from kimi_k3_path.kernels.mla_attention import MlaWorkspace
    from kimi_k3_path.kernels.mla_output import mla_output

    m, _, heads, _ = part_o.shape
    ws = MlaWorkspace(part_o.cuda(), part_ml.cuda())
    out = torch.full((m, heads * V_HEAD), float("nan"), device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.current_stream()
    mla_output(ws, w_uv.cuda(), projected.cuda(), GATE_START, out, stream)
    torch.cuda.synchronize()
    return out.cpu()


def assert_rows_match(out, want, heads):
    m = out.shape[0]
    for i in range(m):
        for h in range(heads):
            cols = slice(h * V_HEAD, (h + 1) * V_HEAD)
            got, ref = out[i, cols].double(), want[i, cols]
            assert torch.isfinite(got).all(), f"sequence {i} head {h}: non-finite output"
            if ref.abs().max() == 0:
                assert not got.any(), f"sequence {i} head {h}: an empty sequence's output is not 0"
            else:
                err = rel_err(got, ref)
                assert err < TOL, f"sequence {i} head {h}: rel err {err:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "splits"), [(1, 1), (1, 32), (7, 5), (64, 2)])
@pytest.mark.parametrize("heads", [12, 6])
def test_the_combine_w_uv_and_gate_match_the_oracle(heads, m, splits, seed):
    gen = torch.Generator().manual_seed(seed)
    case = random_case(m, heads, splits, gen)
    assert_rows_match(launch(*case), oracle(*case, GATE_START), heads)


@pytest.mark.gpu
def test_a_nan_in_one_sequences_partials_stays_in_that_sequence(seed):
    gen = torch.Generator().manual_seed(seed)
    part_o, part_ml, w_uv, projected = random_case(4, 12, 8, gen)
    part_o[2, 1, 3, 100] = float("nan")  # sequence 2, split 1 (not empty: every sequence's split 0 ... keep it so)
    part_ml[2, 1, 3] = torch.tensor([0.5, 2.0])
    out = launch(part_o, part_ml, w_uv, projected)
    head3 = slice(3 * V_HEAD, 4 * V_HEAD)
    assert torch.isnan(out[2, head3]).all()
    others = torch.ones(4, dtype=torch.bool)
    others[2] = False
    assert torch.isfinite(out[others]).all() and torch.isfinite(out[2, : 3 * V_HEAD]).all()
