"""Settings: every ``KL_*`` environment variable, read once at process start.

This is the only module that reads the environment for the service. ``Settings.from_env()`` is
called by ``create_app``, the worker and ``kl``; everything else receives the frozen object.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path

from app.domain.throttle import parse_networks
from app.errors import ConfigError


class AuthMode(StrEnum):
    OPEN = "open"
    STATIC = "static"
    DATABASE = "database"


DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MIN_SECRET_LENGTH = 32


@dataclass(frozen=True, slots=True)
class Settings:
    """The service's configuration. Field docs live in docs/configuration.md (a test checks)."""

    database_url: str | None = None
    redis_url: str | None = None
    data_dir: Path | None = None
    auth_mode: AuthMode = AuthMode.OPEN
    auth_token: str | None = field(default=None, repr=False)
    control_token: str | None = field(default=None, repr=False)
    terraform_bin: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    auto_migrate: bool = True
    db_pool_size: int = 10
    log_level: str = "INFO"
    public_url: str | None = None
    allow_open_on_network: bool = False
    max_wait_seconds: int = 300
    wait_ticket_seconds: int = 10
    max_globs_per_request: int = 1000
    max_globs_per_run: int = 5000
    session_secret: str | None = field(default=None, repr=False)
    log_format: str = "text"
    metrics_token: str | None = field(default=None, repr=False)
    # The GitHub bot (docs/github.md).
    github_webhook_secret: str | None = field(default=None, repr=False)
    github_app_id: str | None = None
    github_private_key: str | None = field(default=None, repr=False)
    github_token: str | None = field(default=None, repr=False)
    github_api_url: str = "https://api.github.com"
    github_clone_urls: tuple[tuple[str, str], ...] = ()
    bot_token: str | None = field(default=None, repr=False)
    repo_cache_dir: Path | None = None
    job_timeout: int = 3600
    webhook_max_bytes: int = 25 * 1024 * 1024
    # Hostile clients (docs/auth.md, docs/http-backend.md).
    auth_failure_limit: int = 10
    auth_failure_window: int = 60
    trusted_proxies: tuple[str, ...] = ()
    large_body_bytes: int = 16 * 1024 * 1024
    max_large_bodies: int = 2
    # Retention of old versions' raw bytes (docs/data-model.md); 0 switches a rule off.
    retain_versions: int = 0
    retain_days: int = 0
    prune_interval_seconds: int = 3600

    @property
    def github_enabled(self) -> bool:
        return bool(self.github_app_id or self.github_token)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``KL_*`` variables; raise ConfigError listing every problem."""
        env = os.environ if env is None else env
        problems: list[str] = []

        def text(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        def integer(name: str, default: int, minimum: int = 1) -> int:
            raw = text(name)
            if raw is None:
                return default
            try:
                value = int(raw)
            except ValueError:
                problems.append(f"{name} must be a whole number, got {raw!r}")
                return default
            if value < minimum:
                problems.append(f"{name} must be at least {minimum}, got {value}")
            return value

        def boolean(name: str, default: bool) -> bool:
            raw = text(name)
            if raw is None:
                return default
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            problems.append(f"{name} must be true or false, got {raw!r}")
            return default

        mode_raw = (text("KL_AUTH_MODE") or AuthMode.OPEN.value).lower()
        try:
            auth_mode = AuthMode(mode_raw)
        except ValueError:
            problems.append(f"KL_AUTH_MODE must be one of open, static, database; got {mode_raw!r}")
            auth_mode = AuthMode.OPEN
        auth_token = text("KL_AUTH_TOKEN")
        if auth_mode is AuthMode.STATIC and auth_token is None:
            problems.append("KL_AUTH_TOKEN is required when KL_AUTH_MODE=static")
        control_token = text("KL_CONTROL_TOKEN")
        if auth_mode is AuthMode.DATABASE and control_token is None:
            problems.append("KL_CONTROL_TOKEN is required when KL_AUTH_MODE=database (it guards /v1/api)")
        session_secret = text("KL_SESSION_SECRET")
        if session_secret is not None and len(session_secret) < MIN_SECRET_LENGTH:
            problems.append(f"KL_SESSION_SECRET must be at least {MIN_SECRET_LENGTH} characters")
        log_format = (text("KL_LOG_FORMAT") or "text").lower()
        if log_format not in LOG_FORMATS:
            problems.append(f"KL_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}; got {log_format!r}")
        log_level = (text("KL_LOG_LEVEL") or "INFO").upper()
        if log_level == "WARN":
            log_level = "WARNING"
        if log_level not in LOG_LEVELS:
            problems.append(f"KL_LOG_LEVEL must be one of {', '.join(LOG_LEVELS)} (any case); "
                            f"got {log_level.lower()!r}")
            log_level = "INFO"
        data_dir = text("KL_DATA_DIR")
        private_key = text("KL_GITHUB_PRIVATE_KEY")
        if private_key and "-----BEGIN" not in private_key:
            key_path = Path(private_key).expanduser()
            try:
                private_key = key_path.read_text()
            except OSError as exc:
                problems.append(f"KL_GITHUB_PRIVATE_KEY is neither PEM text nor a readable file ({exc.strerror})")
        app_id = text("KL_GITHUB_APP_ID")
        if app_id and not private_key:
            problems.append("KL_GITHUB_PRIVATE_KEY is required with KL_GITHUB_APP_ID")
        clone_urls: list[tuple[str, str]] = []
        for item in (text("KL_GITHUB_CLONE_URLS") or "").split(","):
            if not item.strip():
                continue
            repo, sep, url = item.strip().partition("=")
            if not sep or "/" not in repo or not url:
                problems.append(f"KL_GITHUB_CLONE_URLS entries are owner/repo=URL; got {item.strip()!r}")
                continue
            clone_urls.append((repo.strip(), url.strip()))
        cache_dir = text("KL_REPO_CACHE_DIR")
        proxies = tuple(p.strip() for p in (text("KL_TRUSTED_PROXIES") or "").split(",") if p.strip())
        try:
            parse_networks(proxies)
        except ValueError as exc:
            problems.append(f"KL_TRUSTED_PROXIES: {exc}; list proxy addresses or CIDR networks, comma-separated")
        settings = cls(
            database_url=text("KL_DATABASE_URL"),
            redis_url=text("KL_REDIS_URL"),
            data_dir=Path(data_dir).expanduser() if data_dir else None,
            auth_mode=auth_mode,
            auth_token=auth_token,
            control_token=control_token,
            terraform_bin=text("KL_TERRAFORM_BIN"),
            max_body_bytes=integer("KL_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
            auto_migrate=boolean("KL_AUTO_MIGRATE", True),
            db_pool_size=integer("KL_DB_POOL_SIZE", 10),
            log_level=log_level,
            public_url=text("KL_PUBLIC_URL"),
            allow_open_on_network=boolean("KL_ALLOW_OPEN_ON_NETWORK", False),
            max_wait_seconds=integer("KL_MAX_WAIT_SECONDS", 300, minimum=0),
            wait_ticket_seconds=integer("KL_WAIT_TICKET_SECONDS", 10, minimum=2),
            max_globs_per_request=integer("KL_MAX_GLOBS_PER_REQUEST", 1000, minimum=1),
            max_globs_per_run=integer("KL_MAX_GLOBS_PER_RUN", 5000, minimum=1),
            session_secret=session_secret,
            log_format=log_format,
            metrics_token=text("KL_METRICS_TOKEN"),
            github_webhook_secret=text("KL_GITHUB_WEBHOOK_SECRET"),
            github_app_id=app_id,
            github_private_key=private_key,
            github_token=text("KL_GITHUB_TOKEN"),
            github_api_url=(text("KL_GITHUB_API_URL") or "https://api.github.com").rstrip("/"),
            github_clone_urls=tuple(clone_urls),
            bot_token=text("KL_BOT_TOKEN"),
            repo_cache_dir=Path(cache_dir).expanduser() if cache_dir else None,
            job_timeout=integer("KL_JOB_TIMEOUT", 3600, minimum=10),
            webhook_max_bytes=integer("KL_WEBHOOK_MAX_BYTES", 25 * 1024 * 1024),
            auth_failure_limit=integer("KL_AUTH_FAILURE_LIMIT", 10),
            auth_failure_window=integer("KL_AUTH_FAILURE_WINDOW", 60),
            trusted_proxies=proxies,
            large_body_bytes=integer("KL_LARGE_BODY_BYTES", 16 * 1024 * 1024),
            max_large_bodies=integer("KL_MAX_LARGE_BODIES", 2),
            retain_versions=integer("KL_RETAIN_VERSIONS", 0, minimum=0),
            retain_days=integer("KL_RETAIN_DAYS", 0, minimum=0),
            prune_interval_seconds=integer("KL_PRUNE_INTERVAL_SECONDS", 3600, minimum=0),
        )
        if problems:
            raise ConfigError(problems)
        return settings


def setting_names() -> tuple[str, ...]:
    """The environment variable behind each Settings field (docs are checked against this)."""
    return tuple(f"KL_{f.name.upper()}" for f in fields(Settings))
