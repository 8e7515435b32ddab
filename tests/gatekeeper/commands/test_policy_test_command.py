"""`gatekeeper policy test DIR`: fixture PRs and their expected verdicts."""

from __future__ import annotations

import shutil

from gatekeeper.cli import main


def test_the_shipped_vllm_cases_get_their_expected_verdicts(root, capsys):
    assert main(["policy", "test", str(root / "policies" / "tests" / "vllm")]) == 0
    out = capsys.readouterr().out
    assert "ok   two-packages: neutral" in out and "3 of 3 case(s) get their expected verdict" in out


def test_a_policy_edit_that_changes_a_verdict_is_shown(root, tmp_path, capsys):
    # The edit gives Kimi K3's NVIDIA package the model file too: the out-of-bounds case now passes confinement.
    policy = (root / "policies" / "vllm.yaml").read_text()
    edited = tmp_path / "vllm.yaml"
    edited.write_text(policy.replace("      - vllm/models/kimi_k3/nvidia/specialized_decode/**\n",
                                     "      - vllm/models/kimi_k3/nvidia/specialized_decode/**\n"
                                     "      - vllm/models/kimi_k3/nvidia/model.py\n"))
    shutil.copytree(root / "policies" / "vllm-models", tmp_path / "vllm-models")
    assert main(["policy", "test", str(root / "policies" / "tests" / "vllm"), "--policy", str(edited)]) == 1
    out = capsys.readouterr().out
    assert "FAIL out-of-bounds: neutral" in out
    assert "verdict: expected fail, got neutral" in out and "confinement: expected fail, got pass" in out


def test_shadow_rules_say_they_would_have_failed(tmp_path, capsys):
    (tmp_path / "p.yaml").write_text(
        "version: 1\nname: s\nowned_paths: [pkg/**]\nshadow: [confinement]\n")
    case = tmp_path / "cases" / "outside"
    case.mkdir(parents=True)
    (case / "change.diff").write_text(
        "diff --git a/other.py b/other.py\n--- a/other.py\n+++ b/other.py\n@@ -1 +1,2 @@\n x\n+y\n")
    (case / "case.yaml").write_text(
        "policy: ../../p.yaml\ndiff: change.diff\nagent_assisted: true\nexpect:\n  verdict: pass\n  checks: {confinement: fail}\n")
    assert main(["policy", "test", str(tmp_path / "cases")]) == 0
    assert "ok   outside: pass (shadow: confinement would have failed)" in capsys.readouterr().out


def test_a_bad_case_file_names_its_line(tmp_path, capsys):
    case = tmp_path / "c"
    case.mkdir()
    (case / "case.yaml").write_text("diff: x.diff\nexpect:\n  verdict: maybe\n")
    assert main(["policy", "test", str(tmp_path)]) == 2
    assert f"{case / 'case.yaml'}:3: expect.verdict: Input should be 'pass', 'fail' or 'neutral'" in capsys.readouterr().err
