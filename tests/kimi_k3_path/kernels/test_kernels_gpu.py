"""GPU correctness of every latent-MoE kernel and of `latent_moe_decode` against the fp32 references, at the
TP8 and TP16 per-rank shapes and M = 1, 7, 16, 33, 64, each launch in the form kernels/dispatch.py gives the batch
(33 leaves most of its last 8-token tile empty): fresh random inputs each run (seed printed), outputs poisoned
with NaN before each launch, routing where every token picks the same experts, exact ties, NaN logits.
Relative error bound for bf16 outputs: 1e-2 (see kimi_k3_path.reference.rel_err)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

pytestmark = pytest.mark.gpu

from kimi_k3_path.reference import latent_moe, rel_err, rms_norm, route, routed_experts  # noqa: E402

TOL = 1e-2
BATCHES = [1, 7, 16, 33, 64]
MULTI_TOKEN = [2, 7, 16, 33, 64]  # the forms of 2 tokens and more
KEY_TIE = 1e-5  # fp32 logits from two summation orders differ by ~1e-7; closer keys may legitimately swap


@pytest.fixture
def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


_WEIGHTS: dict = {}


def weights(dims, tp, gen):
    """Fresh random weights per test; the kernel copy is built from them (bf16/uint8 tensors are shared)."""
    from kimi_k3_path.kernels.moe import MoeWorkspace, prepare_weights
    from kimi_k3_path.reference import random_moe_weights

    d = dims(tp)
    ref = random_moe_weights(d, gen)
    kw = prepare_weights(ref, d.top_k, d.routed_scaling_factor, d.eps, "cuda")
    return d, ref, kw, MoeWorkspace(kw, "cuda")


def poisoned(*shape, dtype):
    return torch.full(shape, float("nan"), device="cuda", dtype=dtype)


def stream():
    return torch.cuda.current_stream()


def run_router(x, kw, ws):
    """The block's front (router, down-projection and from 2 tokens the shared gate_up) in the form the dispatch
    table gives this batch; its ids, weights and plan (x_lat and a_sh stay in the workspace)."""
    from kimi_k3_path.kernels.front import front
    from kimi_k3_path.kernels.moe import forms_for

    m = x.shape[0]
    forms = forms_for(kw, m)
    ws.ids.fill_(-1)
    ws.weights.fill_(float("nan"))
    for t in (ws.x_lat, ws.a_sh):
        t.fill_(float("nan"))
    for t in ws.plan:
        t.fill_(-1)
    front(x, kw, ws, m, stream(), router_mma=forms.router_on_tensor_cores, shared=not forms.one_token)
    torch.cuda.synchronize()
    return ws.ids[:m], ws.weights[:m]


def assert_router_state_left_for_the_next_launch(ws):
    from kimi_k3_path.kernels.router import LOGIT_UNSET

    assert not ws.router_sync.any(), "the router must leave its counters and masks at zero for the next launch"
    unset = ws.logits.view(torch.int32) == LOGIT_UNSET
    assert unset.all(), f"the router must leave every logit word LOGIT_UNSET: {int((~unset).sum())} are not"


def assert_same_selection(ids, ref_ids, keys):
    """Identical selection and order, except that experts whose reference keys are within KEY_TIE may swap."""
    ids, ref_ids = ids.long().cpu(), ref_ids.cpu()
    keys = keys.double().cpu()
    for t in range(ids.shape[0]):
        got, want = ids[t], ref_ids[t]
        if torch.equal(got, want):
            continue
        got_keys, want_keys = keys[t, got], keys[t, want]
        assert torch.allclose(got_keys, want_keys, atol=KEY_TIE, rtol=0), f"token {t}: {got.tolist()} != {want.tolist()}"
        assert len(set(got.tolist())) == len(got), f"token {t}: an expert chosen twice: {got.tolist()}"


def assert_plan_matches(ids, ws, m):
    """The plan groups every (token, slot) pair under its expert, experts ascending, tokens ascending."""
    n_active, slot_expert, slot_count, slot_pairs = (t.cpu() for t in ws.plan)
    ids = ids.long().cpu()
    experts = sorted(set(ids.flatten().tolist()))
    assert int(n_active[0]) == len(experts)
    assert slot_expert[: len(experts)].tolist() == experts
    k = ids.shape[1]
    for s, e in enumerate(experts):
        pairs = [t * k + j for t in range(m) for j in range(k) if ids[t, j] == e]
        assert int(slot_count[s]) == len(pairs)
        assert slot_pairs[s, : len(pairs)].tolist() == pairs


@pytest.mark.parametrize("tp", [8, 16])
@pytest.mark.parametrize("m", [1, 2, 7, 15, 16, 33, 64])
def test_front_matches_reference(tp, m, gen, dims):
    """The front as the block runs it (the router's logits on the tensor cores from 16 tokens, one CTA per 16
    experts): the selection, the weights (within 1e-5 of the fp32 reference's renormalized sigmoid scores), the plan,
    x_lat = x @ W_down^T in fp16 and, from 2 tokens, the shared experts' a_sh."""
    from kimi_k3_path.reference import situ_glu_packed

    d, ref, kw, ws, x = check_router(m, gen, dims, tp)
    assert rel_err(ws.x_lat[:m], x.float() @ ref.down.float().T) < TOL
    if m > 1:
        assert rel_err(ws.a_sh[:m], situ_glu_packed(x.float() @ ref.shared13.float().T)) < TOL
    else:
        assert ws.a_sh[:1].isnan().all()  # one token: GEMM2's grid computes it


def check_router(m, gen, dims, tp: int = 8):
    d, ref, kw, ws = weights(dims, tp, gen)
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ids, wts = run_router(x, kw, ws)
    ref_ids, ref_w = route(x, ref, d)
    keys = torch.sigmoid(x.float() @ ref.router.float().T) + ref.router_bias
    assert_same_selection(ids, ref_ids, keys)
    scores = torch.sigmoid(x.float() @ ref.router.float().T).gather(1, ids.long())
    assert rel_err(wts, scores / scores.sum(-1, keepdim=True) * d.routed_scaling_factor) < 1e-5
    # Against the reference's weights only where both chose the same experts: a near-tie swap (allowed above) changes
    # every weight of its token through the renormalization (seed 1900759755 at M=64 had one).
    same = (torch.sort(ids.long(), 1).values == torch.sort(ref_ids, 1).values).all(1)
    assert same.sum() >= m - max(1, m // 8), f"{m - int(same.sum())} of {m} tokens chose other experts"
    by_id, ref_by_id = torch.argsort(ids.long(), 1), torch.argsort(ref_ids, 1)
    if same.any():
        assert rel_err(wts.gather(1, by_id)[same], ref_w.gather(1, ref_by_id)[same]) < 1e-4
    assert_plan_matches(ids, ws, m)
    assert_router_state_left_for_the_next_launch(ws)
    return d, ref, kw, ws, x


@pytest.mark.parametrize("m", [1, 7])
def test_router_ties_go_to_the_lower_index_and_nan_is_never_preferred(m, gen, dims):
    """M=1 takes the one-token selection (router.one_token_select: the plan without masks), 7 the batch's."""
    d, ref, kw, ws = weights(dims, 8, gen)
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    favourites = list(range(100, 100 + d.top_k - 1))  # 15 sure picks
    low, high, nan_row = 40, 700, 3  # low and high tie exactly for the 16th place
    bias = torch.zeros(d.experts, device="cuda")
    bias[favourites] = 10.0
    bias[[low, high]] = 5.0
    bias[nan_row] = 20.0
    kw.router[high] = kw.router[low]
    kw.router[nan_row] = float("nan")
    kw.router_bias.copy_(bias)
    ids, wts = run_router(x, kw, ws)
    for t in range(m):
        chosen = ids[t].tolist()
        assert set(chosen) == set(favourites) | {low}, f"token {t}: {chosen}"
        assert chosen[-1] == low
    assert torch.isfinite(wts).all()
    assert_plan_matches(ids, ws, m)


@pytest.mark.parametrize("m", [1, 64])
def test_router_all_keys_equal_takes_the_lowest_indices_in_order(m, gen, dims):
    """Every key ties (zero router weight, zero bias): the threshold key is shared by all 896 experts, spread over
    every lane and register slot, so the winners are decided by index alone."""
    d, _, kw, ws = weights(dims, 8, gen)
    kw.router.zero_()
    kw.router_bias.zero_()
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ids, wts = run_router(x, kw, ws)
    assert ids.cpu().tolist() == [list(range(d.top_k))] * m
    assert torch.allclose(wts, torch.full_like(wts, d.routed_scaling_factor / d.top_k), rtol=1e-6, atol=0)
    assert_plan_matches(ids, ws, m)
    assert_router_state_left_for_the_next_launch(ws)


@pytest.mark.parametrize("m", [1, 7])
def test_router_keys_of_both_signs_match_reference(m, gen, dims):
    """Biases that push keys across zero: the order key of a negative float must order below every positive one."""
    d, ref, kw, ws = weights(dims, 8, gen)
    bias = torch.rand(d.experts, generator=gen, device="cuda") * 2.0 - 1.5  # keys in about (-1.5, 1.5)
    kw.router_bias.copy_(bias)
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ids, _ = run_router(x, kw, ws)
    ref = dataclasses.replace(ref, router_bias=bias)
    ref_ids, _ = route(x, ref, d)
    keys = torch.sigmoid(x.float() @ ref.router.float().T) + bias
    assert (keys < 0).any() and (keys > 0).any()
    assert_same_selection(ids, ref_ids, keys)
    assert_plan_matches(ids, ws, m)


@pytest.mark.parametrize("m", [1, 3])
def test_router_nan_keys_rank_below_every_number_including_minus_infinity(m, gen, dims):
    """10 finite keys, 2 keys of -inf, NaN keys elsewhere: the 10 in key order, then the two -inf experts (lower index
    first), then the lowest-index NaN-key experts; the weights stay finite (a NaN bias selects, it never weighs)."""
    d, ref, kw, ws = weights(dims, 8, gen)
    finite = [5, 17, 64, 100, 333, 334, 500, 640, 777, 895]
    minus_inf = [900 - 12, 12]
    bias = torch.full((d.experts,), float("nan"), device="cuda")
    bias[finite] = torch.linspace(0.0, 0.9, len(finite), device="cuda")
    bias[minus_inf] = float("-inf")
    kw.router_bias.copy_(bias)
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ids, wts = run_router(x, kw, ws)
    keys = (torch.sigmoid(x.float() @ ref.router.float().T) + bias).cpu()
    nan_experts = [e for e in range(d.experts) if e not in finite and e not in minus_inf]
    for t in range(m):
        by_key = sorted(finite, key=lambda e: (-float(keys[t, e]), e))
        want = by_key + sorted(minus_inf) + nan_experts[: d.top_k - len(finite) - len(minus_inf)]
        assert ids[t].tolist() == want, f"token {t}"
    assert torch.isfinite(wts).all()
    assert_plan_matches(ids, ws, m)


@pytest.mark.parametrize("multi_tile", [False, True])
@pytest.mark.parametrize("tp", [8, 16])
@pytest.mark.parametrize("m", MULTI_TOKEN)
def test_experts_match_reference(tp, m, multi_tile, gen, dims):
    """Both expert launches of a batch (GEMM1 as the block runs it: holding its weights up to 4 tokens, on the
    tensor cores above; GEMM2 on the tensor cores with the latent RMSNorm tail, one or several tiles per CTA, at
    every batch whichever the block takes)."""
    from kimi_k3_path.kernels.gemm1_held import experts_gemm1_held
    from kimi_k3_path.kernels.gemm1_mma import experts_gemm1_mma
    from kimi_k3_path.kernels.gemm2_mma import experts_gemm2_mma
    from kimi_k3_path.kernels.moe import forms_for

    d, ref, kw, ws = weights(dims, tp, gen)
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ids, wts = run_router(x, kw, ws)
    x_lat = torch.randn(m, d.latent, generator=gen, device="cuda").to(torch.float16)  # the front kernel's format
    a = poisoned(m * d.top_k, d.intermediate, dtype=torch.float16)
    y_lat = poisoned(m, d.latent, dtype=torch.float32)
    normed = poisoned(m, d.latent, dtype=torch.bfloat16)
    if forms_for(kw, m).gemm1_held:
        experts_gemm1_held(x_lat, kw.w13_packed, kw.w13_scales, ws.plan, d.top_k, a, y_lat, stream(), one_token=False)
    else:
        experts_gemm1_mma(x_lat, kw.w13_packed, kw.w13_scales, ws.plan, d.top_k, a, y_lat, stream())
    experts_gemm2_mma(a, kw.w2_packed, kw.w2_scales, ws.plan, wts, y_lat, ws.gemm2_counter, kw.latent_norm, normed,
                      d.eps, stream(), multi_tile=multi_tile)
    torch.cuda.synchronize()
    want = routed_experts(x_lat, ids.long(), wts, ref)
    assert rel_err(y_lat, want) < TOL
    assert rel_err(normed, rms_norm(want, ref.latent_norm, d.eps)) < TOL
    assert ws.gemm2_counter.tolist() == [0, 0]


@pytest.mark.parametrize("tp", [8, 16])
def test_one_token_gemm1_writes_situ_glu_of_each_slots_expert(tp, gen, dims):
    """GEMM1's one-token form (v17): a[p] = situ_glu(x_lat . w13[e_p]) for each of the token's k pairs, a poisoned
    before the launch, y_lat left as it was (GEMM2's one-token form writes it); x_lat with a wide range (fp16
    activations, |x| up to ~100)."""
    from kimi_k3_path.kernels.gemm1_held import experts_gemm1_held
    from kimi_k3_path.reference import mxfp4_unpack, situ_glu_packed

    d, ref, kw, ws = weights(dims, tp, gen)
    x = torch.randn(1, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ids, _ = run_router(x, kw, ws)
    x_lat = (torch.randn(1, d.latent, generator=gen, device="cuda") * torch.rand(1, d.latent, generator=gen,
                                                                                 device="cuda") * 30).to(torch.float16)
    a = poisoned(d.top_k, d.intermediate, dtype=torch.float16)
    y_lat = torch.full((1, d.latent), 7.0, device="cuda")
    experts_gemm1_held(x_lat, kw.w13_packed, kw.w13_scales, ws.plan, d.top_k, a, y_lat, stream(), one_token=True)
    torch.cuda.synchronize()
    assert y_lat.eq(7.0).all()
    for p, e in enumerate(ids[0].tolist()):
        want = situ_glu_packed(x_lat.float() @ mxfp4_unpack(ref.w13_packed[e], ref.w13_scales[e]).T)
        assert rel_err(a[p:p + 1], want) < TOL, f"pair {p} (expert {e})"


@pytest.mark.parametrize("same_experts", [False, True])
def test_held_gemm1_takes_every_token_of_a_slot(same_experts, gen, dims):
    """GEMM1 holding its weights for a batch (up to 4 tokens: kernels/dispatch.py): with every token on the same 16
    experts each slot holds them all, so the loop over a slot's further tokens runs; a poisoned, y_lat zeroed."""
    from kimi_k3_path.kernels.gemm1_held import experts_gemm1_held
    from kimi_k3_path.reference import mxfp4_unpack, situ_glu_packed

    d, ref, kw, ws = weights(dims, 8, gen)
    m = 4
    if same_experts:
        kw.router_bias[torch.randperm(d.experts, generator=gen, device="cuda")[: d.top_k]] += 10.0
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ids, _ = run_router(x, kw, ws)
    if same_experts:
        assert int(ws.plan[0][0]) == d.top_k and ws.plan[2][: d.top_k].eq(m).all()
    x_lat = torch.randn(m, d.latent, generator=gen, device="cuda").to(torch.float16)
    a = poisoned(m * d.top_k, d.intermediate, dtype=torch.float16)
    y_lat = poisoned(m, d.latent, dtype=torch.float32)
    experts_gemm1_held(x_lat, kw.w13_packed, kw.w13_scales, ws.plan, d.top_k, a, y_lat, stream(), one_token=False)
    torch.cuda.synchronize()
    assert y_lat.eq(0).all()
    for e in ids.unique().tolist():
        tokens, slots = (ids == e).nonzero(as_tuple=True)
        want = situ_glu_packed(x_lat[tokens].float() @ mxfp4_unpack(ref.w13_packed[e], ref.w13_scales[e]).T)
        assert rel_err(a[tokens * d.top_k + slots], want) < TOL, f"expert {e}"


@pytest.mark.parametrize("gate_up", [None, "first", "last"])
@pytest.mark.parametrize("tp", [8, 16])
def test_one_token_gemm2_writes_the_combine_its_gamma_product_and_the_sums_of_squares(tp, gate_up, gen, dims):
    """GEMM2's one-token form (v16): y_lat = the weighted combine, normed = y_lat * gamma (not yet divided by the
    RMS), and sq_parts adds up to sum(y_lat^2); all three poisoned before the launch. With the shared experts' gate_up
    in its grid (v20a), its CTAs before or after GEMM2's: a_sh (poisoned) as well."""
    from kimi_k3_path.kernels.gemm1_held import experts_gemm1_held
    from kimi_k3_path.kernels.gemm2_one_token import experts_gemm2_one_token
    from kimi_k3_path.reference import situ_glu_packed

    d, ref, kw, ws = weights(dims, tp, gen)
    x = torch.randn(1, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    ids, wts = run_router(x, kw, ws)
    x_lat = torch.randn(1, d.latent, generator=gen, device="cuda").to(torch.float16)
    a = poisoned(d.top_k, d.intermediate, dtype=torch.float16)
    y_lat = poisoned(1, d.latent, dtype=torch.float32)
    normed = poisoned(1, d.latent, dtype=torch.bfloat16)
    sq_parts = poisoned(*ws.sq_parts.shape, dtype=torch.float32)
    experts_gemm1_held(x_lat, kw.w13_packed, kw.w13_scales, ws.plan, d.top_k, a, ws.y_lat[:1], stream(), one_token=True)
    a_sh = poisoned(1, d.shared_intermediate, dtype=torch.bfloat16)
    shared = None if gate_up is None else (x, kw.shared13, a_sh)
    experts_gemm2_one_token(a, kw.w2_packed, kw.w2_scales, ws.plan, wts, kw.latent_norm, y_lat, normed, sq_parts,
                            stream(), shared, gate_up == "first")
    torch.cuda.synchronize()
    want = routed_experts(x_lat, ids.long(), wts, ref)
    assert rel_err(y_lat, want) < TOL
    assert rel_err(normed, want * ref.latent_norm) < TOL
    assert sq_parts.sum().item() == pytest.approx(want.square().sum().item(), rel=TOL)
    if gate_up is None:
        assert a_sh.isnan().all()
    else:
        assert rel_err(a_sh, situ_glu_packed(x.float() @ ref.shared13.float().T)) < TOL


def one_token_finalize_case(tp, gen, dims):
    """Inputs of the one-token finalize (normed = y * gamma, sq_parts partial sums of y^2 split unevenly, a_sh),
    a poisoned output, and the fp32 reference of what it must hold."""
    d, ref, kw, ws = weights(dims, tp, gen)
    y = torch.randn(1, d.latent, generator=gen, device="cuda") * 3.0
    squares = y.square().reshape(-1)
    cuts = torch.sort(torch.randint(0, d.latent, (ws.sq_parts.shape[0] - 1,), generator=gen, device="cuda")).values
    sq_parts = torch.stack([part.sum() for part in torch.tensor_split(squares, cuts.cpu())])
    a_sh = torch.randn(1, d.shared_intermediate, generator=gen, device="cuda").to(torch.bfloat16)
    out = poisoned(1, d.hidden, dtype=torch.bfloat16)
    want = rms_norm(y, ref.latent_norm, d.eps).to(torch.bfloat16).float() @ ref.up.float().T + (
        a_sh.float() @ ref.shared2.float().T)
    return d, kw, (y * ref.latent_norm).to(torch.bfloat16), sq_parts, a_sh, out, want


@pytest.mark.parametrize(("ctas_per_sm", "stages"), [(3, 3), (2, 4), (1, 2)])
@pytest.mark.parametrize("tp", [8, 16])
def test_streamed_finalize_matches_the_reference(tp, ctas_per_sm, stages, gen, dims):
    """The block's one-token finalize (finalize_streamed.FinalizeStreamed): every row pair streamed through a ring of
    `stages` slots by ctas_per_sm persistent CTAs per SM (3584 row pairs over 132 x 3 CTAs leave 20 of them one pair
    more), the RMS applied from the partial sums."""
    from kimi_k3_path.kernels.finalize_streamed import finalize_streamed

    d, kw, normed, sq_parts, a_sh, out, want = one_token_finalize_case(tp, gen, dims)
    finalize_streamed(normed, kw.up, a_sh, kw.shared2, out, sq_parts, d.eps, stream(), ctas_per_sm, stages)
    torch.cuda.synchronize()
    assert rel_err(out, want) < TOL


@pytest.mark.parametrize("tp", [8, 16])
@pytest.mark.parametrize("m", MULTI_TOKEN)
def test_finalize_matches_reference(tp, m, gen, dims):
    from kimi_k3_path.kernels.finalize_mma import finalize_mma

    d, ref, kw, ws = weights(dims, tp, gen)
    normed = rms_norm(torch.randn(m, d.latent, generator=gen, device="cuda"), ref.latent_norm, d.eps)
    normed = normed.to(torch.bfloat16)  # what GEMM2's last CTA writes (tested above)
    a_sh = torch.randn(m, d.shared_intermediate, generator=gen, device="cuda").to(torch.bfloat16)
    out = poisoned(m, d.hidden, dtype=torch.bfloat16)
    finalize_mma(normed, kw.up, a_sh, kw.shared2, out, stream())
    torch.cuda.synchronize()
    want = normed.float() @ ref.up.float().T + a_sh.float() @ ref.shared2.float().T
    assert rel_err(out, want) < TOL


@pytest.mark.parametrize("same_experts", [False, True])
@pytest.mark.parametrize("tp", [8, 16])
@pytest.mark.parametrize("m", BATCHES)
def test_latent_moe_decode_matches_reference(tp, m, same_experts, gen, dims):
    from kimi_k3_path.kernels.moe import latent_moe_decode

    d, ref, kw, ws = weights(dims, tp, gen)
    if same_experts:  # every token routes to the same 16 experts: one slot each, m tokens per slot
        kw.router_bias[torch.randperm(d.experts, generator=gen, device="cuda")[: d.top_k]] += 10.0
        ref = dataclasses.replace(ref, router_bias=kw.router_bias.clone())
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    for t in (ws.x_lat, ws.a_sh, ws.a, ws.y_lat, ws.normed, ws.sq_parts):
        t.fill_(float("nan"))
    out = poisoned(m, d.hidden, dtype=torch.bfloat16)
    latent_moe_decode(x, kw, ws, out, stream())
    torch.cuda.synchronize()
    if same_experts:
        assert int(ws.plan[0][0]) == d.top_k and ws.plan[2][: d.top_k].eq(m).all()
    assert rel_err(out, latent_moe(x, ref, d)) < TOL
    assert_router_state_left_for_the_next_launch(ws)
    assert ws.gemm2_counter.tolist() == [0, 0]


def test_one_workspace_serves_each_router_form_in_turn(gen, dims):
    """Blocks of 16, 1, 7, 64 and 1 tokens on one workspace: the router's logits on the tensor cores (counted in),
    at one token and in 8-token tiles on the CUDA cores (polled for), each leaving the logits unset for the next,
    whatever form it takes; each block against the fp32 reference."""
    from kimi_k3_path.kernels.moe import latent_moe_decode

    d, ref, kw, ws = weights(dims, 8, gen)
    for m in (16, 1, 7, 64, 1):
        x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
        out = poisoned(m, d.hidden, dtype=torch.bfloat16)
        latent_moe_decode(x, kw, ws, out, stream())
        torch.cuda.synchronize()
        assert rel_err(out, latent_moe(x, ref, d)) < TOL, f"M={m}"
        assert_router_state_left_for_the_next_launch(ws)


@pytest.mark.parametrize("m", [1, 4, 33])
def test_latent_moe_decode_replays_in_a_cuda_graph(m, gen, dims):
    """Captured once, replayed on new inputs in the same buffers: each replay matches the reference."""
    from kimi_k3_path.kernels.moe import latent_moe_decode

    d, ref, kw, ws = weights(dims, 8, gen)
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    out = poisoned(m, d.hidden, dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        latent_moe_decode(x, kw, ws, out, side)  # compile + warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        latent_moe_decode(x, kw, ws, out, torch.cuda.current_stream())
    for _ in range(2):
        x.copy_(torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, latent_moe(x, ref, d)) < TOL


@pytest.mark.parametrize("m", [1, 8])
def test_a_block_reads_the_output_of_the_block_before_it(m, gen, dims):
    """Two blocks back to back on one stream and one workspace, the second's x the first's output, in a CUDA graph
    replayed twice: each launch started early (GEMM2, the finalize) must read what the launch before it wrote, the
    front must start only after the finalize before it has written its x, and the counters one block leaves must be
    those the next expects."""
    from kimi_k3_path.kernels.moe import latent_moe_decode

    d, ref, kw, ws = weights(dims, 8, gen)
    x = torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16)
    mid, out = poisoned(m, d.hidden, dtype=torch.bfloat16), poisoned(m, d.hidden, dtype=torch.bfloat16)
    latent_moe_decode(x, kw, ws, mid, stream())  # compile outside the capture
    latent_moe_decode(mid, kw, ws, out, stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        latent_moe_decode(x, kw, ws, mid, torch.cuda.current_stream())
        latent_moe_decode(mid, kw, ws, out, torch.cuda.current_stream())
    for _ in range(2):
        x.copy_(torch.randn(m, d.hidden, generator=gen, device="cuda").to(torch.bfloat16))
        mid.fill_(float("nan"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(mid, latent_moe(x, ref, d)) < TOL
        assert rel_err(out, latent_moe(mid, ref, d)) < TOL
        assert_router_state_left_for_the_next_launch(ws)


@pytest.mark.parametrize("tp", [8, 16])
def test_cta_trace_of_the_one_token_block_records_every_cta_in_launch_order(tp, seed, dims):
    """kernels/trace.py on the block (bench_moe --trace-out): every CTA of the four launches records (summarize
    raises otherwise), the traced block's output matches the reference, GEMM1 starts only after the front has ended
    (stream order) while GEMM2 and the finalize start before their predecessors end (launched early), and no SM ever
    holds more CTAs of a launch than its registers allow, and each launch's SM clock is one an H200 runs at."""
    from benchmarks.kimi_k3.bench_moe import block_ctas, trace_one_token_block
    from kimi_k3_path.kernels.finalize_streamed import STREAMED_CTAS_PER_SM
    from kimi_k3_path.kernels.front import ONE_TOKEN_FRONT_CTAS_PER_SM

    t = trace_one_token_block(tp, replays=2, seed=seed)
    launches = t["launches"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert {name: launch["ctas"] for name, launch in launches.items()} == block_ctas(dims(tp), sms)
    assert t["rel_err"] < TOL and launches["front"]["start_us"]["first"] == 0.0
    assert launches["gemm1"]["start_us"]["first"] >= launches["front"]["end_us"]["last"]
    assert launches["gemm2"]["start_us"]["first"] < launches["gemm1"]["end_us"]["last"]
    assert launches["finalize"]["start_us"]["first"] < launches["gemm2"]["end_us"]["last"]
    # CTAs per SM the registers allow (test_compile.py): the front is bounded to ONE_TOKEN_FRONT_CTAS_PER_SM; GEMM2
    # with its gate_up has 60 registers at TP8, 48 at TP16; the streamed finalize is persistent, STREAMED_CTAS_PER_SM
    # of them on every SM.
    for name, ctas_per_sm in {"front": ONE_TOKEN_FRONT_CTAS_PER_SM, "gemm1": 4, "gemm2": 4 if tp == 8 else 5,
                              "finalize": STREAMED_CTAS_PER_SM}.items():
        assert 1 <= launches[name]["max_resident_per_sm"] <= ctas_per_sm, name
        assert 500 <= launches[name]["sm_mhz"] <= 2100, (name, launches[name]["sm_mhz"])  # the H200 boosts to 1980
