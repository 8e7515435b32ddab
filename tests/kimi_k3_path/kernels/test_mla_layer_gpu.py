"""GPU correctness of an MLA layer's attention on the kernels (kernels/mla.py: the projections, the norms, the
split-KV attention of kernels/mla_attention.py and the output launch) against the fp32 reference
`kimi_k3_path.reference.mla_decode`, at the per-rank widths (TP8: 12 heads, TP16: 6), M = 1, 3, 64, sequence
lengths at page edges (1, 63, 64, 65, 4096: the decoded token's row is the first, last or 64th of a page), pages in
random order in a pool with spare pages. Fresh random inputs each run (seed printed).

Checked: every output row (token) within OUT_TOL of the reference; each decoded row written at its slot within
ROW_TOL of the reference's row; every other row of the pool (the sequences' earlier rows, other pages) bit for bit as
it was; unchecked under CUDA graph capture with a fixed workspace, replayed on a new input.

Tolerances (kimi_k3_path.reference.rel_err; weights and cache bf16-representable, so only activations round):
- output, per token: 2e-2, the bar the stock-like path and the KDA attention are held to (bf16 outputs of the
  qkv_a, q_b, absorb, attention, W_UV, gate and o_proj steps; the attention alone is within 1e-2 of its oracle).
- decoded row: 1e-2 (the normed kv_c and k_pe rounded to bf16 once: ~2e-3).
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.reference import (  # noqa: E402
    PagedLatentCache,
    mla_decode,
    random_mla_weights,
    random_paged_cache,
    rel_err,
)

OUT_TOL = 2e-2
ROW_TOL = 1e-2
PAGE = 64
EDGES = [1, 63, 64, 65, 4096]

pytestmark = pytest.mark.gpu


def mla_dims(tp: int):
    from kimi_k3_path.config import named_config
    from kimi_k3_path.reference.dims import layer_dims

    return layer_dims(named_config("kimi_k3"), tp).mla


def rounded(obj):
    return dataclasses.replace(obj, **{f.name: getattr(obj, f.name).bfloat16().float() for f in dataclasses.fields(obj)
                                       if isinstance(getattr(obj, f.name), torch.Tensor)
                                       and getattr(obj, f.name).is_floating_point()})


def slots_of(cache: PagedLatentCache) -> torch.Tensor:
    return torch.tensor([page * PAGE + off for page, off in
                         (cache.slot(i, n - 1) for i, n in enumerate(cache.seq_lens.tolist()))], dtype=torch.int64)


def lengths(name: str, gen) -> list[int]:
    if name == "M64":  # the page edges, then random lengths up to 4096
        return EDGES + torch.randint(1, 4097, (64 - len(EDGES),), generator=gen).tolist()
    return [int(n) for n in name.split(",")]


def make_case(tp: int, lens: list[int], gen):
    d = mla_dims(tp)
    w = rounded(random_mla_weights(d, gen))
    cache = rounded(random_paged_cache(d, lens, PAGE, gen, spare_pages=len(lens) + 2))
    x = torch.randn(len(lens), d.hidden, generator=gen).bfloat16()
    return d, w, cache, x


def device_args(cache: PagedLatentCache):
    return (cache.pages.bfloat16().cuda(), cache.block_table.cuda(), cache.seq_lens.cuda(), slots_of(cache).cuda())


def assert_matches_the_reference(d, w, cache, x, out, pages):
    ref_out, ref_cache = mla_decode(x.float(), w, cache, d)
    for i in range(out.shape[0]):
        err = rel_err(out[i].float().cpu(), ref_out[i])
        assert err < OUT_TOL, f"token {i} ({int(cache.seq_lens[i])} tokens): rel err {err:.2e}"
    flat, ref_flat = pages.cpu().view(-1, d.cache_row), ref_cache.pages.view(-1, d.cache_row)
    slots = slots_of(cache)
    for i, slot in enumerate(slots.tolist()):
        err = rel_err(flat[slot].float(), ref_flat[slot])
        assert err < ROW_TOL, f"decoded row of sequence {i}: rel err {err:.2e}"
    others = torch.ones(flat.shape[0], dtype=torch.bool)
    others[slots] = False
    before = cache.pages.bfloat16().view(-1, d.cache_row)
    assert torch.equal(flat[others].view(torch.int16), before[others].view(torch.int16)), "other rows moved"


@pytest.mark.parametrize("batch", ["1", "63", "64", "65", "4096", "1,64,65", "63,4096,64", "M64"])
@pytest.mark.parametrize("tp", [8, 16])
def test_the_mla_layer_matches_the_reference(tp, batch, seed):
    from kimi_k3_path.kernels.mla import mla_decode as kernel_mla_decode, prepare_mla_weights

    gen = torch.Generator().manual_seed(seed)
    d, w, cache, x = make_case(tp, lengths(batch, gen), gen)
    pages, table, seq_lens, slots = device_args(cache)
    out = torch.full((x.shape[0], d.hidden), float("nan"), device="cuda", dtype=torch.bfloat16)
    kernel_mla_decode(x.cuda(), prepare_mla_weights(w, d, "cuda"), pages, table, seq_lens, slots, out,
                      torch.cuda.current_stream(), None)
    torch.cuda.synchronize()
    assert_matches_the_reference(d, w, cache, x, out, pages)


@pytest.mark.parametrize("tp", [8, 16])
def test_captured_in_a_cuda_graph_and_replayed_on_a_new_input(tp, seed):
    """Unchecked (check_inputs=False: no host synchronization) with a workspace allocated once, captured in a CUDA
    graph; replayed on a new input written in place into the captured x, over the pool as it was before any call."""
    from kimi_k3_path.kernels.mla import mla_decode as kernel_mla_decode, prepare_mla_weights
    from kimi_k3_path.kernels.mla_attention import choose_splits, mla_workspace

    gen = torch.Generator().manual_seed(seed)
    lens = [65, 1, 4096]
    d, w, cache, x = make_case(tp, lens, gen)
    pages, table, seq_lens, slots = device_args(cache)
    pool = pages.clone()
    kw = prepare_mla_weights(w, d, "cuda")
    ws = mla_workspace(len(lens), d.heads, choose_splits(len(lens), max(lens)), "cuda")
    x_dev = x.cuda()
    out = torch.empty(len(lens), d.hidden, device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compiled (and cuBLAS set up) outside the capture
        kernel_mla_decode(x_dev, kw, pages, table, seq_lens, slots, out, stream, ws, check_inputs=False)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        kernel_mla_decode(x_dev, kw, pages, table, seq_lens, slots, out, stream, ws, check_inputs=False)
    new_x = torch.randn(x.shape, generator=gen).bfloat16()
    x_dev.copy_(new_x)
    pages.copy_(pool)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_the_reference(d, w, cache, new_x, out, pages)
