from __future__ import annotations

import json
import subprocess

from gatekeeper.cli import main


def test_validate_the_shipped_policies_end_to_end(gatekeeper, root):
    for name in ("vllm-kimi-k3", "kimi-k3-latency-specialized"):
        result = gatekeeper("policy", "validate", f"policies/{name}.yaml")
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"policies/{name}.yaml: valid policy '{name}' (sha256 ")
        assert result.stdout.rstrip().endswith("0 warnings")


def test_this_repositorys_policy_matches_its_files(root, capsys):
    assert main(["policy", "validate", str(root / "policies/kimi-k3-latency-specialized.yaml"), "--repo", str(root)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_invalid_policy_exits_2_naming_line_and_field(tmp_path, capsys):
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nname: x\nowned_paths: [a/**]\ntouchpoints:\n  - path: b.py\n    max_added: -1\n    max_removed: 0\n")
    assert main(["policy", "validate", str(policy)]) == 2
    assert f"gatekeeper: error: {policy}:6: touchpoints.0.max_added: Input should be greater than or equal to 0" in (
        capsys.readouterr().err
    )


def test_lint_warnings_point_at_their_lines_and_do_not_fail(tmp_path, capsys):
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "mod.py").write_text("")
    (repo / "setup.py").write_text("")
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "version: 1\nname: x\nowned_paths:\n  - pkg/**\n  - docs/**\n  - pkg/**\n"
        "touchpoints:\n  - {path: pkg/mod.py, max_added: 1, max_removed: 0}\n"
    )
    assert main(["policy", "validate", str(policy), "--repo", str(repo)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"{policy}:6: warning: owned_paths.2: duplicate of owned_paths[0] ('pkg/**')",
        f"{policy}:8: warning: touchpoints.0.path: 'pkg/mod.py' overlaps the owned paths (pkg/mod.py is owned): "
        "its budget never applies there",
        f"{policy}:5: warning: owned_paths.1: 'docs/**' matches no file in the repository",
    ]
    assert captured.out.rstrip().endswith("3 warnings")


def test_validate_against_a_git_repository_reads_its_head(tmp_path, capsys):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "kimi_k3_path").mkdir()
    (repo / "kimi_k3_path" / "untracked.py").write_text("")  # not committed: not in HEAD
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nname: x\nowned_paths: [kimi_k3_path/**]\n")
    subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-q", "--allow-empty", "-m", "x"],
                   cwd=repo, check=True)
    assert main(["policy", "validate", str(policy), "--repo", str(repo)]) == 0
    assert "'kimi_k3_path/**' matches no file in the repository" in capsys.readouterr().err


def test_missing_repo_is_an_input_error(tmp_path, root, capsys):
    code = main(["policy", "validate", str(root / "policies/vllm-kimi-k3.yaml"), "--repo", str(tmp_path / "nope")])
    assert code == 2
    assert "--repo is not a directory" in capsys.readouterr().err


def test_schema_is_json_schema_of_the_policy(capsys):
    assert main(["policy", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "Policy"
    assert {"version", "name", "owned_paths", "touchpoints", "agent_detection", "checks"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False
