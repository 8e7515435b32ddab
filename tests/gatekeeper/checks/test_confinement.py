from __future__ import annotations

import os
import subprocess

import pytest

from gatekeeper.changes import ChangeSet, FileChange, FileStatus
from gatekeeper.checks import CheckContext
from gatekeeper.checks.confinement import run
from gatekeeper.policy import LoadedPolicy, Mode, Policy
from gatekeeper.provenance import Provenance
from gatekeeper.sources.git import changes_from_git
from gatekeeper.verdict import Severity, Status

OWNED = ("vllm/models/kimi_k3/**", "tests/models/kimi_k3/**")
TOUCHPOINT = {"path": "vllm/model_executor/models/registry.py", "max_added": 3, "max_removed": 1}


def _policy(**overrides) -> LoadedPolicy:
    data = {"version": 1, "name": "test", "owned_paths": OWNED, "touchpoints": [TOUCHPOINT], **overrides}
    return LoadedPolicy(policy=Policy.model_validate(data), source="test.yaml", sha256="0" * 64)


def _check(*files: FileChange, policy: LoadedPolicy | None = None):
    ctx = CheckContext(policy or _policy(), ChangeSet(source="test", files=files), Provenance(), Mode.strict)
    return run(ctx)


def _file(path: str, status: FileStatus = FileStatus.modified, **fields) -> FileChange:
    return FileChange(path=path, status=status, **fields)


def _only_finding(result):
    assert result.status is Status.failed
    assert len(result.findings) == 1
    return result.findings[0]


def test_owned_and_in_budget_touchpoint_pass_with_counts():
    result = _check(
        _file("vllm/models/kimi_k3/nvidia/decode.py", FileStatus.added, added_lines=tuple(range(1, 400))),
        _file("tests/models/kimi_k3/test_decode.py", FileStatus.removed, removed_lines=(1, 2, 3)),
        _file("vllm/model_executor/models/registry.py", added_lines=(10, 11, 12), removed_lines=(10,)),
    )
    assert result.status is Status.passed
    assert result.findings == ()
    assert result.summary == (
        "3 files changed: 2 in owned paths, 1 in touchpoints, 0 outside, 0 hostile; 0 offending."
    )
    assert result.details["touchpoints"] == [
        {"path": TOUCHPOINT["path"], "added": 3, "max_added": 3, "removed": 1, "max_removed": 1}
    ]


def test_empty_change_passes():
    result = _check()
    assert result.status is Status.passed
    assert result.summary.startswith("0 files changed")


def test_file_outside_names_its_first_added_line():
    finding = _only_finding(_check(_file("vllm/engine/llm_engine.py", added_lines=(40, 41), removed_lines=(40,))))
    assert (finding.path, finding.line, finding.severity) == ("vllm/engine/llm_engine.py", 40, Severity.error)
    assert "outside the owned paths" in finding.message


def test_pure_deletion_outside_has_no_line():
    finding = _only_finding(_check(_file("vllm/engine/old.py", FileStatus.removed, removed_lines=(1, 2))))
    assert finding.line is None


def test_touchpoint_over_budget_points_at_the_first_line_beyond_it():
    finding = _only_finding(
        _check(_file("vllm/model_executor/models/registry.py", added_lines=(5, 6, 7, 8, 9), removed_lines=(5,)))
    )
    assert finding.line == 8
    assert "5 added lines (budget 3; line 8 is the first beyond it)" in finding.message


def test_touchpoint_removed_lines_over_budget_names_the_old_line():
    finding = _only_finding(_check(_file("vllm/model_executor/models/registry.py", removed_lines=(3, 4))))
    assert finding.line is None
    assert "old line 4 is the first beyond it" in finding.message


def test_glob_touchpoint_budget_is_shared_across_its_files():
    policy = _policy(touchpoints=[{"path": "docs/models/*.md", "max_added": 4, "max_removed": 0}])
    result = _check(
        _file("docs/models/a.md", added_lines=(1, 2, 3)),
        _file("docs/models/b.md", added_lines=(7, 8)),
        policy=policy,
    )
    finding = _only_finding(result)
    assert (finding.path, finding.line) == ("docs/models/b.md", 8)


