"""GPU correctness of the dense decode projection (kernels/dense.py) against an fp32 matmul of
the same bf16 inputs, at the KDA attention's projections (in_proj, o_proj, f_b at TP8 and TP16) and the MLA attention's
qkv_a (its o_proj is KDA's shape), for batches that take
each form (1 token on the CUDA cores; 2, 16, 17, 33, 64 on the tensor cores, partial tiles included). Outputs are
poisoned with NaN before each launch; fresh random inputs each run (seed printed).

Tolerance: 1e-2 relative error per token (the bf16 output's rounding alone is ~2e-3; a dropped K slice or a row
written to the wrong place moves it by far more)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.reference import rel_err  # noqa: E402

from test_compile_dense import dense_projections, kda_projections  # noqa: E402

OUT_TOL = 1e-2


def run(n: int, k: int, m: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    from kimi_k3_path.kernels.dense import dense_decode

    x = torch.randn(m, k, generator=gen).bfloat16()
    w = (torch.randn(n, k, generator=gen) / k**0.5).bfloat16()
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    dense_decode(x.cuda(), w.cuda(), y, torch.cuda.current_stream())
    torch.cuda.synchronize()
    return y.cpu().float(), x.float() @ w.float().T


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 16, 17, 33, 64])
@pytest.mark.parametrize("tp", [8, 16])
@pytest.mark.parametrize("projection", ["in_proj", "o_proj", "f_b", "mla_qkv_a"])
def test_matches_an_fp32_matmul(projection, tp, m, seed):
    n, k = dense_projections(tp)[projection]
    got, want = run(n, k, m, torch.Generator().manual_seed(seed))
    for t in range(m):
        assert rel_err(got[t], want[t]) < OUT_TOL, f"{projection} tp={tp} M={m}: token {t}"


@pytest.mark.gpu
def test_captured_in_a_cuda_graph_and_replayed(seed):
    from kimi_k3_path.kernels.dense import dense_decode

    gen = torch.Generator().manual_seed(seed)
    n, k = kda_projections(8)["o_proj"]
    x = torch.randn(1, k, generator=gen).bfloat16().cuda()
    w = (torch.randn(n, k, generator=gen) / k**0.5).bfloat16().cuda()
    y = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    dense_decode(x, w, y, torch.cuda.current_stream())  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dense_decode(x, w, y, torch.cuda.current_stream())
    y.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(y.cpu().float(), x.cpu().float() @ w.cpu().float().T) < OUT_TOL
