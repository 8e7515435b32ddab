"""Gated NoPE Multi-head Latent Attention decode over a paged latent cache, fp32 reference of one TP rank.

Mirrors vLLM's `kimi_k3/nvidia/mla.py` decode (q-LoRA front-end with the output gate merged into the first
projection; MQA over the latent cache with W_UK absorbed into the query and W_UV applied to the latent output):

    qkv_a   x -> [q_c (q_lora) | kv_c (kv_lora) | k_pe (rope) | gate (heads*v)]   (q_c, kv_c, k_pe replicated)
    norms   q_c = rms_norm(q_c), kv_c = rms_norm(kv_c)
    q_b     q_c -> q [heads, nope + rope] = [q_nope | q_pe]
    cache   row of the new token = [kv_c | k_pe] (576 wide in K3), written at position seq_len-1
    absorb  ql = q_nope @ W_UK  (kv_b rows per head: nope rows are W_UK, then v rows are W_UV)
    attend  softmax([ql | q_pe] . row * (nope+rope)^-0.5) over the sequence; latent = sum p * row[:kv_lora]
    out     v = latent @ W_UV^T; attn = v * sigmoid(gate); o_proj

NoPE: no rotary embedding is applied, but the rope-wide part of the row is still stored and scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .norm import rms_norm


@dataclass(frozen=True)
class MlaDims:
    hidden: int
    heads: int  # per rank
    q_lora: int = 1536
    kv_lora: int = 512
    qk_nope: int = 128
    qk_rope: int = 64
    v_head: int = 128
    eps: float = 1e-5

    @property
    def qk_head(self) -> int:
        return self.qk_nope + self.qk_rope

    @property
    def cache_row(self) -> int:
        return self.kv_lora + self.qk_rope

    @property
    def qkv_a_rows(self) -> int:
        return self.q_lora + self.kv_lora + self.qk_rope + self.heads * self.v_head

    @property
    def scale(self) -> float:
        return self.qk_head**-0.5


@dataclass(frozen=True)
class MlaWeights:
    qkv_a: torch.Tensor  # [qkv_a_rows, hidden]
    q_a_norm: torch.Tensor  # [q_lora]
    kv_a_norm: torch.Tensor  # [kv_lora]
    q_b: torch.Tensor  # [heads*(nope+rope), q_lora]
    kv_b: torch.Tensor  # [heads*(nope+v), kv_lora], per head the nope rows then the v rows
    o_proj: torch.Tensor  # [hidden, heads*v]

    def absorbed(self, d: MlaDims) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_UK [heads, nope, kv_lora], W_UV [heads, v, kv_lora]) split out of kv_b."""
        per_head = self.kv_b.float().reshape(d.heads, d.qk_nope + d.v_head, d.kv_lora)
        return per_head[:, : d.qk_nope], per_head[:, d.qk_nope :]


