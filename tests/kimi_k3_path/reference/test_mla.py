from __future__ import annotations

import torch

from kimi_k3_path.reference import mla_decode, mla_decode_unabsorbed, naive, random_mla_weights, random_paged_cache, rel_err


def test_absorbed_equals_unabsorbed_and_naive(gen, mla_dims):
    w = random_mla_weights(mla_dims, gen)
    cache = random_paged_cache(mla_dims, [1, 7, 12], page_size=4, gen=gen)
    x = torch.randn(3, mla_dims.hidden, generator=gen)
    out, new_cache = mla_decode(x, w, cache, mla_dims)
    out_un, cache_un = mla_decode_unabsorbed(x, w, cache, mla_dims)
    assert rel_err(out, out_un) < 1e-5
    assert torch.equal(new_cache.pages, cache_un.pages)
    assert rel_err(out, naive.mla_decode(x, w, cache, mla_dims)) < 1e-5


def test_step_writes_only_the_decoded_rows_576_wide(gen, mla_dims):
    w = random_mla_weights(mla_dims, gen)
    cache = random_paged_cache(mla_dims, [5, 8], page_size=4, gen=gen)
    x = torch.randn(2, mla_dims.hidden, generator=gen)
    _, new = mla_decode(x, w, cache, mla_dims)
    changed = (new.pages != cache.pages).any(dim=-1).nonzero().tolist()
    assert sorted(changed) == sorted([list(cache.slot(0, 4)), list(cache.slot(1, 7))])
    assert new.pages.shape[-1] == mla_dims.kv_lora + mla_dims.qk_rope
    # The rope-wide tail is stored (NoPE: not rotated) and is the k_pe slice of the first projection.
    k_pe = (x @ w.qkv_a.T)[:, mla_dims.q_lora + mla_dims.kv_lora : mla_dims.q_lora + mla_dims.kv_lora + mla_dims.qk_rope]
    page, off = cache.slot(0, 4)
    assert rel_err(new.pages[page, off, mla_dims.kv_lora :], k_pe[0]) < 1e-6


def test_rope_part_takes_part_in_scores(gen, mla_dims):
    # Changing only the stored 64-wide (here 8-wide) part of an old row changes the output.
    w = random_mla_weights(mla_dims, gen)
    cache = random_paged_cache(mla_dims, [6], page_size=4, gen=gen)
    x = torch.randn(1, mla_dims.hidden, generator=gen)
    out, _ = mla_decode(x, w, cache, mla_dims)
    page, off = cache.slot(0, 0)
    cache.pages[page, off, mla_dims.kv_lora :] += 5.0
    assert rel_err(mla_decode(x, w, cache, mla_dims)[0], out) > 1e-4
