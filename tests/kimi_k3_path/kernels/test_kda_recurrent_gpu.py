"""GPU correctness of the KDA recurrent step kernel (kernels/kda_recurrent.py) against the fp32 reference: f_b on
in_proj's f_a, then `kimi_k3_path.reference.kda_recurrent_step` (conv_step, l2_normalize, kda_gate, delta_rule_step,
gated_rms_norm composed between the GEMVs; its own CPU check is the first test here and
tests/kimi_k3_path/reference/test_kda.py), at the per-rank widths (TP8: 12 heads, TP16: 6; head dim 128) and
M = 1, 2, 7, 64. Each batch's states live at random slots of a larger pool whose other slots hold NaN and must come
back bit for bit; outputs are poisoned with NaN before each launch; fresh random inputs each run (seed printed).

Tolerances (kimi_k3_path.reference.rel_err, over the whole tensor):
- output, bf16: 1e-2: its bf16 rounding alone is ~2e-3 (the latent-MoE kernels' bound).
- recurrent state, fp32: 1e-4: fp32 arithmetic in another order with the SFU's exp and rsqrt gives ~1e-6; a
  missed, doubled or misplaced term moves it by more than 1e-2.
- conv state: bit for bit (the kernel only moves bf16 values).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

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

WARP_FORMS = (8, 16)  # kda_recurrent.WARP_FORMS (that module imports CuTe DSL; a CPU test checks the two agree)

OUT_TOL = 1e-2
STATE_TOL = 1e-4
BATCHES = [1, 2, 7, 64]
STEPS = 16


def reference_step(projected, w, conv_pool, rec_pool, slots, d: KdaDims):
    """The oracle on CPU: f_b (fp32) and kda_recurrent_step on the batch's slots of the pools, from in_proj's output
    (its first in_proj_rows columns); returns (o [M, proj] fp32, conv pool, recurrent pool), new pools with the
    other slots as they were."""
    idx = slots.long().cpu()
    conv_pool, rec_pool = conv_pool.cpu().clone(), rec_pool.cpu().clone()
    state = KdaState(conv=conv_pool[idx].float(), recurrent=rec_pool[idx].float())
    used = projected.cpu().float()[:, : d.in_proj_rows]
    g_raw = split_in_proj(used, d)[2] @ w.f_b.float().T
    o, new = kda_recurrent_step(used, g_raw, w, state, d)
    conv_pool[idx] = new.conv.to(conv_pool.dtype)
    rec_pool[idx] = new.recurrent
    return o, conv_pool, rec_pool


def bits(t):
    """t's bits, so that NaN compares equal to the same NaN."""
    return t.view({2: torch.int16, 4: torch.int32}[t.element_size()])


def test_pool_oracle_is_the_decode_step_on_its_slots():
    """CPU, no kernel: the oracle (slots of a pool, any order; the middle between the GEMVs) composed with in_proj,
    f_b and o_proj is reference.kda_decode_step of the gathered states, and leaves every other slot as it was."""
    d = KdaDims(hidden=48, heads=2, head_dim=16)
    gen = torch.Generator().manual_seed(35)
    w = random_kda_weights(d, gen)
    pool = random_kda_state(d, 9, gen)
    conv_pool, rec_pool = pool.conv.to(torch.bfloat16), pool.recurrent.clone()
    slots = torch.tensor([6, 1, 4], dtype=torch.int32)
    others = torch.tensor([s for s in range(9) if s not in slots.tolist()])
    conv_pool[others], rec_pool[others] = float("nan"), float("nan")
    x = torch.randn(3, d.hidden, generator=gen)
    projected = (x @ w.in_proj.T).to(torch.bfloat16)
    o, conv_new, rec_new = reference_step(projected, w, conv_pool, rec_pool, slots, d)
    # The batch's slots are the middle on the gathered states; the other slots are left as they were.
    state = KdaState(conv=conv_pool[slots.long()].float(), recurrent=rec_pool[slots.long()])
    g_raw = split_in_proj(projected.float(), d)[2] @ w.f_b.T
    want_o, want = kda_recurrent_step(projected.float(), g_raw, w, state, d)
    assert torch.equal(o, want_o) and torch.equal(rec_new[slots.long()], want.recurrent)
    assert torch.equal(conv_new[slots.long()], want.conv.to(torch.bfloat16))
    assert torch.equal(bits(conv_new[others]), bits(conv_pool[others]))
    assert torch.equal(bits(rec_new[others]), bits(rec_pool[others]))
    # The same middle inside the full step, fp32 projections (no bf16 rounding in between): equal to the decode step.
    p32 = x @ w.in_proj.T
    o32, _, rec32 = reference_step(p32, w, pool.conv, pool.recurrent, slots, d)
    out, ref_state = kda_decode_step(x, w, KdaState(pool.conv[slots.long()], pool.recurrent[slots.long()]), d)
    assert torch.equal(o32 @ w.o_proj.T, out)
    assert torch.equal(rec32[slots.long()], ref_state.recurrent)


