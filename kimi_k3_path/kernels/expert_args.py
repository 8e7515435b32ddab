"""The tensors GEMM1's two forms take (gemm1_held.py, gemm1_mma.py): the launchers' host check and the fake tensors
their kernels are compiled with, written once."""

from __future__ import annotations

from cutlass import Float16, Float32, Uint8

from .common import FP4_GROUP
from .router import expect_plan, fake_plan


def expect_gemm1(x_lat, w13, s13, plan, top_k: int, a, y_lat) -> tuple[int, int, int, int]:
    """Check x_lat [M, L] fp16, w13 [E, 2I, L/2] and s13 [E, 2I, L/32] uint8, the plan, a [M*k, I] fp16 and y_lat
    [M, L] fp32 (runtime.expect: each error names the argument); return (M, L, E, I)."""
    from .runtime import expect

    m, latent = x_lat.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    expect("x_lat", x_lat, (m, latent), "float16")
    expect("w13", w13, (experts, 2 * inter, latent // 2), "uint8")
    expect("s13", s13, (experts, 2 * inter, latent // FP4_GROUP), "uint8")
    expect_plan(plan, experts)
    expect("a", a, (m * top_k, inter), "float16")
    expect("y_lat", y_lat, (m, latent), "float32")
    return m, latent, experts, inter


def fake_gemm1(experts: int, latent: int, inter: int) -> tuple:
    """GEMM1's kernel arguments as fake tensors (M and the pair count dynamic) and a fake stream."""
    from .runtime import dyn, fake, fake_stream

    md, pd = dyn(), dyn()
    return (fake(Float16, (md, latent)), fake(Uint8, (experts, 2 * inter, latent // 2)),
            fake(Uint8, (experts, 2 * inter, latent // FP4_GROUP)), *fake_plan(experts), fake(Float16, (pd, inter)),
            fake(Float32, (md, latent)), fake_stream())
