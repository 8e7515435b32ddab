"""The App end to end: signed octokit payloads into the App under uvicorn, GitHub played by the fake."""

from __future__ import annotations

import copy

from app_harness import AGENT_COMMIT, REPO, both_stores, comment_event, file_entry, setup_repo
from fake_github import FakeCommit, FakePull, webhook_example

HEAD_FIXED = "1" * 40
HEAD_BROKEN_AGAIN = "2" * 40


def _pull_event(name: str, head: str | None = None) -> dict:
    event = webhook_example(name)
    if head is not None:
        event["pull_request"]["head"]["sha"] = head
        event["after"] = head
    return event


@both_stores
def test_failure_fix_redelivery_override(fake, start_app):
    opened = _pull_event("pull_request.opened")
    base, head = opened["pull_request"]["base"]["sha"], opened["pull_request"]["head"]["sha"]
    repo = fake.repos[REPO]
    setup_repo(repo, base)
    repo.permissions.update({"maintainer": "write", "drive-by": "read"})
    outside = file_entry("vllm/engine/core.py", added=4)
    repo.pulls[2] = FakePull(2, head, base, [file_entry("kimi_k3_path/ops.py"), outside],
                             [FakeCommit(head, AGENT_COMMIT)])
    app = start_app()

    # 1. A PR that edits a file outside the owned paths fails, with an annotation on that file.
    assert app.send("pull_request", opened, delivery="d-opened").status_code == 202
    assert app.wait_done("d-opened")["status"] == "done"
    [run] = fake.check_runs(REPO, head)
    assert run["name"] == "gatekeeper / kimi-k3"
    assert (run["status"], run["conclusion"]) == ("completed", "failure")
    assert run["output"]["title"] == "Failed: confinement"
    assert "confinement" in run["output"]["summary"] and "vllm/engine/core.py" in run["output"]["summary"]
    assert [(a["path"], a["annotation_level"], a["start_line"]) for a in run["annotations"]] == [
        ("vllm/engine/core.py", "failure", 1)]
    assert run["actions"][0]["identifier"] == "rerun"

    # 2. The fixing push: a new head, a new check run, success.
    repo.pulls[2] = FakePull(2, HEAD_FIXED, base, [file_entry("kimi_k3_path/ops.py")],
                             [FakeCommit(HEAD_FIXED, AGENT_COMMIT)])
    sync = _pull_event("pull_request.synchronize", HEAD_FIXED)
    assert app.send("pull_request", sync, delivery="d-sync").status_code == 202
    app.wait_done("d-sync")
    [fixed] = fake.check_runs(REPO, HEAD_FIXED)
    assert fixed["conclusion"] == "success" and fixed["annotations"] == []

    # 3. Redelivery: the same X-GitHub-Delivery is acknowledged and does nothing; a new delivery of the
    #    same content is processed but judged a duplicate (same head, policy and inputs).
    patches = len(fake.check_run_patches)
    again = app.send("pull_request", sync, delivery="d-sync")
    assert again.status_code == 200 and again.json() == {"duplicate": "d-sync"}
    assert app.send("pull_request", sync, delivery="d-sync-copy").status_code == 202
    assert app.wait_done("d-sync-copy")["outcome"] == "duplicate: already evaluated"
    assert len(fake.check_run_patches) == patches
    assert len(fake.check_runs(REPO)) == 2

    # 4. Broken again, then overridden by a user with write permission for this head: success, with the
    #    reason shown.
    repo.pulls[2] = FakePull(2, HEAD_BROKEN_AGAIN, base, [file_entry("kimi_k3_path/ops.py"), outside],
                             [FakeCommit(HEAD_BROKEN_AGAIN, AGENT_COMMIT)])
    app.send("pull_request", _pull_event("pull_request.synchronize", HEAD_BROKEN_AGAIN), delivery="d-break")
    app.wait_done("d-break")
    [broken] = fake.check_runs(REPO, HEAD_BROKEN_AGAIN)
    assert broken["conclusion"] == "failure"

    app.send("issue_comment", comment_event(f"/gatekeeper override {HEAD_BROKEN_AGAIN[:7]} not mine", "drive-by"),
             delivery="d-refused")
    assert app.wait_done("d-refused")["outcome"].startswith("refused override by @drive-by")
    assert fake.check_runs(REPO, HEAD_BROKEN_AGAIN)[0]["conclusion"] == "failure"

    comment = f"Looks fine to me.\n/gatekeeper override {HEAD_BROKEN_AGAIN[:10]} the engine hook is reviewed upstream"
    app.send("issue_comment", comment_event(comment, "maintainer"), delivery="d-override")
    app.wait_done("d-override")
    [overridden] = fake.check_runs(REPO, HEAD_BROKEN_AGAIN)
    assert overridden["id"] == broken["id"]  # the same check run, updated: never a second one for a head
    assert overridden["conclusion"] == "success"
    assert overridden["output"]["title"] == "Overridden by @maintainer (was failure)"
    assert "the engine hook is reviewed upstream" in overridden["output"]["summary"]

    records = app.records()
    kinds = [(e["kind"], e["conclusion"], e["actor"]) for e in records.audit_log(repo=REPO)]
    assert kinds == [
        ("decision", "failure", None), ("decision", "success", None), ("decision", "failure", None),
        ("override_refused", None, "drive-by"), ("override", None, "maintainer"), ("decision", "success", None),
    ]
    assert all(e["policy_sha256"] for e in records.audit_log(repo=REPO) if e["kind"] == "decision")