# --- GPU -------------------------------------------------------------------------------------------------------------

def kda_dims(tp: int) -> KdaDims:
    from kimi_k3_path.config import named_config
    from kimi_k3_path.reference.dims import layer_dims

    return layer_dims(named_config("kimi_k3"), tp).kda


@dataclasses.dataclass
class Case:
    d: KdaDims
    kw: object  # KdaKernelWeights on the GPU
    w: object  # the reference weights as the kernel sees them (taps rounded to bf16), CPU
    conv_pool: torch.Tensor  # [P, 3*proj, 3] bf16, GPU
    rec_pool: torch.Tensor  # [P, heads, D, D] fp32, GPU
    slots: torch.Tensor  # [M] int32, GPU
    others: torch.Tensor  # the pool's slots not in the batch (NaN), CPU


def make_case(tp: int, m: int, gen) -> Case:
    from kimi_k3_path.kernels.kda_recurrent import prepare_kda_weights

    d = kda_dims(tp)
    # The middle reads no hidden-sized weight: build the rest at hidden=1.
    ref = random_kda_weights(dataclasses.replace(d, hidden=1), gen)
    kw = prepare_kda_weights(ref, d, "cuda")
    w = dataclasses.replace(ref, conv=kw.conv.float().cpu(), f_b=kw.f_b.float().cpu())
    pool = 2 * m + 3
    state = random_kda_state(d, pool, gen)
    order = torch.randperm(pool, generator=gen)
    slots, others = order[:m].to(torch.int32), order[m:]
    conv_pool, rec_pool = state.conv.to(torch.bfloat16), state.recurrent.clone()
    conv_pool[others], rec_pool[others] = float("nan"), float("nan")
    return Case(d, kw, w, conv_pool.cuda(), rec_pool.cuda(), slots.cuda(), others)


def inputs(case: Case, m: int, gen):
    """in_proj's output row per sequence, bf16 (standard normal: the scale of a projection of a normed input), its
    alignment padding (the columns past in_proj_rows) NaN: the launch must not read it."""
    from kimi_k3_path.kernels.kda_recurrent import aligned_columns

    d = case.d
    projected = torch.full((m, aligned_columns(d.heads, d.head_dim)), float("nan")).to(torch.bfloat16)
    projected[:, : d.in_proj_rows] = torch.randn(m, d.in_proj_rows, generator=gen)
    return projected


def run_kernel(case: Case, projected, check_slots: bool = True, warps: int | None = None):
    """One launch on fresh GPU copies of the inputs, the output poisoned first; returns the output. warps: the CTA
    form (kda_recurrent.WARP_FORMS; default the batch's)."""
    from kimi_k3_path.kernels.kda_recurrent import kda_recurrent_decode

    m = projected.shape[0]
    out = torch.full((m, case.d.proj), float("nan"), device="cuda", dtype=torch.bfloat16)
    kda_recurrent_decode(projected.cuda(), case.kw, case.slots, case.conv_pool, case.rec_pool, out,
                         torch.cuda.current_stream(), check_slots=check_slots, warps=warps)
    torch.cuda.synchronize()
    return out


def assert_step_matches(case: Case, out, ref_o, ref_conv, ref_rec, rows=None):
    """The kernel's output and pools against the oracle's: the batch's rows (all, or `rows`) within tolerance, the
    conv state bit for bit, every slot outside the batch unchanged bit for bit."""
    rows = torch.arange(out.shape[0]) if rows is None else torch.as_tensor(rows)
    idx = case.slots.long().cpu()[rows]
    conv, rec = case.conv_pool.cpu(), case.rec_pool.cpu()
    assert rel_err(out.cpu()[rows], ref_o[rows]) < OUT_TOL
    assert rel_err(rec[idx], ref_rec[idx]) < STATE_TOL
    assert torch.equal(bits(conv[idx]), bits(ref_conv[idx]))
    assert torch.equal(bits(conv[case.others]), bits(ref_conv[case.others]))
    assert torch.equal(bits(rec[case.others]), bits(ref_rec[case.others]))


