"""The kernels' host side on CPU: argument validation names the bad argument, and compiled kernels are cached per
shape and register cap."""

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
    from cutlass import BFloat16

    from kimi_k3_path.kernels.gemv import SkinnyGemm

    builds = []

    def build():
        builds.append(1)
        m = runtime.dyn()
        args = (runtime.fake(BFloat16, (m, 256)), runtime.fake(BFloat16, (16, 256)), runtime.fake(BFloat16, (m, 16)),
                runtime.fake_stream())
        return SkinnyGemm(16, 256, 1), args

    first = runtime.compile_cached(("test_runtime_skinny", 16, 256), build)
    assert callable(first)
    assert runtime.compile_cached(("test_runtime_skinny", 16, 256), build) is first and len(builds) == 1
    other = runtime.compile_cached(("test_runtime_skinny", 16, 256, "another key"), build)
    assert other is not first and len(builds) == 2


def test_experts_one_token_forms_serve_one_token_and_are_refused_for_a_batch():
    from kimi_k3_path.kernels.moe import decode_steps, one_token_experts

    assert one_token_experts(1) and not one_token_experts(2)
    with pytest.raises(ValueError, match="one-token forms serve M=1, not M=2"):
        decode_steps(torch.empty(2, 8), None, None, None, one_token=True)


def test_gemm1_one_token_form_is_refused_for_a_batch_and_held_weights_stop_at_their_measured_bound():
    from kimi_k3_path.kernels.experts import GEMM1_HELD_MAX_TOKENS, experts_gemm1_situ, holds_gemm1_weights

    with pytest.raises(ValueError, match="one_token serves M=1, not M=3"):
        experts_gemm1_situ(torch.empty(3, 512), torch.empty(4, 16, 256), None, None, 16, None, None, None,
                           one_token=True)
    assert holds_gemm1_weights(GEMM1_HELD_MAX_TOKENS, True) and not holds_gemm1_weights(GEMM1_HELD_MAX_TOKENS + 1, True)
    assert not holds_gemm1_weights(1, tensor_cores=False)  # the bench's all-CUDA-core comparison keeps its kernels
