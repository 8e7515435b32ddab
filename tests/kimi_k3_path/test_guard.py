from __future__ import annotations

import pytest

from kimi_k3_path.guard import UnsupportedDeployment, check_deployment, unsupported_fields
from kimi_k3_path.support import SUPPORT_MATRIX, Deployment


@pytest.mark.parametrize("d", SUPPORT_MATRIX.example_deployments(), ids=lambda d: f"{d.arch}-tp{d.tp}-{d.spec}")
def test_every_deployment_of_the_matrix_is_admitted(d):
    assert check_deployment(d) is None
    for batch in SUPPORT_MATRIX.perf_batches:
        assert check_deployment(d.model_copy(update={"max_batch": batch})) is None
    for context in (1, *SUPPORT_MATRIX.perf_contexts):
        assert check_deployment(d.model_copy(update={"max_context": context})) is None


def test_the_interface_example_is_admitted():
    assert check_deployment(Deployment(arch="sm_90", tp=8, max_batch=64, max_context=4096)) is None
    assert check_deployment(Deployment(arch="sm_90", tp=8, max_batch=64, max_context=32768)) is None
    assert check_deployment(Deployment(arch="sm_90", tp=16, max_batch=1, max_context=4096)) is None


@pytest.mark.parametrize("arch", ["sm_100", "sm_103"])
def test_blackwell_is_rejected_for_lack_of_evidence(arch):
    with pytest.raises(UnsupportedDeployment) as caught:
        check_deployment(Deployment(arch=arch, tp=8, max_batch=64, max_context=4096))
    assert caught.value.fields == ("arch",)
    message = str(caught.value)
    assert f"arch='{arch}': no evidence from that hardware exists yet (supported: sm_90)" in message


@pytest.mark.parametrize(
    ("field", "value", "supported"),
    [
        ("arch", "sm_80", "sm_90"),
        ("tp", 4, "8, 16"),
        ("tp", 1, "8, 16"),
        ("max_batch", 65, "1..64"),
        ("max_context", 32769, "1..32768"),
        ("max_context", 131072, "1..32768"),
        ("kv_dtype", "fp8_e4m3", "bfloat16"),
        ("act_dtype", "float16", "bfloat16"),
        ("expert_quant", "nvfp4", "mxfp4"),
        ("pp", 2, "1"),
        ("expert_parallel", True, "False"),
        ("kda_state_dtypes", ("bfloat16", "bfloat16"), "bfloat16/float32"),
    ],
)
def test_each_unsupported_field_is_named_with_the_supported_values(field, value, supported):
    d = Deployment(arch="sm_90", tp=8, max_batch=64, max_context=4096).model_copy(update={field: value})
    with pytest.raises(UnsupportedDeployment) as caught:
        check_deployment(d)
    assert caught.value.fields == (field,)
    assert f"{field}={value!r}" in str(caught.value)
    assert f"(supported: {supported})" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_a_context_longer_than_measured_is_rejected_with_the_reason():
    with pytest.raises(UnsupportedDeployment) as caught:
        check_deployment(Deployment(arch="sm_90", tp=8, max_batch=64, max_context=131072))
    assert caught.value.fields == ("max_context",)
    assert "max_context=131072: longer contexts are not measured (supported: 1..32768)" in str(caught.value)


def test_spec_decode_and_dcp_are_not_admitted_yet():
    d = Deployment(arch="sm_90", tp=8, dcp=8, max_batch=64, max_context=4096, spec_method="dspark", spec_tokens=3)
    with pytest.raises(UnsupportedDeployment) as caught:
        check_deployment(d)
    assert caught.value.fields == ("dcp", "spec_method", "spec_tokens")
    assert "spec_method='dspark' (supported: none)" in str(caught.value)


def test_every_unsupported_field_is_named_at_once():
    d = Deployment(
        arch="sm_100", tp=4, dcp=2, max_batch=256, max_context=131072, spec_method="eagle", spec_tokens=2,
        kv_dtype="fp8", act_dtype="float16", expert_quant="nvfp4", pp=2, expert_parallel=True,
    )
    with pytest.raises(UnsupportedDeployment) as caught:
        check_deployment(d)
    expected = ("arch", "tp", "dcp", "max_batch", "max_context", "spec_method", "spec_tokens", "kv_dtype",
                "act_dtype", "expert_quant", "pp", "expert_parallel")
    assert caught.value.fields == expected
    message = str(caught.value)
    for field in expected:
        assert f"  - {field}=" in message
    assert "'auto' decode backend" in message
    assert caught.value.problems == unsupported_fields(d)
    assert caught.value.deployment is d


def test_the_guard_follows_the_matrix_it_is_given():
    widened = SUPPORT_MATRIX.model_copy(update={"tp": (4, 8, 16)})
    d = Deployment(arch="sm_90", tp=4, max_batch=8, max_context=4096)
    assert check_deployment(d, widened) is None
    with pytest.raises(UnsupportedDeployment):
        check_deployment(d)


def test_the_guard_refuses_what_is_not_a_deployment():
    with pytest.raises(TypeError, match="takes a kimi_k3_path.support.Deployment, got dict"):
        check_deployment({"arch": "sm_90", "tp": 8, "max_batch": 64, "max_context": 4096})


def test_a_rejection_always_names_something():
    with pytest.raises(ValueError, match="needs at least one unsupported field"):
        UnsupportedDeployment(Deployment(arch="sm_90", tp=8, max_batch=64, max_context=4096), ())
