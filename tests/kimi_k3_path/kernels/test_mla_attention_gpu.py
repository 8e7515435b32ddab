"""GPU correctness of the split-KV MLA attention (kernels/mla_attention.py) against the fp32
oracle `kimi_k3_path.reference.mla.mla_attend` (the attention part of reference.mla_decode, which calls it; its CPU
check is the first test here), at the per-rank widths (TP8: 12 heads, TP16: 6; rows 576 = 512 | 64, pages of 64).

Each batch's pages sit in random order in a larger pool; the pool's unused pages, the block table's entries past a
sequence's pages and the rows past seq_len in a sequence's last page hold NaN, which must reach no output; outputs
and partials are poisoned with NaN before each launch; the pool must come back bit for bit; fresh random inputs each
run (seed printed). Contexts of 1, 63, 64, 65 and 4096 tokens (page edges), sequences of different lengths in one
batch, M = 1, 7, 64.

Tolerance, per output row (sequence, head; 512 values; kimi_k3_path.reference.rel_err):
- 1e-2: the output's bf16 rounding alone is ~2e-3 and the probabilities are rounded to bf16 before P @ V (~1e-3 more;
  q and the rows are bf16 in the oracle too, so the scores differ only in summation order); a missed or doubled row
  of 4096 moves a row by ~sqrt(1/4096) = 1.6e-2 when the weights are even, and a page by ~0.12.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.reference import (  # noqa: E402
    MlaDims,
    PagedLatentCache,
    mla_attend,
    mla_decode,
    mla_decode_unabsorbed,
    random_mla_weights,
    random_paged_cache,
    rel_err,
)
from kimi_k3_path.reference.mla import _finish, insert_rows, mla_query  # noqa: E402

OUT_TOL = 1e-2
PAGE = 64
MIXED = [1, 63, 64, 65, 129, 4096, 1000]  # M = 7: every page edge and a long sequence in one batch


def test_attend_is_mla_decodes_attention():
    """CPU, no kernel: the oracle composed with the rest of the absorbed decode is reference.mla_decode bit for bit
    (and the prefill-form decode within fp32 rounding), and it reads only the sequences' rows: NaN in the pool's
    other pages and past seq_len changes nothing."""
    d = MlaDims(hidden=48, heads=3, q_lora=24, kv_lora=32, qk_nope=16, qk_rope=8, v_head=16)
    gen = torch.Generator().manual_seed(36)
    w = random_mla_weights(d, gen)
    cache = random_paged_cache(d, [1, 4, 5, 11], page_size=4, gen=gen, spare_pages=3)
    x = torch.randn(4, d.hidden, generator=gen)
    query = mla_query(x, w, d)
    written = insert_rows(cache, query.new_row)
    w_uk, w_uv = w.absorbed(d)
    mqa_q = torch.cat([torch.einsum("mhp,hpl->mhl", query.q_nope, w_uk), query.q_pe], dim=-1)
    latent = mla_attend(mqa_q, written, d.kv_lora, d.scale)
    out = _finish(torch.einsum("mhl,hvl->mhv", latent, w_uv), query, w)
    want, _ = mla_decode(x, w, cache, d)
    assert torch.equal(out, want)
    assert rel_err(out, mla_decode_unabsorbed(x, w, cache, d)[0]) < 1e-5
    poisoned = poison_unread(written, 4)
    assert torch.equal(mla_attend(mqa_q, poisoned, d.kv_lora, d.scale), latent)


def poison_unread(cache: PagedLatentCache, page_size: int) -> PagedLatentCache:
    """A copy of `cache` with NaN in every row no sequence reads: pages outside the sequences' used prefixes of the
    block table, rows past seq_len in each last page, and block table entries past a sequence's pages pointed at a
    NaN page (the pool needs one unused page)."""
    pages, table = cache.pages.clone(), cache.block_table.clone()
    used = set()
    for i, n in enumerate(cache.seq_lens.tolist()):
        count = -(-n // page_size)
        used.update(table[i, :count].tolist())
        pages[table[i, count - 1], n - (count - 1) * page_size:] = float("nan")
    unused = [p for p in range(pages.shape[0]) if p not in used]
    pages[unused] = float("nan")
    for i, n in enumerate(cache.seq_lens.tolist()):
        table[i, -(-n // page_size):] = unused[0]
    return PagedLatentCache(pages=pages, block_table=table, seq_lens=cache.seq_lens)


# --- GPU -------------------------------------------------------------------------------------------------------------

def mla_dims(tp: int) -> MlaDims:
    from kimi_k3_path.config import named_config
    from kimi_k3_path.reference.dims import layer_dims

    return layer_dims(named_config("kimi_k3"), tp).mla


@dataclasses.dataclass
class Case:
    d: MlaDims
    cache: PagedLatentCache  # the oracle's: bf16 values as fp32, NaN where nothing may be read, CPU
    q: torch.Tensor  # [M, heads, 576] bf16, CPU
    pages: torch.Tensor  # the kernel's pool, bf16, GPU
    table: torch.Tensor  # [M, W] int32, GPU
    seq_lens: torch.Tensor  # [M] int32, GPU


def make_case(tp: int, seq_lens: list[int], gen, extra_columns: int = 1) -> Case:
    """The batch's pages in random order in a pool with spare pages; the block table `extra_columns` wider than the
    longest sequence needs (those entries, like every unread row, NaN)."""
    d = mla_dims(tp)
    cache = random_paged_cache(d, seq_lens, PAGE, gen, spare_pages=len(seq_lens) + 2)
    table = torch.cat([cache.block_table, torch.zeros(len(seq_lens), extra_columns, dtype=torch.int32)], dim=1)
    cache = dataclasses.replace(cache, pages=cache.pages.to(torch.bfloat16).float(), block_table=table)
    cache = poison_unread(cache, PAGE)
    q = torch.randn(len(seq_lens), d.heads, d.cache_row, generator=gen).to(torch.bfloat16)
    return Case(d, cache, q, cache.pages.to(torch.bfloat16).cuda(), cache.block_table.cuda(),
                cache.seq_lens.cuda())


def oracle(case: Case) -> torch.Tensor:
    return mla_attend(case.q.float(), case.cache, case.d.kv_lora, case.d.scale)


def run_kernel(case: Case, workspace=None, check_inputs: bool = True) -> torch.Tensor:
    """One call on the case (output and partials poisoned first); returns the output on the CPU."""
    from kimi_k3_path.kernels.mla_attention import mla_attention_decode

    m = case.q.shape[0]
    out = torch.full((m, case.d.heads, case.d.kv_lora), float("nan"), device="cuda", dtype=torch.bfloat16)
    if workspace is not None:
        workspace.part_o.fill_(float("nan"))
        workspace.part_ml.fill_(float("nan"))
    mla_attention_decode(case.q.cuda(), case.pages, case.table, case.seq_lens, out, torch.cuda.current_stream(),
                         case.d.scale, workspace=workspace, check_inputs=check_inputs)
    torch.cuda.synchronize()
    return out.cpu()


def assert_rows_match(out: torch.Tensor, ref: torch.Tensor, seq_lens: list[int], rows=None) -> None:
    """Every (sequence, head) output row within OUT_TOL of the oracle (rel_err also rejects NaN and Inf)."""
    for i in range(out.shape[0]) if rows is None else rows:
        for h in range(out.shape[1]):
            err = rel_err(out[i, h].float(), ref[i, h])
            assert err < OUT_TOL, f"sequence {i} ({seq_lens[i]} tokens), head {h}: rel err {err:.2e}"


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def batch_lengths(name: str, gen) -> list[int]:
    if name == "M7":
        return MIXED
    if name == "M64":  # the page edges, then random lengths up to 4096
        return MIXED + torch.randint(1, 4097, (64 - len(MIXED),), generator=gen).tolist()
    return [int(name)]


@pytest.mark.gpu
@pytest.mark.parametrize("batch", ["1", "63", "64", "65", "4096", "M7", "M64"])
@pytest.mark.parametrize("tp", [8, 16])
def test_mla_attention_matches_the_oracle(tp, batch, seed):
    gen = torch.Generator().manual_seed(seed)
    lens = batch_lengths(batch, gen)
    case = make_case(tp, lens, gen)
    pool = case.pages.cpu()
    out = run_kernel(case)
    assert_rows_match(out, oracle(case), lens)
    assert torch.equal(bits(case.pages.cpu()), bits(pool)), "the kernel wrote into the cache"


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 5, 64])
@pytest.mark.parametrize("tp", [8, 16])
def test_any_split_count_gives_the_same_attention(tp, splits, seed):
    """A given workspace's split count instead of choose_splits': one split (no combine work), 5 (uneven page
    ranges), 64 (most splits of the short sequences empty: max -inf, sum 0, weighed 0 by the combine)."""
    from kimi_k3_path.kernels.mla_attention import mla_workspace

    gen = torch.Generator().manual_seed(seed)
    case = make_case(tp, MIXED, gen)
    out = run_kernel(case, mla_workspace(len(MIXED), case.d.heads, splits, "cuda"))
    assert_rows_match(out, oracle(case), MIXED)


@pytest.mark.gpu
def test_captured_in_a_cuda_graph_and_replayed_with_other_lengths(seed):
    """Unchecked (check_inputs=False, no host synchronization) under CUDA graph capture with a fixed workspace and
    table width; replayed after the lengths and queries change in place it matches the oracle of the new lengths,
    and a padding sequence of length 0 gets a zero row."""
    from kimi_k3_path.kernels.mla_attention import choose_splits, mla_attention_decode, mla_workspace

    gen = torch.Generator().manual_seed(seed)
    case = make_case(8, MIXED, gen)
    m, d = len(MIXED), case.d
    width = case.table.shape[1]
    ws = mla_workspace(m, d.heads, choose_splits(m, width * PAGE), "cuda")
    q = case.q.cuda()
    out = torch.full((m, d.heads, d.kv_lora), float("nan"), device="cuda", dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # compiled outside the capture
        mla_attention_decode(q, case.pages, case.table, case.seq_lens, out, stream, d.scale, ws, check_inputs=False)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        mla_attention_decode(q, case.pages, case.table, case.seq_lens, out, stream, d.scale, ws, check_inputs=False)
    # Shorter lengths (the pages stay the sequences' own), one of them a padding sequence of length 0.
    shorter = [max(1, n // 2) for n in MIXED]
    shorter[2] = 0
    case.seq_lens.copy_(torch.tensor(shorter, dtype=torch.int32))
    q.copy_(torch.randn(q.shape, generator=gen).to(torch.bfloat16))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    kept = [i for i, n in enumerate(shorter) if n > 0]
    oracle_case = dataclasses.replace(
        case, q=q.cpu()[kept],
        cache=PagedLatentCache(case.cache.pages, case.cache.block_table[kept], torch.tensor(shorter)[kept]))
    got = out.cpu()
    assert_rows_match(got[kept], oracle(oracle_case), [shorter[i] for i in kept])
    assert (got[2] == 0).all()


@pytest.mark.gpu
def test_wrapper_reads_the_lengths_and_pages_and_rejects_bad_ones(seed):
    gen = torch.Generator().manual_seed(seed)
    case = make_case(16, [65, 3], gen)
    width = case.table.shape[1]
    case.seq_lens[1] = width * PAGE + 1
    with pytest.raises(ValueError, match="outside 1.."):
        run_kernel(case)
    case.seq_lens[1] = 3
    case.table[0, 1] = case.pages.shape[0]
    with pytest.raises(ValueError, match="sequence 0 uses pages"):
        run_kernel(case)
