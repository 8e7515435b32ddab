"""The App's pure parts and its database, without servers."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from app_harness import APP_ID, both_stores, make_config

from gatekeeper.cli import main
from gatekeeper.errors import InputError
from gatekeeper.github import signature
from gatekeeper.github.checkrun import (
    STRENGTH,
    CheckRunReport,
    rule_report,
    rule_run_name,
    SUMMARY_LIMIT,
    MissingEvidence,
    error_report,
    truncate,
    verdict_report,
)
from gatekeeper.github.client import GitHubApp, InstallationTokens
from gatekeeper.github.config import load_config
from gatekeeper.github.overrides import may_override, parse_override
from gatekeeper.github.db import open_database
from gatekeeper.github.queue import DeliveryQueue
from gatekeeper.github.records import EvaluationKey, Override, Records
from gatekeeper.verdict import CheckResult, Finding, PolicyRef, Severity, Status, Verdict


def test_signature_round_trip_and_rejections():
    body = b'{"zen": "Keep it logically awesome."}'
    header = signature.sign("s3cret", body)
    assert header.startswith("sha256=") and signature.verify("s3cret", body, header)
    assert not signature.verify("other", body, header)
    assert not signature.verify("s3cret", body + b"\n", header)
    assert not signature.verify("s3cret", body, None)
    assert not signature.verify("s3cret", body, header.replace("sha256=", "sha1="))


HEAD_SHA = "9f1c2e4b7a3d" + "0" * 28


@pytest.mark.parametrize("body, prefix, reason", [
    ("/gatekeeper override 9f1c2e4 upstream owns this hook", "9f1c2e4", "upstream owns this hook"),
    ("LGTM\n  /gatekeeper override 9F1C2E4B7A3D  hotfix for release  \nthanks", "9f1c2e4b7a3d", "hotfix for release"),
    ("/gatekeeper override 9f1c2e4", "9f1c2e4", None),
    ("/gatekeeper override because I say so", None, "because I say so"),
    ("/gatekeeper override", None, None),
    ("```\ncode\n```\n/gatekeeper override 9f1c2e4 after a closed fence", "9f1c2e4", "after a closed fence"),
])
def test_override_commands(body, prefix, reason):
    request = parse_override(body)
    assert request is not None and (request.head_prefix, request.reason) == (prefix, reason)
    assert (request.problem is None) == (prefix is not None and reason is not None)
    if request.problem is None:
        assert request.approves(HEAD_SHA) and not request.approves("1" * 40)


@pytest.mark.parametrize("body", [
    "> /gatekeeper override 9f1c2e4 quoted",
    "  > /gatekeeper override 9f1c2e4 quoted, indented",
    "please /gatekeeper override 9f1c2e4 this",
    "```\n/gatekeeper override 9f1c2e4 inside a fence\n```",
    "~~~~md\n/gatekeeper override 9f1c2e4 inside a tilde fence\n~~~\nstill inside\n~~~~",
    "    /gatekeeper override 9f1c2e4 an indented code block",
    "\t/gatekeeper override 9f1c2e4 a tab-indented code block",
    "/gatekeeper overrides 9f1c2e4 not the command",
    "", None,
])
def test_text_that_is_not_an_override(body):
    assert parse_override(body) is None


def test_write_permission_is_needed():
    assert may_override("admin") and may_override("write") and may_override("maintain")
    assert not may_override("read") and not may_override("triage") and not may_override("none")


def _verdict(findings: int = 0, verdict: str = "fail") -> Verdict:
    status = {"fail": Status.failed, "pass": Status.passed, "neutral": Status.neutral}[verdict]
    found = tuple(Finding(path=f"x/{i}.py", line=i or None, severity=Severity.error, message=f"bad {i}")
                  for i in range(findings))
    return Verdict(verdict=verdict, policy=PolicyRef(name="p", sha256="0" * 64), agent_assisted=True,
                   checks=(CheckResult(id="confinement", status=status, summary="s", findings=found),))


def test_verdict_report_conclusions_annotations_and_override():
    report = verdict_report(_verdict(findings=120), "summary")
    assert (report.status, report.conclusion, report.title) == ("completed", "failure", "Failed: confinement")
    assert [len(b) for b in report.annotation_batches()] == [50, 50, 20]
    assert report.annotations[0]["start_line"] == 1 and report.annotations[5]["start_line"] == 5
    overridden = verdict_report(_verdict(findings=1), "summary", Override("alice", "known issue", HEAD_SHA))
    assert overridden.conclusion == "success" and overridden.title == "Overridden by @alice (was failure)"
    assert overridden.summary.startswith("> **Overridden** by @alice for head `9f1c2e4b7a3d`: known issue")
    assert verdict_report(_verdict(verdict="pass"), "ok", Override("alice", "x", HEAD_SHA)).title == "Passed: 1 check"


MISSING = MissingEvidence("the artifact", "gatekeeper collect ...", "https://github.com/o/r/actions/workflows/g.yml",
                          wait_until=None)


def test_no_verdict_concludes_neutral_or_skipped_which_github_counts_as_passing():
    """GitHub's required checks pass on neutral and skipped: the App must never conclude either."""
    waiting = verdict_report(_verdict(verdict="neutral"), "s", missing=replace(MISSING, wait_until=time.time() + 60))
    assert (waiting.status, waiting.conclusion) == ("in_progress", None)
    assert waiting.title == "Waiting for evidence: confinement" and "gatekeeper collect ..." in waiting.summary
    undecided = verdict_report(_verdict(verdict="neutral"), "s", missing=MISSING)
    assert (undecided.status, undecided.conclusion) == ("completed", "action_required")
    assert undecided.details_url == MISSING.details_url and "gatekeeper collect ..." in undecided.summary
    with pytest.raises(ValueError):
        verdict_report(_verdict(verdict="neutral"), "s")  # undecided without saying what would decide it
    assert error_report("GitHub answered 503").conclusion == "failure"
    for verdict in ("pass", "fail", "neutral"):
        for override in (None, Override("alice", "x", HEAD_SHA)):
            report = verdict_report(_verdict(verdict=verdict), "s", override, MISSING)
            assert report.conclusion not in ("neutral", "skipped")
    assert STRENGTH["success"] < STRENGTH["in_progress"] < STRENGTH["action_required"] < STRENGTH["failure"]


