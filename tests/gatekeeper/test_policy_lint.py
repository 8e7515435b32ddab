from __future__ import annotations

from gatekeeper.policy import Policy
from gatekeeper.policy_lint import lint


def _policy(**fields) -> Policy:
    return Policy.model_validate({"version": 1, "name": "t", "owned_paths": ["pkg/**"], **fields})


def _lint(policy: Policy, paths=None) -> list[tuple[str, str]]:
    return [(w.field, w.message) for w in lint(policy, paths)]


def test_a_clean_policy_has_no_warnings():
    policy = _policy(touchpoints=[{"path": "setup.py", "max_added": 2, "max_removed": 0}])
    assert _lint(policy, ["pkg/a.py", "setup.py"]) == []


def test_duplicate_globs_and_touchpoints():
    policy = _policy(
        owned_paths=["pkg/**", "pkg/**"],
        touchpoints=[{"path": "a.py", "max_added": 1, "max_removed": 0}, {"path": "a.py", "max_added": 2, "max_removed": 0}],
    )
    assert _lint(policy) == [
        ("owned_paths.1", "duplicate of owned_paths[0] ('pkg/**')"),
        ("touchpoints.1.path", "duplicate of touchpoints[0] ('a.py')"),
    ]


def test_owning_everything_is_flagged():
    assert _lint(_policy(owned_paths=["**"])) == [("owned_paths.0", "'**' owns every file: confinement can never fail")]


def test_owned_glob_inside_another_is_redundant():
    policy = _policy(owned_paths=["pkg/**", "pkg/sub/*.py", "pkg/setup.py"])
    # A literal path is judged exactly; a glob only against the repository's files.
    assert _lint(policy) == [("owned_paths.2", "'pkg/setup.py' adds nothing: every file it matches is owned through 'pkg/**'")]
    assert _lint(policy, ["pkg/sub/a.py", "pkg/setup.py"]) == [
        ("owned_paths.1", "'pkg/sub/*.py' adds nothing: every file it matches is owned through 'pkg/**'"),
        ("owned_paths.2", "'pkg/setup.py' adds nothing: every file it matches is owned through 'pkg/**'"),
    ]


def test_touchpoints_overlapping_owned_paths_or_each_other():
    policy = _policy(touchpoints=[
        {"path": "pkg/x.py", "max_added": 1, "max_removed": 0},
        {"path": "docs/*.md", "max_added": 1, "max_removed": 0},
        {"path": "docs/index.md", "max_added": 1, "max_removed": 0},
    ])
    assert _lint(policy, ["pkg/x.py", "docs/index.md"]) == [
        ("touchpoints.0.path", "'pkg/x.py' overlaps the owned paths (pkg/x.py is owned): its budget never applies there"),
        ("touchpoints.2.path", "'docs/index.md' overlaps touchpoints[1] ('docs/*.md') at docs/index.md: "
                               "only the first touchpoint's budget is charged"),
    ]


def test_globs_matching_nothing_only_with_a_repository():
    policy = _policy(touchpoints=[{"path": "setup.cfg", "max_added": 1, "max_removed": 0}])
    assert _lint(policy) == []
    assert _lint(policy, ["README.md"]) == [
        ("owned_paths.0", "'pkg/**' matches no file in the repository"),
        ("touchpoints.0.path", "'setup.cfg' matches no file in the repository"),
    ]


def test_commit_window_paths_matching_no_owned_file():
    policy = _policy(checks={"perf_matrix": {"commit_window": 3, "commit_window_counts": "owned",
                                             "commit_window_paths": ["pkg/**/*.py", "docs/**", "pkg/**/*.cu"]}})
    assert _lint(policy) == []
    assert _lint(policy, ["pkg/ops.py", "docs/index.md"]) == [
        ("checks.perf_matrix.commit_window_paths.1", "'docs/**' matches no owned file: no change there can age the perf evidence"),
        ("checks.perf_matrix.commit_window_paths.2", "'pkg/**/*.cu' matches no owned file: no change there can age the perf evidence"),
    ]


def test_contradicting_check_settings():
    policy = _policy(
        default_mode_checks=["perf_matrix"],
        require_trusted=["startup_guard"],
        checks={"startup_guard": {"enabled": True}},
        agent_detection={"on_signal": "default", "on_no_signal": "strict"},
    )
    assert _lint(policy) == [
        ("default_mode_checks.0", "perf_matrix is disabled in checks, so this has no effect"),
        ("checks.startup_guard.guard", "startup_guard is enabled but names no guard: it can never pass"),
        ("agent_detection.on_signal", "agent-assisted changes get a lighter review than the others"),
    ]
