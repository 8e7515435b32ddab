from __future__ import annotations

import json

import pytest

from gatekeeper.changes import FileStatus
from gatekeeper.errors import InputError
from gatekeeper.paths import path_problem
from gatekeeper.sources.github import (
    changes_from_pr_file_entries,
    changes_from_pr_files,
    pull_request_from_json,
)

HEAD = "6dcb09b5b57875f334f61aebed695e2e4193db5e"


def entry(filename="src/a.py", status="modified", patch="@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three", **extra):
    """A diff-entry exactly as GitHub's schema spells it (all required fields present)."""
    added = sum(1 for line in (patch or "").split("\n") if line.startswith("+"))
    removed = sum(1 for line in (patch or "").split("\n") if line.startswith("-"))
    data = {
        "sha": "bbcd538c8e72b8c175046e27cc8f907076331401",
        "filename": filename,
        "status": status,
        "additions": added,
        "deletions": removed,
        "changes": added + removed,
        "blob_url": f"https://github.com/octocat/Hello-World/blob/{HEAD}/{filename}",
        "raw_url": f"https://github.com/octocat/Hello-World/raw/{HEAD}/{filename}",
        "contents_url": f"https://api.github.com/repos/octocat/Hello-World/contents/{filename}?ref={HEAD}",
    }
    if patch is not None:
        data["patch"] = patch
    data.update(extra)
    return data


COMMIT = {
    "url": f"https://api.github.com/repos/octocat/Hello-World/commits/{HEAD}",
    "sha": HEAD,
    "node_id": "MDY6Q29tbWl0NmRjYjA5YjViNTc4NzVmMzM0ZjYxYWViZWQ2OTVlMmU0MTkzZGI1ZQ==",
    "html_url": f"https://github.com/octocat/Hello-World/commit/{HEAD}",
    "comments_url": f"https://api.github.com/repos/octocat/Hello-World/commits/{HEAD}/comments",
    "commit": {
        "url": f"https://api.github.com/repos/octocat/Hello-World/git/commits/{HEAD}",
        "author": {"name": "Monalisa Octocat", "email": "support@github.com", "date": "2011-04-14T16:00:49Z"},
        "committer": {"name": "Monalisa Octocat", "email": "support@github.com", "date": "2011-04-14T16:00:49Z"},
        "message": "Fix all the bugs\n\nAssisted-by: Claude",
        "tree": {"url": "https://api.github.com/repos/octocat/Hello-World/tree/6dcb09b", "sha": "6dcb09b"},
        "comment_count": 0,
        "verification": {"verified": False, "reason": "unsigned", "signature": None, "payload": None},
    },
    "author": {"login": "octocat", "id": 1, "type": "User", "site_admin": False},
    "committer": {"login": "octocat", "id": 1, "type": "User", "site_admin": False},
    "parents": [{"url": "https://api.github.com/repos/octocat/Hello-World/commits/6dcb09b", "sha": "6dcb09b"}],
}

PULL = {
    "url": "https://api.github.com/repos/octocat/Hello-World/pulls/1347",
    "number": 1347,
    "state": "open",
    "title": "Amazing new feature",
    "body": "Please pull these awesome changes in!\n\n## Agent assistance\nClaude wrote the kernels.",
    "user": {"login": "octocat", "id": 1, "type": "User"},
    "labels": [{"id": 208045946, "name": "bug", "color": "f29513", "default": True},
               {"id": 208045947, "name": "agent-assisted", "color": "a2eeef", "default": False}],
    "head": {"label": "octocat:new-topic", "ref": "new-topic", "sha": HEAD},
    "base": {"label": "octocat:master", "ref": "master", "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5f"},
    "draft": False,
}


def _load(entries, commits=None):
    return changes_from_pr_files(json.dumps(entries), "pr-files.json",
                                 None if commits is None else json.dumps(commits), "commits.json")


def _error(entries_text: str) -> InputError:
    with pytest.raises(InputError) as info:
        changes_from_pr_files(entries_text, "pr-files.json")
    return info.value


