"""The kernels' host side on CPU: argument validation names the bad argument, compiled kernels are cached per key,
and the block refuses what its dispatch table does not serve."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

from kimi_k3_path.kernels import runtime  # noqa: E402


def _cuda_like(shape=(2, 8), dtype=torch.bfloat16, contiguous=True, address=4096):
    """Stands in for a CUDA tensor, which this machine may not have: expect() reads only these attributes."""
    return SimpleNamespace(shape=shape, dtype=dtype, is_contiguous=lambda: contiguous, is_cuda=True,
                           data_ptr=lambda: address, device="cuda:0")


@pytest.mark.parametrize(
    ("tensor", "message"),
    [
        (_cuda_like(shape=(3, 8)), r"x: expected shape \(2, 8\), got \(3, 8\)"),
        (_cuda_like(dtype=torch.float16), "x: expected dtype bfloat16, got torch.float16"),
        (_cuda_like(contiguous=False), "x: must be contiguous"),
        (torch.zeros(2, 8, dtype=torch.bfloat16), "x: must be a CUDA tensor"),
        (_cuda_like(address=4100), "x: data pointer must be 16-byte aligned"),
    ],
)
def test_expect_names_the_argument_and_what_is_wrong(tensor, message):
    with pytest.raises(ValueError, match=message):
        runtime.expect("x", tensor, (2, 8), "bfloat16")


def test_expect_accepts_a_matching_tensor():
    runtime.expect("x", _cuda_like(), (2, 8), "bfloat16")


def test_compiled_kernels_are_cached_per_key():
    from kimi_k3_path.kernels.finalize_mma import Finalize

    builds = []

    def build():
        from cutlass import BFloat16

        builds.append(1)
        m = runtime.dyn()
        args = (runtime.fake(BFloat16, (m, 256)), runtime.fake(BFloat16, (16, 256)), runtime.fake(BFloat16, (m, 64)),
                runtime.fake(BFloat16, (16, 64)), runtime.fake(BFloat16, (m, 16)), runtime.fake_stream())
        return Finalize(16, 256, 64, 16), args

    size = runtime.cache_size()
    first = runtime.compile_cached(("test_runtime_finalize", 16, 256), build)
    assert callable(first)
    assert runtime.compile_cached(("test_runtime_finalize", 16, 256), build) is first and len(builds) == 1
    other = runtime.compile_cached(("test_runtime_finalize", 16, 256, "another key"), build)
    assert other is not first and len(builds) == 2 and runtime.cache_size() == size + 2


def test_a_tensors_cute_view_has_a_dynamic_leading_dimension_only_when_asked():
    """The view must match the fake tensor the kernel was compiled with: a dyn() batch, or every dimension static."""
    t = torch.zeros(4, 8, dtype=torch.bfloat16)
    static, dynamic = runtime.to_cute(t), runtime.to_cute(t, dynamic_rows=True)
    assert static.shape == dynamic.shape == (4, 8)
    assert "(4,8):(8,1)" in str(static) and "(?,8):(8,1)" in str(dynamic)


def test_a_torch_streams_handle_becomes_the_driver_stream_cute_launches_on():
    handle = 0x7F00  # what torch.cuda.Stream.cuda_stream returns: the CUstream's address
    assert int(runtime.cu_stream(SimpleNamespace(cuda_stream=handle))) == handle


def test_the_block_refuses_batches_outside_its_table():
    from kimi_k3_path.kernels.moe import decode_steps

    with pytest.raises(ValueError, match="decode batch M=65 must be in 1..64"):
        decode_steps(torch.empty(65, 8), None, None, None)
    weights = SimpleNamespace(intermediate=256)
    with pytest.raises(ValueError, match="expert intermediate 256 is not the per-rank width of an admitted TP"):
        decode_steps(torch.empty(2, 8), weights, None, None)


def test_gemm1_one_token_form_is_refused_for_a_batch():
    from kimi_k3_path.kernels.gemm1_held import experts_gemm1_held

    with pytest.raises(ValueError, match="one_token serves M=1, not M=3"):
        experts_gemm1_held(torch.empty(3, 512), torch.empty(4, 16, 256), None, None, 16, None, None, None,
                           one_token=True)