def test_no_rule_run_concludes_neutral_or_skipped_whatever_the_rule_and_the_overall_run_say():
    for status in Status:
        verdict = Verdict(verdict="fail", policy=PolicyRef(name="p", sha256="0" * 64), agent_assisted=True,
                          checks=(CheckResult(id="confinement", status=status, summary="s"),))
        for overall in (CheckRunReport(None, "waiting", "s"), CheckRunReport("failure", "f", "s"),
                        CheckRunReport("action_required", "u", "s")):
            for override in (None, Override("alice", "x", HEAD_SHA)):
                report = rule_report(verdict, "confinement", overall, "s", override, "https://page#rule-confinement")
                assert report.conclusion not in ("neutral", "skipped")
                assert report.details_url == "https://page#rule-confinement"
                if status is Status.neutral and override is None:  # it waits exactly while the overall run waits
                    assert report.conclusion == (None if overall.conclusion is None else "action_required")
    assert rule_run_name("gatekeeper / p", "perf_matrix") == "gatekeeper / p / perf_matrix"


def test_summary_truncation_stays_under_githubs_limit_and_says_so():
    text = truncate("x" * (SUMMARY_LIMIT + 10))
    assert len(text) <= SUMMARY_LIMIT and "truncated" in text
    assert truncate("short") == "short"
    long_override = verdict_report(_verdict(), "y" * SUMMARY_LIMIT, Override("bob", "r", HEAD_SHA))
    assert len(long_override.summary) <= SUMMARY_LIMIT


def test_config_environment_overrides_file_and_errors_hide_the_secret(tmp_path):
    path = tmp_path / "gatekeeper.yml"
    path.write_text("app_id: 1\nprivate_key_path: /k.pem\nwebhook_secret: from-file\nworkers: 3\n")
    config = load_config(path, {"GATEKEEPER_APP_ID": "42", "GATEKEEPER_WEBHOOK_SECRET": "from-env",
                                "GATEKEEPER_GITHUB_API_URL": "http://127.0.0.1:1"})
    assert (config.app_id, config.workers, config.github_api_url) == (42, 3, "http://127.0.0.1:1")
    assert config.webhook_secret.get_secret_value() == "from-env" and "from-env" not in repr(config)
    with pytest.raises(InputError) as error:
        load_config(path, {"GATEKEEPER_APP_ID": "not-a-number", "GATEKEEPER_WEBHOOK_SECRET": "hunter2"})
    assert "app_id" in str(error.value) and "GATEKEEPER_APP_ID" in str(error.value)
    path.write_text("app_id: [1\n")
    with pytest.raises(InputError) as error:
        load_config(path, {})
    assert error.value.line == 2 and error.value.source == str(path)


def test_the_public_url_is_an_absolute_http_url_kept_without_its_trailing_slash(tmp_path):
    path = tmp_path / "gatekeeper.yml"
    path.write_text("app_id: 1\nprivate_key_path: /k.pem\nwebhook_secret: s\n")
    assert load_config(path, {}).public_url is None
    assert load_config(path, {"GATEKEEPER_PUBLIC_URL": "https://gk.example.com/app/"}).public_url == \
        "https://gk.example.com/app"
    for bad in ("gk.example.com", "ftp://gk.example.com", "https://gk.example.com/?a=1", "https://gk.example.com#x"):
        with pytest.raises(InputError) as error:
            load_config(path, {"GATEKEEPER_PUBLIC_URL": bad})
        assert "public_url: must be an absolute http(s) URL" in str(error.value)
        assert "GATEKEEPER_PUBLIC_URL" in str(error.value)