def test_touchpoint_without_patch_fails_but_owned_without_patch_is_a_notice():
    result = _check(
        _file("vllm/model_executor/models/registry.py", has_patch=False),
        _file("vllm/models/kimi_k3/big_table.py", has_patch=False),
    )
    assert result.status is Status.failed
    touch, owned = result.findings
    assert touch.severity is Severity.error and "cannot be verified" in touch.message
    assert owned.severity is Severity.notice and owned.path == "vllm/models/kimi_k3/big_table.py"
    assert "1 offending. 1 notice." in result.summary


@pytest.mark.parametrize(
    "path",
    [
        "vllm/models/kimi_k3/../../../etc/passwd",
        "/vllm/models/kimi_k3/x.py",
        "vllm\\models\\kimi_k3\\x.py",
        "vllm/models/kimi_k3/x\u202e.py",
        "vllm/models/kimi_k3/x\x07.py",
        "vllm/models/kimi_k3/.git/hooks/post-checkout",
    ],
)
def test_hostile_paths_fail_even_when_the_glob_would_match(path):
    finding = _only_finding(_check(_file(path, FileStatus.added, added_lines=(1,))))
    assert finding.message.startswith("hostile path")
    assert finding.path == path


def test_hostile_old_path_of_a_rename_fails():
    finding = _only_finding(
        _check(_file("vllm/models/kimi_k3/a.py", FileStatus.renamed, old_path="vllm/models/kimi_k3/../../setup.py"))
    )
    assert "hostile path 'vllm/models/kimi_k3/../../setup.py'" in finding.message


def test_rename_from_outside_into_owned_fails_because_it_deletes_the_old_file():
    finding = _only_finding(
        _check(_file("vllm/models/kimi_k3/sampler.py", FileStatus.renamed, old_path="vllm/v1/sample/sampler.py"))
    )
    assert "renamed from vllm/v1/sample/sampler.py" in finding.message
    assert finding.path == "vllm/models/kimi_k3/sampler.py"


def test_copy_from_outside_into_owned_is_allowed():
    result = _check(_file("vllm/models/kimi_k3/sampler.py", FileStatus.copied, old_path="vllm/v1/sample/sampler.py"))
    assert result.status is Status.passed


def test_rename_inside_owned_passes_and_rename_out_of_owned_fails():
    inside = _file("vllm/models/kimi_k3/b.py", FileStatus.renamed, old_path="vllm/models/kimi_k3/a.py")
    assert _check(inside).status is Status.passed
    out = _file("vllm/attention/a.py", FileStatus.renamed, old_path="vllm/models/kimi_k3/a.py")
    assert "outside the owned paths" in _only_finding(_check(out)).message


def _symlink(path: str, target: str | None) -> FileChange:
    return FileChange(path=path, status=FileStatus.added, new_mode="120000", symlink_target=target, added_lines=(1,))


@pytest.mark.parametrize(
    "target, reason",
    [
        ("../../attention/backend.py", "outside the owned paths"),
        ("../../../../../etc/passwd", "outside the repository"),
        ("/etc/passwd", "absolute target"),
        (None, "unknown target"),
        ("nvidia\\decode.py", "backslash"),
    ],
)
def test_symlinks_that_leave_the_owned_paths_or_are_unknown_fail(target, reason):
    finding = _only_finding(_check(_symlink("vllm/models/kimi_k3/link.py", target)))
    assert reason in finding.message


def test_symlink_inside_owned_paths_passes():
    assert _check(_symlink("vllm/models/kimi_k3/link.py", "./nvidia/../common/impl.py")).status is Status.passed


def test_symlinks_can_be_disallowed_and_never_count_in_touchpoints():
    policy = _policy(checks={"confinement": {"allow_symlinks": False}})
    assert "symlink" in _only_finding(_check(_symlink("vllm/models/kimi_k3/l.py", "a.py"), policy=policy)).message
    touch = _symlink(TOUCHPOINT["path"], "vllm/models/kimi_k3/a.py")
    assert "symlink in touchpoint" in _only_finding(_check(touch)).message


def test_removed_symlink_in_owned_needs_no_target():
    removed = FileChange(path="vllm/models/kimi_k3/l.py", status=FileStatus.removed, old_mode="120000")
    assert _check(removed).status is Status.passed


