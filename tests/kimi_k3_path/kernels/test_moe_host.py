"""kernels/moe.py and gemm2_mma.experts_gemm2_mma on the CPU: the host side of the latent-MoE block at the real
per-rank shapes (on torch's meta device: shapes and dtypes, no data), with the launches stood in for. Which form
each launch takes at each batch (dispatch.py's table, as decode_steps applies it), what each is handed, and the
GEMM2 host function's checks and compile key; the kernels themselves run in test_kernels_gpu.py."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

from kimi_k3_path.config import named_config  # noqa: E402
from kimi_k3_path.kernels import gemm2_mma, moe, runtime  # noqa: E402
from kimi_k3_path.reference.dims import layer_dims  # noqa: E402
from kimi_k3_path.reference.moe import MoeWeights  # noqa: E402

META = "meta"
runtime_expect = runtime.expect  # the real checks, before a test stands in for the device part


def meta_reference(d) -> MoeWeights:
    """A reference MoeWeights of dims d with no data (the full experts are 1.2 GB at TP8)."""

    def t(*shape, dtype=torch.float32):
        return torch.empty(*shape, dtype=dtype, device=META)

    u8 = torch.uint8
    return MoeWeights(router=t(d.experts, d.hidden), router_bias=t(d.experts), down=t(d.latent, d.hidden),
                      w13_packed=t(d.experts, 2 * d.intermediate, d.latent // 2, dtype=u8),
                      w13_scales=t(d.experts, 2 * d.intermediate, d.latent // 32, dtype=u8),
                      w2_packed=t(d.experts, d.latent, d.intermediate // 2, dtype=u8),
                      w2_scales=t(d.experts, d.latent, d.intermediate // 32, dtype=u8),
                      latent_norm=t(d.latent), up=t(d.hidden, d.latent),
                      shared13=t(2 * d.shared_intermediate, d.hidden), shared2=t(d.hidden, d.shared_intermediate))


@pytest.fixture(params=[8, 16], ids=["tp8", "tp16"])
def block(request):
    d = layer_dims(named_config("kimi_k3"), request.param).moe
    w = moe.prepare_weights(meta_reference(d), d.top_k, d.routed_scaling_factor, d.eps, META)
    return request.param, d, w, moe.MoeWorkspace(w, META)


def test_weights_and_workspace_take_the_kernels_layout(block):
    tp, d, w, ws = block
    assert (w.experts, w.hidden, w.latent, w.intermediate, w.shared_intermediate) == (
        d.experts, d.hidden, d.latent, d.intermediate, d.shared_intermediate)
    assert (w.router.dtype, w.router_bias.dtype, w.w13_packed.dtype, w.latent_norm.dtype, w.up.dtype) == (
        torch.bfloat16, torch.float32, torch.uint8, torch.float32, torch.bfloat16)
    sizes = w.weight_bytes()
    assert sizes["w13_packed"] == d.experts * 2 * d.intermediate * d.latent // 2
    assert sizes["router"] == d.experts * d.hidden * 2 and len(sizes) == 11
    assert (ws.x_lat.dtype, ws.x_lat.shape) == (torch.float16, (64, d.latent))
    assert ws.a.shape == (64 * d.top_k, d.intermediate) and ws.plan.slot_pairs.shape == (d.experts, 64)
    assert ws.sq_parts.shape == (d.latent // moe.ONE_TOKEN_ROWS,) and ws.gemm2_counter.shape == (2,)


def record_launches(monkeypatch) -> list:
    calls = []
    for name in ("front", "experts_gemm1_held", "experts_gemm1_mma", "experts_gemm2_mma", "experts_gemm2_one_token",
                 "finalize_streamed", "finalize_mma"):
        monkeypatch.setattr(moe, name, lambda *a, _name=name, **k: calls.append((_name, a, k)))
    return calls


@pytest.mark.parametrize("m", [1, 2, 8, 16, 64])
def test_each_batch_launches_its_four_forms_in_order_on_the_stream(block, m, monkeypatch):
    tp, d, w, ws = block
    calls = record_launches(monkeypatch)
    x = torch.empty(m, d.hidden, dtype=torch.bfloat16, device=META)
    out = torch.empty(m, d.hidden, dtype=torch.bfloat16, device=META)
    stream = object()
    moe.latent_moe_decode(x, w, ws, out, stream)
    names = [name for name, _, _ in calls]
    if m == 1:
        assert names == ["front", "experts_gemm1_held", "experts_gemm2_one_token", "finalize_streamed"]
    else:
        assert names == ["front", "experts_gemm1_held" if m <= 4 else "experts_gemm1_mma", "experts_gemm2_mma",
                         "finalize_mma"]
    (_, front_args, front_kwargs), (_, gemm1_args, gemm1_kwargs), (_, gemm2_args, gemm2_kwargs), (_, fin_args, _) = calls
    assert front_args[:4] == (x, w, ws, m) and front_args[4] is stream
    assert front_kwargs == {"router_mma": m >= 16, "shared": m > 1}
    assert gemm1_args[6].shape == (m, d.latent) and gemm1_args[5].shape == (m * d.top_k, d.intermediate)
    assert gemm1_kwargs == ({"one_token": m == 1} if m <= 4 else {})
    if m == 1:
        assert gemm2_args[0].shape == (d.top_k, d.intermediate) and gemm2_args[-2][0] is x
        assert fin_args[4] is out and fin_args[-1] is stream
    else:
        assert gemm2_kwargs == {"multi_tile": m == 64}  # dispatch.MoeForms.gemm2_multi_tile
        assert gemm2_args[0].shape == (m * d.top_k, d.intermediate) and gemm2_args[-1] is stream
        assert fin_args[4] is out and fin_args[5] is stream
    assert [s.kind for s in moe.decode_steps(x, w, ws, out)] == ["front", "gemm1", "gemm2", "finalize"]
    assert moe.forms_for(w, m).one_token == (m == 1)


@pytest.mark.parametrize("m", [0, 65])
def test_a_batch_outside_1_to_64_is_refused(block, m):
    tp, d, w, ws = block
    x = torch.empty(m, d.hidden, dtype=torch.bfloat16, device=META)
    with pytest.raises(ValueError, match=f"decode batch M={m} must be in 1..64"):
        moe.decode_steps(x, w, ws, x)


@pytest.mark.parametrize("multi_tile", [False, True])
def test_gemm2_host_checks_its_tensors_and_compiles_one_kernel_per_tile_count(block, multi_tile, monkeypatch):
    """experts_gemm2_mma as the block calls it: every tensor checked (shape, dtype; the device check stood in for),
    the kernel built for the real widths with gemm2_tiles_per_cta tiles or one, its cache key naming the count."""
    tp, d, w, ws = block
    m = 8
    built, launched = {}, []

    def compile_cached(key, build):
        op, args = build()
        built[key] = op
        return lambda *a: launched.append(len(a))

    monkeypatch.setattr(runtime, "expect", lambda *spec, device=True: runtime_expect(*spec, device=False))
    monkeypatch.setattr(runtime, "compile_cached", compile_cached)
    monkeypatch.setattr(runtime, "to_cute", lambda t, dynamic_rows=False: t)
    monkeypatch.setattr(runtime, "cu_stream", lambda stream: stream)
    args = (ws.a[: m * d.top_k], w.w2_packed, w.w2_scales, ws.plan, ws.weights[:m], ws.y_lat[:m], ws.gemm2_counter,
            w.latent_norm, ws.normed[:m], d.eps, object())
    gemm2_mma.experts_gemm2_mma(*args, multi_tile=multi_tile)
    ((key, op),) = built.items()
    tiles = {8: 2, 16: 4}[tp] if multi_tile else 1
    assert key[-1] == tiles and op.tiles == tiles and op.ctas_per_slot() == d.latent // 128 // tiles
    assert launched == [13]  # a, w2, s2, the plan's 4 tensors, topk_w, y_lat, counter, gamma, normed, the stream
    with pytest.raises(ValueError, match="gamma: expected dtype float32"):
        gemm2_mma.experts_gemm2_mma(*args[:7], w.latent_norm.to(torch.bfloat16), *args[8:], multi_tile=multi_tile)

