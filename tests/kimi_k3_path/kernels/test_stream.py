"""The streaming one-token GEMV (kernels/stream.py): sm_90a compile checks on the CPU, argument checks, and on the
GPU its result against fp32 with fresh random inputs and a NaN-poisoned output, at the block's M=1 shapes."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

os.environ["CUTE_DSL_ARCH"] = "sm_90a"

import cutlass.cute as cute  # noqa: E402
from cutlass import BFloat16, Float16  # noqa: E402

from kimi_k3_path.kernels.runtime import fake, fake_stream  # noqa: E402
from kimi_k3_path.kernels.stream import StreamGemv, stages_for  # noqa: E402

TOL = 1e-2


def _args(n, k0, k1, y_dtype):
    k1_shape = k1 or k0
    return (fake(BFloat16, (1, k0)), fake(BFloat16, (n, k0)), fake(BFloat16, (1, k1_shape)),
            fake(BFloat16, (n, k1_shape)), fake(y_dtype, (1, n)), fake_stream())


@pytest.mark.parametrize("n, k0, k1, y_dtype", [
    (3584, 7168, 0, Float16),  # routed down-projection into the experts' fp16 x_lat
    (7168, 3584, 768, BFloat16),  # finalize at TP8: up-projection + shared experts' down-projection
    (7168, 3584, 384, BFloat16),  # finalize at TP16
])
@pytest.mark.parametrize("ctas, rows", [(132, 1), (132, 4), (264, 2)])
def test_stream_gemv_compiles_for_sm90a(n, k0, k1, y_dtype, ctas, rows):
    assert callable(cute.compile(StreamGemv(n, k0, k1, ctas, rows), *_args(n, k0, k1, y_dtype)))


def test_ring_holds_at_least_two_rows():
    assert stages_for(14336) == 8  # 112 KB of 14 KB rows
    assert stages_for(200_000) == 2


@pytest.mark.parametrize("n, k0, k1, ctas, message", [
    (3584, 7164, 0, 132, "K0=7164 is not a multiple of 8"),
    (7168, 3584, 764, 132, "K1=764 is not a multiple of 8"),
    (0, 3584, 0, 132, "must be positive"),
])
def test_bad_shapes_are_rejected_with_the_reason(n, k0, k1, ctas, message):
    with pytest.raises(ValueError, match=message):
        StreamGemv(n, k0, k1, ctas)


@pytest.mark.gpu
@pytest.mark.parametrize("per_sm, rows", [(1, 1), (1, 4), (2, 2)])
@pytest.mark.parametrize("n, k0, k1, dtype", [
    (3584, 7168, 0, torch.float16),
    (7168, 3584, 768, torch.bfloat16),
    (896, 7168, 0, torch.bfloat16),  # fewer rows per CTA than ring stages
    (100, 256, 64, torch.bfloat16),  # fewer rows than CTAs: some CTAs own none
])
def test_stream_gemv_matches_fp32(n, k0, k1, dtype, per_sm, rows, seed):
    from kimi_k3_path.kernels.stream import stream_gemv

    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU (runs on the H200)")
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape):
        return (torch.randn(*shape, generator=gen, device="cuda") / shape[-1] ** 0.5).to(torch.bfloat16)

    x0, w0 = torch.randn(1, k0, generator=gen, device="cuda").to(torch.bfloat16), rand(n, k0)
    x1, w1 = (torch.randn(1, k1, generator=gen, device="cuda").to(torch.bfloat16), rand(n, k1)) if k1 else (None, None)
    want = x0.float() @ w0.float().T + (x1.float() @ w1.float().T if k1 else 0)
    out = torch.full((1, n), float("nan"), device="cuda", dtype=dtype)
    stream_gemv(x0, w0, out, torch.cuda.current_stream(), x1, w1, ctas_per_sm=per_sm, rows=rows,
                stages=None if per_sm == 1 else 3)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert float((out.float() - want).norm() / want.norm()) < TOL
