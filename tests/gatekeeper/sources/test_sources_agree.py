"""The same change read from a git range, from `git diff` text and from GitHub's PR files gives the same
ChangeSet, up to what GitHub cannot show."""

from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gatekeeper.changes import ChangeSet, FileChange, FileStatus
from gatekeeper.sources.diff import changes_from_diff
from gatekeeper.sources.git import changes_from_git, tree_entries
from gatekeeper.sources.github import changes_from_pr_files, with_tree_facts

BASE_LINES = "".join(f"line {i}\n" for i in range(1, 21))


def github_view(change: FileChange) -> FileChange:
    """What GitHub's PR files can show: no modes (but submodules can be inferred), no symlink target, no
    binary flag, and a patch only when there are changed lines."""
    return change.model_copy(update={
        "old_mode": change.old_mode if change.is_submodule else None,
        "new_mode": change.new_mode if change.is_submodule else None,
        "symlink_target": None, "binary": False,
        "has_patch": bool(change.added_lines or change.removed_lines),
    })


def diff_view(change: FileChange) -> FileChange:
    """What `git diff` text shows: a pure rename or copy prints no mode (so no symlink facts either)."""
    if change.status in (FileStatus.renamed, FileStatus.copied) and not (change.added_lines or change.removed_lines):
        return change.model_copy(update={"old_mode": None, "new_mode": None, "symlink_target": None})
    return change


