"""kernels/mla.py's host composition on CPU: the GEMMs, norms, row insertion, the kernel's q layout and o_proj around
the split-KV attention and the output launch, with stand-ins for those launches (the fp32 oracle `mla_attend` over the
pages as the split launch reads them; W_UV and the gate in torch), against `reference.mla_decode`; and its refusals
before anything is written. The kernels themselves: test_mla_attention_gpu.py, test_mla_output_gpu.py; the whole op
on the H200: test_mla_layer_gpu.py."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

from types import SimpleNamespace  # noqa: E402

from kimi_k3_path.kernels import dense, mla  # noqa: E402
from kimi_k3_path.reference import (  # noqa: E402
    MlaDims,
    PagedLatentCache,
    mla_attend,
    mla_decode,
    random_mla_weights,
    random_paged_cache,
    rel_err,
)
from kimi_k3_path.reference.mla import mla_query  # noqa: E402

from test_kda_attention import bf16_matmul  # noqa: E402

DIMS = MlaDims(hidden=96, heads=3, q_lora=48, kv_lora=32, qk_nope=16, qk_rope=8, v_head=16)
PAGE = 64


def rounded(w):
    """bf16-representable weights, so that only the activations' rounding differs from the fp32 reference."""
    return dataclasses.replace(w, **{f.name: getattr(w, f.name).bfloat16().float() for f in dataclasses.fields(w)})


def slots_of(cache: PagedLatentCache) -> torch.Tensor:
    return torch.tensor([page * PAGE + off for page, off in
                         (cache.slot(i, n - 1) for i, n in enumerate(cache.seq_lens.tolist()))], dtype=torch.int64)


def standin_attention(calls):
    """The one-token tail: mla_split_kv, its partials stood in for by the oracle's latent from the pages as they are
    when it is called, and mla_output on that latent in torch; the many-token tail's mla_attention_decode writes that
    latent in bf16 (the kernels: test_mla_attention_gpu.py, test_mla_output_gpu.py)."""

    def attend(q, pages, block_table, seq_lens, scale, workspace, check_inputs, tail):
        calls.append({"q": q.clone(), "pages": pages.clone(), "workspace": workspace, "check_inputs": check_inputs,
                      "scale": scale, "tail": tail})
        assert q.dtype == torch.bfloat16 and q.shape == (seq_lens.shape[0], DIMS.heads, DIMS.cache_row)
        cache = PagedLatentCache(pages.float(), block_table, seq_lens)
        return mla_attend(q.float(), cache, DIMS.kv_lora, scale)

    def split(q, pages, block_table, seq_lens, stream, scale, workspace=None, check_inputs=True, max_seq_len=None):
        return SimpleNamespace(latent=attend(q, pages, block_table, seq_lens, scale, workspace, check_inputs,
                                             "mla_output"))

    def whole(q, pages, block_table, seq_lens, out, stream, scale, workspace=None, check_inputs=True,
              max_seq_len=None):
        out.copy_(attend(q, pages, block_table, seq_lens, scale, workspace, check_inputs, "combine + torch"))

    def output(partials, w_uv, projected, gate_start, out, stream):
        calls[-1]["gate_start"] = gate_start
        v = torch.einsum("mhd,hdv->mhv", partials.latent, w_uv.float()).reshape(out.shape)
        out.copy_(torch.sigmoid(projected[:, gate_start:gate_start + out.shape[1]].float()) * v)

    return split, output, whole


def stand_in(monkeypatch, calls):
    split, output, whole = standin_attention(calls)
    monkeypatch.setattr(mla, "mla_split_kv", split)
    monkeypatch.setattr(mla, "mla_output", output)
    monkeypatch.setattr(mla, "mla_attention_decode", whole)


