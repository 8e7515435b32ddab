"""What the App decided and why, in its database: evaluations (idempotency), check-run and sticky-comment ids,
overrides, evidence received from CI, the heads' first sighting, installations, and the audit log."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gatekeeper.github.db import Connection, Database, upsert


@dataclass(frozen=True)
class EvaluationKey:
    """What makes two evaluations the same: same PR at the same head, same policy, same other inputs."""

    repo: str
    pr: int
    head_sha: str
    policy_sha256: str
    inputs_sha256: str


@dataclass(frozen=True)
class Override:
    actor: str
    reason: str
    head_sha: str  # the one head it approves


@dataclass(frozen=True)
class StoredEvidence:
    sha256: str
    document: str
    workflow_path: str  # the workflow file whose run uploaded it


class Records:
    def __init__(self, db: Database):
        self.db = db

    # ------------------------------------------------------------------------------------------ idempotency

    def evaluation_done(self, key: EvaluationKey) -> bool:
        row = self.db.connection().execute(
            "SELECT 1 FROM evaluations WHERE repo = ? AND pr = ? AND head_sha = ? AND policy_sha256 = ?"
            " AND inputs_sha256 = ?",
            (key.repo, key.pr, key.head_sha, key.policy_sha256, key.inputs_sha256),
        ).fetchone()
        return row is not None

    def decision_for(self, key: EvaluationKey) -> str | None:
        """The outcome published for exactly this evaluation, if any."""
        row = self.db.connection().execute(
            "SELECT conclusion FROM evaluations WHERE repo = ? AND pr = ? AND head_sha = ? AND policy_sha256 = ?"
            " AND inputs_sha256 = ?",
            (key.repo, key.pr, key.head_sha, key.policy_sha256, key.inputs_sha256),
        ).fetchone()
        return row["conclusion"] if row else None

    def latest_decision(self, repo: str, pr: int, head_sha: str) -> str | None:
        """The outcome most recently published for a PR head, whatever the inputs (merge queues read it)."""
        row = self.db.connection().execute(
            "SELECT conclusion FROM evaluations WHERE repo = ? AND pr = ? AND head_sha = ? AND policy_sha256 != ''"
            " ORDER BY evaluated_at DESC LIMIT 1", (repo, pr, head_sha)).fetchone()
        return row["conclusion"] if row else None

    def first_seen(self, repo: str, head_sha: str, now: float) -> float:
        """When this head was first judged: recorded now if it never was."""
        with self.db.transaction() as db:
            db.execute("INSERT INTO heads (repo, head_sha, first_seen_at) VALUES (?, ?, ?)"
                       " ON CONFLICT (repo, head_sha) DO NOTHING", (repo, head_sha, now))
            return db.execute("SELECT first_seen_at FROM heads WHERE repo = ? AND head_sha = ?",
                              (repo, head_sha)).fetchone()["first_seen_at"]

    def record_decision(self, key: EvaluationKey, check_run_id: int | None, conclusion: str,
                        evidence_sha256: str | None, delivery_id: str | None, reason: str) -> None:
        """The evaluation record and its audit row commit together: one decision, one audit entry."""
        now = time.time()
        with self.db.transaction() as db:
            upsert(db, "evaluations", ("repo", "pr", "head_sha", "policy_sha256", "inputs_sha256"),
                   check_run_id=check_run_id, conclusion=conclusion, evaluated_at=now,
                   repo=key.repo, pr=key.pr, head_sha=key.head_sha, policy_sha256=key.policy_sha256,
                   inputs_sha256=key.inputs_sha256)
            insert_audit(db, "decision", key.repo, key.pr, key.head_sha, conclusion=conclusion, reason=reason,
                         policy_sha256=key.policy_sha256, evidence_sha256=evidence_sha256,
                         check_run_id=check_run_id, delivery_id=delivery_id, at=now)

    def check_run_id(self, repo: str, head_sha: str, name: str) -> int | None:
        row = self.db.connection().execute(
            "SELECT check_run_id FROM check_runs WHERE repo = ? AND head_sha = ? AND name = ?",
            (repo, head_sha, name),
        ).fetchone()
        return row["check_run_id"] if row else None

    def remember_check_run(self, repo: str, head_sha: str, name: str, check_run_id: int) -> None:
        with self.db.transaction() as db:
            upsert(db, "check_runs", ("repo", "head_sha", "name"), repo=repo, head_sha=head_sha, name=name,
                   check_run_id=check_run_id)

    # ------------------------------------------------------------------------------------------ overrides

    def add_override(self, repo: str, pr: int, head_sha: str, actor: str, reason: str,
                     delivery_id: str | None) -> None:
        now = time.time()
        with self.db.transaction() as db:
            upsert(db, "overrides", ("repo", "pr", "head_sha"), repo=repo, pr=pr, head_sha=head_sha, actor=actor,
                   reason=reason, at=now)
            insert_audit(db, "override", repo, pr, head_sha, actor=actor, reason=reason,
                         delivery_id=delivery_id, at=now)

    def override_for(self, repo: str, pr: int, head_sha: str) -> Override | None:
        row = self.db.connection().execute(
            "SELECT actor, reason FROM overrides WHERE repo = ? AND pr = ? AND head_sha = ?", (repo, pr, head_sha)
        ).fetchone()
        return Override(row["actor"], row["reason"], head_sha) if row else None

    # ------------------------------------------------------------------------------------------ evidence

    def put_evidence(self, repo: str, head_sha: str, sha256: str, document: str, workflow_run_id: int,
                     workflow_path: str) -> None:
        with self.db.transaction() as db:
            upsert(db, "evidence", ("repo", "head_sha"), repo=repo, head_sha=head_sha, sha256=sha256,
                   document=document, workflow_run_id=workflow_run_id, received_at=time.time(),
                   workflow_path=workflow_path)

    def evidence_for(self, repo: str, head_sha: str) -> StoredEvidence | None:
        row = self.db.connection().execute(
            "SELECT sha256, document, workflow_path FROM evidence WHERE repo = ? AND head_sha = ?", (repo, head_sha)
        ).fetchone()
        return StoredEvidence(row["sha256"], row["document"], row["workflow_path"]) if row else None

    # ------------------------------------------------------------------------------------------ installations

    def set_installation(self, installation_id: int, account: str | None, active: bool) -> None:
        with self.db.transaction() as db:
            upsert(db, "installations", ("id",), id=installation_id, account=account, active=int(active),
                   updated_at=time.time())

    def installation_active(self, installation_id: int) -> bool | None:
        row = self.db.connection().execute("SELECT active FROM installations WHERE id = ?",
                                           (installation_id,)).fetchone()
        return bool(row["active"]) if row else None

    # ------------------------------------------------------------------------------------------ sticky comment

    def sticky_comment_id(self, repo: str, pr: int) -> int | None:
        row = self.db.connection().execute("SELECT comment_id FROM sticky_comments WHERE repo = ? AND pr = ?",
                                           (repo, pr)).fetchone()
        return row["comment_id"] if row else None

    def remember_sticky_comment(self, repo: str, pr: int, comment_id: int) -> None:
        with self.db.transaction() as db:
            upsert(db, "sticky_comments", ("repo", "pr"), repo=repo, pr=pr, comment_id=comment_id)

    # ------------------------------------------------------------------------------------------ audit

    def audit(self, kind: str, repo: str | None, pr: int | None, head_sha: str | None, **fields: Any) -> None:
        with self.db.transaction() as db:
            insert_audit(db, kind, repo, pr, head_sha, at=time.time(), **fields)

    def audit_log(self, repo: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM audit"
        params: list[Any] = []
        if repo is not None:
            sql += " WHERE repo = ?"
            params.append(repo)
        sql += " ORDER BY id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [dict(r) for r in self.db.connection().execute(sql, params).fetchall()]


def insert_audit(db: Connection, kind: str, repo: str | None, pr: int | None, head_sha: str | None, *,
                 at: float, conclusion: str | None = None, actor: str | None = None, reason: str | None = None,
                 policy_sha256: str | None = None, evidence_sha256: str | None = None,
                 check_run_id: int | None = None, delivery_id: str | None = None) -> None:
    """An audit row, inside the caller's transaction: it commits with the change it records, or not at all."""
    db.execute(
        "INSERT INTO audit (at, kind, repo, pr, head_sha, conclusion, actor, reason, policy_sha256,"
        " evidence_sha256, check_run_id, delivery_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (at, kind, repo, pr, head_sha, conclusion, actor, reason, policy_sha256, evidence_sha256,
         check_run_id, delivery_id),
    )