@both_stores
def test_queue_deduplicates_orders_and_survives_a_crash(store):
    queue = DeliveryQueue(open_database(store))
    assert queue.enqueue("a", "pull_request", "opened", b"{}", now=1.0)
    assert not queue.enqueue("a", "pull_request", "opened", b"{}", now=2.0)  # a redelivery
    assert queue.enqueue("b", "pull_request", "opened", b"{}", now=3.0)
    first = queue.claim(now=10.0)
    assert first.delivery_id == "a" and first.attempts == 1
    queue.retry_later("a", delay_s=3600, error="502")
    assert queue.claim().delivery_id == "b"  # "a" waits for its backoff
    assert queue.claim() is None
    queue.db.close()
    reopened = DeliveryQueue(open_database(store))  # "b" was running when the process died
    assert reopened.claim() is None  # not before its lease runs out: its server might still be alive
    again = reopened.claim(now=time.time() + reopened.lease_s + 1)
    assert again.delivery_id == "b" and again.attempts == 2


@both_stores
def test_decisions_are_idempotent_and_audited(store):
    records = Records(open_database(store))
    key = EvaluationKey("o/r", 1, "a" * 40, "p" * 64, "i" * 64)
    assert not records.evaluation_done(key)
    records.record_decision(key, 7, "failure", "e" * 64, "d1", "Failed: confinement")
    assert records.evaluation_done(key)
    assert not records.evaluation_done(EvaluationKey("o/r", 1, "a" * 40, "q" * 64, "i" * 64))
    [entry] = records.audit_log()
    assert (entry["kind"], entry["conclusion"], entry["evidence_sha256"]) == ("decision", "failure", "e" * 64)


def test_installation_tokens_are_cached_until_shortly_before_expiry(fake, rsa_keys, tmp_path):
    app = GitHubApp(make_config(rsa_keys, fake, tmp_path))
    now = [time.time()]
    tokens = InstallationTokens(app.integration, margin_s=300, clock=lambda: now[0])
    first = tokens.get(1)
    assert tokens.get(1) == first and fake.tokens_issued == 1
    now[0] += 3600 - 299  # inside the renewal margin of a one-hour token
    assert tokens.get(1) != first and fake.tokens_issued == 2
    tokens.invalidate(1)
    tokens.get(1)
    assert fake.tokens_issued == 3


@both_stores
def test_audit_command_lists_entries_as_json_and_table(tmp_path, capsys, store):
    db = store
    records = Records(open_database(db))
    records.record_decision(EvaluationKey("o/r", 1, "a" * 40, "p" * 64, "i" * 64), 7, "failure", None, "d1", "t")
    records.add_override("o/r", 1, "a" * 40, "alice", "known", "d2")
    records.record_decision(EvaluationKey("x/y", 2, "b" * 40, "p" * 64, "i" * 64), 8, "success", None, "d3", "t")
    assert main(["audit", "--db", str(db), "--repo", "o/r", "--format", "json"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert [(e["kind"], e["actor"]) for e in entries] == [("decision", None), ("override", "alice")]
    assert main(["audit", "--db", str(db)]) == 0
    assert "x/y" in capsys.readouterr().out
    assert main(["audit", "--db", str(tmp_path / "missing.sqlite3")]) == 2
    assert "no gatekeeper database" in capsys.readouterr().err
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"not a database at all" * 100)
    assert main(["audit", "--db", str(garbage)]) == 2
    assert "cannot open the SQLite database: file is not a database" in capsys.readouterr().err


def test_serve_refuses_a_bad_configuration_without_echoing_secrets(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GATEKEEPER_WEBHOOK_SECRET", "hunter2")
    monkeypatch.setenv("GATEKEEPER_APP_ID", str(APP_ID))
    monkeypatch.setenv("GATEKEEPER_PRIVATE_KEY_PATH", str(tmp_path / "absent.pem"))
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "absent.pem" in err and "cannot read the App private key" in err and "hunter2" not in err


def test_the_fake_flags_answers_outside_githubs_schemas(rsa_keys):
    from fake_github import FakeGitHub

    fake = FakeGitHub(APP_ID, rsa_keys[1])
    fake._answer("GET /repos/{owner}/{repo}/collaborators/{username}/permission 200",
                 {"permission": "write", "role_name": "write", "user": None})
    assert fake.violations == []
    fake._answer("GET /repos/{owner}/{repo}/collaborators/{username}/permission 200", {"permission": 3})
    assert len(fake.violations) == 1 and "permission" in fake.violations[0]