def standin_norms(calls):
    """mla_norms_insert as torch computes it (the kernel against torch's RMSNorm: test_mla_norms_gpu.py)."""

    def launch(projected, q_a_norm, kv_a_norm, eps, rope, pages, slots, q_c, stream):
        calls.append("norms")
        q_lora, kv_lora = q_a_norm.shape[0], kv_a_norm.shape[0]
        q_c.copy_(torch.nn.functional.rms_norm(projected[:, :q_lora], (q_lora,), q_a_norm, eps))
        kv_c = torch.nn.functional.rms_norm(projected[:, q_lora:q_lora + kv_lora], (kv_lora,), kv_a_norm, eps)
        k_pe = projected[:, q_lora + kv_lora:q_lora + kv_lora + rope]
        pages.view(-1, pages.shape[2]).index_copy_(0, slots, torch.cat([kv_c, k_pe], dim=1))

    return launch


def case(gen, lens):
    w = rounded(random_mla_weights(DIMS, gen))
    cache = random_paged_cache(DIMS, lens, PAGE, gen, spare_pages=2)
    cache = dataclasses.replace(cache, pages=cache.pages.bfloat16().float())
    x = torch.randn(len(lens), DIMS.hidden, generator=gen).bfloat16()
    return w, cache, x


@pytest.mark.parametrize("lens", [[1], [65, 64, 63]])
def test_the_layer_composes_the_attention_and_writes_only_the_new_rows(monkeypatch, lens):
    gen = torch.Generator().manual_seed(11 + len(lens))
    w, cache, x = case(gen, lens)
    kw = mla.prepare_mla_weights(w, DIMS, "cpu")
    calls, gemvs = [], []
    stand_in(monkeypatch, calls)
    monkeypatch.setattr(dense, "dense_decode", bf16_matmul(gemvs))
    norms = []
    monkeypatch.setattr(mla, "mla_norms_insert", standin_norms(norms))
    pages = cache.pages.bfloat16()
    slots = slots_of(cache)
    out = torch.full((len(lens), DIMS.hidden), float("nan"), dtype=torch.bfloat16)
    workspace = object()
    mla.mla_decode(x, kw, pages, cache.block_table, cache.seq_lens, slots, out, None, workspace)

    # One token: qkv_a and o_proj on dense.py's GEMV (dense.project); from two, cuBLAS.
    shapes = mla.projection_shapes(DIMS)
    assert shapes == {"qkv_a": (48 + 32 + 8 + 3 * 16, 96), "o_proj": (96, 3 * 16)}
    assert gemvs == ([("dense", shapes["qkv_a"]), ("dense", shapes["o_proj"])] if len(lens) == 1 else [])
    (call,) = calls
    assert norms == ["norms"]
    assert call["workspace"] is workspace and call["check_inputs"] and call["scale"] == DIMS.scale
    # One token: the fused tail (mla_output.py); from two the combine launch and torch (dispatch.attention_forms).
    assert call["tail"] == ("mla_output" if len(lens) == 1 else "combine + torch")
    if len(lens) == 1:
        assert call["gate_start"] == DIMS.q_lora + DIMS.kv_lora + DIMS.qk_rope  # the gate: qkv_a's last heads*v
    ref_out, ref_cache = mla_decode(x.float(), w, cache, DIMS)
    assert rel_err(out, ref_out) < 2e-2  # bf16 GEMM and norm outputs against fp32
    # The new rows were in the pages before the attention read them, and no other row moved.
    flat, ref_flat, before = pages.view(-1, DIMS.cache_row), ref_cache.pages.view(-1, DIMS.cache_row), cache.pages
    assert torch.equal(call["pages"], pages)
    assert rel_err(flat[slots], ref_flat[slots]) < 1e-2
    others = torch.ones(flat.shape[0], dtype=torch.bool)
    others[slots] = False
    assert torch.equal(flat[others].float(), before.view(-1, DIMS.cache_row)[others])
    # The kernel's q: [q_nope @ W_UK | q_pe] per head.
    query = mla_query(x.float(), w, DIMS)
    w_uk, _ = w.absorbed(DIMS)
    want_q = torch.cat([torch.einsum("mhp,hpl->mhl", query.q_nope, w_uk), query.q_pe], dim=-1)
    assert rel_err(call["q"], want_q) < 2e-2


