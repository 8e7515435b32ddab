"""`gatekeeper audit`: list the App's decisions and overrides from its database (SQLite or PostgreSQL)."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from gatekeeper.errors import InputError

COLUMNS = ("at", "kind", "repo", "pr", "head_sha", "conclusion", "actor", "reason", "policy_sha256",
           "evidence_sha256", "check_run_id", "delivery_id")


def register(subparsers) -> None:
    parser = subparsers.add_parser("audit", help="list the App's audit log (decisions and overrides)")
    parser.add_argument("--db", help="SQLite file or postgresql:// URL (default: $GATEKEEPER_DB or "
                                     "./gatekeeper.sqlite3)")
    parser.add_argument("--repo", help="only this repository (owner/name)")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--limit", type=int, help="at most this many entries (oldest first)")
    parser.set_defaults(func=_run)


def _run(args) -> int:
    from gatekeeper.github.config import AppConfig
    from gatekeeper.github.db import is_postgres, open_database, redact
    from gatekeeper.github.records import Records

    where = args.db or os.environ.get("GATEKEEPER_DB") or AppConfig.model_fields["db_path"].default
    if not is_postgres(where) and not Path(where).is_file():
        raise InputError(where, "no gatekeeper database here (pass --db or set GATEKEEPER_DB)")
    db = open_database(where)  # InputError for a server that cannot be reached
    try:
        entries = Records(db).audit_log(repo=args.repo, limit=args.limit)
    except db.Error as exc:
        raise InputError(redact(where), f"not a gatekeeper database: {exc}") from None
    finally:
        db.close()
    for entry in entries:
        entry["at"] = datetime.fromtimestamp(entry["at"], timezone.utc).isoformat(timespec="seconds")
    if args.format == "json":
        json.dump([{k: e[k] for k in COLUMNS} for e in entries], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    _print_table(entries)
    return 0


def _print_table(entries: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"gatekeeper audit log ({len(entries)} entries)")
    for column in ("at", "kind", "repo", "pr", "head", "conclusion", "actor", "reason", "policy", "evidence"):
        table.add_column(column, overflow="fold")
    for e in entries:
        table.add_row(e["at"], e["kind"], e["repo"] or "", str(e["pr"] or ""), (e["head_sha"] or "")[:12],
                      e["conclusion"] or "", e["actor"] or "", e["reason"] or "", (e["policy_sha256"] or "")[:12],
                      (e["evidence_sha256"] or "")[:12])
    Console().print(table)
