"""The details page in the App (issue 39): with `public_url` set, each published verdict is kept and served at
/evaluations/<id>, which the check run's details_url links to; without it, nothing is kept and the runs link what
they linked before. The page is checked in a real headless Chromium (marker `browser`)."""

from __future__ import annotations

import re
import sqlite3

import pytest
from app_harness import BASE, HEAD, POLICY, REPO, both_stores, comment_event, file_entry, judge_opened, setup_pull
from fake_github import FakeCommit

from gatekeeper.github.db import open_database

PUBLIC_URL = "https://gatekeeper.example.com"  # the proxy in front of the App; the tests call the App directly
# Six required perf rows and no perf evidence: six holes in the heatmap, and the verdict undecided.
PERF_POLICY = POLICY + ("checks:\n  perf_matrix: {enabled: true, extra_axes: {tp: [8, 16], batch: [1, 2, 4]}}\n"
                        "app:\n  evidence_wait_minutes: 0\n")
HOSTILE_COMMIT = "Speed up decode\n\nCo-authored-by: Claude <img src=x onerror=alert(1)><script>alert(2)</script>\n"


def _judged(fake, start_app, policy: str = POLICY, **config):
    repo = setup_pull(fake)
    repo.trees[BASE][".github/gatekeeper.yml"] = policy
    repo.pulls[2].commits = [FakeCommit(HEAD, HOSTILE_COMMIT)]
    app = start_app(**config)
    judge_opened(app)
    [run] = fake.check_runs(REPO, HEAD)
    return app, run


def _page_path(run: dict) -> str:
    match = re.fullmatch(re.escape(PUBLIC_URL) + r"(/evaluations/[A-Za-z0-9_-]+)", run["details_url"] or "")
    assert match, run["details_url"]
    return match.group(1)


def test_without_a_public_url_no_page_is_kept_and_runs_link_as_before(fake, start_app):
    app, run = _judged(fake, start_app)
    assert run["conclusion"] == "success" and run["details_url"] in (None, "")
    assert "Full report" not in run["output"]["summary"]
    with sqlite3.connect(app.config.db_path) as db:
        assert db.execute("SELECT COUNT(*) FROM details_pages").fetchone() == (0,)
    assert app.client.get(app.url + "/evaluations/" + "A" * 32).status_code == 404


@both_stores
def test_the_run_links_its_page_which_shows_the_published_verdict(fake, start_app):
    app, run = _judged(fake, start_app, public_url=PUBLIC_URL + "/")
    assert run["conclusion"] == "success"
    path = _page_path(run)
    assert f"[Full report]({PUBLIC_URL}{path})" in run["output"]["summary"]
    page = app.client.get(app.url + path)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["referrer-policy"] == "no-referrer"
    assert f"{REPO}#2 at {HEAD[:12]}" in page.text and "PASS" in page.text
    assert "<script" not in page.text and "<img" not in page.text and "&lt;img src=x" in page.text

    # A re-run judges the head again: the same page, updated, so the link on the run stays good.
    fake.repos[REPO].pulls[2].labels = ["agent-assisted"]
    judge_opened(app, delivery="d-labeled")
    [again] = fake.check_runs(REPO, HEAD)
    assert _page_path(again) == path
    db = open_database(app.config.db_path)
    assert db.connection().execute("SELECT COUNT(*) AS n FROM details_pages").fetchone()["n"] == 1
    db.close()


def test_unknown_and_malformed_page_ids_are_not_found(fake, start_app):
    app, _ = _judged(fake, start_app, public_url=PUBLIC_URL)
    for page_id in ("A" * 32, "x", "%3Cscript%3E" * 3, "' OR 1=1 --" + "a" * 20):
        response = app.client.get(app.url + "/evaluations/" + page_id)
        assert response.status_code == 404 and "<script" not in response.text


@pytest.mark.browser
def test_the_served_page_loads_in_chromium_with_one_cell_per_perf_row(fake, start_app, browser_page, artifacts_dir):
    app, run = _judged(fake, start_app, PERF_POLICY, public_url=PUBLIC_URL)
    assert run["conclusion"] == "action_required"  # undecided: no perf evidence, and no wait
    page, errors = browser_page
    response = page.goto(app.url + _page_path(run))
    assert response is not None and response.status == 200
    assert page.locator("svg.heatmap g.cell").count() == 6
    assert page.locator("svg.heatmap g.cell.missing").count() == 6  # no evidence: every row a hole
    assert page.locator("#rule-perf_matrix .badge").inner_text() == "undecided"
    assert page.locator("img").count() == 0 and page.locator("script").count() == 0
    assert "onerror=alert(1)" in page.locator("#signals").inner_text()  # the hostile trailer, as text
    page.screenshot(path=str(artifacts_dir / "details-page-app.png"), full_page=True)
    assert errors == []


def test_the_page_of_an_overridden_head_says_so(fake, start_app):
    repo = setup_pull(fake, files=[file_entry("vllm/engine/core.py")])
    repo.permissions["maintainer"] = "write"
    app = start_app(public_url=PUBLIC_URL)
    judge_opened(app)
    comment = comment_event(f"/gatekeeper override {HEAD[:10]} <b>reviewed</b> by hand", "maintainer")
    app.send("issue_comment", comment, delivery="d-override")
    app.wait_done("d-override")
    [run] = fake.check_runs(REPO, HEAD)
    assert run["conclusion"] == "success"
    page = app.client.get(app.url + _page_path(run)).text
    assert 'id="override"' in page and "@maintainer" in page and "&lt;b&gt;reviewed&lt;/b&gt; by hand" in page
    assert "FAIL" in page  # what the rules found, under the override
