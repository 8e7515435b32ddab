from __future__ import annotations

import pytest

from gatekeeper.changes import FileStatus
from gatekeeper.errors import InputError
from gatekeeper.sources.diff import changes_from_diff

EDIT = """\
diff --git a/src/a.py b/src/a.py
index 1111111111111111111111111111111111111111..2222222222222222222222222222222222222222 100644
--- a/src/a.py
+++ b/src/a.py
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
@@ -10,2 +10,3 @@ def f():
 ten
+ten and a half
 eleven
"""

QUOTED = r'''diff --git "a/t\303\251st \"q\".txt" "b/t\303\251st \"q\".txt"
new file mode 100644
index 0000000..3b18e51
--- /dev/null
+++ "b/t\303\251st \"q\".txt"
@@ -0,0 +1 @@
+hello
'''


def _error(text: str) -> InputError:
    with pytest.raises(InputError) as info:
        changes_from_diff(text, "change.diff")
    assert info.value.source == "change.diff"
    return info.value


def test_edit_with_two_hunks():
    (change,) = changes_from_diff(EDIT, "change.diff").files
    assert change.status == FileStatus.modified
    assert (change.path, change.old_path) == ("src/a.py", None)
    assert change.added_lines == (2, 11) and change.removed_lines == (2,)
    assert (change.old_mode, change.new_mode, change.has_patch) == ("100644", "100644", True)


def test_quoted_path_with_utf8_octal_escapes_and_quotes():
    (change,) = changes_from_diff(QUOTED, "change.diff").files
    assert change.path == 'tést "q".txt'
    assert change.status == FileStatus.added and change.added_lines == (1,)


def test_empty_diff_is_an_empty_change():
    assert changes_from_diff("", "change.diff").files == ()
    assert changes_from_diff("\n\n", "change.diff").files == ()


def test_preamble_and_format_patch_signature_are_ignored():
    text = "From abc Mon Sep 17 00:00:00 2001\nSubject: [PATCH] x\n\n---\n src/a.py | 2 +-\n\n" + EDIT + "-- \n2.39.5\n"
    (change,) = changes_from_diff(text, "change.diff").files
    assert change.added_lines == (2, 11)


def test_mode_only_change_and_pure_rename_have_no_hunks():
    text = """\
diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
diff --git a/old name.txt b/new name.txt
similarity index 100%
rename from old name.txt
rename to new name.txt
"""
    mode, rename = changes_from_diff(text, "d").files
    assert (mode.path, mode.old_mode, mode.new_mode, mode.mode_changed) == ("run.sh", "100644", "100755", True)
    assert (rename.status, rename.old_path, rename.path) == (FileStatus.renamed, "old name.txt", "new name.txt")
    assert rename.old_mode is None and rename.new_mode is None  # the text does not say
    assert rename.paths == ("old name.txt", "new name.txt")


def test_git_binary_patch_block_is_binary_without_lines():
    text = """\
diff --git a/b.bin b/b.bin
index 87ae6b695deceaf160611414f7dcd5c7366b2e79..22f6b3b038c9c8f81e86f801c481bbf851e477fe 100644
GIT binary patch
literal 8
PcmYew%wtF_sx$%s42c4`

literal 7
OcmYew%wtF_sssQD(E^45

""" + EDIT
    binary, edit = changes_from_diff(text, "d").files
    assert (binary.path, binary.binary, binary.has_patch, binary.added_lines) == ("b.bin", True, False, ())
    assert edit.path == "src/a.py"


def test_symlink_and_submodule_are_recognised():
    text = """\
diff --git a/evil b/evil
new file mode 120000
index 0000000..1111111
--- /dev/null
+++ b/evil
@@ -0,0 +1 @@
+../../../etc/passwd
\\ No newline at end of file
diff --git a/third_party/lib b/third_party/lib
index 1111111..2222222 160000
--- a/third_party/lib
+++ b/third_party/lib
@@ -1 +1 @@
-Subproject commit 1111111111111111111111111111111111111111
+Subproject commit 2222222222222222222222222222222222222222
"""
    link, sub = changes_from_diff(text, "d").files
    assert link.is_symlink and link.symlink_target == "../../../etc/passwd"
    assert sub.is_submodule and not sub.is_symlink and sub.symlink_target is None


def test_crlf_content_lines_count_like_any_other():
    text = EDIT.replace(" one\n", " one\r\n").replace("+TWO\n", "+TWO\r\n")
    (change,) = changes_from_diff(text, "d").files
    assert change.added_lines == (2, 11)


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (EDIT[: EDIT.index(" three")], 8, "Hunk is shorter than expected"),  # truncated after line 8
        (EDIT.replace(" ten\n", " ten\n extra\n"), 14, "outside any hunk"),  # longer than its header says
        (EDIT + "garbage between files\n" + EDIT, 14, "line outside any hunk"),
        (EDIT.replace("index 1111111111111111111111111111111111111111..", "indecks 1.."), 2, "outside any hunk"),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", None, "not a git-format diff"),
        ("just some text\nthat is not a diff\n", 1, "no 'diff --git' file header"),
        (EDIT.replace("diff --git a/src/a.py b/src/a.py", "diff --git a/src/a.py b/src/b.py"), 4, "Target without source"),
        ("diff --git a/x b/y\nold mode 100644\nnew mode 100755\n", 1, "two paths"),
        ("diff --git x/a y/a\nold mode 100644\nnew mode 100755\n", 1, "'a/' and 'b/'"),
        ("diff --git a/x b/y\nrename from x\n", 1, "must come together"),
        ("diff --git a/x b/x\nold mode 100644\n", 1, "must come together"),
        ("diff --git a/x b/x\nnew file mode 100644\nnew file mode 100755\n", 1, "appears twice"),
        ("diff --git a/x b/x\nnew file mode 100644\ndeleted file mode 100644\n", 1, "both create and delete"),
        ('diff --git "a/\\q" "b/\\q"\nold mode 100644\nnew mode 100755\n', 1, "bad escape"),
        ('diff --git "a/\\377" "b/\\377"\nold mode 100644\nnew mode 100755\n', 1, "not valid UTF-8"),
        ('diff --git "a/x b/x\nold mode 100644\nnew mode 100755\n', 1, "unterminated"),
        ("diff --git a/x y b/x z\nold mode 100644\nnew mode 100755\n", 1, "cannot tell the two paths apart"),
        ('diff --git a/x "b/x"\nold mode 100644\nnew mode 100755\n', 1, "cannot tell the two paths apart"),
        ('diff --git "a/x" "b/y"\nold mode 100644\nnew mode 100755\n', 1, "two paths but the header has no rename"),
        ('diff --git "a/x y""b/x"\nold mode 100644\nnew mode 100755\n', 1, "expected a space after the first path"),
    ],
)
def test_malformed_diffs_are_errors_with_their_line(text, line, reason):
    error = _error(text)
    assert reason in error.reason
    if line is not None:
        assert error.line == line


def test_every_file_section_becomes_a_change_even_many():
    text = "".join(EDIT.replace("src/a.py", f"src/f{i}.py") for i in range(3500))
    changes = changes_from_diff(text, "d")
    assert len(changes.files) == 3500
    assert {f.path for f in changes.files} == {f"src/f{i}.py" for i in range(3500)}


def test_hostile_paths_are_kept_verbatim_for_the_checks_to_judge():
    text = EDIT.replace("src/a.py", "src/../../etc/passwd")
    (change,) = changes_from_diff(text, "d").files
    assert change.path == "src/../../etc/passwd"
