"""The details pages the App serves at /evaluations/<id>: each evaluation's verdict, kept as JSON in a table of
its own and rendered on request (gatekeeper/report/html.py), so a page always shows what its check run says.

One page per (repository, PR, head SHA, policy hash): a re-evaluation of that head (CI's evidence came, an
override) updates the same page, so the check run's `details_url` stays valid. The id is random (not derived
from the key), so a page of a private repository cannot be found by guessing its PR and head; the link is the
access, as with a secret gist (docs/github-app.md says so).

The table is in db.py's schema (`details_pages`), so it lives on SQLite or PostgreSQL alike; the SQL here is
the shared dialect (`?` placeholders, INSERT ... ON CONFLICT).
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass

from gatekeeper.github.db import Database
from gatekeeper.github.records import EvaluationKey

PAGE_ID = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


@dataclass(frozen=True)
class StoredPage:
    repo: str
    pr: int
    head_sha: str
    verdict_json: str | None  # None: reserved for a verdict not published yet

    @property
    def subject(self) -> str:
        return f"{self.repo}#{self.pr} at {self.head_sha[:12]}"


class Pages:
    def __init__(self, db: Database):
        self.db = db

    def reserve(self, key: EvaluationKey) -> str:
        """The page id of this (repo, PR, head, policy), made now if it has none. Before judging: the check run
        links to the page in the same write that publishes the verdict."""
        with self.db.transaction() as db:
            db.execute("INSERT INTO details_pages (id, repo, pr, head_sha, policy_sha256) VALUES (?, ?, ?, ?, ?)"
                       " ON CONFLICT (repo, pr, head_sha, policy_sha256) DO NOTHING",
                       (secrets.token_urlsafe(24), key.repo, key.pr, key.head_sha, key.policy_sha256))
            row = db.execute("SELECT id FROM details_pages WHERE repo = ? AND pr = ? AND head_sha = ?"
                             " AND policy_sha256 = ?", (key.repo, key.pr, key.head_sha, key.policy_sha256)).fetchone()
        return row["id"]

    def store(self, page_id: str, verdict_json: str) -> None:
        """The published verdict, for the page to show (after publishing: only what the check run says)."""
        with self.db.transaction() as db:
            db.execute("UPDATE details_pages SET verdict = ?, updated_at = ? WHERE id = ?",
                       (verdict_json, time.time(), page_id))

    def get(self, page_id: str) -> StoredPage | None:
        if not PAGE_ID.match(page_id):
            return None
        row = self.db.connection().execute(
            "SELECT repo, pr, head_sha, verdict FROM details_pages WHERE id = ?", (page_id,)).fetchone()
        return StoredPage(row["repo"], row["pr"], row["head_sha"], row["verdict"]) if row else None


def page_url(public_url: str, page_id: str) -> str:
    return f"{public_url.rstrip('/')}/evaluations/{page_id}"
