from __future__ import annotations

from pathlib import Path

import pytest

from gatekeeper.errors import InputError
from gatekeeper.policy import Mode, field_line, load_policy, load_policy_text

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = "version: 1\nname: demo\nowned_paths:\n  - pkg/**\n"


def _error(text: str) -> InputError:
    with pytest.raises(InputError) as raised:
        load_policy_text(text, "p.yaml")
    return raised.value


@pytest.mark.parametrize("name", ["vllm-kimi-k3", "kimi-k3-latency-specialized"])
def test_shipped_policies_load(name):
    loaded = load_policy(ROOT / "policies" / f"{name}.yaml")
    assert loaded.policy.name == name
    assert loaded.policy.touchpoints == ()
    assert loaded.policy.agent_detection.on_signal is Mode.strict


def test_vllm_policy_owns_exactly_the_kimi_k3_paths():
    policy = load_policy(ROOT / "policies" / "vllm-kimi-k3.yaml").policy
    assert policy.owned_paths == (
        "vllm/models/kimi_k3/**", "tests/models/kimi_k3/**",
        "benchmarks/kernels/benchmark_kimi_k3_*", "csrc/libtorch_stable/kimi_k3/**",
    )
    guard = policy.checks.startup_guard
    assert guard.guard.endswith(":specialized_decode_config") and guard.raises == "ValueError"


def test_this_repositorys_policy_declares_the_guard_and_its_probes():
    guard = load_policy(ROOT / "policies" / "kimi-k3-latency-specialized.yaml").policy.checks.startup_guard
    assert (guard.guard, guard.raises) == ("kimi_k3_path.guard:check_deployment", "kimi_k3_path.guard:UnsupportedDeployment")
    assert {p.expect for p in guard.probes} == {"accept", "reject"}


def test_this_repositorys_probes_behave_as_declared_against_the_code_at_hand(tmp_path):
    """Run as `gatekeeper collect` runs them (a child process importing this checkout): every probe builds a
    Deployment, and the guard gives the declared answer naming what it must (a new required Deployment field the
    probes lack would make each one an error here, not only in the dogfood run)."""
    from gatekeeper.checks.startup_guard import probe_verdicts
    from gatekeeper.collect.probes import run_probes
    from gatekeeper.evidence import Origin

    guard = load_policy(ROOT / "policies" / "kimi-k3-latency-specialized.yaml").policy.checks.startup_guard
    probes, axes = run_probes(guard, ROOT, tmp_path, Origin(trust="trusted", source="test"))
    findings, rows = probe_verdicts(probes, guard)
    assert findings == [] and [row["ok"] for row in rows] == ["yes"] * len(guard.probes)
    assert {"context-above-32768", "h200-tp8-batch64-context32768"} <= {p.name for p in guard.probes}
    assert axes.axes["context"] == (4096, 32768)


def test_minimal_policy_and_its_hash_is_of_the_text():
    first, second = load_policy_text(MINIMAL, "a"), load_policy_text(MINIMAL + "# comment\n", "a")
    assert first.policy == second.policy
    assert first.sha256 != second.sha256  # the hash names the exact file the verdict was computed with


@pytest.mark.parametrize(
    "text, line, reason",
    [
        ("version: 1\nname: demo\nowned_paths: [a/**\n", 4, "invalid YAML"),
        ("version: 2\nname: demo\nowned_paths: [a/**]\n", 1, "version: Input should be 1"),
        ("version: 1\nname: demo\nowned_path: [a/**]\n", 1,
         "owned_paths: Field required; owned_path (line 3): Extra inputs are not permitted"),
        ("version: 1\nname: demo\n", 1, "owned_paths: Field required"),
        (MINIMAL + "touchpoints:\n  - path: a.py\n    max_added: 3\n", 6, "touchpoints.0.max_removed: Field required"),
        (MINIMAL + "checks:\n  startup_guard:\n    guard: not a reference\n", 7, "is not a 'package.module:name' reference"),
        (MINIMAL + "agent_detection:\n  on_signal: lenient\n", 6, "agent_detection.on_signal: Input should be 'strict' or 'default'"),
        (MINIMAL + "max_files: 5000\n", 5, "max_files: Input should be less than or equal to 3000"),
        ("- just\n- a list\n", 1, "a policy must be a YAML mapping"),
        (MINIMAL + "  - ../etc/**\n", 5, "owned_paths.1: Value error, glob '../etc/**' has an empty, '.' or '..' segment"),
        (MINIMAL + "  - /abs/**\n", 5, "drop the leading '/'"),
        (MINIMAL + "  - docs/\n", 5, "write 'docs/**' for every file below it"),
        (MINIMAL + "  - ''\n", 5, "empty glob"),
        (MINIMAL + "touchpoints:\n  - {path: \"a\\u202e.py\", max_added: 1, max_removed: 0}\n", 6,
         "contains control or invisible characters"),
        (MINIMAL + "checks:\n  perf_matrix:\n    evidence_globs: [a//b]\n", 7, "empty, '.' or '..' segment"),
        (MINIMAL + "name: again\n", 5, "duplicate key 'name' (first set on line 2"),
        (MINIMAL + "checks:\n  perf_matrix: {min_runs: 5}\n  confinement: {}\n  perf_matrix: {commit_window: 3}\n", 8,
         "duplicate key 'perf_matrix' (first set on line 6"),
        (MINIMAL + "checks:\n  startup_guard:\n    probes:\n      - {name: a, name: b}\n", 8, "duplicate key 'name'"),
        (MINIMAL + "checks:\n  perf_matrix:\n    commit_window: 3\n    commit_window_paths: ['pkg/**/*.py']\n", 7,
         "commit_window_paths only applies with commit_window_counts: owned"),
    ],
)
def test_errors_name_the_yaml_line_and_field(text, line, reason):
    error = _error(text)
    assert (error.source, error.line) == ("p.yaml", line)
    assert reason in error.reason


def test_field_line_finds_nested_fields():
    text = MINIMAL + "touchpoints:\n  - path: a.py\n    max_added: 3\n    max_removed: 0\n"
    assert field_line(text, ("touchpoints", 0, "max_added")) == 7
    assert field_line(text, ("owned_paths", 0)) == 4


def test_the_vllm_policy_has_the_four_specialized_decode_packages_with_their_guards():
    """Loads without vllm installed (tests/policies/test_vllm_policy.py runs it against vLLM's sources)."""
    policy = load_policy(ROOT / "policies" / "vllm.yaml").policy
    guards = {p.name: p.startup_guard.guard for p in policy.packages}
    assert guards == {
        "kimi_k3-nvidia": "vllm.models.kimi_k3.nvidia.specialized_decode.runtime:specialized_decode_config",
        "kimi_k3-amd": "vllm.models.kimi_k3.amd.specialized_decode.runtime:specialized_decode_config",
        "deepseek_v41-nvidia": "vllm.models.deepseek_v41.nvidia.specialized_decode:specialized_decode_config",
        "minimax_m3-amd": "vllm.models.minimax_m3.amd.specialized_decode.runtime.spec:specialized_decode_config",
    }
    assert all(p.startup_guard.probe_builder == "vllm" and p.startup_guard.probes for p in policy.packages)
    assert all((ROOT / "policies" / p.startup_guard.vllm_model).is_file() for p in policy.packages)