def _edit(text: str, line_no: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[line_no - 1] = new
    return "".join(lines)


def _build_scenario(repo):
    repo.write("src/edit.py", BASE_LINES)
    repo.write("src/delete_me.py", "a\nb\nc\n")
    repo.write("src/rename_me.py", BASE_LINES.replace("line", "rename"))
    repo.write("src/pure_rename.txt", "p1\np2\np3\n")
    repo.write("src/copy_source.py", BASE_LINES.replace("line", "copy"))
    repo.symlink("link_retarget", "src/edit.py")
    repo.symlink("pure_link", "../outside")
    repo.write("assets/logo.bin", b"\x89PNG\x00\x01\x02")
    repo.write("tools/run.sh", "#!/bin/sh\necho hi\n")
    repo.write("docs/with space.md", "# title\nbody\n")
    repo.write("docs/tést.md", "é\n")
    repo.write("no_eol.txt", "a\nb")
    repo.write("crlf.txt", "a\r\nb\r\nc\r\n")
    repo.submodule("sub", "1" * 40)
    base = repo.commit("base")
    repo.git("checkout", "-q", "-b", "feature")

    repo.write("src/edit.py", _edit(_edit(BASE_LINES, 2, "changed 2\n"), 15, "changed 15\n"))
    repo.write("src/new.py", "x = 1\ny = 2\nz = 3\n")
    repo.write("src/__init__.py", "")
    repo.remove("src/delete_me.py")
    repo.move("src/rename_me.py", "src/renamed.py")
    repo.write("src/renamed.py", _edit(BASE_LINES.replace("line", "rename"), 5, "renamed 5\n"))
    repo.move("src/pure_rename.txt", "moved/pure_renamed.txt")
    repo.write("src/copy_dest.py", BASE_LINES.replace("line", "copy"))
    repo.write("src/copy_source.py", _edit(BASE_LINES.replace("line", "copy"), 1, "first\n"))
    repo.commit("first half\n\nAssisted-by: Claude")

    repo.symlink("escape", "../../etc/passwd")
    repo.symlink("link_retarget", "docs/with space.md")
    repo.move("pure_link", "moved/pure_link")
    repo.write("assets/logo.bin", b"\x89PNG\x00\x01\x03")
    repo.write("assets/new.bin", b"\x00\xff" * 10)
    repo.write("tools/run.sh", "#!/bin/sh\necho hi\n", executable=True)
    repo.write("docs/with space.md", "# title\nbody, edited\n")
    repo.write("docs/tést.md", "é\nü\n")
    repo.write('weird\ttab"quote.txt', "w\n")
    repo.write("new\nline\u202e.txt", "n\n")  # git C-quotes the newline and octal-escapes the bidi bytes
    repo.write("no_eol.txt", "a\nc")
    repo.write("crlf.txt", "a\r\nB\r\nc\r\n")
    repo.submodule("sub", "2" * 40)
    repo.submodule("vendor/lib", "3" * 40)
    repo.commit("second half\n\nCo-authored-by: Copilot <copilot@github.com>")
    return base


def _by_path(changes: ChangeSet) -> dict[str, FileChange]:
    assert len(changes.by_path()) == len(changes.files), "no path may appear twice in this scenario"
    return changes.by_path()


def test_scenario_git_range_reads_every_kind_of_change(repo):
    base = _build_scenario(repo)
    changes = changes_from_git(repo.root, base, "feature")
    got = _by_path(changes)
    m = FileStatus.modified

    def check(path, status, added=(), removed=(), old_path=None, old_mode="100644", new_mode="100644", **extra):
        expected = FileChange(path=path, old_path=old_path, status=status, added_lines=added, removed_lines=removed,
                              old_mode=old_mode, new_mode=new_mode, **extra)
        assert got.pop(path) == expected

    check("src/edit.py", m, (2, 15), (2, 15))
    check("src/new.py", FileStatus.added, (1, 2, 3), old_mode=None)
    check("src/__init__.py", FileStatus.added, old_mode=None)
    check("src/delete_me.py", FileStatus.removed, removed=(1, 2, 3), new_mode=None)
    check("src/renamed.py", FileStatus.renamed, (5,), (5,), old_path="src/rename_me.py")
    check("moved/pure_renamed.txt", FileStatus.renamed, old_path="src/pure_rename.txt")
    check("src/copy_dest.py", FileStatus.copied, old_path="src/copy_source.py")
    check("src/copy_source.py", m, (1,), (1,))
    check("escape", FileStatus.added, (1,), old_mode=None, new_mode="120000", symlink_target="../../etc/passwd")
    check("link_retarget", m, (1,), (1,), old_mode="120000", new_mode="120000", symlink_target="docs/with space.md")
    check("moved/pure_link", FileStatus.renamed, old_path="pure_link", old_mode="120000", new_mode="120000",
          symlink_target="../outside")
    check("assets/logo.bin", m, binary=True, has_patch=False)
    check("assets/new.bin", FileStatus.added, old_mode=None, binary=True, has_patch=False)
    check("tools/run.sh", m, new_mode="100755")
    check("docs/with space.md", m, (2,), (2,))
    check("docs/tést.md", m, (2,))
    check('weird\ttab"quote.txt', FileStatus.added, (1,), old_mode=None)
    check("new\nline\u202e.txt", FileStatus.added, (1,), old_mode=None)
    check("no_eol.txt", m, (2,), (2,))
    check("crlf.txt", m, (2,), (2,))
    check("sub", m, (1,), (1,), old_mode="160000", new_mode="160000")
    check("vendor/lib", FileStatus.added, (1,), old_mode=None, new_mode="160000")
    assert got == {}, f"unexpected extra files: {sorted(got)}"

    assert changes.source == "git"
    assert changes.base_sha == base
    assert changes.head_sha == repo.git("rev-parse", "feature").strip()
    assert [c.message for c in changes.commits] == [
        "first half\n\nAssisted-by: Claude", "second half\n\nCo-authored-by: Copilot <copilot@github.com>"]
    assert {(c.author_name, c.author_email) for c in changes.commits} == {("Ada Author", "ada@example.com")}


def test_scenario_three_sources_agree(repo):
    base = _build_scenario(repo)
    from_git = _by_path(changes_from_git(repo.root, base, "feature"))
    from_diff = _by_path(changes_from_diff(repo.diff_text(base, "feature"), "change.diff"))
    from_github = _by_path(changes_from_pr_files(repo.pr_files_json(base, "feature"), "pr-files.json"))

    assert {p: diff_view(c) for p, c in from_git.items()} == from_diff
    assert {p: github_view(c) for p, c in from_git.items()} == from_github
    # What the diff text cannot show, git fills in: the renamed symlink is still a symlink.
    assert from_diff["moved/pure_link"].is_symlink is False and from_git["moved/pure_link"].is_symlink


def test_github_without_patch_means_lines_unknown(repo):
    base = _build_scenario(repo)
    entries = repo.pr_files(base, "feature", omit_patch={"src/edit.py"})
    edit = next(e for e in entries if e["filename"] == "src/edit.py")
    assert "patch" not in edit and edit["additions"] == 2
    got = changes_from_pr_files(json.dumps(entries), "pr-files.json").by_path()["src/edit.py"]
    assert got.has_patch is False and got.added_lines == () and got.removed_lines == ()


def test_type_change_is_a_removal_and_an_addition_in_git_and_diff(repo):
    repo.write("thing", "content\n")
    base = repo.commit("base")
    (repo.root / "thing").unlink()
    repo.symlink("thing", "elsewhere")
    repo.commit("file becomes symlink")
    from_git = changes_from_git(repo.root, base)
    from_diff = changes_from_diff(repo.diff_text(base), "d")
    assert [(f.status, f.old_mode, f.new_mode, f.symlink_target) for f in from_git.files] == [
        (FileStatus.removed, "100644", None, None), (FileStatus.added, None, "120000", "elsewhere")]
    assert from_git.files == from_diff.files


# --- property: random small trees, random edits -------------------------------------------------------

_names = st.text(alphabet=string.ascii_lowercase + " _.-é", min_size=1, max_size=6).filter(
    lambda n: n.strip() == n and n not in (".", "..") and not n.startswith("."))
_lines = st.lists(st.sampled_from(["a", "b", "c", "", "d d", "é"]), min_size=0, max_size=12)
_trees = st.dictionaries(_names, _lines, min_size=1, max_size=5)


def _text(lines: list[str], eol: bool) -> str:
    body = "\n".join(lines)
    return body + "\n" if eol and lines else body


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base_tree=_trees, head_tree=_trees, renames=st.booleans(), eol=st.booleans(), subdir=st.booleans())
def test_git_range_and_diff_text_agree_on_random_trees(new_repo, base_tree, head_tree, renames, eol, subdir):
    repo = new_repo()
    prefix = "pkg/" if subdir else ""
    for name, lines in base_tree.items():
        repo.write(prefix + name, _text(lines, eol))
    base = repo.commit("base")
    for name in base_tree:
        if name not in head_tree:
            repo.remove(prefix + name)
    for name, lines in head_tree.items():
        repo.write(prefix + name, _text(lines, not eol))
    if renames:
        # Move an unchanged copy of a base file somewhere else: rename detection must pair them up.
        name, lines = next(iter(base_tree.items()))
        if len(lines) > 3 and (repo.root / (prefix + name)).exists():
            repo.write(prefix + name, _text(lines, eol))
            repo.move(prefix + name, "moved/" + name)
    repo.commit("head")

    from_git = changes_from_git(repo.root, base)
    from_diff = changes_from_diff(repo.diff_text(base), "d")
    from_github = changes_from_pr_files(repo.pr_files_json(base), "f")
    assert [diff_view(f) for f in from_git.files] == list(from_diff.files)
    assert sorted(map(github_view, from_git.files), key=lambda f: f.path) == sorted(from_github.files, key=lambda f: f.path)
    changed = {f.path for f in from_git.files} | {f.old_path for f in from_git.files if f.old_path}
    expected = {prefix + n for n in set(base_tree) ^ set(head_tree)} | {
        prefix + n for n in set(base_tree) & set(head_tree)
        if _text(base_tree[n], eol) != _text(head_tree[n], not eol)}
    assert expected <= changed


# --- the App: GitHub's file list plus the trees and blobs it reads ---------------------------------------

def test_github_with_tree_facts_agrees_with_git_on_every_file(repo):
    """What the App sees (PR files + head and merge-base trees + the blobs of symlinks and files without a
    patch) is what `gatekeeper check --base` sees: modes, symlink targets, binaries, no-line renames."""
    base = _build_scenario(repo)
    from_git = _by_path(changes_from_git(repo.root, base, "feature"))
    head_tree, old_tree = tree_entries(repo.root, "feature"), tree_entries(repo.root, base)
    blobs = {entry.sha: repo.git_bytes("cat-file", "blob", entry.sha)
             for entry in (*head_tree.values(), *old_tree.values()) if entry.type == "blob"}
    from_github = changes_from_pr_files(repo.pr_files_json(base, "feature"), "pr-files.json")
    with_facts = _by_path(with_tree_facts(from_github, head_tree, old_tree, blobs))
    assert with_facts == from_git
    assert with_facts["assets/new.bin"].binary and with_facts["escape"].symlink_target == "../../etc/passwd"
    assert with_facts["tools/run.sh"].mode_changed and with_facts["moved/pure_renamed.txt"].has_patch
