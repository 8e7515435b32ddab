"""App configuration: a YAML file, overridden by environment variables. Secrets never appear in repr or logs."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from gatekeeper.errors import InputError
from gatekeeper.github.db import is_postgres

GITHUB_API_URL = "https://api.github.com"

# Environment variable -> config field. The environment wins over the file, so a deployment can keep
# secrets out of the file entirely.
ENV_FIELDS = {
    "GATEKEEPER_WEBHOOK_SECRET": "webhook_secret",
    "GATEKEEPER_APP_ID": "app_id",
    "GATEKEEPER_PRIVATE_KEY_PATH": "private_key_path",
    "GATEKEEPER_DB": "db_path",
    "GATEKEEPER_GITHUB_API_URL": "github_api_url",
    "GATEKEEPER_PUBLIC_URL": "public_url",
}


class AppConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    app_id: int = Field(gt=0)
    private_key_path: Path
    webhook_secret: SecretStr = Field(min_length=1)
    # A SQLite file (one machine), or a postgresql:// URL: several servers on several machines share it.
    db_path: str = "gatekeeper.sqlite3"
    # NORMAL: acknowledged deliveries survive a crash of the server; FULL: also a power loss (slower acks).
    db_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    github_api_url: str = GITHUB_API_URL
    policy_path: str = ".github/gatekeeper.yml"  # read from the PR's base branch, never from its head
    max_body_bytes: int = Field(default=25 * 1024 * 1024, gt=0)  # GitHub caps webhook payloads at 25 MB
    # All bodies being received at once, before their signatures are checked: a flood of forged 25 MB bodies is
    # answered 503 beyond it instead of filling memory (GitHub's own deliveries are mostly a few kB).
    max_inflight_body_bytes: int = Field(default=100 * 1024 * 1024, gt=0)
    workers: int = Field(default=4, ge=1, le=64)
    max_attempts: int = Field(default=5, ge=1)  # per delivery, before it becomes a failed check
    retry_backoff_s: float = Field(default=2.0, ge=0)  # job-level backoff base (doubles per attempt)
    http_retries: int = Field(default=5, ge=0)  # per request: 5xx and rate limits, inside PyGithub
    http_backoff_s: float = Field(default=0.5, ge=0)
    http_timeout_s: int = Field(default=30, gt=0)
    # PyGithub's own pacing, per installation, against GitHub's secondary rate limits (its defaults).
    seconds_between_requests: float = Field(default=0.25, ge=0)
    seconds_between_writes: float = Field(default=1.0, ge=0)
    token_refresh_margin_s: float = Field(default=300.0, ge=0)  # renew installation tokens this early
    reconcile_interval_s: float = Field(default=900.0, ge=0)  # 0 disables the periodic sweep
    sticky_comment: bool = False  # also keep one PR comment with the summary, updated in place
    evidence_artifact: str = "gatekeeper-evidence"  # artifact name uploaded by the gatekeeper action
    # The only workflow files whose artifacts count as evidence: the collector's output is labelled trusted,
    # so it must come from a workflow the PR cannot edit (a required workflow; see docs/evidence.md).
    evidence_workflows: tuple[str, ...] = (".github/workflows/gatekeeper.yml",)
    max_artifact_bytes: int = Field(default=50 * 1024 * 1024, gt=0)
    # A claimed delivery is leased for this long and the lease renewed while it runs, so several servers can
    # share one database: a job whose server died is taken over by another once its lease has run out.
    job_lease_s: float = Field(default=60.0, gt=0)
    # How long /healthz trusts its last "does GitHub accept the App's JWT" answer; 0 disables the check.
    health_github_check_s: float = Field(default=60.0, ge=0)
    # Where people reach this server (https://gatekeeper.example.com): the check runs' details_url then links
    # each evaluation's details page (/evaluations/<id>). None: no pages are kept and no run links one.
    public_url: str | None = None

    @field_validator("public_url")
    @classmethod
    def _absolute_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise PydanticCustomError("public_url", "must be an absolute http(s) URL without query or fragment, "
                                                    "like https://gatekeeper.example.com")
        return value.rstrip("/")

    @field_validator("db_path", mode="before")
    @classmethod
    def _db_path_or_url(cls, value: object) -> object:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, str) and "://" in value and not is_postgres(value):
            # The value itself is not echoed: a URL may carry a password.
            raise PydanticCustomError("db_url", "a database URL must start with postgresql:// (or give a SQLite "
                                                "file path)")
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _secret_not_blank(cls, value: SecretStr) -> SecretStr:
        # " " passes min_length, and anyone can sign with it: a server that verifies nothing must not start.
        if not value.get_secret_value().strip():
            raise PydanticCustomError("blank_secret", "must not be empty or only whitespace")
        return value

    def private_key(self) -> str:
        """The App's private key (PEM text), parsed once to prove it is one: a bad key stops the server at
        start-up naming the file, instead of failing every GitHub call later with a misleading message."""
        where = str(self.private_key_path)
        try:
            text = self.private_key_path.read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(where, f"cannot read the App private key: {exc}") from None
        try:
            key = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:  # TypeError: encrypted, needs a password
            reason = " ".join(str(exc).split()) or type(exc).__name__
        else:
            if isinstance(key, rsa.RSAPrivateKey):
                return text
            reason = "it is not an RSA key (GitHub App keys are RSA)"
        raise InputError(where, f"the App private key is not a PEM RSA private key: {reason}")


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> AppConfig:
    """Merge the optional YAML file with the environment and validate. Errors name the file or variable."""
    environ = os.environ if environ is None else environ
    data: dict = {}
    source = "environment"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(source, f"cannot read config: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise InputError(source, f"invalid YAML: {exc}", mark.line + 1 if mark else None) from None
        if loaded is not None and not isinstance(loaded, dict):
            raise InputError(source, "the config must be a YAML mapping", 1)
        data = dict(loaded or {})
    for var, field in ENV_FIELDS.items():
        if environ.get(var):
            data[field] = environ[var]
    try:
        return AppConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        env_var = next((v for v, f in ENV_FIELDS.items() if f == field), None)
        hint = f" (set it in the file or {env_var})" if env_var else ""
        # Never echo the input value: it may be the webhook secret.
        raise InputError(source, f"{field}: {first['msg']}{hint}") from None