@dataclass(frozen=True)
class PagedLatentCache:
    """The latent KV cache of the requests in a batch.

    pages [num_pages, page_size, cache_row]; block_table [M, max_pages] (page index of each page of a sequence);
    seq_lens [M], each counting the token being decoded (its row is written by the step)."""

    pages: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor

    def slot(self, seq: int, position: int) -> tuple[int, int]:
        page_size = self.pages.shape[1]
        return int(self.block_table[seq, position // page_size]), position % page_size

    def rows(self, seq: int) -> torch.Tensor:
        """The cache rows of sequence `seq`, [seq_len, cache_row]."""
        n = int(self.seq_lens[seq])
        page_size = self.pages.shape[1]
        used = self.block_table[seq, : -(-n // page_size)].long()
        return self.pages[used].reshape(-1, self.pages.shape[2])[:n]


def random_mla_weights(d: MlaDims, gen: torch.Generator) -> MlaWeights:
    def lin(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen, device=gen.device) / cols**0.5

    return MlaWeights(
        qkv_a=lin(d.qkv_a_rows, d.hidden),
        q_a_norm=1.0 + 0.1 * torch.randn(d.q_lora, generator=gen, device=gen.device),
        kv_a_norm=1.0 + 0.1 * torch.randn(d.kv_lora, generator=gen, device=gen.device),
        q_b=lin(d.heads * d.qk_head, d.q_lora),
        kv_b=lin(d.heads * (d.qk_nope + d.v_head), d.kv_lora),
        o_proj=lin(d.hidden, d.heads * d.v_head),
    )


def random_paged_cache(
    d: MlaDims, seq_lens: list[int], page_size: int, gen: torch.Generator, spare_pages: int = 1
) -> PagedLatentCache:
    """A cache with random rows and a shuffled page assignment (pages of one sequence are not contiguous)."""
    if min(seq_lens) < 1:
        raise ValueError(f"random_paged_cache: every sequence needs at least the decoded token, got {seq_lens}")
    pages_per_seq = [-(-n // page_size) for n in seq_lens]
    max_pages = max(pages_per_seq)
    total = sum(pages_per_seq) + spare_pages
    order = torch.randperm(total, generator=gen, device=gen.device).cpu()
    table = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    start = 0
    for i, n in enumerate(pages_per_seq):
        table[i, :n] = order[start : start + n].to(torch.int32)
        start += n
    pages = torch.randn(total, page_size, d.cache_row, generator=gen, device=gen.device)
    return PagedLatentCache(pages=pages, block_table=table, seq_lens=torch.tensor(seq_lens, dtype=torch.int32))


@dataclass(frozen=True)
class MlaQuery:
    q_nope: torch.Tensor  # [M, heads, nope]
    q_pe: torch.Tensor  # [M, heads, rope]
    new_row: torch.Tensor  # [M, cache_row] = [rms_norm(kv_c) | k_pe]
    gate: torch.Tensor  # [M, heads*v]


def mla_query(x: torch.Tensor, w: MlaWeights, d: MlaDims) -> MlaQuery:
    m = x.shape[0]
    q_c, kv_c, k_pe, gate = (x.float() @ w.qkv_a.float().T).split(
        [d.q_lora, d.kv_lora, d.qk_rope, d.heads * d.v_head], dim=-1
    )
    q = (rms_norm(q_c, w.q_a_norm, d.eps) @ w.q_b.float().T).reshape(m, d.heads, d.qk_head)
    return MlaQuery(
        q_nope=q[..., : d.qk_nope],
        q_pe=q[..., d.qk_nope :],
        new_row=torch.cat([rms_norm(kv_c, w.kv_a_norm, d.eps), k_pe], dim=-1),
        gate=gate,
    )


def insert_rows(cache: PagedLatentCache, rows: torch.Tensor) -> PagedLatentCache:
    """A copy of `cache` with each sequence's decoded-token row written at position seq_len-1."""
    pages = cache.pages.clone()
    for i in range(rows.shape[0]):
        page, offset = cache.slot(i, int(cache.seq_lens[i]) - 1)
        pages[page, offset] = rows[i].to(pages.dtype)
    return PagedLatentCache(pages=pages, block_table=cache.block_table, seq_lens=cache.seq_lens)


def mla_attend(mqa_q: torch.Tensor, cache: PagedLatentCache, kv_lora: int, scale: float) -> torch.Tensor:
    """The part that reads the cache: per sequence i and head, softmax(mqa_q[i] . row * scale) over the sequence's
    rows, then the probabilities times the rows' first kv_lora columns. mqa_q [M, heads, cache_row] = [ql | q_pe]
    (ql = q_nope @ W_UK) -> latent [M, heads, kv_lora] fp32 (kernels/mla_attention.py's oracle)."""
    latent = torch.empty(mqa_q.shape[0], mqa_q.shape[1], kv_lora, device=mqa_q.device)
    for i in range(mqa_q.shape[0]):
        rows = cache.rows(i).float()  # one latent row serves every head (MQA)
        p = torch.softmax(mqa_q[i] @ rows.T * scale, dim=-1)
        latent[i] = p @ rows[:, :kv_lora]
    return latent


def _finish(v: torch.Tensor, query: MlaQuery, w: MlaWeights) -> torch.Tensor:
    attn = v.reshape(v.shape[0], -1) * torch.sigmoid(query.gate)
    return attn @ w.o_proj.float().T


def mla_decode(
    x: torch.Tensor, w: MlaWeights, cache: PagedLatentCache, d: MlaDims
) -> tuple[torch.Tensor, PagedLatentCache]:
    """Absorbed decode: x [M, hidden] -> (output [M, hidden], cache with the new rows). Pure."""
    query = mla_query(x, w, d)
    cache = insert_rows(cache, query.new_row)
    w_uk, w_uv = w.absorbed(d)
    mqa_q = torch.cat([torch.einsum("mhp,hpl->mhl", query.q_nope, w_uk), query.q_pe], dim=-1)
    latent = mla_attend(mqa_q, cache, d.kv_lora, d.scale)
    return _finish(torch.einsum("mhl,hvl->mhv", latent, w_uv), query, w), cache


def mla_decode_unabsorbed(
    x: torch.Tensor, w: MlaWeights, cache: PagedLatentCache, d: MlaDims
) -> tuple[torch.Tensor, PagedLatentCache]:
    """The same function computed the prefill way: per-head K and V materialized from the latent rows."""
    query = mla_query(x, w, d)
    cache = insert_rows(cache, query.new_row)
    w_uk, w_uv = w.absorbed(d)
    v_out = torch.empty(x.shape[0], d.heads, d.v_head)
    for i in range(x.shape[0]):
        rows = cache.rows(i).float()
        kv_c, k_pe = rows[:, : d.kv_lora], rows[:, d.kv_lora :]
        k = torch.cat([torch.einsum("tl,hpl->htp", kv_c, w_uk), k_pe.expand(d.heads, -1, -1)], dim=-1)
        v = torch.einsum("tl,hvl->htv", kv_c, w_uv)
        q = torch.cat([query.q_nope[i], query.q_pe[i]], dim=-1)  # [heads, qk_head]
        p = torch.softmax((k @ q.unsqueeze(-1)).squeeze(-1) * d.scale, dim=-1)  # [heads, T]
        v_out[i] = (p.unsqueeze(1) @ v).squeeze(1)
    return _finish(v_out, query, w), cache
