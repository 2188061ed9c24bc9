"""Settings: every ``KL_*`` variable of the service, read once at process start from one table.

This is the only module that reads the environment for the service. ``Settings.from_env()`` is
called by ``create_app``, the worker and ``kl``; everything else receives the frozen object. Each
variable is one row of :data:`TABLE` (its field, parser and doc; the default is the field's own, written
once on :class:`Settings`); ``docs/configuration.md`` is checked against the table both ways. The ``kl``
client's own variables are ``runner.core.config``'s table.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path

from app import envtable
from app.domain.manual_holds import (
    DEFAULT_HOLD_SECONDS,
    DEFAULT_MAX_HOLDS_PER_STATE,
    DEFAULT_MAX_HOLDS_PER_TOKEN,
    MAX_HOLD_SECONDS,
    MIN_HOLD_SECONDS,
    HoldPolicy,
)
from app.domain.repositories import parse_patterns
from app.domain.reservations import DEFAULT_MAX_GLOBS_PER_REQUEST, DEFAULT_MAX_GLOBS_PER_RUN
from app.domain.throttle import parse_networks
from app.envtable import Setting, bind, boolean, comma_list, one_of, read_table, text, url, whole
from app.errors import ConfigError


class AuthMode(StrEnum):
    OPEN = "open"
    STATIC = "static"
    DATABASE = "database"


DEFAULT_MAX_BODY_BYTES = 256 * 1024 * 1024
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MIN_SECRET_LENGTH = 32
GITHUB_API_URL = "https://api.github.com"


def resolve_data_dir(configured: Path | None) -> Path:
    """The data directory: ``KL_DATA_DIR`` as configured, else the per-user data folder."""
    if configured is not None:
        return configured
    from app.embedded import default_data_dir  # platformdirs, only when needed

    return default_data_dir()


@dataclass(frozen=True, slots=True)
class BotProjectToken:
    """One entry of ``KL_BOT_PROJECT_TOKENS``: the engine token the bot presents for ``project`` of ``repo``
    (``*``: every project of the repository without an entry of its own). The token stays out of ``repr``."""

    repo: str
    project: str
    token: str = field(repr=False)

    @property
    def key(self) -> str:
        """The entry as the operator wrote it (what errors and logs name; never the token)."""
        return self.repo if self.project == "*" else f"{self.repo}:{self.project}"


@dataclass(frozen=True, slots=True)
class Settings:
    """The service's configuration. Field docs live in docs/configuration.md (a test checks)."""

    database_url: str | None = None
    redis_url: str | None = None
    data_dir: Path | None = None
    auth_mode: AuthMode = AuthMode.OPEN
    auth_token: str | None = field(default=None, repr=False)
    control_token: str | None = field(default=None, repr=False)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    auto_migrate: bool = True
    db_pool_size: int = 10
    log_level: str = "INFO"
    public_url: str | None = None
    allow_open_on_network: bool = False
    max_wait_seconds: int = 300
    wait_ticket_seconds: int = 10
    max_globs_per_request: int = DEFAULT_MAX_GLOBS_PER_REQUEST
    max_globs_per_run: int = DEFAULT_MAX_GLOBS_PER_RUN
    # Manual holds (docs/reservations.md, "Manual holds").
    max_holds_per_token: int = DEFAULT_MAX_HOLDS_PER_TOKEN
    max_holds_per_state: int = DEFAULT_MAX_HOLDS_PER_STATE
    hold_default_seconds: int = DEFAULT_HOLD_SECONDS
    hold_max_seconds: int = MAX_HOLD_SECONDS
    hold_until_released: tuple[str, ...] = ()
    session_secret: str | None = field(default=None, repr=False)
    log_format: str = "text"
    metrics_token: str | None = field(default=None, repr=False)
    # The GitHub bot (docs/github.md).
    github_webhook_secret: str | None = field(default=None, repr=False)
    github_app_id: str | None = None
    github_private_key: str | None = field(default=None, repr=False)
    github_token: str | None = field(default=None, repr=False)
    github_api_url: str = GITHUB_API_URL
    github_clone_urls: tuple[tuple[str, str], ...] = ()
    # Repositories the bot serves, and those whose untrusted pull requests get credential-free previews.
    github_repositories: tuple[str, ...] = ()
    github_untrusted_previews: tuple[str, ...] = ()
    bot_token: str | None = field(default=None, repr=False)
    bot_project_tokens: tuple[BotProjectToken, ...] = field(default=(), repr=False)
    repo_cache_dir: Path | None = None
    job_timeout: int = 3600
    webhook_max_bytes: int = 25 * 1024 * 1024
    # Hostile clients (docs/auth.md, docs/http-backend.md).
    auth_failure_limit: int = 10
    auth_failure_window: int = 60
    trusted_proxies: tuple[str, ...] = ()
    large_body_bytes: int = 16 * 1024 * 1024
    max_large_bodies: int = 2
    # A whole-state POST this large gets a splice base built in the background (app.store.splicebase); 0: never.
    splice_base_bytes: int = 8 * 1024 * 1024
    # Retention of old versions' raw bytes (docs/data-model.md); 0 switches a rule off.
    retain_versions: int = 0
    retain_days: int = 0
    prune_interval_seconds: int = 3600
    # Outgoing events (docs/events.md).
    event_retry_seconds: tuple[int, ...] = (10, 60, 300, 1800, 7200)
    event_poll_seconds: int = 5
    event_timeout_seconds: int = 10

    @property
    def hold_policy(self) -> HoldPolicy:
        return HoldPolicy(default_seconds=self.hold_default_seconds, max_seconds=self.hold_max_seconds,
                          max_per_token=self.max_holds_per_token, max_per_state=self.max_holds_per_state,
                          until_released=self.hold_until_released)

    @property
    def github_enabled(self) -> bool:
        return bool(self.github_app_id or self.github_token)

    def secret_values(self) -> tuple[str, ...]:
        """The configured secrets (every field kept out of ``repr``, and the database and Redis URLs), for
        redaction of what leaves the process (``app.domain.redaction``)."""
        values = [getattr(self, f.name) for f in fields(self) if not f.repr]
        values += [entry.token for entry in self.bot_project_tokens]
        values += [self.database_url, self.redis_url]
        return tuple(v for v in values if isinstance(v, str) and v)

    @property
    def data_root(self) -> Path:
        """KL_DATA_DIR, else the per-user data folder: where embedded servers and kl keep their data."""
        return resolve_data_dir(self.data_dir)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Build settings from ``KL_*`` variables (:data:`TABLE`); raise ConfigError listing every problem."""
        values, problems = read_table(TABLE, os.environ if env is None else env)
        settings = cls(**values)
        refused = {problem.split(" ", 1)[0] for problem in problems}
        problems.extend(message for missing, variable, message in _REQUIRED
                        if missing(settings) and variable not in refused)
        if problems:
            raise ConfigError(problems)
        return settings


def _auth_mode(raw: str) -> AuthMode:
    return AuthMode(one_of(tuple(AuthMode))(raw))


def _session_secret(raw: str) -> str:
    value = raw.strip()
    if len(value) < MIN_SECRET_LENGTH:
        raise ValueError(f"must be at least {MIN_SECRET_LENGTH} characters")
    return value


def _private_key(raw: str) -> str:
    """PEM text as given, or the text of the file it names."""
    value = raw.strip()
    if "-----BEGIN" in value:
        return value
    try:
        return Path(value).expanduser().read_text()
    except OSError as exc:
        raise ValueError(f"is neither PEM text nor a readable file ({exc.strerror})") from None


def _clone_urls(raw: str) -> tuple[tuple[str, str], ...]:
    found: list[tuple[str, str]] = []
    bad: list[str] = []
    for item in comma_list(raw):
        repo, sep, target = item.partition("=")
        if not sep or "/" not in repo or not target:
            bad.append(f"entries are owner/repo=URL; got {item!r}")
        else:
            found.append((repo.strip(), target.strip()))
    if bad:
        raise ValueError(*bad)
    return tuple(found)


MAX_BOT_PROJECT_TOKENS = 10_000
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


class _Pairs(list[tuple[str, object]]):
    """A JSON object's members in file order, duplicates kept (``json.loads``' ``object_pairs_hook``)."""


def _bot_project_tokens(raw: str) -> tuple[BotProjectToken, ...]:
    """The JSON file ``raw`` names: an object of ``"owner/repo:project"`` (or ``"owner/repo"``, every project of
    it) to a token. Every problem names its entry, never a token."""
    path = Path(raw.strip()).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        raise ValueError(f"names {str(path)!r}, which cannot be read ({reason})") from None
    try:
        document = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as exc:
        raise ValueError(f"file {str(path)!r} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    if not isinstance(document, _Pairs):
        raise ValueError(f"file {str(path)!r} must hold a JSON object of \"owner/repo:project\": \"TOKEN\" entries")
    if len(document) > MAX_BOT_PROJECT_TOKENS:
        raise ValueError(f"file {str(path)!r} has {len(document)} entries; at most {MAX_BOT_PROJECT_TOKENS}")
    found: dict[tuple[str, str], BotProjectToken] = {}
    bad: list[str] = []
    for key, token in document:
        repo, sep, project = key.strip().partition(":")
        entry = BotProjectToken(repo.strip(), project.strip() or "*", token if isinstance(token, str) else "")
        if not _REPO.fullmatch(entry.repo) or ":" in project or (sep and not project.strip()):
            bad.append(f"entry {key!r}: the key must be owner/repo:project, or owner/repo for every project of it")
        elif not isinstance(token, str) or not token.strip() or token != token.strip() or any(
                c.isspace() for c in token):
            bad.append(f"entry {key!r}: the value must be the token's secret, one word of text")
        elif (entry.repo.lower(), entry.project) in found:
            bad.append(f"entry {key!r} is given twice (repository names are compared without case)")
        else:
            found[(entry.repo.lower(), entry.project)] = entry
    if bad:
        raise ValueError(*bad)
    return tuple(found.values())


def _repositories(raw: str) -> tuple[str, ...]:
    return parse_patterns(comma_list(raw))


def _proxies(raw: str) -> tuple[str, ...]:
    proxies = comma_list(raw)
    try:
        parse_networks(proxies)
    except ValueError as exc:
        raise ValueError(f"must list proxy addresses or CIDR networks, comma-separated: {exc}") from None
    return proxies


def _seconds_list(raw: str) -> tuple[int, ...]:
    values = tuple(whole(0)(item) for item in comma_list(raw))
    if not values or len(values) > 20:
        raise ValueError("must list 1 to 20 whole numbers of seconds")
    return values


DATA_DIR = Setting("data_dir", "KL_DATA_DIR", envtable.path, "where embedded servers and kl keep their data",
                   shown="the per-user data folder")

TABLE: tuple[Setting, ...] = bind(Settings, (
    Setting("database_url", "KL_DATABASE_URL", text, "libpq URL of Postgres; unset: embedded Postgres"),
    Setting("redis_url", "KL_REDIS_URL", text, "Redis for background jobs; unset: embedded Redis"),
    DATA_DIR,
    Setting("auth_mode", "KL_AUTH_MODE", _auth_mode, "open, static or database authentication"),
    Setting("auth_token", "KL_AUTH_TOKEN", text, "the shared token of static mode", shown="none"),
    Setting("control_token", "KL_CONTROL_TOKEN", text, "the operator's token for /v1/api", shown="none"),
    Setting("max_body_bytes", "KL_MAX_BODY_BYTES", whole(), "largest request body"),
    Setting("auto_migrate", "KL_AUTO_MIGRATE", boolean, "apply pending migrations at start"),
    Setting("db_pool_size", "KL_DB_POOL_SIZE", whole(), "Postgres connections per process"),
    Setting("log_level", "KL_LOG_LEVEL", one_of(LOG_LEVELS, upper=True, aliases={"WARN": "WARNING"},
                                                note=" (any case)"), "Python logging level"),
    Setting("public_url", "KL_PUBLIC_URL", text, "the URL clients reach the service at"),
    Setting("allow_open_on_network", "KL_ALLOW_OPEN_ON_NETWORK", boolean,
            "open mode answers clients beyond this machine"),
    Setting("max_wait_seconds", "KL_MAX_WAIT_SECONDS", whole(0), "longest a reservation request queues"),
    Setting("wait_ticket_seconds", "KL_WAIT_TICKET_SECONDS", whole(2),
            "how long a queue ticket keeps its place unpresented"),
    Setting("max_globs_per_request", "KL_MAX_GLOBS_PER_REQUEST", whole(), "most globs one request names"),
    Setting("max_globs_per_run", "KL_MAX_GLOBS_PER_RUN", whole(), "most globs one apply run holds"),
    Setting("max_holds_per_token", "KL_MAX_HOLDS_PER_TOKEN", whole(), "most live manual holds one token has"),
    Setting("max_holds_per_state", "KL_MAX_HOLDS_PER_STATE", whole(), "most live manual holds on one state"),
    Setting("hold_default_seconds", "KL_HOLD_DEFAULT_SECONDS", whole(MIN_HOLD_SECONDS),
            "how long a manual hold lasts without --until"),
    Setting("hold_max_seconds", "KL_HOLD_MAX_SECONDS", whole(MIN_HOLD_SECONDS),
            "the longest --until a manual hold may ask for"),
    Setting("hold_until_released", "KL_HOLD_UNTIL_RELEASED", comma_list,
            "token names that may take manual holds without expiry (--until-released); * for every caller",
            shown="unset: nobody"),
    Setting("session_secret", "KL_SESSION_SECRET", _session_secret, "signs the dashboard's sessions"),
    Setting("log_format", "KL_LOG_FORMAT", one_of(LOG_FORMATS), "text or json log lines"),
    Setting("metrics_token", "KL_METRICS_TOKEN", text, "the bearer token /metrics requires"),
    Setting("github_webhook_secret", "KL_GITHUB_WEBHOOK_SECRET", text, "the GitHub webhook's secret"),
    Setting("github_app_id", "KL_GITHUB_APP_ID", text, "the GitHub App's numeric id"),
    Setting("github_private_key", "KL_GITHUB_PRIVATE_KEY", _private_key,
            "the GitHub App's private key, PEM text or a file", shown="none"),
    Setting("github_token", "KL_GITHUB_TOKEN", text, "a personal GitHub token, without an App"),
    Setting("github_api_url", "KL_GITHUB_API_URL", url, "base URL of GitHub's REST API"),
    Setting("github_clone_urls", "KL_GITHUB_CLONE_URLS", _clone_urls,
            "owner/repo=URL pairs overriding where repositories are cloned from"),
    Setting("github_repositories", "KL_GITHUB_REPOSITORIES", _repositories,
            "owner/name, owner/* or * patterns of the repositories the bot serves",
            shown="unset: every delivery is acknowledged and ignored"),
    Setting("github_untrusted_previews", "KL_GITHUB_UNTRUSTED_PREVIEWS", _repositories,
            "repositories whose fork and outside pull requests get credential-free plan previews", shown="unset"),
    Setting("bot_token", "KL_BOT_TOKEN", text, "the token the bot's jobs present to the engine lane"),
    Setting("bot_project_tokens", "KL_BOT_PROJECT_TOKENS", _bot_project_tokens,
            "a JSON file of owner/repo:project to the bot's token for that project", shown="unset: `KL_BOT_TOKEN` "
            "for every project"),
    Setting("repo_cache_dir", "KL_REPO_CACHE_DIR", envtable.path, "where workers keep repository mirrors",
            shown="`KL_DATA_DIR/repos`"),
    Setting("job_timeout", "KL_JOB_TIMEOUT", whole(10), "seconds a bot job may run"),
    Setting("webhook_max_bytes", "KL_WEBHOOK_MAX_BYTES", whole(), "largest webhook body"),
    Setting("auth_failure_limit", "KL_AUTH_FAILURE_LIMIT", whole(), "failed authentications per window"),
    Setting("auth_failure_window", "KL_AUTH_FAILURE_WINDOW", whole(), "that window, in seconds"),
    Setting("trusted_proxies", "KL_TRUSTED_PROXIES", _proxies, "reverse proxies whose X-Forwarded-For counts"),
    Setting("large_body_bytes", "KL_LARGE_BODY_BYTES", whole(), "the size of a large body"),
    Setting("max_large_bodies", "KL_MAX_LARGE_BODIES", whole(), "large bodies read at once per process"),
    Setting("splice_base_bytes", "KL_SPLICE_BASE_BYTES", whole(0),
            "POSTed states this large get a splice base built in the background"),
    Setting("retain_versions", "KL_RETAIN_VERSIONS", whole(0), "keep the raw bytes of the newest N versions"),
    Setting("retain_days", "KL_RETAIN_DAYS", whole(0), "keep the raw bytes of versions younger than N days"),
    Setting("prune_interval_seconds", "KL_PRUNE_INTERVAL_SECONDS", whole(0), "how often retention runs"),
    Setting("event_retry_seconds", "KL_EVENT_RETRY_SECONDS", _seconds_list,
            "waits between an event's delivery attempts", shown="`10,60,300,1800,7200`"),
    Setting("event_poll_seconds", "KL_EVENT_POLL_SECONDS", whole(1), "how often workers look for new events"),
    Setting("event_timeout_seconds", "KL_EVENT_TIMEOUT_SECONDS", whole(1), "seconds one event delivery may take"),
))

# Rules over several settings, checked once the table is read: (is it missing?, the variable, what to say).
# A variable whose own value was refused is not reported missing as well.
_REQUIRED: tuple[tuple[Callable[[Settings], bool], str, str], ...] = (
    (lambda s: s.auth_mode is AuthMode.STATIC and s.auth_token is None, "KL_AUTH_TOKEN",
     "KL_AUTH_TOKEN is required when KL_AUTH_MODE=static"),
    (lambda s: s.auth_mode is AuthMode.DATABASE and s.control_token is None, "KL_CONTROL_TOKEN",
     "KL_CONTROL_TOKEN is required when KL_AUTH_MODE=database (it guards /v1/api)"),
    (lambda s: bool(s.github_app_id) and not s.github_private_key, "KL_GITHUB_PRIVATE_KEY",
     "KL_GITHUB_PRIVATE_KEY is required with KL_GITHUB_APP_ID"),
)


def setting_names() -> tuple[str, ...]:
    """The environment variable behind each Settings field (docs are checked against this)."""
    return tuple(row.variable for row in TABLE)
