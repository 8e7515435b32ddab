from __future__ import annotations

import pytest

from gatekeeper.changes import FileStatus
from gatekeeper.errors import InputError
from gatekeeper.changes import FileChange
from gatekeeper.git import Git
from gatekeeper.sources.git import GitSnapshot, _complete_from_raw, _parse_raw, changes_from_git


def _error(*args) -> InputError:
    with pytest.raises(InputError) as info:
        changes_from_git(*args)
    return info.value


def test_not_a_directory_and_not_a_repository(tmp_path):
    assert "not a directory" in _error(tmp_path / "missing", "HEAD").reason
    error = _error(tmp_path, "HEAD")
    assert error.source == str(tmp_path) and "not a git repository" in error.reason


def test_bad_refs_are_named(repo):
    repo.write("a", "a\n")
    repo.commit("one")
    assert "'nope' does not name a commit" in _error(repo.root, "nope").reason
    assert "'HEAD~5' does not name a commit" in _error(repo.root, "HEAD", "HEAD~5").reason
    assert "bad git ref '--output=/tmp/x'" in _error(repo.root, "--output=/tmp/x").reason
    tree = repo.git("rev-parse", "HEAD^{tree}").strip()
    assert "does not name a commit" in _error(repo.root, tree).reason


def test_unrelated_histories_have_no_merge_base(repo):
    repo.write("a", "a\n")
    repo.commit("one")
    repo.git("checkout", "-q", "--orphan", "other")
    repo.write("b", "b\n")
    repo.commit("two")
    assert "main and other share no history (no merge base)" in _error(repo.root, "main", "other").reason


def test_range_is_read_like_a_pull_request_from_the_merge_base(repo):
    repo.write("shared.txt", "1\n")
    base = repo.commit("base")
    repo.git("checkout", "-q", "-b", "feature")
    repo.write("feature.txt", "f\n")
    repo.commit("feature work")
    repo.git("checkout", "-q", "main")
    repo.write("main_only.txt", "m\n")  # moved on after the branch: not part of the PR
    repo.commit("main moves on")
    changes = changes_from_git(repo.root, "main", "feature")
    assert [f.path for f in changes.files] == ["feature.txt"]
    assert changes.base_sha == base
    assert [c.message for c in changes.commits] == ["feature work"]


def test_user_config_cannot_change_what_is_parsed(repo):
    repo.write("a.txt", "1\n2\n3\n")
    repo.submodule("sub", "1" * 40)
    base = repo.commit("base")
    repo.write("a.txt", "1\nTWO\n3\n")
    repo.submodule("sub", "2" * 40)
    repo.commit("edit")
    for key, value in [("diff.ignoreSubmodules", "all"), ("submodule.sub.ignore", "all"),("diff.noprefix", "true"), ("diff.mnemonicPrefix", "true"), ("color.ui", "always"),
                       ("diff.external", "false"), ("diff.submodule", "log"), ("diff.relative", "true"),
                       ("core.quotePath", "false"), ("log.showSignature", "true")]:
        repo.git("config", key, value)
    change, sub = changes_from_git(repo.root, base).files
    assert (change.path, change.added_lines, change.removed_lines) == ("a.txt", (2,), (2,))
    assert sub.path == "sub" and sub.is_submodule  # a submodule bump cannot be configured out of sight


def test_empty_range_and_commit_messages_kept_whole(repo):
    repo.write("a", "a\n")
    base = repo.commit("base")
    assert changes_from_git(repo.root, base).files == ()
    repo.commit("empty commit\n\nbody line with é\n\nAssisted-by: Kimi K3\nCo-authored-by: Claude <noreply@anthropic.com>")
    changes = changes_from_git(repo.root, base)
    assert changes.files == ()
    assert changes.commits[0].message == (
        "empty commit\n\nbody line with é\n\nAssisted-by: Kimi K3\nCo-authored-by: Claude <noreply@anthropic.com>")


def test_run_from_a_subdirectory_still_reads_repository_paths(repo):
    repo.write("pkg/sub/a.py", "x\n")
    base = repo.commit("base")
    repo.write("pkg/sub/a.py", "y\n")
    repo.write("top.py", "t\n")
    repo.commit("edit")
    changes = changes_from_git(repo.root / "pkg" / "sub", base)
    assert sorted(f.path for f in changes.files) == ["pkg/sub/a.py", "top.py"]


def test_snapshot_reads_the_commit_not_the_work_tree(repo):
    repo.write("a.txt", "committed\n")
    repo.write("bin.dat", b"\x00\x01")
    repo.symlink("link", "a.txt")
    repo.submodule("vendor/lib", "4" * 40)
    repo.write("dir/inner.txt", "i\n")
    repo.write("latin1.txt", "caf\u00e9\n".encode("latin-1"))
    repo.commit("base")
    repo.write("a.txt", "uncommitted\n")
    snapshot = GitSnapshot(repo.root, "HEAD")
    assert snapshot.read("a.txt") == "committed\n"
    assert snapshot.read("link") == "a.txt"  # a symlink's blob text is its target
    assert snapshot.read("bin.dat") is None
    assert snapshot.read("latin1.txt") is None  # not UTF-8: not text the checks can read
    assert snapshot.read("missing.txt") is None
    assert snapshot.read("dir") is None  # a tree, not a file
    assert snapshot.read("vendor/lib") is None  # a gitlink, not a file
    assert list(snapshot.paths()) == ["a.txt", "bin.dat", "dir/inner.txt", "latin1.txt", "link", "vendor/lib"]
    assert snapshot.paths() is snapshot.paths()  # listed once
    with pytest.raises(InputError, match="does not name a commit"):
        GitSnapshot(repo.root, "no-such-branch")


def test_removed_symlink_has_no_target(repo):
    repo.symlink("link", "target")
    base = repo.commit("base")
    repo.remove("link")
    repo.commit("drop link")
    (change,) = changes_from_git(repo.root, base).files
    assert (change.status, change.old_mode, change.new_mode, change.symlink_target) == (
        FileStatus.removed, "120000", None, None)
    assert change.is_symlink


def test_patch_text_and_raw_listing_must_agree(repo):
    """The cross-check that guarantees no file goes missing between git's two outputs."""
    repo.write("a", "a\n")
    repo.commit("one")
    git = Git.open(repo.root)
    raw = _parse_raw(":100644 100644 " + "1" * 40 + " " + "2" * 40 + " M\0a\0", git.source)
    seen = FileChange(path="a", status=FileStatus.modified, old_mode="100644", new_mode="100644")
    assert _complete_from_raw([seen], raw, git) == [seen]
    with pytest.raises(InputError, match=r"disagree about \['a', 'b'\]"):
        _complete_from_raw([seen.model_copy(update={"path": "b"})], raw, git)
    with pytest.raises(InputError, match="disagree about duplicate entries"):
        _complete_from_raw([seen, seen], raw, git)
    with pytest.raises(InputError, match="the patch says mode 100755, git says 100644"):
        _complete_from_raw([seen.model_copy(update={"new_mode": "100755"})], raw, git)
    with pytest.raises(InputError, match="unexpected `git diff --raw` record"):
        _parse_raw(":100644 100644 x y Q\0a\0", git.source)
