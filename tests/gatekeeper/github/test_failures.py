"""GitHub misbehaving: 5xx answers, a token that dies mid-evaluation, a missing installation, permanent
errors, and PRs too large to judge. Nothing fails silently and nothing passes: each ends in a failed check
run or a logged failure, never in `neutral` (which GitHub counts as passing a required check)."""

from __future__ import annotations

from app_harness import BASE, HEAD, REPO, file_entry, judge_opened, setup_pull

from gatekeeper.github.publish import external_id


def test_a_502_then_200_is_retried_inside_the_request(fake, start_app):
    setup_pull(fake)
    fake.fail("GET", r"/pulls/2/files$", 502, times=1)
    app = start_app()
    row = judge_opened(app)
    assert row["status"] == "done" and row["attempts"] == 1
    [run] = fake.check_runs(REPO, HEAD)
    assert run["conclusion"] == "success"
    statuses = [status for method, path, status in fake.calls if path.endswith("/pulls/2/files")]
    assert statuses == [502, 200]


def test_github_down_for_good_fails_the_check_with_the_reason(fake, start_app):
    setup_pull(fake)
    fake.fail("GET", r"/pulls/2/commits$", 503, times=1000)
    app = start_app(max_attempts=2, http_retries=1)
    row = judge_opened(app)
    assert row["status"] == "failed" and row["attempts"] == 2
    [run] = fake.check_runs(REPO, HEAD)
    assert (run["conclusion"], run["output"]["title"]) == ("failure", "Could not evaluate")
    assert "could not evaluate" in run["output"]["summary"] and "503" in run["output"]["summary"]
    assert run["name"] == "gatekeeper / kimi-k3"  # the required check's own name, not a side run
    [error] = [e for e in app.records().audit_log() if e["kind"] == "error"]
    assert error["conclusion"] == "failure" and "gave up after 2 attempts" in error["reason"]


def test_a_permanent_error_is_not_retried(fake, start_app):
    setup_pull(fake)
    fake.fail("GET", r"/pulls/2/commits$", 404, times=1)
    app = start_app()
    row = judge_opened(app)
    assert row["status"] == "failed" and row["attempts"] == 1 and "404" in row["error"]
    assert fake.check_runs(REPO, HEAD)[0]["conclusion"] == "failure"


def test_a_token_rejected_mid_evaluation_is_renewed_and_the_job_rerun(fake, start_app):
    setup_pull(fake)
    fake.revoke_tokens_on("GET", r"/pulls/2/files$")
    app = start_app()
    row = judge_opened(app)
    assert row["status"] == "done" and row["attempts"] == 2
    assert fake.tokens_issued == 2
    [run] = fake.check_runs(REPO, HEAD)  # the rerun found and reused the check run it had started
    assert run["conclusion"] == "success"


def test_an_unknown_installation_fails_the_delivery_with_the_reason(fake, start_app):
    setup_pull(fake)
    fake.installations.clear()
    app = start_app()
    row = judge_opened(app)
    assert row["status"] == "failed" and "404" in row["error"]
    assert "check could not be posted" not in row["error"]  # nothing to post on: the PR was never read
    assert [e["kind"] for e in app.records().audit_log()] == ["error"]


def test_more_files_than_the_policy_allows_fails_closed(fake, start_app):
    setup_pull(fake, files=[file_entry(f"kimi_k3_path/f{i}.py", added=1) for i in range(3001)])
    app = start_app()
    judge_opened(app)
    [run] = fake.check_runs(REPO, HEAD)
    # GitHub lists at most 3000 files, so the PR's changed_files (3001) is what tells.
    assert run["conclusion"] == "failure" and run["output"]["title"] == "Too many files to judge (3001 > 3000)"


def test_the_file_limit_counts_the_real_file_list_not_only_changed_files(fake, start_app):
    """changed_files in the PR object can lag behind (or be cut by) GitHub; the listed files count too."""
    repo = setup_pull(fake, files=[file_entry(f"kimi_k3_path/f{i}.py", added=1) for i in range(3)])
    repo.trees[BASE][".github/gatekeeper.yml"] += "max_files: 2\n"
    fake.pr_changed_files_override = 1
    app = start_app()
    judge_opened(app)
    [run] = fake.check_runs(REPO, HEAD)
    assert run["conclusion"] == "failure" and run["output"]["title"] == "Too many files to judge (3 > 2)"


def test_annotations_go_in_batches_of_50(fake, start_app):
    setup_pull(fake, files=[file_entry(f"outside/f{i}.py", added=1) for i in range(120)])
    app = start_app()
    judge_opened(app)
    [run] = fake.check_runs(REPO, HEAD)
    assert run["conclusion"] == "failure" and len(run["annotations"]) == 120
    sizes = [len((body.get("output") or {}).get("annotations") or []) for _, body in fake.check_run_patches]
    assert sizes == [50, 50, 20]
    assert sorted(a["path"] for a in run["annotations"]) == sorted(f"outside/f{i}.py" for i in range(120))


def test_a_secondary_rate_limit_is_retried_later(fake, start_app):
    setup_pull(fake)
    fake.fail("GET", r"/pulls/2/files$", 429, times=1)  # urllib3 does not retry 429: the job does
    app = start_app()
    row = judge_opened(app)
    assert row["status"] == "done" and row["attempts"] == 2
    assert fake.check_runs(REPO, HEAD)[0]["conclusion"] == "success"


def test_a_check_run_created_before_a_crash_is_found_and_reused(fake, start_app):
    """The process died after GitHub created the run but before the database learnt its id."""
    setup_pull(fake)
    orphan = fake.add_check_run(REPO, HEAD, "gatekeeper / kimi-k3",
                                external_id=external_id(REPO, 2, HEAD, "gatekeeper / kimi-k3"))
    app = start_app()
    judge_opened(app)
    [run] = fake.check_runs(REPO, HEAD)
    assert run["id"] == orphan and run["conclusion"] == "success"


def test_a_post_whose_answer_was_lost_leaves_no_second_run_open(fake, start_app):
    """GitHub created the run but the answer was lost; the client's retry created a second one. Neither may
    stay in progress (blocking) or say anything else than the verdict."""
    setup_pull(fake, files=[file_entry("outside.py")])
    fake.fail("POST", r"/check-runs$", 502, lost=True)
    app = start_app()
    assert judge_opened(app)["status"] == "done"
    runs = fake.check_runs(REPO, HEAD)
    # Both POSTs created a run (the first one's 201 never reached the App): GitHub holds two.
    assert [status for method, path, status in fake.calls if method == "POST" and path.endswith("/check-runs")] == [
        201, 201]
    assert len(runs) == 2 and all((r["status"], r["conclusion"]) == ("completed", "failure") for r in runs)


def test_a_stale_run_from_before_external_ids_is_completed_like_the_verdict(fake, start_app):
    setup_pull(fake, files=[file_entry("outside.py")])
    legacy = fake.add_check_run(REPO, HEAD, "gatekeeper / kimi-k3", status="in_progress")
    app = start_app()
    judge_opened(app)
    runs = {r["id"]: r for r in fake.check_runs(REPO, HEAD)}
    assert len(runs) == 2 and runs[legacy]["conclusion"] == "failure"
    assert runs[legacy]["output"]["title"].startswith("Superseded by run ")


def test_a_pr_closed_before_its_turn_is_skipped(fake, start_app):
    repo = setup_pull(fake)
    repo.pulls[2].state = "closed"
    app = start_app()
    assert judge_opened(app)["outcome"] == "skipped: PR #2 is closed"
    assert fake.check_runs(REPO) == []