def test_the_absorb_matrix_is_w_uk_and_an_identity_for_q_pe():
    w = random_mla_weights(DIMS, torch.Generator().manual_seed(2))
    kw = mla.prepare_mla_weights(w, DIMS, "cpu")
    w_uk, w_uv = w.absorbed(DIMS)
    assert kw.absorb.shape == (DIMS.heads, DIMS.qk_head, DIMS.cache_row) and kw.absorb.dtype == torch.bfloat16
    assert torch.equal(kw.absorb[:, : DIMS.qk_nope, : DIMS.kv_lora], w_uk.bfloat16())
    assert torch.equal(kw.absorb[:, DIMS.qk_nope :, DIMS.kv_lora :],
                       torch.eye(DIMS.qk_rope).bfloat16().expand(DIMS.heads, -1, -1))
    assert not kw.absorb[:, : DIMS.qk_nope, DIMS.kv_lora :].any()
    assert not kw.absorb[:, DIMS.qk_nope :, : DIMS.kv_lora].any()
    assert torch.equal(kw.w_uv, w_uv.transpose(1, 2).bfloat16())


def test_unchecked_the_inputs_are_not_read_on_the_host(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    w, cache, x = case(gen, [5, 70])
    calls = []
    stand_in(monkeypatch, calls)
    monkeypatch.setattr(mla, "mla_norms_insert", standin_norms([]))
    monkeypatch.setattr(mla, "check_slots", lambda *a: pytest.fail("read on the host"))
    monkeypatch.setattr(mla, "check_cache_inputs", lambda *a: pytest.fail("read on the host"))
    out = torch.empty(2, DIMS.hidden, dtype=torch.bfloat16)
    mla.mla_decode(x, mla.prepare_mla_weights(w, DIMS, "cpu"), cache.pages.bfloat16(), cache.block_table,
                   cache.seq_lens, slots_of(cache), out, None, None, check_inputs=False)
    assert [c["check_inputs"] for c in calls] == [False]


def test_bad_inputs_are_refused_before_anything_is_written(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    w, cache, x = case(gen, [5, 70])
    kw = mla.prepare_mla_weights(w, DIMS, "cpu")
    monkeypatch.setattr(mla, "mla_split_kv", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr(mla, "mla_output", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr(mla, "mla_attention_decode", lambda *a, **k: pytest.fail("launched"))
    monkeypatch.setattr(mla, "mla_norms_insert", lambda *a, **k: pytest.fail("launched"))
    pages = cache.pages.bfloat16()
    before = pages.clone()
    slots = slots_of(cache)
    out = torch.empty(2, DIMS.hidden, dtype=torch.bfloat16)

    def call(**changed):
        args = dict(x=x, w=kw, pages=pages, block_table=cache.block_table, seq_lens=cache.seq_lens, slots=slots,
                    out=out, stream=None, workspace=None)
        mla.mla_decode(**{**args, **changed})

    with pytest.raises(ValueError, match=r"x must be \[M, 96\] bf16, got \(2, 96\) torch.float32"):
        call(x=x.float())
    with pytest.raises(ValueError, match=r"pages must be \[P, page, 40\]"):
        call(pages=pages.view(-1, DIMS.cache_row))
    with pytest.raises(ValueError, match="slots: expected dtype int64"):
        call(slots=slots.int())
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 96\)"):
        call(out=out[:1])
    with pytest.raises(ValueError, match=r"sequence 1 \(70 tokens\) has slot .*; the row of its token at position 69"):
        call(slots=slots + torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="outside 1.."):
        call(seq_lens=torch.tensor([5, 200], dtype=torch.int32))
    assert torch.equal(pages, before)