@pytest.mark.gpu
@pytest.mark.parametrize("warps", WARP_FORMS)
@pytest.mark.parametrize("m", BATCHES)
@pytest.mark.parametrize("tp", [8, 16])
def test_kda_recurrent_matches_reference(tp, m, warps, seed):
    gen = torch.Generator().manual_seed(seed)
    case = make_case(tp, m, gen)
    projected = inputs(case, m, gen)
    ref = reference_step(projected, case.w, case.conv_pool, case.rec_pool, case.slots, case.d)
    out = run_kernel(case, projected, warps=warps)
    assert_step_matches(case, out, *ref)


@pytest.mark.gpu
@pytest.mark.parametrize("warps", WARP_FORMS)
@pytest.mark.parametrize("m", [1, 7])
@pytest.mark.parametrize("tp", [8, 16])
def test_sixteen_steps_carried_through_the_state_do_not_drift(tp, m, warps, seed):
    """The kernel's pools carried through 16 steps, the oracle's through its own 16: every step within the same
    tolerance (the delta rule with |k| = 1, beta < 1 and decay < 1 does not amplify an error; a drift would show)."""
    gen = torch.Generator().manual_seed(seed)
    case = make_case(tp, m, gen)
    ref_conv, ref_rec = case.conv_pool.cpu(), case.rec_pool.cpu()
    for step in range(STEPS):
        projected = inputs(case, m, gen)
        ref_o, ref_conv, ref_rec = reference_step(projected, case.w, ref_conv, ref_rec, case.slots, case.d)
        out = run_kernel(case, projected, warps=warps)
        try:
            assert_step_matches(case, out, ref_o, ref_conv, ref_rec)
        except AssertionError as e:
            raise AssertionError(f"step {step}: {e}") from e


@pytest.mark.gpu
@pytest.mark.parametrize("warps", WARP_FORMS)
@pytest.mark.parametrize("tp", [8, 16])
def test_nan_and_inf_stay_in_their_sequence(tp, warps, seed):
    """A NaN in one sequence's k channel (head 0) and an Inf in another's v channel (head 1) reach those
    sequences' states and outputs and nothing of any other sequence (or of the pool's other slots)."""
    m, nan_seq, inf_seq = 7, 2, 5
    gen = torch.Generator().manual_seed(seed)
    case = make_case(tp, m, gen)
    d = case.d
    projected = inputs(case, m, gen)
    projected[nan_seq, d.proj + 3] = float("nan")  # k, head 0
    projected[inf_seq, 2 * d.proj + d.head_dim + 5] = float("inf")  # v, head 1
    ref = reference_step(projected, case.w, case.conv_pool, case.rec_pool, case.slots, case.d)
    out = run_kernel(case, projected, warps=warps)
    clean = [t for t in range(m) if t not in (nan_seq, inf_seq)]
    assert_step_matches(case, out, *ref, rows=clean)
    rec = case.rec_pool.cpu()
    for seq, head in ((nan_seq, 0), (inf_seq, 1)):
        slot = int(case.slots[seq])
        assert not torch.isfinite(rec[slot, head]).all(), f"sequence {seq}: the bad input never reached its state"
        assert torch.isfinite(rec[slot, head + 1 :]).all() and torch.isfinite(rec[slot, :head]).all()
        assert not torch.isfinite(out[seq, head * d.head_dim : (head + 1) * d.head_dim].float()).all()


@pytest.mark.gpu
def test_a_slot_outside_the_pool_touches_nothing(seed):
    """vLLM pads a batch with slot -1: unchecked (check_slots=False, as under CUDA graph capture), that sequence
    reads and writes no state and gets a zero output row; the others are as usual."""
    m, kept = 4, [0, 2, 3]
    gen = torch.Generator().manual_seed(seed)
    case = make_case(16, m, gen)
    projected = inputs(case, m, gen)
    skipped = case.slots[1:2].cpu().long()
    ref = reference_step(projected[kept], case.w, case.conv_pool, case.rec_pool, case.slots[kept], case.d)
    case.slots[1] = -1
    out = run_kernel(case, projected, check_slots=False)
    assert (out[1] == 0).all()
    # Against the oracle of the other three: the padded sequence's own slot is one the launch must leave alone.
    three = dataclasses.replace(case, slots=case.slots[kept], others=torch.cat([case.others, skipped]))
    assert_step_matches(three, out[kept], *ref)


@pytest.mark.gpu
def test_wrapper_reads_the_slots_and_rejects_shared_or_out_of_range_ones(seed):
    gen = torch.Generator().manual_seed(seed)
    case = make_case(16, 3, gen)
    projected = inputs(case, 3, gen)
    for bad, message in (([0, 4, 0], "used by more than one sequence"), ([0, 9, 2], "outside the pool")):
        case.slots = torch.tensor(bad, dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match=message):
            run_kernel(case, projected)