def test_modified_entry_and_commit():
    changes = _load([entry()], [COMMIT])
    (change,) = changes.files
    assert changes.source == "github"
    assert (change.path, change.status, change.added_lines, change.removed_lines) == ("src/a.py", FileStatus.modified, (2,), (2,))
    assert change.has_patch and change.old_mode is None and change.new_mode is None
    (commit,) = changes.commits
    assert commit.sha == HEAD and commit.message.endswith("Assisted-by: Claude")
    assert (commit.author_name, commit.author_email, commit.author_login) == ("Monalisa Octocat", "support@github.com", "octocat")


def test_commit_without_github_account():
    changes = _load([], [dict(COMMIT, author=None)])
    assert changes.commits[0].author_login is None


@pytest.mark.parametrize(
    ("status", "expected"),
    [("added", FileStatus.added), ("removed", FileStatus.removed), ("modified", FileStatus.modified),
     ("changed", FileStatus.modified), ("unchanged", FileStatus.modified)],
)
def test_status_mapping_keeps_every_entry(status, expected):
    (change,) = _load([entry(status=status, patch=None)]).files
    assert change.status == expected and change.has_patch is False


def test_rename_and_copy_keep_the_old_path():
    renamed, copied = _load([
        entry("new/place.py", "renamed", None, previous_filename="outside/owned.py"),
        entry("copy.py", "copied", None, previous_filename="orig.py"),
    ]).files
    assert (renamed.status, renamed.old_path, renamed.paths) == (FileStatus.renamed, "outside/owned.py",
                                                                 ("outside/owned.py", "new/place.py"))
    assert (copied.status, copied.old_path) == (FileStatus.copied, "orig.py")


def test_no_newline_marker_and_added_file_lines():
    patch = "@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file"
    (change,) = _load([entry("n.py", "added", patch)]).files
    assert change.added_lines == (1, 2) and change.removed_lines == ()


def test_more_than_3000_files_are_all_returned():
    entries = [entry(f"f{i}.py") for i in range(3001)]
    changes = _load(entries)
    assert len(changes.files) == 3001 and changes.files[-1].path == "f3000.py"


def test_decoded_entries_give_the_same_changes():
    assert changes_from_pr_file_entries([entry()], [COMMIT]) == _load([entry()], [COMMIT])
    with pytest.raises(InputError, match="expected a list, got dict"):
        changes_from_pr_file_entries({"files": []})
    with pytest.raises(InputError, match=r"\[0\]\.status: Field required"):
        changes_from_pr_file_entries([{"filename": "a", "additions": 0, "deletions": 0, "changes": 0}])


def test_githubs_own_schema_example_is_rejected_because_its_counts_disagree():
    # The example in GitHub's REST description is illustrative, not a real diff: additions 103, a stub patch.
    example = entry("file1.txt", "added", "@@ -132,7 +132,7 @@ module Test @@ -1000,7 +1000,7 @@ module Test",
                    additions=103, deletions=21, changes=124)
    error = _error(json.dumps([example]))
    assert "[0] 'file1.txt': patch line" in error.reason


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ('[{"filename": "a",\n  "status": }]', 2, "invalid JSON: Expecting value (column 13)"),
        ("", 1, "invalid JSON"),
        ('{"files": []}', 1, "expected a JSON array of diff-entry objects"),
        ("null", 1, "got null"),
    ],
)
def test_malformed_json_names_line_and_column(text, line, reason):
    error = _error(text)
    assert (error.source, error.line) == ("pr-files.json", line)
    assert reason in error.reason


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"status": "moved"}, "[1].status: Input should be 'added'"),
        ({"additions": "1"}, "[1].additions: Input should be a valid integer"),
        ({"additions": True}, "[1].additions: Input should be a valid integer"),
        ({"deletions": -1}, "[1].deletions: Input should be greater than or equal to 0"),
        ({"filename": None}, "[1].filename: Input should be a valid string"),
        ({"patch": 7}, "[1].patch: Input should be a valid string"),
        ({"changes": 9}, "[1] 'src/a.py': changes is 9, but additions + deletions is 2"),
        ({"additions": 2, "changes": 3}, "additions/deletions say 2/1, the patch shows 1/1"),
        ({"status": "renamed"}, "status 'renamed' without previous_filename"),
        ({"previous_filename": "x.py"}, "previous_filename given for status 'modified'"),
        ({"patch": "not a hunk"}, "patch line 1: a patch must start with a '@@ ' hunk header"),
        ({"patch": "@@ -1,3 +1,3 @@\n one\n-two\n+TWO"}, "patch line 4: malformed patch: Hunk is shorter"),
        ({"patch": "@@ -1,3 +1,3 @@\n one\n-two\n+TWO\n three\ntrailing junk"}, "patch line 6: line outside any hunk"),
    ],
)
def test_wrong_shapes_name_the_index_and_field(bad, reason):
    entries = [entry("ok.py"), {**entry(), **bad}]
    error = _error(json.dumps(entries))
    assert reason in error.reason
    assert error.source == "pr-files.json"


