"""The App fails closed (issue 41): nothing it did not earn may let a PR merge. GitHub counts a required
check's `neutral` and `skipped` as passing, so undecided is `in_progress` then `action_required`; a verdict
once published is only added to; the verdict belongs to the head whose files were read; an override
approves one head; merge queues carry their PR's verdict; modes, binaries and symlinks count as in
`gatekeeper check --base`; evidence from a workflow the PR edits is self-reported."""

from __future__ import annotations

import io
import json
import sqlite3
import time
import zipfile

from app_harness import (
    AGENT_COMMIT,
    BASE,
    HEAD,
    INSTALLATION,
    OPENED,
    POLICY,
    REPO,
    comment_event,
    file_entry,
    judge_opened,
    setup_pull,
)
from fake_github import FakeCommit, FakePull, webhook_example

NAME = "gatekeeper / kimi-k3"
NEW_HEAD = "5" * 40
EVIDENCE_POLICY = POLICY + "checks:\n  changed_path_tests: {enabled: true}\napp:\n  evidence_wait_minutes: 30\n"


def _run(fake, head: str = HEAD) -> dict:
    [run] = [r for r in fake.check_runs(REPO, head) if r["name"] == NAME]
    return run


def _with_policy(fake, policy: str, **pull) -> None:
    repo = setup_pull(fake, **pull)
    repo.trees[BASE][".github/gatekeeper.yml"] = policy


# --- 1. undecided: in progress while CI's evidence may come, then action_required ------------------------

def test_a_check_waiting_for_evidence_stays_in_progress_then_requires_action(fake, start_app):
    _with_policy(fake, EVIDENCE_POLICY)
    app = start_app()
    before = time.time()
    judge_opened(app)
    run = _run(fake)
    assert (run["status"], run["conclusion"]) == ("in_progress", None)
    assert run["output"]["title"] == "Waiting for evidence: changed_path_tests"
    assert "gatekeeper-evidence" in run["output"]["summary"]
    deadline_id = f"deadline:{REPO}#2@{HEAD}"
    with sqlite3.connect(app.config.db_path) as db:
        [(available_at,)] = db.execute("SELECT available_at FROM deliveries WHERE id = ?", (deadline_id,))
        assert before + 1800 - 5 < available_at < time.time() + 1800 + 5
        # Half an hour passes: the head was first judged long ago, and the deadline job is due.
        db.execute("UPDATE heads SET first_seen_at = first_seen_at - 3600")
        db.execute("UPDATE deliveries SET available_at = 0 WHERE id = ?", (deadline_id,))
    assert app.wait_done(deadline_id)["outcome"].startswith("action_required: Undecided: changed_path_tests")
    run = _run(fake)
    assert (run["status"], run["conclusion"]) == ("completed", "action_required")
    assert run["details_url"] == "https://github.com/Codertocat/Hello-World/actions/workflows/gatekeeper.yml"
    assert (f"gatekeeper collect --policy .github/gatekeeper.yml --base {BASE} --repo . --out evidence.json"
            in run["output"]["summary"])


def test_no_wait_means_action_required_at_once_and_nothing_is_ever_neutral(fake, start_app):
    _with_policy(fake, EVIDENCE_POLICY.replace("evidence_wait_minutes: 30", "evidence_wait_minutes: 0"))
    app = start_app()
    judge_opened(app)
    assert _run(fake)["conclusion"] == "action_required"
    assert all(r["conclusion"] not in ("neutral", "skipped") for r in fake.check_runs(REPO))


# --- 2. a published verdict is only added to -------------------------------------------------------------

def test_a_failure_after_publishing_does_not_replace_the_verdict(fake, start_app):
    setup_pull(fake, files=[file_entry("outside.py")])
    fake.fail("POST", r"/issues/2/comments$", 403)  # the sticky comment is refused
    app = start_app(sticky_comment=True)
    row = judge_opened(app)
    assert row["status"] == "done" and "sticky comment could not be written" in row["outcome"]
    run = _run(fake)
    assert (run["conclusion"], run["output"]["title"]) == ("failure", "Failed: confinement")
    conclusions = [body.get("conclusion") for _, body in fake.check_run_patches if body.get("conclusion")]
    assert conclusions == ["failure"]
    assert [(e["kind"], e["conclusion"]) for e in app.records().audit_log()] == [("decision", "failure"), ("error", None)]


# --- 3. the verdict belongs to the head whose files were read --------------------------------------------

