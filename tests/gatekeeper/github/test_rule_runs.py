"""One check run per rule (policy `app.check_runs: per_rule`, issue 39): beside `gatekeeper / <policy>`, one run
`gatekeeper / <policy> / <rule>` per enabled rule, so a ruleset can require a subset of the rules, with the App's
guarantees: never neutral or skipped, one external id per run, stale runs completed alike, errors on every run,
merge groups carrying each rule's run."""

from __future__ import annotations

from app_harness import (
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
from fake_github import webhook_example

NAME = "gatekeeper / kimi-k3"
CONFINEMENT, PERF = NAME + " / confinement", NAME + " / perf_matrix"
# Confinement decides; perf_matrix needs evidence that never comes (no wait): undecided, so action_required.
PER_RULE = POLICY + ("checks:\n  perf_matrix: {enabled: true, extra_axes: {tp: [8, 16]}}\n"
                     "app:\n  evidence_wait_minutes: 0\n  check_runs: per_rule\n")
GROUP_HEAD = "6" * 40


def _setup(fake, policy: str = PER_RULE, **pull):
    repo = setup_pull(fake, **pull)
    repo.trees[BASE][".github/gatekeeper.yml"] = policy
    return repo


def _runs(fake, head: str = HEAD) -> dict[str, dict]:
    runs = fake.check_runs(REPO, head)
    assert len({r["name"] for r in runs}) == len(runs), [r["name"] for r in runs]  # one run per name
    return {r["name"]: r for r in runs}


def test_each_enabled_rule_gets_its_own_run_beside_the_overall_one(fake, start_app):
    _setup(fake, files=[file_entry("kimi_k3_path/ops.py"), file_entry("vllm/engine/core.py")])
    app = start_app()
    judge_opened(app)
    runs = _runs(fake)
    assert set(runs) == {NAME, CONFINEMENT, PERF}  # startup_guard and changed_path_tests are disabled: no run
    assert (runs[NAME]["conclusion"], runs[NAME]["output"]["title"]) == ("failure", "Failed: confinement")
    assert runs[CONFINEMENT]["conclusion"] == "failure"
    assert runs[CONFINEMENT]["output"]["title"].startswith("Failed: 2 files changed")
    assert [a["path"] for a in runs[CONFINEMENT]["annotations"]] == ["vllm/engine/core.py"]
    assert "## ❌ gatekeeper / confinement: FAIL" in runs[CONFINEMENT]["output"]["summary"]
    assert "perf_matrix" not in runs[CONFINEMENT]["output"]["summary"]
    assert (runs[PERF]["conclusion"], runs[PERF]["output"]["title"]) == ("action_required", "Undecided: perf_matrix")
    assert runs[PERF]["annotations"] == [] and runs[PERF]["details_url"]
    assert len({r["external_id"] for r in runs.values()}) == 3
    assert all(r["status"] == "completed" and r["conclusion"] not in ("neutral", "skipped") for r in runs.values())
    # One decision for the evaluation, as with one run: the overall run's.
    assert [(e["kind"], e["conclusion"]) for e in app.records().audit_log()] == [("decision", "failure")]


def test_a_ruleset_may_require_the_rules_that_pass(fake, start_app):
    _setup(fake)
    app = start_app(public_url="https://gatekeeper.example.com")
    judge_opened(app)
    runs = _runs(fake)
    assert runs[NAME]["conclusion"] == "action_required"  # perf_matrix undecided: the whole verdict does not pass
    assert runs[CONFINEMENT]["conclusion"] == "success"  # but a ruleset requiring confinement alone is satisfied
    assert runs[CONFINEMENT]["details_url"].endswith("#rule-confinement")
    assert runs[PERF]["details_url"].endswith("#rule-perf_matrix")


def test_a_rule_the_mode_does_not_require_succeeds_saying_so_and_never_skips(fake, start_app):
    _setup(fake, agent=False)  # no signal: default mode, which requires only changed_path_tests (disabled here)
    app = start_app()
    judge_opened(app)
    runs = _runs(fake)
    assert {name: (r["conclusion"], r["output"]["title"]) for name, r in runs.items()} == {
        NAME: ("success", "Passed: 0 checks, 4 skipped"),
        CONFINEMENT: ("success", "Not required: Not required in default mode."),
        PERF: ("success", "Not required: Not required in default mode."),
    }


def test_an_override_makes_every_run_success(fake, start_app):
    repo = _setup(fake, files=[file_entry("vllm/engine/core.py")])
    repo.permissions["maintainer"] = "write"
    app = start_app()
    judge_opened(app)
    comment = comment_event(f"/gatekeeper override {HEAD[:10]} reviewed by hand", "maintainer")
    app.send("issue_comment", comment, delivery="d-override")
    app.wait_done("d-override")
    runs = _runs(fake)
    assert {name: r["conclusion"] for name, r in runs.items()} == {NAME: "success", CONFINEMENT: "success",
                                                                    PERF: "success"}
    assert runs[CONFINEMENT]["output"]["title"] == "Overridden by @maintainer (was failure)"
    assert runs[PERF]["output"]["title"] == "Overridden by @maintainer (was undecided)"


def test_a_stale_rule_run_is_completed_like_ours(fake, start_app):
    _setup(fake, files=[file_entry("vllm/engine/core.py")])
    stale = fake.add_check_run(REPO, HEAD, CONFINEMENT)  # from before external ids: in progress, no external id
    app = start_app()
    judge_opened(app)
    runs = [r for r in fake.check_runs(REPO, HEAD) if r["name"] == CONFINEMENT]
    assert len(runs) == 2 and all(r["conclusion"] == "failure" for r in runs)
    assert next(r for r in runs if r["id"] == stale)["output"]["title"].startswith("Superseded by run ")


def test_an_error_fails_every_rule_run_already_there(fake, start_app):
    _setup(fake)
    app = start_app()
    judge_opened(app)
    assert _runs(fake)[CONFINEMENT]["conclusion"] == "success"
    # The same head again, and GitHub now refuses the PR's files for good: the evaluation fails closed, and no
    # earlier rule run may stay green for what this evaluation could not judge.
    fake.fail("GET", r"/pulls/2/files", 404, times=100)
    app.send("pull_request", OPENED, delivery="d-again")
    assert app.wait_done("d-again")["status"] == "failed"
    runs = _runs(fake)
    assert {name: r["conclusion"] for name, r in runs.items()} == {NAME: "failure", CONFINEMENT: "failure",
                                                                    PERF: "failure"}
    assert runs[CONFINEMENT]["output"]["title"].startswith("Not a rule run of this evaluation: Could not evaluate")


def test_back_to_one_run_the_rule_runs_carry_the_overall_report(fake, start_app):
    repo = _setup(fake)
    app = start_app()
    judge_opened(app)
    repo.trees[BASE][".github/gatekeeper.yml"] = PER_RULE.replace("check_runs: per_rule", "check_runs: single")
    judge_opened(app, delivery="d-single")  # another policy: judged again
    runs = _runs(fake)
    assert {name: r["conclusion"] for name, r in runs.items()} == {
        NAME: "action_required", CONFINEMENT: "action_required", PERF: "action_required"}


def test_a_merge_group_carries_each_rules_run(fake, start_app):
    repo = _setup(fake)
    app = start_app()
    judge_opened(app)  # PR head: overall action_required, confinement success, perf_matrix action_required
    repo.compares[(BASE, GROUP_HEAD)] = ["kimi_k3_path/ops.py"]
    group = webhook_example("merge_group.checks_requested")
    group["repository"], group["installation"] = OPENED["repository"], {"id": INSTALLATION}
    group["merge_group"].update(head_sha=GROUP_HEAD, base_sha=BASE,
                                head_ref=f"refs/heads/gh-readonly-queue/main/pr-2-{HEAD}")
    app.send("merge_group", group, delivery="d-group")
    app.wait_done("d-group")
    runs = _runs(fake, GROUP_HEAD)
    assert {name: r["conclusion"] for name, r in runs.items()} == {NAME: "failure", CONFINEMENT: "success",
                                                                    PERF: "failure"}
    assert "check run `gatekeeper / kimi-k3 / perf_matrix` is `action_required`" in runs[PERF]["output"]["summary"]
    # A group that holds another PR's change fails every run, the passing rule's too.
    repo.compares[(BASE, GROUP_HEAD)] = ["kimi_k3_path/ops.py", "setup.py"]
    app.send("merge_group", group, delivery="d-group-2")
    app.wait_done("d-group-2")
    assert _runs(fake, GROUP_HEAD)[CONFINEMENT]["conclusion"] == "failure"