def test_policy_comes_from_the_base_branch(fake, start_app):
    """A PR that rewrites the policy to own everything is still judged by the base branch's policy."""
    opened = _pull_event("pull_request.opened")
    base, head = opened["pull_request"]["base"]["sha"], opened["pull_request"]["head"]["sha"]
    repo = fake.repos[REPO]
    setup_repo(repo, base)
    permissive = "version: 1\nname: kimi-k3\nowned_paths: ['**']\n"
    repo.trees[head] = {".github/gatekeeper.yml": permissive}
    repo.pulls[2] = FakePull(2, head, base, [file_entry(".github/gatekeeper.yml"), file_entry("setup.py")],
                             [FakeCommit(head, AGENT_COMMIT)])
    app = start_app()
    app.send("pull_request", opened, delivery="d1")
    app.wait_done("d1")
    [run] = fake.check_runs(REPO, head)
    assert run["conclusion"] == "failure"
    assert sorted(a["path"] for a in run["annotations"]) == [".github/gatekeeper.yml", "setup.py"]


def test_missing_policy_fails_with_the_reason(fake, start_app):
    opened = _pull_event("pull_request.opened")
    head, base = opened["pull_request"]["head"]["sha"], opened["pull_request"]["base"]["sha"]
    fake.repos[REPO].pulls[2] = FakePull(2, head, base, [file_entry("x.py")])
    app = start_app()
    app.send("pull_request", opened, delivery="d1")
    app.wait_done("d1")
    [run] = fake.check_runs(REPO, head)
    assert run["conclusion"] == "failure"
    assert ".github/gatekeeper.yml" in run["output"]["summary"]


def test_invalid_policy_fails_with_file_and_line(fake, start_app):
    opened = _pull_event("pull_request.opened")
    head, base = opened["pull_request"]["head"]["sha"], opened["pull_request"]["base"]["sha"]
    repo = fake.repos[REPO]
    setup_repo(repo, base, policy="version: 1\nname: kimi-k3\nowned_paths: []\n")
    repo.pulls[2] = FakePull(2, head, base, [file_entry("x.py")])
    app = start_app()
    app.send("pull_request", opened, delivery="d1")
    app.wait_done("d1")
    [run] = fake.check_runs(REPO, head)
    assert run["conclusion"] == "failure"
    assert f"{REPO}@{base}:.github/gatekeeper.yml:3" in run["output"]["summary"]


def test_labels_change_the_inputs_so_a_labeled_event_is_judged_again(fake, start_app):
    opened = _pull_event("pull_request.opened")
    head, base = opened["pull_request"]["head"]["sha"], opened["pull_request"]["base"]["sha"]
    repo = fake.repos[REPO]
    setup_repo(repo, base)
    repo.pulls[2] = FakePull(2, head, base, [file_entry("kimi_k3_path/ops.py")])
    app = start_app()
    app.send("pull_request", opened, delivery="d1")
    app.wait_done("d1")
    repo.pulls[2].labels = ["agent-assisted"]
    labeled = copy.deepcopy(webhook_example("pull_request.labeled"))
    app.send("pull_request", labeled, delivery="d2")
    assert not app.wait_done("d2")["outcome"].startswith("duplicate")
    assert len(fake.check_runs(REPO, head)) == 1
    decisions = [e for e in app.records().audit_log() if e["kind"] == "decision"]
    assert len(decisions) == 2


@both_stores
def test_workers_in_a_child_process_as_gatekeeper_serve_runs_them(fake, start_app):
    opened = _pull_event("pull_request.opened")
    head, base = opened["pull_request"]["head"]["sha"], opened["pull_request"]["base"]["sha"]
    repo = fake.repos[REPO]
    setup_repo(repo, base)
    repo.pulls[2] = FakePull(2, head, base, [file_entry("kimi_k3_path/ops.py")], [FakeCommit(head, AGENT_COMMIT)])
    app = start_app(workers="process")
    assert app.wait_healthy()["workers"] == app.config.workers
    app.send("pull_request", opened, delivery="d1")
    assert app.wait_done("d1", timeout=30)["outcome"].startswith("success")
    assert fake.check_runs(REPO, head)[0]["conclusion"] == "success"