def test_a_push_during_the_review_never_lends_one_heads_files_to_another(fake, start_app):
    """The PR is read at a bad head; before its files are read, a push moves it to a good head. The bad head
    must never get the good head's success, not even from the cache after a force-push back."""
    repo = setup_pull(fake, files=[file_entry("outside.py")])
    good = [file_entry("kimi_k3_path/ops.py")]
    fake.move_head(REPO, 2, NEW_HEAD, after=("GET", r"/pulls/2$", 1), files=good)
    app = start_app()
    judge_opened(app)
    assert fake.check_runs(REPO, HEAD) == []  # the bad head was never judged by the good head's files
    assert _run(fake, NEW_HEAD)["conclusion"] == "success"
    # Force-push back to the bad head: judged by its own files, not "duplicate".
    repo.pulls[2] = FakePull(2, HEAD, BASE, [file_entry("outside.py")], [FakeCommit(HEAD, AGENT_COMMIT)])
    app.send("pull_request", OPENED, delivery="d-back")
    assert app.wait_done("d-back")["outcome"].startswith("failure")
    assert _run(fake, HEAD)["conclusion"] == "failure"


def test_the_same_head_with_other_files_is_judged_again(fake, start_app):
    """The files' digest is in the evaluation key: a cached verdict is never reused for another file list."""
    repo = setup_pull(fake)
    app = start_app()
    judge_opened(app)
    assert _run(fake)["conclusion"] == "success"
    repo.pulls[2].files = [file_entry("outside.py")]  # same head SHA, other files (e.g. the base moved)
    app.send("pull_request", OPENED, delivery="d-again")
    assert not app.wait_done("d-again")["outcome"].startswith("duplicate")
    assert _run(fake)["conclusion"] == "failure"


# --- 4. an override approves the head its author saw -----------------------------------------------------

def _failing_pr(fake, start_app, policy: str = POLICY, **config):
    _with_policy(fake, policy, files=[file_entry("outside.py")])
    repo = fake.repos[REPO]
    repo.permissions.update({"maintainer": "write", "dev": "write"})  # dev is the PR's author
    app = start_app(**config)
    judge_opened(app)
    return app, repo


def test_an_override_naming_an_older_head_is_refused_with_a_reply(fake, start_app):
    app, repo = _failing_pr(fake, start_app)
    repo.pulls[2].head_sha = NEW_HEAD  # pushed after the maintainer looked
    app.send("issue_comment", comment_event(f"/gatekeeper override {HEAD[:7]} reviewed", "maintainer"), delivery="d-o")
    row = app.wait_done("d-o")
    assert row["status"] == "done" and row["outcome"].startswith("refused override by @maintainer: it names head")
    [reply] = [c for c in repo.comments.values() if "override was refused" in c["body"]]
    assert NEW_HEAD[:12] in reply["body"]
    assert app.records().override_for(REPO, 2, NEW_HEAD) is None


def test_the_author_may_not_override_unless_the_policy_says_so(fake, start_app):
    app, repo = _failing_pr(fake, start_app)
    app.send("issue_comment", comment_event(f"/gatekeeper override {HEAD[:7]} mine is fine", "dev"), delivery="d-self")
    assert "author may not override" in app.wait_done("d-self")["outcome"]
    assert _run(fake)["conclusion"] == "failure"
    repo.trees[BASE][".github/gatekeeper.yml"] = POLICY + "app: {allow_author_override: true}\n"
    app.send("issue_comment", comment_event(f"/gatekeeper override {HEAD[:7]} mine is fine", "dev"), delivery="d-self2")
    assert app.wait_done("d-self2")["outcome"].startswith("success: Overridden by @dev")


def test_commands_in_code_or_quotes_and_strangers_are_not_overrides(fake, start_app):
    app, repo = _failing_pr(fake, start_app)
    fenced = f"To override, write:\n```\n/gatekeeper override {HEAD[:7]} reason\n```\n"
    app.send("issue_comment", comment_event(fenced, "maintainer"), delivery="d-fence")
    assert app.wait_done("d-fence")["outcome"] == "ignored: no gatekeeper command"
    app.send("issue_comment", comment_event(f"/gatekeeper override {HEAD[:7]} drive-by", "stranger"), delivery="d-x")
    row = app.wait_done("d-x")  # GitHub answers 404 for a non-collaborator's permission: a refusal, not an error
    assert row["status"] == "done" and "permission on Codertocat/Hello-World is `none`" in row["outcome"]
    assert [e["kind"] for e in app.records().audit_log()][-1] == "override_refused"
    assert _run(fake)["conclusion"] == "failure"


# --- 8. merge queues -------------------------------------------------------------------------------------

GROUP_HEAD = "6" * 40


