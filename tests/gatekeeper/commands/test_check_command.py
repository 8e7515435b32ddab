from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from gatekeeper.cli import main

ROOT = Path(__file__).resolve().parents[3]
CONFINED = ROOT / "examples" / "pr-confined"
ESCAPES = ROOT / "examples" / "pr-escapes"


def _pr_args(example: Path) -> list[str]:
    return ["--pr-files", example / "pr-files.json", "--commits", example / "commits.json", "--pr", example / "pull.json"]


def test_json_output_follows_the_contract_and_exit_1_on_fail(policy_file, gatekeeper):
    result = gatekeeper("check", "--policy", policy_file, *_pr_args(ESCAPES), "--format", "json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["schema_version"] == 1 and data["verdict"] == "fail" and data["mode"] == "strict"
    assert data["policy"]["name"] == "cli-test" and len(data["policy"]["sha256"]) == 64
    assert data["agent_assisted"] is True
    assert [s["kind"] for s in data["signals"]] == ["trailer", "label"]
    confinement = data["checks"][0]
    assert confinement["id"] == "confinement" and confinement["status"] == "fail"
    assert [(f["path"], f["line"], f["severity"]) for f in confinement["findings"]] == [
        ("gatekeeper/evaluate.py", 30, "error"),
        ("tests/kimi_k3_path/conftest.py", None, "error"),
        ("kimi_k3_path/evidence/decode_table.bin", None, "notice"),
    ]
    assert [c["status"] for c in data["checks"][1:]] == ["skipped", "skipped", "skipped"]


def test_markdown_output_passes_with_exit_0(policy_file, gatekeeper):
    result = gatekeeper("check", "--policy", policy_file, *_pr_args(CONFINED), "--format", "markdown")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("## ✅ gatekeeper: PASS")
    assert "- **disclosure** in pull request #42 body:" in result.stdout
    assert result.stderr == ""


def test_html_output_is_the_details_page(policy_file, gatekeeper, tmp_path):
    out = tmp_path / "report.html"
    result = gatekeeper("check", "--policy", policy_file, *_pr_args(ESCAPES), "--format", "html", "--output", out)
    assert result.returncode == 1
    assert result.stderr.startswith(f"gatekeeper: FAIL; report written to {out}")
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and 'id="rule-confinement"' in page and "gatekeeper/evaluate.py" in page


def test_terminal_output_to_a_file(policy_file, gatekeeper, tmp_path):
    out = tmp_path / "report.txt"
    result = gatekeeper("check", "--policy", policy_file, *_pr_args(ESCAPES), "--output", out)
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"gatekeeper: FAIL; report written to {out}" in result.stderr
    text = out.read_text()
    assert "gatekeeper: FAIL" in text and "gatekeeper/evaluate.py:30" in text
    assert "\x1b[" not in text  # no colour codes in a file


def test_without_its_evidence_the_demo_is_neutral_loudly_and_strict_makes_it_fail(gatekeeper, capsys):
    args = ["check", "--policy", ROOT / "policies" / "kimi-k3-latency-specialized.yaml", *_pr_args(CONFINED)]
    result = gatekeeper(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["verdict"] == "neutral"
    assert data["checks"][0]["status"] == "pass"
    assert "the verdict is NEUTRAL, which is not a pass: exit 0; --strict makes it exit 1" in result.stderr
    assert main([*map(str, args), "--format", "json", "--strict"]) == 1
    assert "exit 1 (--strict)" in capsys.readouterr().err


def test_the_demo_with_its_collected_evidence_decides_every_rule_and_states_its_blast_radius(gatekeeper):
    """`make demo`: the example's evidence was made by `gatekeeper collect` (examples/build.py)."""
    args = ["check", "--policy", ROOT / "policies" / "kimi-k3-latency-specialized.yaml", *_pr_args(CONFINED),
            "--evidence", CONFINED / "evidence.json"]
    result = gatekeeper(*args, "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert {c["id"]: c["status"] for c in data["checks"]} == {
        "confinement": "pass", "startup_guard": "pass", "changed_path_tests": "pass", "perf_matrix": "pass"}
    assert data["verdict"] == "pass" and result.stderr == ""
    [radius] = data["blast_radius"]
    assert radius["statement"].startswith("Kimi K3 on sm_90, TP 8 or 16, DCP 1, batch <= 64")
    assert radius["change"] == "guard_changed" and radius["widened"] == {}
    markdown = gatekeeper(*args, "--format", "markdown").stdout
    assert "### Blast radius" in markdown and "guard code changed, same admitted deployments" in markdown


def test_the_example_that_widens_the_matrix_fails_on_the_guard_and_says_what_it_widens(gatekeeper):
    widens = ROOT / "examples" / "pr-widens-guard"
    result = gatekeeper("check", "--policy", ROOT / "policies" / "kimi-k3-latency-specialized.yaml", *_pr_args(widens),
                        "--evidence", widens / "evidence.json", "--format", "json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    guard = next(c for c in data["checks"] if c["id"] == "startup_guard")
    assert guard["status"] == "fail"
    assert "probe 'tp4' (expect reject): the guard accepted a deployment it must reject" in [
        f["message"] for f in guard["findings"]]
    [radius] = data["blast_radius"]
    assert radius["change"] == "widens" and radius["widened"] == {"tp": [4]}
    assert radius["newly_accepted_probes"] == ["tp4"]
    assert [s["agent"] for s in data["signals"] if s["kind"] == "trailer"][0] == "claude-code"


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "T",
           "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def _repo_with_a_readme(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "kimi_k3_path").mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "README.md").write_text("# demo\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    return repo


def test_git_range_and_the_same_diff_on_stdin_give_the_same_verdict(policy_file, tmp_path, capsys, monkeypatch):
    repo = _repo_with_a_readme(tmp_path)
    (repo / "kimi_k3_path" / "guard.py").write_text("def check():\n    raise ValueError('tp')\n")
    (repo / "README.md").write_text("# demo\nline 2\nline 3\nline 4\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "Add the guard\n\nCo-authored-by: Claude <noreply@anthropic.com>")
    assert main(["check", "--policy", str(policy_file), "--base", "HEAD~1", "--repo", str(repo), "--format", "json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert [s["detail"] for s in verdict["signals"]] == ["Co-authored-by: Claude <noreply@anthropic.com> (agent: Claude)"]
    assert verdict["checks"][0]["findings"][0]["path"] == "README.md"
    assert verdict["checks"][0]["findings"][0]["line"] == 4  # the third added line, beyond a budget of 2

    monkeypatch.setattr("sys.stdin", io.StringIO(_git(repo, "diff", "HEAD~1", "HEAD")))
    assert main(["check", "--policy", str(policy_file), "--diff", "-", "--agent-assisted", "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["checks"] == verdict["checks"]


def test_a_lone_carriage_return_in_a_diff_file_is_content_not_a_line_break(policy_file, tmp_path, capsys):
    repo = _repo_with_a_readme(tmp_path)
    (repo / "README.md").write_bytes(b"# demo\nhalf\rline\nline 3\nline 4\n")
    _git(repo, "commit", "-q", "-am", "edit")
    assert main(["check", "--policy", str(policy_file), "--base", "HEAD~1", "--repo", str(repo), "--format", "json",
                 "--agent-assisted"]) == 1
    from_git = json.loads(capsys.readouterr().out)["checks"]
    diff = tmp_path / "change.diff"
    diff.write_bytes(subprocess.run(["git", "diff", "HEAD~1", "HEAD"], cwd=repo, check=True, capture_output=True).stdout)
    assert main(["check", "--policy", str(policy_file), "--diff", str(diff), "--format", "json",
                 "--agent-assisted"]) == 1
    from_file = json.loads(capsys.readouterr().out)["checks"]
    assert from_file == from_git
    assert from_git[0]["findings"][0]["line"] == 4  # not shifted by the \r


@pytest.mark.parametrize(
    "args, message",
    [
        (["--diff", "x.diff", "--commits", "c.json"], "--commits needs --pr-files"),
        (["--diff", "x.diff", "--head", "main"], "--head needs --base"),
        (["--diff", "x.diff", "--pr-files", "f.json"], "not allowed with argument"),
        (["--diff", "x.diff", "--agent-assisted", "--not-agent-assisted"], "not allowed with argument"),
        ([], "one of the arguments --base --diff --pr-files is required"),
    ],
)
def test_usage_errors_exit_2(policy_file, capsys, args, message):
    with pytest.raises(SystemExit) as exited:
        main(["check", "--policy", str(policy_file), *args])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_input_errors_exit_2_with_file_and_line(policy_file, tmp_path, capsys):
    broken = tmp_path / "pr-files.json"
    broken.write_text('[\n  {"filename": "a.py",\n  "status": }\n]\n')
    assert main(["check", "--policy", str(policy_file), "--pr-files", str(broken)]) == 2
    assert f"gatekeeper: error: {broken}:3: invalid JSON" in capsys.readouterr().err

    assert main(["check", "--policy", str(tmp_path / "missing.yaml"), "--pr-files", str(broken)]) == 2
    assert "missing.yaml: cannot read policy" in capsys.readouterr().err


def test_bad_evidence_exits_2_naming_the_file(policy_file, tmp_path, capsys):
    evidence = tmp_path / "evidence.json"
    evidence.write_text('{"schema_version": 1, "perf": "fast"}')
    code = main(["check", "--policy", str(policy_file), *map(str, _pr_args(CONFINED)), "--evidence", str(evidence)])
    assert code == 2
    assert f"{evidence}: perf" in capsys.readouterr().err


def test_not_agent_assisted_overrides_the_signals_but_lists_them(policy_file, capsys):
    code = main(["check", "--policy", str(policy_file), *map(str, _pr_args(CONFINED)), "--not-agent-assisted",
                 "--format", "json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["agent_assisted"] is False and data["mode"] == "default"
    assert [s["kind"] for s in data["signals"]] == ["trailer", "disclosure"]


def _evidence_file(tmp_path: Path, name: str, **parts) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"schema_version": 1, **parts}))
    return path


def _run(label: str) -> dict:
    return {"origin": {"trust": "trusted", "source": "collector"}, "label": label, "tests": [{"id": f"t::{label}", "outcome": "passed"}]}


def _probes(guard: str) -> dict:
    return {"origin": {"trust": "trusted", "source": "collector"}, "guard": guard, "results": []}


def test_several_evidence_files_are_combined(tmp_path):
    from gatekeeper.evidence import combine_evidence, load_evidence

    first = _evidence_file(tmp_path, "a.json", tests=[_run("cpu")], guard_probes=_probes("m:g"))
    second = _evidence_file(tmp_path, "b.json", tests=[_run("gpu")])
    combined = combine_evidence([(str(p), load_evidence(p)) for p in (first, second)])
    assert [run.label for run in combined.tests] == ["cpu", "gpu"]
    assert combined.guard_probes.guard == "m:g"
    assert combine_evidence([]) is None


def test_contradicting_evidence_files_are_an_input_error(policy_file, tmp_path, capsys):
    first = _evidence_file(tmp_path, "a.json", guard_probes=_probes("m:g"))
    second = _evidence_file(tmp_path, "b.json", guard_probes=_probes("m:other"))
    args = ["check", "--policy", str(policy_file), *map(str, _pr_args(CONFINED))]
    assert main([*args, "--evidence", str(first), "--evidence", str(second)]) == 2
    assert f"{second}: guard_probes is also given by {first}; give it in one evidence file only" in capsys.readouterr().err


def test_evidence_from_a_workflow_the_change_edits_counts_as_self_reported(policy_file, tmp_path, capsys):
    """The App's trust rule where the CLI can tell: with --base, from the two trees."""
    repo = _repo_with_a_readme(tmp_path)
    workflow = repo / ".github" / "workflows" / "gatekeeper.yml"
    workflow.parent.mkdir(parents=True)
    workflow.write_text("on: pull_request\njobs:\n  e:\n    steps:\n      - run: gatekeeper collect\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "the evidence workflow")
    (repo / "kimi_k3_path" / "ops.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "a change that leaves the workflow")
    evidence = _evidence_file(tmp_path, "e.json", tests=[_run("cpu")])
    args = ["check", "--policy", str(policy_file), "--repo", str(repo), "--evidence", str(evidence), "--format", "json"]
    main([*args, "--base", "HEAD~1"])
    assert "self-reported" not in capsys.readouterr().err
    workflow.write_text(workflow.read_text() + "      - run: echo forged > evidence.json\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "a change that edits it")
    main([*args, "--base", "HEAD~2"])
    err = capsys.readouterr().err
    assert "CI's evidence counts as self-reported: the pull request changes `.github/workflows/gatekeeper.yml`" in err
