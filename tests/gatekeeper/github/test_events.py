"""Re-runs, CI evidence, the sticky comment, installations and the reconciliation sweep."""

from __future__ import annotations

import io
import json
import zipfile

from app_harness import APP_ID, HEAD, INSTALLATION, OPENED, REPO, judge_opened, setup_pull
from fake_github import webhook_example

from gatekeeper.github.reconcile import sweep

def _decisions(app) -> list[dict]:
    return [e for e in app.records().audit_log() if e["kind"] == "decision"]


def _opened_and_judged(fake, start_app, **config):
    setup_pull(fake)
    app = start_app(**config)
    judge_opened(app)
    return app


def _our_check_run_event(example: str, fake) -> dict:
    """A check_run example retargeted at the gatekeeper's run on PR #2."""
    [run] = fake.check_runs(REPO, HEAD)
    event = webhook_example(example)
    event["repository"] = OPENED["repository"]
    event["installation"] = {"id": INSTALLATION}
    event["check_run"].update(id=run["id"], name=run["name"], head_sha=HEAD, app={"id": APP_ID},
                              pull_requests=[{"number": 2}])
    return event


def test_check_run_rerequested_judges_again_on_the_same_run(fake, start_app):
    app = _opened_and_judged(fake, start_app)
    event = _our_check_run_event("check_run.rerequested", fake)
    app.send("check_run", event, delivery="d-rerun")
    assert app.wait_done("d-rerun")["outcome"].startswith("success")
    assert len(fake.check_runs(REPO, HEAD)) == 1 and len(_decisions(app)) == 2


def test_the_rerun_button_and_foreign_check_runs(fake, start_app):
    app = _opened_and_judged(fake, start_app)
    event = _our_check_run_event("check_run.requested_action", fake)
    event["check_run"]["pull_requests"] = []
    event["requested_action"] = {"identifier": "rerun"}
    app.send("check_run", event, delivery="d-button")  # no pull_requests listed (a fork): found by head SHA
    assert app.wait_done("d-button")["outcome"].startswith("success")
    event["check_run"]["app"] = {"id": APP_ID + 1}
    app.send("check_run", event, delivery="d-foreign")
    assert app.wait_done("d-foreign")["outcome"].startswith("ignored")
    assert len(_decisions(app)) == 2


def test_check_suite_rerequested(fake, start_app):
    app = _opened_and_judged(fake, start_app)
    event = webhook_example("check_suite.rerequested")
    event["installation"] = {"id": INSTALLATION}
    app.send("check_suite", event, delivery="d-suite")
    assert app.wait_done("d-suite")["outcome"].startswith("success")
    assert len(_decisions(app)) == 2


def _evidence_zip(document: str) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("evidence.json", document)
    return buffer.getvalue()


def _workflow_run(run_id: int) -> dict:
    event = webhook_example("workflow_run.completed.with-pull-requests")
    event["repository"] = OPENED["repository"]
    event["installation"] = {"id": INSTALLATION}
    event["workflow_run"].update(id=run_id, head_sha=HEAD, path=".github/workflows/gatekeeper.yml")
    return event


def test_workflow_run_evidence_is_stored_and_the_pr_judged_again(fake, start_app):
    app = _opened_and_judged(fake, start_app)
    document = json.dumps({"schema_version": 1})
    fake.add_artifact(REPO, 77, "gatekeeper-evidence", _evidence_zip(document))
    app.send("workflow_run", _workflow_run(77), delivery="d-ci")
    assert app.wait_done("d-ci")["outcome"].startswith("evidence stored; success")
    first, second = _decisions(app)
    assert first["evidence_sha256"] is None and second["evidence_sha256"]  # the audit says what was judged


def test_invalid_evidence_is_rejected_and_audited(fake, start_app):
    app = _opened_and_judged(fake, start_app)
    fake.add_artifact(REPO, 78, "gatekeeper-evidence", _evidence_zip('{"schema_version": 1, "bogus": 1}'))
    app.send("workflow_run", _workflow_run(78), delivery="d-bad")
    assert app.wait_done("d-bad")["outcome"].startswith("rejected evidence")
    fake.add_artifact(REPO, 79, "other-artifact", b"not a zip")
    app.send("workflow_run", _workflow_run(79), delivery="d-none")
    assert "no 'gatekeeper-evidence' artifact" in app.wait_done("d-none")["outcome"]
    assert [e["kind"] for e in app.records().audit_log()] == ["decision", "error"]


def test_artifacts_of_other_workflows_are_not_evidence(fake, start_app):
    """A workflow the PR can edit could forge the collector's output: only the configured ones count."""
    app = _opened_and_judged(fake, start_app)
    fake.add_artifact(REPO, 80, "gatekeeper-evidence", _evidence_zip(json.dumps({"schema_version": 1})))
    event = _workflow_run(80)
    event["workflow_run"]["path"] = ".github/workflows/test.yml"
    app.send("workflow_run", event, delivery="d-other")
    assert app.wait_done("d-other")["outcome"] == "ignored: workflow '.github/workflows/test.yml' is not an evidence workflow"
    assert app.records().evidence_for(REPO, HEAD) is None


def test_sticky_comment_is_updated_never_duplicated(fake, start_app):
    setup_pull(fake)
    # Someone quoting the marker in their own comment: not ours to edit.
    quoted = fake.add_comment(REPO, 2, "<!-- gatekeeper:sticky-comment --> copied", "someone")
    app = start_app(sticky_comment=True)
    judge_opened(app)
    repo = fake.repos[REPO]
    repo.pulls[2].labels = ["agent-assisted"]  # new inputs: judged again
    app.send("pull_request", webhook_example("pull_request.labeled"), delivery="d-label")
    app.wait_done("d-label")
    ours = [c for c in repo.comments.values() if c["id"] != quoted]
    assert len(ours) == 1 and ours[0]["body"].startswith("<!-- gatekeeper:sticky-comment -->\n")
    assert repo.comments[quoted]["body"] == "<!-- gatekeeper:sticky-comment --> copied"
    assert len(_decisions(app)) == 2


def test_reconciliation_sweep_repairs_a_missed_webhook(fake, start_app):
    setup_pull(fake)
    app = start_app()
    ctx = app_context(app)
    assert sweep(ctx) == 1  # the PR has no gatekeeper check run: queued
    assert sweep(ctx) == 0  # the same head is not queued twice
    app.wait_done(f"sweep:{REPO}#2@{HEAD}")
    assert fake.check_runs(REPO, HEAD)[0]["conclusion"] == "success"


def test_installation_events_are_recorded(fake, start_app):
    app = start_app()
    event = webhook_example("installation.created")
    app.send("installation", event, delivery="d-inst")
    app.wait_done("d-inst")
    assert app.records().installation_active(event["installation"]["id"]) is True
    event["action"] = "deleted"
    app.send("installation", event, delivery="d-uninst")
    app.wait_done("d-uninst")
    assert app.records().installation_active(event["installation"]["id"]) is False


def app_context(app):
    from gatekeeper.github.client import GitHubApp
    from gatekeeper.github.context import AppContext
    from gatekeeper.github.db import open_database
    from gatekeeper.github.queue import DeliveryQueue
    from gatekeeper.github.records import Records

    db = open_database(app.config.db_path)
    return AppContext(app.config, DeliveryQueue(db), Records(db), GitHubApp(app.config))
