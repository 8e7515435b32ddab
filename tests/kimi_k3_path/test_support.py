from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from kimi_k3_path.support import BOUNDS, SUPPORT_MATRIX, Deployment, SupportMatrix, spec_label


def test_the_common_case_needs_four_fields():
    d = Deployment(arch="sm_90", tp=8, max_batch=64, max_context=4096)
    assert (d.dcp, d.spec_method, d.spec_tokens) == (1, None, 0)
    assert (d.kv_dtype, d.act_dtype, d.expert_quant) == ("bfloat16", "bfloat16", "mxfp4")
    assert d.spec == "none"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"arch": "hopper"}, "not a GPU architecture name"),
        ({"tp": 0}, "greater than or equal to 1"),
        ({"max_batch": 0}, "greater than or equal to 1"),
        ({"max_context": 0}, "greater than or equal to 1"),
        ({"spec_tokens": 3}, "needs a spec_method"),
        ({"spec_method": "dspark"}, "needs spec_tokens >= 1"),
        ({"spec_method": " ", "spec_tokens": 1}, "use None"),
        ({"dcp": 3}, "dcp=3 must divide tp=8"),
        ({"max_batchs": 8}, "Extra inputs are not permitted"),
    ],
)
def test_malformed_deployments_are_refused_with_the_reason(fields, message):
    base = {"arch": "sm_90", "tp": 8, "max_batch": 64, "max_context": 4096}
    with pytest.raises(ValidationError, match=message):
        Deployment(**{**base, **fields})


@pytest.mark.parametrize("bound", ["max_batch", "max_context"])
def test_the_bounds_are_required(bound):
    """No default: a deployment that does not say how large it runs cannot be judged against the bounds."""
    fields = {"arch": "sm_90", "tp": 8, "max_batch": 64, "max_context": 4096}
    del fields[bound]
    with pytest.raises(ValidationError, match=rf"{bound}\n +Field required"):
        Deployment(**fields)


def test_perf_axes_are_what_the_evidence_must_cover():
    assert SUPPORT_MATRIX.perf_axes() == {
        "arch": ("sm_90",),
        "tp": (8, 16),
        "dcp": (1,),
        "batch": (1, 2, 4, 8, 16, 32, 64),
        "spec": ("none",),
        "context": (4096, 32768),
    }


def test_the_context_is_bounded_by_what_was_measured():
    """The MLA decode's cost grows with the context: only the measured contexts are admitted."""
    assert SUPPORT_MATRIX.max_context == max(SUPPORT_MATRIX.perf_contexts) == 32768
    assert SUPPORT_MATRIX.supported_text("max_context") == "1..32768"


def test_the_bounds_are_the_upper_bounds_of_their_perf_axes():
    assert set(BOUNDS) == {"max_batch", "max_context"}
    axes = SUPPORT_MATRIX.perf_axes()
    for field, bound in BOUNDS.items():
        assert axes[bound.axis] == getattr(SUPPORT_MATRIX, bound.measured)
        assert max(axes[bound.axis]) == getattr(SUPPORT_MATRIX, field)
        assert SUPPORT_MATRIX.supported_text(field) == f"1..{getattr(SUPPORT_MATRIX, field)}"


def test_blackwell_is_known_but_not_admitted():
    assert "sm_100" not in SUPPORT_MATRIX.arch and "sm_103" not in SUPPORT_MATRIX.arch
    for arch in ("sm_100", "sm_103"):
        assert "no evidence from that hardware exists yet" in SUPPORT_MATRIX.unvalidated_arch[arch]


def test_every_discrete_deployment_field_has_admitted_values():
    assert set(SUPPORT_MATRIX.discrete_fields()) == set(Deployment.model_fields) - {"max_batch", "max_context"}
    for field in SUPPORT_MATRIX.discrete_fields():
        default = Deployment.model_fields[field].default
        admitted = SUPPORT_MATRIX.admitted(field)
        assert admitted, field
        # A field with a default must admit it, or the common case would be rejected.
        if not Deployment.model_fields[field].is_required():
            assert default in admitted, field
    for bound in ("max_batch", "max_context"):
        with pytest.raises(KeyError):
            SUPPORT_MATRIX.admitted(bound)


def test_example_deployments_enumerate_the_matrix():
    examples = SUPPORT_MATRIX.example_deployments()
    assert {(d.arch, d.tp, d.dcp, d.spec) for d in examples} == set(
        itertools.product(*(SUPPORT_MATRIX.perf_axes()[axis] for axis in ("arch", "tp", "dcp", "spec")))
    )
    assert all(d.max_batch == SUPPORT_MATRIX.max_batch for d in examples)
    assert all(d.max_context == SUPPORT_MATRIX.max_context for d in examples)


def test_spec_settings_pair_methods_with_draft_lengths():
    widened = SUPPORT_MATRIX.model_copy(update={"spec_method": (None, "dspark"), "spec_tokens": (0, 3, 7)})
    assert widened.spec_settings() == ((None, 0), ("dspark", 3), ("dspark", 7))
    assert widened.perf_axes()["spec"] == ("none", "dspark:3", "dspark:7")
    assert spec_label("dspark", 3) == "dspark:3"


def test_a_matrix_whose_perf_batches_miss_the_bound_is_refused():
    fields = SUPPORT_MATRIX.model_dump()
    with pytest.raises(ValidationError, match="must lie in 1..max_batch and reach 64"):
        SupportMatrix(**{**fields, "perf_batches": (1, 2, 4, 8, 16, 32)})
    with pytest.raises(ValidationError, match=r"perf_contexts \(1024,\) must lie in 1..max_context and reach 32768"):
        SupportMatrix(**{**fields, "perf_contexts": (1024,)})
    with pytest.raises(ValidationError, match="must lie in 1..max_context and reach 32768"):
        SupportMatrix(**{**fields, "perf_contexts": ()})
    with pytest.raises(ValidationError, match="must lie in 1..max_context and reach 8192"):
        SupportMatrix(**{**fields, "max_context": 8192})
    with pytest.raises(ValidationError, match="must lie in 1..max_context"):
        SupportMatrix(**{**fields, "perf_contexts": (0, 4096)})
    wider = SupportMatrix(**{**fields, "max_context": 65536, "perf_contexts": (4096, 32768, 65536)})
    assert wider.perf_axes()["context"] == (4096, 32768, 65536)
    with pytest.raises(ValidationError, match="both admitted and unvalidated"):
        SupportMatrix(**{**fields, "unvalidated_arch": {"sm_90": "x"}})


def test_the_pure_modules_import_without_torch_or_vllm():
    """The gatekeeper's static checks import these on a core install (no torch, no vllm)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
        "sys.modules['vllm'] = None\n"
        "import kimi_k3_path, kimi_k3_path.support, kimi_k3_path.guard, kimi_k3_path.config\n"
        "import kimi_k3_path.vllm_plugin\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_readme_table_matches_the_matrix():
    """The scope doc beside the code lists exactly what SUPPORT_MATRIX admits."""
    import re
    from pathlib import Path

    import kimi_k3_path

    readme = (Path(kimi_k3_path.__file__).parent / "README.md").read_text()
    section = readme.split("## Supported deployments", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \|[^|\n]*\| ([^|\n]*?) \|$", section, flags=re.M))
    assert set(rows) == set(Deployment.model_fields)
    for field, supported in rows.items():
        assert supported == SUPPORT_MATRIX.supported_text(field), field
    assert "no evidence from that hardware exists yet" in section