def _merge_group(pr_head: str = HEAD) -> dict:
    event = webhook_example("merge_group.checks_requested")
    event["repository"], event["installation"] = OPENED["repository"], {"id": INSTALLATION}
    event["merge_group"].update(head_sha=GROUP_HEAD, base_sha=BASE,
                                head_ref=f"refs/heads/gh-readonly-queue/main/pr-2-{pr_head}")
    return event


def test_a_merge_group_carries_its_prs_verdict(fake, start_app):
    repo = setup_pull(fake)
    app = start_app()
    judge_opened(app)
    repo.compares[(BASE, GROUP_HEAD)] = ["kimi_k3_path/ops.py"]
    app.send("merge_group", _merge_group(), delivery="d-group")
    assert "success: Carries PR #2's verdict" in app.wait_done("d-group")["outcome"]
    assert _run(fake, GROUP_HEAD)["conclusion"] == "success"


def test_a_merge_group_fails_for_a_failing_pr_or_files_beyond_it(fake, start_app):
    repo = setup_pull(fake, files=[file_entry("outside.py")])
    app = start_app()
    judge_opened(app)
    repo.compares[(BASE, GROUP_HEAD)] = ["outside.py"]
    app.send("merge_group", _merge_group(), delivery="d-bad-pr")
    assert app.wait_done("d-bad-pr")["outcome"].endswith("failure: PR #2 is not passed by the gatekeeper")
    repo.pulls[2].files = [file_entry("kimi_k3_path/ops.py")]
    repo.pulls[2].head_sha = NEW_HEAD
    repo.compares[(BASE, GROUP_HEAD)] = ["kimi_k3_path/ops.py", "setup.py"]  # another PR's change rode along
    app.send("merge_group", _merge_group(NEW_HEAD), delivery="d-extra")  # PR judged on demand: success
    assert app.wait_done("d-extra")["outcome"].endswith("failure: Merge group holds more than the judged PR")
    assert _run(fake, NEW_HEAD)["conclusion"] == "success"


# --- 9. modes: binaries and symlinks in owned paths ------------------------------------------------------

def test_binaries_and_escaping_symlinks_in_owned_paths_fail_as_in_the_cli(fake, start_app):
    binary = {"filename": "kimi_k3_path/weights.bin", "status": "added", "additions": 0, "deletions": 0,
              "_content": b"\x89PNG\x00\x01"}
    link = {"filename": "kimi_k3_path/config", "status": "added", "additions": 1, "deletions": 0,
            "patch": "@@ -0,0 +1 @@\n+../../etc/passwd\n\\ No newline at end of file",
            "_mode": "120000", "_content": "../../etc/passwd"}
    setup_pull(fake, files=[binary, link, file_entry("kimi_k3_path/ops.py")])
    app = start_app()
    judge_opened(app)
    run = _run(fake)
    assert run["conclusion"] == "failure"
    messages = {a["path"]: a["message"] for a in run["annotations"]}
    assert "binary file" in messages["kimi_k3_path/weights.bin"]
    assert "points outside the repository" in messages["kimi_k3_path/config"]


# --- 10. evidence from a workflow the PR edits -----------------------------------------------------------

WORKFLOW = ".github/workflows/gatekeeper.yml"
PINNED_WORKFLOW = "on: pull_request\njobs:\n  e:\n    steps:\n      - run: gatekeeper collect\n"


def _evidence_run(fake, app, run_id: int) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("evidence.json", json.dumps({"schema_version": 1}))
    fake.add_artifact(REPO, run_id, "gatekeeper-evidence", buffer.getvalue())
    event = webhook_example("workflow_run.completed.with-pull-requests")
    event["repository"], event["installation"] = OPENED["repository"], {"id": INSTALLATION}
    event["workflow_run"].update(id=run_id, head_sha=HEAD, path=WORKFLOW)
    app.send("workflow_run", event, delivery=f"d-ci-{run_id}")
    app.wait_done(f"d-ci-{run_id}")
    return _run(fake)["output"]["summary"]


def test_evidence_is_self_reported_when_the_pr_edits_the_workflow(fake, start_app):
    repo = setup_pull(fake)
    repo.trees[BASE][WORKFLOW] = PINNED_WORKFLOW
    app = start_app()
    judge_opened(app)
    assert "self-reported" not in _evidence_run(fake, app, 90)
    repo.pulls[2].files.append({"filename": WORKFLOW, "status": "modified", "additions": 1, "deletions": 0,
                                "patch": "@@ -5,0 +6 @@\n+      - run: echo forged > evidence.json",
                                "_content": PINNED_WORKFLOW + "      - run: echo forged > evidence.json\n"})
    summary = _evidence_run(fake, app, 91)
    assert ("CI's evidence counts as self-reported:** the pull request changes `.github/workflows/gatekeeper.yml`"
            in summary)