def test_submodule_fails_unless_allowed_and_owned():
    bump = _file("vllm/models/kimi_k3/third_party/cutlass", old_mode="160000", new_mode="160000", has_patch=False)
    assert "submodule" in _only_finding(_check(bump)).message
    allowed = _policy(checks={"confinement": {"allow_submodules": True}})
    assert _check(bump, policy=allowed).findings == ()
    outside = _file("third_party/cutlass", old_mode="160000", new_mode="160000", has_patch=False)
    assert "outside the owned paths" in _only_finding(_check(outside, policy=allowed)).message


def test_binary_fails_unless_allowed():
    blob = _file("vllm/models/kimi_k3/table.bin", FileStatus.added, binary=True, has_patch=False)
    assert "binary file" in _only_finding(_check(blob)).message
    allowed = _policy(checks={"confinement": {"allow_binary": True}})
    assert _check(blob, policy=allowed).findings == ()
    in_touchpoint = _file(TOUCHPOINT["path"], binary=True, has_patch=False)
    assert "binary file in touchpoint" in _only_finding(_check(in_touchpoint, policy=allowed)).message


def test_mode_changes_follow_the_setting():
    chmod = _file("vllm/models/kimi_k3/run.sh", old_mode="100644", new_mode="100755")
    assert _check(chmod).status is Status.passed
    strict = _policy(checks={"confinement": {"allow_mode_changes": False}})
    assert "mode change 100644 -> 100755" in _only_finding(_check(chmod, policy=strict)).message


def test_several_problems_of_one_file_make_one_finding():
    blob = _file("vllm/models/kimi_k3/x.bin", FileStatus.renamed, old_path="vllm/x.bin", binary=True, has_patch=False)
    finding = _only_finding(_check(blob))
    assert "renamed from vllm/x.bin" in finding.message and "binary file" in finding.message


def test_more_files_than_max_files_fails_closed():
    policy = _policy(max_files=2)
    files = [_file(f"vllm/models/kimi_k3/f{i}.py") for i in range(3)]
    result = _check(*files, policy=policy)
    finding = _only_finding(result)
    assert finding.path is None
    assert result.summary.startswith("3 files changed, more than the policy's max_files (2): failing closed")


def _git(repo, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "T",
           "GIT_COMMITTER_EMAIL": "t@example.com", "PATH": "/usr/bin:/bin", "HOME": str(repo)}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def test_hostile_cases_from_a_real_git_repository(tmp_path):
    repo = tmp_path / "repo"
    owned = repo / "vllm" / "models" / "kimi_k3"
    owned.mkdir(parents=True)
    (repo / "vllm" / "sampler.py").write_text("def sample():\n    pass\n")
    (owned / "run.sh").write_text("echo hi\n")
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")

    _git(repo, "mv", "vllm/sampler.py", "vllm/models/kimi_k3/sampler.py")          # deletes a file outside
    os.symlink("../../sampler_outside.py", owned / "escape.py")                     # points outside
    os.symlink("sampler.py", owned / "alias.py")                                    # stays inside
    (owned / "weights.bin").write_bytes(bytes(range(256)))                          # binary
    (owned / "run.sh").chmod(0o755)                                                 # mode change (allowed)
    _git(repo, "add", ".")
    head = _git(repo, "rev-parse", "HEAD").strip()  # a gitlink with no work tree behind it: a submodule bump
    _git(repo, "update-index", "--add", "--cacheinfo", f"160000,{head},vllm/models/kimi_k3/cutlass")
    _git(repo, "commit", "-q", "-m", "change")

    changes = changes_from_git(repo, "HEAD~1")
    result = run(CheckContext(_policy(touchpoints=[]), changes, Provenance(), Mode.strict))
    messages = {f.path: f.message for f in result.findings}
    assert "renamed from vllm/sampler.py" in messages["vllm/models/kimi_k3/sampler.py"]
    assert "resolves to vllm/sampler_outside.py, outside the owned paths" in messages["vllm/models/kimi_k3/escape.py"]
    assert "binary file" in messages["vllm/models/kimi_k3/weights.bin"]
    assert "submodule change" in messages["vllm/models/kimi_k3/cutlass"]
    assert "vllm/models/kimi_k3/alias.py" not in messages
    assert "vllm/models/kimi_k3/run.sh" not in messages
    assert result.status is Status.failed
    assert result.summary == "6 files changed: 6 in owned paths, 0 in touchpoints, 0 outside, 0 hostile; 4 offending."
