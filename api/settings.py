"""Settings: read once from `TALLY_*` environment variables, typed, secrets masked."""

from __future__ import annotations

from typing import Literal, NamedTuple
from urllib.parse import unquote, urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.proxies import parse_networks
from ingest.storage.factory import DEFAULT_DATABASE, describe


class SettingsError(Exception):
    """Raised by `load_settings` when a required setting is missing or malformed."""


class MailServer(NamedTuple):
    """An SMTP server (`TALLY_SMTP_URL`): `tls` for smtps:// (TLS from the start)."""

    host: str
    port: int
    tls: bool
    user: str | None
    password: str | None


def mail_server(url: str) -> MailServer:
    """`smtp://[user:password@]host[:port]` or `smtps://...`; ValueError naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in ("smtp", "smtps"):
        raise ValueError("must be smtp://host:port or smtps://host:port")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has a port that is not a number from 1 to 65535") from None
    if not parts.hostname:
        raise ValueError("names no host (smtp://host:port)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("must be only smtp[s]://[user:password@]host:port")
    tls = parts.scheme == "smtps"
    user = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    return MailServer(parts.hostname, port or (465 if tls else 25), tls, user, password)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TALLY_", frozen=True, extra="ignore")

    database: str = DEFAULT_DATABASE
    base_url: str = "http://127.0.0.1:8000"
    operator_token: SecretStr = Field(min_length=16)
    stripe_webhook_secrets: SecretStr = SecretStr("")
    stripe_tolerance_seconds: int = Field(default=300, ge=1, le=86400)
    reconcile_interval_seconds: int = Field(default=60, ge=0)
    # The page cache of the key index (ingest/storage/duckdb/keys.py), in MiB: what the hot path
    # keeps in memory.
    key_cache_mb: int = Field(default=64, ge=1, le=65536)
    # The database's own memory limit, in MiB (the embedded engine's buffer pool and operators).
    database_memory_mb: int = Field(default=512, ge=64, le=1048576)
    # PostgreSQL only: where this replica keeps the reconciler's working copy of the log (a
    # DuckDB file, derived and disposable); empty: a temporary directory of the process.
    engine_dir: str = ""
    # PostgreSQL only: how many partitions the programs are reconciled in (ingest/storage/
    # partitions.py), each taken by whichever replica is free; every replica must say the same.
    reconcile_partitions: int = Field(default=1, ge=1, le=64)
    # PostgreSQL only: how many program keys a replica keeps in memory for the track endpoints
    # (each group commit reads its keys again, so a revoked key is refused at once); 0: none.
    credential_cache: int = Field(default=4096, ge=0, le=1_000_000)
    public_rate_per_second: float = Field(default=20.0, ge=0)
    public_rate_burst: int = Field(default=100, ge=1)
    # Refusals of unverified calls (bad signature, no valid key, a public call not taken) per
    # client: each leaves a tracking-log note, so a flood of them is cut off (api/refusals.py).
    refusal_rate_per_second: float = Field(default=1.0, ge=0)
    refusal_rate_burst: int = Field(default=60, ge=1)
    # Peers (addresses or networks) whose X-Forwarded-For is believed; none by default.
    trusted_proxies: str = ""
    # Slow clients: a request's headers, each pause inside its body, and its whole body (a body
    # trickled a byte at a time never pauses long) may take this long.
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=600)
    body_total_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    # Observability (docs/observability.md): log lines as text or JSON, their level, and whether
    # GET /metrics answers without the operator token.
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    metrics_public: bool = False
    # Webhooks to brand servers (CONTRACT section 13): `http://` URLs and private, loopback and
    # link-local addresses allowed (development and tests only); and whether this process runs a
    # delivery worker (any replica may; each delivery is leased in the database).
    webhooks_allow_private: bool = False
    webhooks_delivery: bool = True
    # Mail (CONTRACT 14): where partners' sign-in links are sent from, `smtp://host:port` (STARTTLS
    # when the server offers it) or `smtps://host:port` (TLS), with `user:password@` when the
    # server wants a login; empty: no mail is sent. A secret: it may hold a password.
    smtp_url: SecretStr = SecretStr("")
    mail_from: str = ""

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

    @field_validator("database")
    @classmethod
    def _database(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a file path or a postgresql:// URL")
        return value

    @field_validator("log_format", mode="before")
    @classmethod
    def _log_format(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _log_level(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("trusted_proxies")
    @classmethod
    def _trusted_proxies(cls, value: str) -> str:
        return ",".join(str(network) for network in parse_networks(value))

    @field_validator("smtp_url")
    @classmethod
    def _smtp_url(cls, value: SecretStr) -> SecretStr:
        raw = value.get_secret_value().strip()
        if raw:
            mail_server(raw)  # ValueError names what is wrong, never the password
        return SecretStr(raw)

    @field_validator("mail_from")
    @classmethod
    def _mail_from(cls, value: str) -> str:
        value = value.strip()
        if value and (value.count("@") != 1 or any(c.isspace() or ord(c) < 32 for c in value)):
            raise ValueError("must be an email address, like partners@brand.test")
        return value

    @model_validator(mode="after")
    def _mail_together(self) -> Settings:
        if bool(self.smtp_url.get_secret_value()) != bool(self.mail_from):
            raise ValueError("TALLY_SMTP_URL and TALLY_MAIL_FROM go together: set both or neither")
        return self

    @property
    def mail(self) -> MailServer | None:
        """Where mail goes, or None when the server sends none."""
        raw = self.smtp_url.get_secret_value()
        return mail_server(raw) if raw else None

    @property
    def database_name(self) -> str:
        """The database as messages show it (a URL without its password)."""
        return describe(self.database)

    def webhook_secrets(self) -> list[str]:
        raw = self.stripe_webhook_secrets.get_secret_value()
        return [s.strip() for s in raw.split(",") if s.strip()]

    def doc_url(self, code: str) -> str:
        return f"{self.base_url}/docs/errors#{code}"


def load_settings(**overrides: object) -> Settings:
    """Read the environment (plus `overrides`); raise `SettingsError` with one clear line each."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if err["loc"]:
                name = "TALLY_" + "_".join(str(p) for p in err["loc"]).upper()
                problems.append(f"{name}: {err['msg']}")
            else:  # a rule on several settings: its message names them
                problems.append(str(err["msg"]).removeprefix("Value error, "))
        raise SettingsError("; ".join(problems)) from None
