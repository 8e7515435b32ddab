"""The webhook door: what is refused, what is acknowledged, and that only valid deliveries are queued."""

from __future__ import annotations

import json

from app_harness import SECRET
from fake_github import webhook_example

from gatekeeper.github.signature import sign


def _queued(app) -> int:
    queue = app.queue()
    try:
        return sum(queue.counts().values())
    finally:
        queue.db.close()


def test_ping_is_acknowledged_before_any_installation(fake, start_app):
    fake.installations.clear()
    app = start_app()
    response = app.send("ping", webhook_example("ping.with-app_id"))
    assert response.status_code == 200 and response.json()["pong"] is True
    assert _queued(app) == 0


def test_missing_or_wrong_signature_is_401_and_not_queued(start_app):
    app = start_app()
    opened = webhook_example("pull_request.opened")
    assert app.send("pull_request", opened, secret="not-the-secret").status_code == 401
    body = json.dumps(opened).encode()
    for bad in ({"X-Hub-Signature-256": ""}, {"X-Hub-Signature-256": "sha1=" + "0" * 40},
                {"X-Hub-Signature-256": sign(SECRET, body + b" ")}):
        assert app.send("pull_request", body, headers=bad).status_code == 401
    assert _queued(app) == 0


def test_malformed_json_is_400(start_app):
    app = start_app()
    response = app.send("pull_request", b'{"action": "opened",')
    assert response.status_code == 400 and "pull_request payload" in response.json()["error"]
    assert _queued(app) == 0


def test_payload_missing_fields_is_422_naming_the_field(start_app):
    app = start_app()
    opened = webhook_example("pull_request.opened")
    del opened["pull_request"]["head"]
    response = app.send("pull_request", opened)
    assert response.status_code == 422 and "pull_request.head" in response.json()["error"]


def test_unknown_event_and_uninteresting_action_are_acknowledged_not_queued(start_app):
    app = start_app()
    assert app.send("star", {"action": "created"}).status_code == 202
    closed = webhook_example("pull_request.opened")
    closed["action"] = "closed"
    response = app.send("pull_request", closed)
    assert response.status_code == 202 and "needs no work" in response.json()["ignored"]
    assert _queued(app) == 0


def test_missing_installation_is_422(start_app):
    app = start_app()
    opened = webhook_example("pull_request.opened")
    del opened["installation"]
    response = app.send("pull_request", opened)
    assert response.status_code == 422 and "no installation" in response.json()["error"]
    assert _queued(app) == 0


def test_huge_payload_is_413_with_or_without_content_length(start_app):
    app = start_app(max_body_bytes=4096)
    huge = webhook_example("pull_request.opened")  # ~28 kB
    assert app.send("pull_request", huge).status_code == 413
    body = json.dumps(huge).encode()
    chunks = (body[i:i + 1000] for i in range(0, len(body), 1000))  # chunked: no Content-Length to trust
    response = app.client.post(app.url + "/webhook", content=chunks, headers={
        "Content-Type": "application/json", "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": "big",
        "X-Hub-Signature-256": sign(SECRET, body)})
    assert response.status_code == 413
    assert _queued(app) == 0


def test_form_encoded_webhooks_are_415(start_app):
    app = start_app()
    response = app.send("pull_request", webhook_example("pull_request.opened"),
                        headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert response.status_code == 415


def test_healthz_reports_the_queue(start_app):
    app = start_app()
    response = app.client.get(app.url + "/healthz")
    assert response.status_code == 200
    assert response.json()["status"] == "ok" and response.json()["workers"] == 2


def test_bodies_past_the_inflight_budget_are_503_and_the_budget_comes_back(start_app):
    """Forged but well-formed signatures still make the server read the body before it can tell: all bodies
    being received share one budget, and past it the answer is 503 with Retry-After (not a larger heap)."""
    app = start_app(max_inflight_body_bytes=16 * 1024)
    big = webhook_example("pull_request.opened")  # ~28 kB: more than the whole 16 kB budget
    response = app.send("pull_request", big, headers={"X-Hub-Signature-256": "sha256=" + "0" * 64})
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    ping = webhook_example("ping.with-app_id")  # small: fits, so the budget was given back after the 503
    for _ in range(3):
        assert app.send("ping", ping).status_code == 200
    assert _queued(app) == 0
