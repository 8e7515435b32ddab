"""GPU correctness of the AttnRes kernel (kernels/attn_res.py) against the fp32 reference
`kimi_k3_path.reference.attn_res.attn_res_mix` applied to the same bf16 stream, at Kimi K3's hidden size 7168: every
source count a layer has (0..8 completed blocks plus the prefix, i.e. 1 to 9 sources), M = 1, 3, 64, each prefix mode,
a block-writing site. Outputs are poisoned with NaN before each launch; fresh random inputs each run (seed printed).

Tolerances: the output (bf16) within 1e-2 relative error per token (its bf16 rounding alone is ~2e-3); the prefix and
the written block bit for bit (the kernel rounds prefix + input to bf16 as torch does); blocks it does not write and
other tokens' rows untouched bit for bit.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.reference import rel_err  # noqa: E402
from kimi_k3_path.reference.attn_res import AttnResWeights, attn_res_mix, random_attn_res_weights  # noqa: E402

HIDDEN = 7168
MAX_BLOCKS = 8
EPS = 1e-5
OUT_TOL = 1e-2


def site(m: int, gen: torch.Generator) -> dict:
    """A random bf16 stream of m tokens and one site's weights, on the GPU."""
    w = random_attn_res_weights(HIDDEN, gen)

    def dev(t: torch.Tensor) -> torch.Tensor:
        return t.to("cuda", torch.bfloat16).contiguous()

    return dict(
        prefix=dev(torch.randn(m, HIDDEN, generator=gen)), delta=dev(torch.randn(m, HIDDEN, generator=gen)),
        blocks=dev(torch.randn(m, MAX_BLOCKS, HIDDEN, generator=gen)),
        res_norm=dev(w.res_norm), res_proj=dev(w.res_proj), out_norm=dev(w.out_norm),
    )


def expected(s: dict, num_blocks: int, write_block: int, mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out fp32, prefix bf16, blocks bf16) as the reference computes them from the same bf16 stream, on the CPU."""
    prefix, delta, blocks = (s[k].cpu() for k in ("prefix", "delta", "blocks"))
    if mode == "add":
        prefix = (prefix.float() + delta.float()).bfloat16()
    elif mode == "replace":
        prefix = delta.clone()
    blocks = blocks.clone()
    if write_block >= 0:
        blocks[:, write_block] = prefix
    w = AttnResWeights(res_norm=s["res_norm"].cpu().float(), res_proj=s["res_proj"].cpu().float(),
                       out_norm=s["out_norm"].cpu().float())
    out = attn_res_mix(blocks[:, :num_blocks].float(), prefix.float(), w, EPS, EPS)
    return out, prefix, blocks


def launch(s: dict, num_blocks: int, write_block: int, mode: str, cluster: int | None = None) -> torch.Tensor:
    from kimi_k3_path.kernels.attn_res import attn_res_decode

    out = torch.full_like(s["prefix"], float("nan"))
    attn_res_decode(s["prefix"], None if mode == "keep" else s["delta"], s["blocks"], num_blocks, write_block,
                    s["res_norm"], s["res_proj"], s["out_norm"], out, EPS, EPS, torch.cuda.current_stream(),
                    replace_prefix=mode == "replace", cluster=cluster)
    torch.cuda.synchronize()
    return out


def check(s: dict, num_blocks: int, write_block: int, mode: str, cluster: int | None = None) -> None:
    want_out, want_prefix, want_blocks = expected(s, num_blocks, write_block, mode)
    out = launch(s, num_blocks, write_block, mode, cluster).cpu()
    for t in range(out.shape[0]):
        err = rel_err(out[t].float(), want_out[t])
        assert err < OUT_TOL, f"token {t}: rel err {err:.2e} ({num_blocks} blocks, {mode}, write {write_block})"
    assert torch.equal(s["prefix"].cpu(), want_prefix), "the prefix as stored"
    assert torch.equal(s["blocks"].cpu(), want_blocks), "the blocks: the written one, the others untouched"


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("num_blocks", range(MAX_BLOCKS + 1))
def test_mix_matches_reference_for_every_source_count(num_blocks, m, seed):
    check(site(m, torch.Generator().manual_seed(seed)), num_blocks, -1, "add")


@pytest.mark.gpu
@pytest.mark.parametrize("mode, num_blocks, write_block", [
    ("keep", 3, -1),  # the prefix as stored, no input
    ("replace", 2, -1),  # a new block starts with the attention output (before the MoE of layers 12, 24, ...)
    ("add", 2, 2),  # before the attention of a block-writing layer: the prefix becomes block 2 and is not mixed
    ("add", 0, 0),  # layer 0: writes block 0, mixes its prefix alone
])
@pytest.mark.parametrize("m", [1, 5])
def test_prefix_modes_and_block_writes(mode, num_blocks, write_block, m, seed):
    check(site(m, torch.Generator().manual_seed(seed)), num_blocks, write_block, mode)


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [1, 2, 3, 8])
@pytest.mark.parametrize("m", [1, 7])
def test_any_cta_count_per_token_gives_the_same_mix(cluster, m, seed):
    """One CTA per token (no cluster), and clusters of 2, 3 (7168 columns in shares of 299, 299 and 298 vectors) and
    8 CTAs: the row sums meet in distributed shared memory whatever the split."""
    check(site(m, torch.Generator().manual_seed(seed)), 8, -1, "add", cluster)
    check(site(m, torch.Generator().manual_seed(seed + 1)), 2, 2, "add", cluster)


@pytest.mark.gpu
def test_nan_and_inf_stay_in_their_token(seed):
    s = site(4, torch.Generator().manual_seed(seed))
    s["blocks"][1, 3, 100] = float("nan")
    s["delta"][2, 7] = float("inf")
    out = launch(s, 6, -1, "add").cpu().float()
    assert torch.isfinite(out[[0, 3]]).all()
    assert not torch.isfinite(out[1]).all() and not torch.isfinite(out[2]).all()


@pytest.mark.gpu
def test_captured_in_a_cuda_graph_and_replayed(seed):
    """As the bench and a decode step run it: no host synchronization inside, the same result on replay."""
    from kimi_k3_path.kernels.attn_res import attn_res_decode

    s = site(8, torch.Generator().manual_seed(seed))
    want_out, _, _ = expected(s, 8, -1, "keep")
    out = torch.full_like(s["prefix"], float("nan"))
    args = (s["prefix"], None, s["blocks"], 8, -1, s["res_norm"], s["res_proj"], s["out_norm"], out, EPS, EPS)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        attn_res_decode(*args, side)  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attn_res_decode(*args, torch.cuda.current_stream())
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out.cpu().float(), want_out) < OUT_TOL