def test_missing_required_field_and_non_object_entry():
    without_status = entry()
    del without_status["status"]
    assert "[0].status: Field required" in _error(json.dumps([without_status])).reason
    assert "[0]: Input should be a valid dictionary" in _error("[3]").reason


def test_bad_commits_name_their_own_file():
    with pytest.raises(InputError) as info:
        _load([entry()], [dict(COMMIT, commit={"author": None})])
    assert info.value.source == "commits.json"
    assert "[0].commit.message: Field required" in info.value.reason


def test_pull_request_object():
    info = pull_request_from_json(json.dumps(PULL), "pull.json")
    assert info.number == 1347 and info.title == "Amazing new feature"
    assert info.labels == ("bug", "agent-assisted")
    assert "## Agent assistance" in info.body
    assert (info.author_login, info.author_type, info.head_sha, info.base_ref) == ("octocat", "User", HEAD, "master")


def test_pull_request_with_null_body_and_bad_shape():
    assert pull_request_from_json(json.dumps(dict(PULL, body=None)), "pull.json").body == ""
    with pytest.raises(InputError) as info:
        pull_request_from_json(json.dumps(dict(PULL, labels=[{"id": 1}])), "pull.json")
    assert "labels[0].name: Field required" in info.value.reason
    with pytest.raises(InputError) as info:
        pull_request_from_json("{\n\n  'single quotes'}", "pull.json")
    assert info.value.line == 3


SUBPROJECT = "@@ -1 +1 @@\n-Subproject commit " + "1" * 40 + "\n+Subproject commit " + "2" * 40


@pytest.mark.parametrize(
    ("data", "modes"),
    [
        (entry("third_party/lib", patch=SUBPROJECT), ("160000", "160000")),
        (entry("third_party/lib", patch=None, blob_url=None, raw_url=None), ("160000", "160000")),
        (entry("third_party/lib", "added", "@@ -0,0 +1 @@\n+Subproject commit " + "3" * 40), (None, "160000")),
        (entry("third_party/lib", "removed", patch=None, blob_url=None, raw_url=None), ("160000", None)),
        (entry("notes.txt", patch="@@ -1 +1,2 @@\n-Subproject commit " + "1" * 40 + "\n+a\n+b"), (None, None)),
        (entry("plain.py", patch=None), (None, None)),
        ({k: v for k, v in entry("plain.py").items() if k not in ("blob_url", "raw_url")}, (None, None)),
    ],
)
def test_submodules_are_inferred_from_what_github_sends(data, modes):
    (change,) = _load([data]).files
    assert (change.old_mode, change.new_mode) == modes
    assert change.is_submodule == ("160000" in modes)


def test_hostile_filenames_are_kept_verbatim_for_the_checks_to_judge():
    names = ["../outside.py", "/etc/passwd", "a\\b.py", "kimi_k3_path/\u202egnp.py", "x\x00y"]
    changes = _load([entry(name) for name in names] + [entry("ok.py", "renamed", None, previous_filename="../../up.py")])
    assert [f.path for f in changes.files] == names + ["ok.py"]
    assert all(path_problem(p) for p in names) and path_problem(changes.files[-1].old_path)
