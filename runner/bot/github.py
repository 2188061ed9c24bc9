"""The only GitHub API client (PyGithub): pull requests, the bot's comment, check runs or commit
statuses, collaborator permissions and the token git clones with.

Two modes, chosen from the settings. **App** (``KL_GITHUB_APP_ID`` + ``KL_GITHUB_PRIVATE_KEY``): a
JWT signed with the App's key finds the installation on the repository and exchanges it for an
installation token, cached per process and refreshed five minutes before it expires; results go to
check runs. **Token** (``KL_GITHUB_TOKEN``): a personal token; results go to commit statuses, since
only Apps may create check runs. The API base URL is ``KL_GITHUB_API_URL`` (GHES, tests).

Retries wrap whole operations, not single HTTP requests: 5xx answers and connection errors are
retried with backoff, rate limits (403/429) after ``Retry-After`` or ``X-RateLimit-Reset``, within a
bounded total wait. Because the operation is retried, a POST whose answer was lost cannot create a
duplicate: the retry looks for the comment (by marker) or check run (by name) first. PyGithub's own
urllib3 retry is off, since it re-sends POSTs blindly. This policy (``_Retrying``) is the only one for GitHub
calls: no other module imports PyGithub (a layering test checks). A job that still fails is retried whole by
RQ (``app.queue``), and that retry posts the outcome the first attempt stored.

Used by jobs on workers only: never in a web request. Error messages never include tokens. GitHub's size
limits and its rate-limit headers are read by plain functions in ``runner.bot.github_rules``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import quote

import requests
from github import Auth, Github, GithubException, GithubIntegration, UnknownObjectException
from github.GithubObject import NotSet
from github.Repository import Repository

from app.config import Settings
from app.domain.redaction import Redactor, redact
from runner.bot.github_rules import (
    COMMENT_LIMIT,
    OUTPUT_LIMIT,
    STATUS_DESCRIPTION_LIMIT,
    TITLE_LIMIT,
    first_line,
    is_rate_limited,
    rate_limit_wait,
    shortened,
    truncate,
    with_marker,
)

log = logging.getLogger("kilolock.github")
T = TypeVar("T")

# An installation token lives one hour; refresh well before, so a clone or a long job never holds
# one that expires under it.
TOKEN_REFRESH_BEFORE = timedelta(minutes=5)
MAX_ATTEMPTS = 5
DEFAULT_MAX_WAIT = 120.0  # total seconds one operation may spend waiting for rate limits
REQUEST_TIMEOUT = 30
USER_AGENT = "kilolock-bot"
CHECK_STATUSES = ("queued", "in_progress", "completed")
CONCLUSIONS = ("success", "failure", "neutral", "cancelled", "skipped", "timed_out", "action_required", "stale")
_STATUS_STATE = {"success": "success", "neutral": "success", "skipped": "success", "failure": "failure",
                 "timed_out": "failure", "action_required": "failure", "cancelled": "error", "stale": "error"}


class GitHubError(Exception):
    """A GitHub API call failed for good (after retries). ``status`` is the HTTP status, or None
    when GitHub could not be reached. The message never contains a token."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class PullInfo:
    number: int
    head_sha: str
    head_ref: str
    base_ref: str
    base_sha: str
    merged: bool
    state: str
    author: str
    # None while GitHub is still computing it (it answers the first read of a changed pull request so).
    mergeable: bool | None = None
    mergeable_state: str = "unknown"
    merge_commit_sha: str | None = None
    # The repository the head lives in: this one, a fork's ``owner/name``, or None (the fork was deleted).
    head_repo: str | None = None


@dataclass(frozen=True, slots=True)
class Review:
    """One submitted review: its author, ``APPROVED``/``CHANGES_REQUESTED``/``COMMENTED``/``DISMISSED``, the
    commit it reviewed and when (GitHub lists them oldest first)."""

    login: str
    state: str
    commit_id: str
    submitted_at: str


# --- App installations, shared by every client of this process -----------------------------------


class _Installation:
    """One App installation: its id, the App's slug and its current access token (refreshed
    ``TOKEN_REFRESH_BEFORE`` ahead of expiry). Thread safe; one per installation per process."""

    def __init__(self, integration: GithubIntegration, installation_id: int, app_slug: str) -> None:
        self.integration = integration
        self.installation_id = installation_id
        self.app_slug = app_slug
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expires_at: datetime | None = None

    @property
    def last_token(self) -> str | None:
        """The token handed out last (to scrub it from messages), without refreshing."""
        return self._token

    def token(self, call: Callable[[str, Callable[[], Any]], Any]) -> str:
        with self._lock:
            now = datetime.now(UTC)
            if self._token is None or self._expires_at is None or self._expires_at - TOKEN_REFRESH_BEFORE <= now:
                granted = call("create an installation token",
                               lambda: self.integration.get_access_token(self.installation_id))
                self._token = str(granted.token)
                expires = granted.expires_at
                self._expires_at = expires if expires.tzinfo else expires.replace(tzinfo=UTC)
            return self._token


class _InstallationAuth(Auth.Auth):
    """PyGithub asks its auth for the token on every request; this one answers with the
    installation's current token, refreshing it when due."""

    def __init__(self, installation: _Installation, call: Callable[[str, Callable[[], Any]], Any]) -> None:
        self._installation = installation
        self._call = call

    @property
    def token_type(self) -> str:
        return "token"

    @property
    def token(self) -> str:
        return self._installation.token(self._call)


class _TtlCache:
    """A bounded, thread-safe cache whose answers expire: team memberships change, so a removed member's
    approval stops counting within ``ttl`` seconds."""

    def __init__(self, size: int, ttl: float) -> None:
        self.size, self.ttl = size, ttl
        self._lock = threading.Lock()
        self._items: dict[tuple[str, ...], tuple[float, bool]] = {}

    def get(self, key: tuple[str, ...]) -> bool | None:
        with self._lock:
            found = self._items.get(key)
            if found is None or found[0] <= time.monotonic():
                self._items.pop(key, None)
                return None
            return found[1]

    def put(self, key: tuple[str, ...], value: bool) -> None:
        with self._lock:
            if len(self._items) >= self.size:
                now = time.monotonic()
                for old in [k for k, (t, _) in self._items.items() if t <= now] or [next(iter(self._items))]:
                    self._items.pop(old, None)
            self._items[key] = (time.monotonic() + self.ttl, value)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


MEMBERSHIP_TTL = 60.0
MEMBERSHIP_CACHE = 4096
_MEMBERSHIPS = _TtlCache(MEMBERSHIP_CACHE, MEMBERSHIP_TTL)
_CACHE_LOCK = threading.Lock()
_INTEGRATIONS: dict[tuple[str, str], GithubIntegration] = {}
_INSTALLATIONS: dict[tuple[str, str, str], _Installation] = {}


def forget_cached_installations() -> None:
    """Drop every cached installation, token and team membership (tests; after an App's key was rotated)."""
    with _CACHE_LOCK:
        _INTEGRATIONS.clear()
        _INSTALLATIONS.clear()
    _MEMBERSHIPS.clear()


# --- the client ---------------------------------------------------------------------------------


class GitHub:
    """GitHub access for one repository. Build it with ``GitHub.for_repo(settings, "owner/name")``."""

    def __init__(self, *, repo: str, mode: str, gh: Github, policy: _Retrying, installation: _Installation | None,
                 token: str | None, app_id: str | None, api_url: str = "") -> None:
        self.repo = repo
        self.mode = mode
        self._gh = gh
        self._policy = policy
        self._installation = installation
        self._token = token
        self._app_id = app_id
        self._login: str | None = f"{installation.app_slug}[bot]" if installation is not None else None
        self._default_branch: str | None = None
        self._permissions: dict[str, str] = {}
        self._repository: Repository = gh.get_repo(repo)
        self._api_url = api_url

    @classmethod
    def for_repo(cls, settings: Settings, repo: str, *, sleep: Callable[[float], None] = time.sleep,
                 max_wait: float = DEFAULT_MAX_WAIT, throttle: bool = True) -> GitHub:
        """A client for ``repo``: App mode when an App id and key are configured (finding the App's
        installation on the repository, cached), else token mode. ``throttle`` keeps PyGithub's
        pause between writes (GitHub's secondary rate limits); tests turn it off. Raises GitHubError
        when nothing is configured or the App is not installed on the repository."""
        owner, sep, name = repo.partition("/")
        if not sep or not owner or not name or "/" in name:
            raise GitHubError(f"repository must be owner/name, got {repo!r}")
        pauses: dict[str, Any] = {} if throttle else {"seconds_between_requests": None,
                                                       "seconds_between_writes": None}
        common: dict[str, Any] = {"base_url": settings.github_api_url, "timeout": REQUEST_TIMEOUT,
                                  "user_agent": USER_AGENT, "retry": None, **pauses}
        # The retry policy exists before the client does: installation lookups use it too.
        policy = _Retrying(sleep, max_wait, secrets=settings.secret_values())
        if settings.github_app_id and settings.github_private_key:
            installation = _installation_for(settings, owner, name, policy, common)
            policy.secrets_from = installation
            auth: Auth.Auth = _InstallationAuth(installation, policy.call)
            gh = Github(auth=auth, lazy=True, per_page=100, **common)
            return cls(repo=repo, mode="app", gh=gh, policy=policy, installation=installation, token=None,
                       app_id=str(settings.github_app_id), api_url=settings.github_api_url)
        if settings.github_token:
            gh = Github(auth=Auth.Token(settings.github_token), lazy=True, per_page=100, **common)
            return cls(repo=repo, mode="token", gh=gh, policy=policy, installation=None,
                       token=settings.github_token, app_id=None, api_url=settings.github_api_url)
        raise GitHubError("GitHub access is not configured: set KL_GITHUB_APP_ID and KL_GITHUB_PRIVATE_KEY "
                          "(a GitHub App, recommended) or KL_GITHUB_TOKEN (a personal token)")

    # --- identity -------------------------------------------------------------------------------

    @property
    def login(self) -> str:
        """The bot's own login: ``<app-slug>[bot]`` for an App, the token's user otherwise."""
        if self._login is None:
            self._login = self._policy.call("read the token's user", lambda: str(self._gh.get_user().login))
        return self._login

    def clone_token(self) -> str:
        """A token for git over HTTPS (user ``x-access-token``), valid for at least five minutes."""
        if self._installation is not None:
            return self._installation.token(self._policy.call)
        assert self._token is not None
        return self._token

    # --- reads ----------------------------------------------------------------------------------

    def pull_request(self, number: int) -> PullInfo:
        def once() -> PullInfo:
            pr = self._repository.get_pull(number)
            return PullInfo(number=pr.number, head_sha=pr.head.sha, head_ref=pr.head.ref, base_ref=pr.base.ref,
                            base_sha=pr.base.sha, merged=bool(pr.merged), state=pr.state, author=pr.user.login,
                            mergeable=pr.mergeable, mergeable_state=str(pr.mergeable_state or "unknown"),
                            merge_commit_sha=pr.merge_commit_sha or None,
                            head_repo=pr.head.repo.full_name if pr.head.repo is not None else None)

        return self._policy.call(f"read pull request #{number}", once)

    def reviews(self, number: int) -> list[Review]:
        """The submitted reviews of PR ``number``, oldest first (every page)."""

        def once() -> list[Review]:
            found = self._repository.get_pull(number).get_reviews()
            return [Review(login=r.user.login if r.user is not None else "", state=str(r.state or ""),
                           commit_id=str(r.commit_id or ""), submitted_at=str(r.submitted_at or ""))
                    for r in found]

        return self._policy.call(f"read the reviews of #{number}", once)

    def default_branch(self) -> str:
        if self._default_branch is None:
            self._default_branch = self._policy.call(
                "read the repository", lambda: str(self._gh.get_repo(self.repo).default_branch))
        return self._default_branch

    def permission(self, login: str) -> str:
        """``login``'s permission on the repository (``GET /repos/{o}/{r}/collaborators/{user}/permission``):
        ``admin``, ``write`` (GitHub reports ``maintain`` as ``write``), ``read`` or ``none`` (also for
        users GitHub does not know). Kept for the life of this client, which is one job."""
        if login not in self._permissions:

            def once() -> str:
                try:
                    return str(self._repository.get_collaborator_permission(login))
                except UnknownObjectException:
                    return "none"

            self._permissions[login] = self._policy.call(f"read {login}'s permission", once)
        return self._permissions[login]

    def has_write_access(self, login: str) -> bool:
        """Whether ``login`` may push to the repository (permission admin, maintain or write)."""
        return self.permission(login) in ("admin", "maintain", "write")

    def is_team_member(self, org: str, team: str, login: str) -> bool:
        """Whether ``login`` is an active member of ``@org/team``
        (``GET /orgs/{org}/teams/{team}/memberships/{login}``, state ``active``; a 404 is no). Answers are
        cached for ``MEMBERSHIP_TTL`` seconds per process, at most ``MEMBERSHIP_CACHE`` of them."""
        key = (self._api_url, org.lower(), team.lower(), login.lower())
        cached = _MEMBERSHIPS.get(key)
        if cached is not None:
            return cached

        def once() -> bool:
            try:
                _, data = self._gh.requester.requestJsonAndCheck(
                    "GET", f"/orgs/{quote(org, safe='')}/teams/{quote(team, safe='')}/memberships/"
                           f"{quote(login, safe='')}")
            except UnknownObjectException:
                return False
            return isinstance(data, dict) and data.get("state") == "active"

        found = self._policy.call(f"read {login}'s membership of {org}/{team}", once)
        _MEMBERSHIPS.put(key, found)
        return found

    def commit_logins(self, sha: str) -> frozenset[str]:
        """The GitHub logins of a commit's author and committer (those GitHub matched to an account)."""

        def once() -> frozenset[str]:
            commit = self._repository.get_commit(sha)
            return frozenset(u.login for u in (commit.author, commit.committer) if u is not None and u.login)

        return self._policy.call(f"read commit {sha[:12]}", once)

    # --- writes ---------------------------------------------------------------------------------

    def upsert_comment(self, number: int, marker: str, body: str) -> int:
        """Edit the bot's own comment on PR ``number`` that contains ``marker`` (a hidden HTML
        comment), or create it; returns the comment id. Comments by anyone else are never edited,
        even when they contain the marker. A retry after a lost answer finds the comment it made."""
        text = with_marker(marker, self._policy.redact(body))

        def once() -> int:
            issue = self._repository.get_issue(number)
            for comment in issue.get_comments():
                if comment.user.login == self.login and marker in (comment.body or ""):
                    if comment.body != text:
                        comment.edit(text)
                    return int(comment.id)
            return int(issue.create_comment(text).id)

        return self._policy.call(f"update the comment on #{number}", once)

    def reply(self, number: int, body: str) -> None:
        """Post a new comment on PR ``number`` (an answer to a comment command). A retry after a
        lost answer first looks for the reply among the bot's recent comments."""
        text = truncate(self._policy.redact(body), COMMENT_LIMIT)
        since = datetime.now(UTC) - timedelta(minutes=1)
        tried = False

        def once() -> None:
            nonlocal tried
            issue = self._repository.get_issue(number)
            if tried and any(c.user.login == self.login and c.body == text for c in issue.get_comments(since=since)):
                return
            tried = True
            issue.create_comment(text)

        self._policy.call(f"reply on #{number}", once)

    def sync_issue(self, marker: str, title: str, body: str, *, open_: bool, number: int | None = None) -> int | None:
        """Keep the bot's one issue that carries ``marker`` (a hidden HTML comment) in step: with ``open_``,
        edit it in place (reopening it when closed) or create it; without, close it with ``body`` when it is
        open. The issue is found by ``number`` (as stored from an earlier call) when that one is the bot's and
        carries the marker, else among the bot's issues by marker, so a retry after a lost answer never
        opens a second one. Returns the issue's number (None: there was none to close)."""
        text = with_marker(marker, self._policy.redact(body))
        short = shortened(self._policy.redact(title), TITLE_LIMIT)

        def mine(issue: Any) -> bool:
            return issue.user is not None and issue.user.login == self.login and marker in (issue.body or "")

        def once() -> int | None:
            found = None
            if number is not None:
                try:
                    candidate = self._repository.get_issue(number)
                    found = candidate if mine(candidate) else None
                except UnknownObjectException:
                    found = None
            if found is None:
                # PyGithub takes the creator's login as well as a NamedUser (its docstring and its own check
                # say so); only its annotation is narrower.
                issues = self._repository.get_issues(state="all", creator=self.login)  # type: ignore[arg-type]
                found = next((i for i in issues
                              if i.pull_request is None and mine(i)), None)
            if open_:
                if found is None:
                    return int(self._repository.create_issue(title=short, body=text).number)
                if found.state != "open" or found.body != text or found.title != short:
                    found.edit(title=short, body=text, state="open")
                return int(found.number)
            if found is None:
                return None
            if found.state == "open":
                found.edit(body=text, state="closed", state_reason="completed")
            return int(found.number)

        return self._policy.call("update the drift issue", once)

    def set_check(self, sha: str, name: str, *, status: str, conclusion: str | None = None, title: str = "",
                  summary: str = "", text: str | None = None, external_id: str = "") -> None:
        """Report ``name`` on commit ``sha``. App mode: the check run of that name (ours, latest) is
        updated, or created when there is none or it completed and a new run starts (``status`` not
        completed). Token mode: a commit status with context ``name``. Outputs are truncated below
        GitHub's limits."""
        if status not in CHECK_STATUSES:
            raise ValueError(f"status must be one of {', '.join(CHECK_STATUSES)}, not {status!r}")
        if status == "completed" and conclusion not in CONCLUSIONS:
            raise ValueError(f"a completed check needs a conclusion ({', '.join(CONCLUSIONS)}), not {conclusion!r}")
        # Every text that reaches GitHub passes the one redaction rule here, whatever rendered it.
        title, summary = self._policy.redact(title), self._policy.redact(summary)
        text = self._policy.redact(text) if text else text
        if self.mode == "token":
            self._set_status(sha, name, status, conclusion, title or first_line(summary))
            return
        output: dict[str, Any] | Any = NotSet
        if title or summary or text:
            output = {"title": shortened(title or name, TITLE_LIMIT),
                      "summary": truncate(summary or title, OUTPUT_LIMIT)}
            if text:
                output["text"] = truncate(text, OUTPUT_LIMIT)
        fields: dict[str, Any] = {"status": status, "output": output,
                                  "conclusion": conclusion if status == "completed" else NotSet,
                                  "external_id": external_id or NotSet}

        def once() -> None:
            commit = self._repository.get_commit(sha)
            existing = next((run for run in commit.get_check_runs(check_name=name, filter="latest")
                             if self._is_own(run)), None)
            if existing is not None and not (existing.status == "completed" and status != "completed"):
                existing.edit(**fields)
                return
            self._repository.create_check_run(name=name, head_sha=sha, **fields)

        self._policy.call(f"set check {name} on {sha[:12]}", once)

    def _set_status(self, sha: str, name: str, status: str, conclusion: str | None, description: str) -> None:
        state = "pending" if status != "completed" else _STATUS_STATE.get(conclusion or "", "error")
        short = shortened(description or name, STATUS_DESCRIPTION_LIMIT)
        self._policy.call(f"set status {name} on {sha[:12]}", lambda: self._repository.get_commit(sha).create_status(
            state=state, description=short, context=name))

    def _is_own(self, run: Any) -> bool:
        app = run.app
        return app is not None and self._app_id is not None and str(app.id) == self._app_id


# --- retries ------------------------------------------------------------------------------------


class _Retrying:
    """Runs one operation, retrying 5xx and connection errors with backoff (at most
    ``MAX_ATTEMPTS`` tries) and rate limits after the wait GitHub names, up to ``max_wait`` seconds
    in total; anything else, or a wait beyond the budget, raises GitHubError."""

    def __init__(self, sleep: Callable[[float], None], max_wait: float, *, secrets: tuple[str | None, ...]) -> None:
        self._sleep = sleep
        self._max_wait = max_wait
        self._secrets = tuple(s for s in secrets if s)
        self.secrets_from: _Installation | None = None

    def call(self, what: str, fn: Callable[[], T]) -> T:
        waited = 0.0
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                return fn()
            except GithubException as exc:
                status = exc.status
                headers = {str(k).lower(): str(v) for k, v in (exc.headers or {}).items()}
                message = _message(exc.data)
                limited = status == 429 or (status == 403 and is_rate_limited(headers, message))
                if limited:
                    delay = rate_limit_wait(headers)
                    if waited + delay > self._max_wait:
                        raise GitHubError(self.redact(
                            f"GitHub could not {what}: rate limited (HTTP {status}) for {delay:.0f} more seconds, "
                            f"beyond the {self._max_wait:.0f} s this operation may wait; the job will be retried"),
                            status) from exc
                elif status >= 500:
                    delay = min(2.0 ** (attempt - 1), 30.0)
                else:
                    raise GitHubError(self.redact(f"GitHub could not {what}: HTTP {status}: {message}"),
                                      status) from exc
                reason = f"HTTP {status}"
            except (requests.ConnectionError, requests.Timeout) as exc:
                if attempt == MAX_ATTEMPTS:
                    raise GitHubError(self.redact(f"GitHub could not {what}: unreachable "
                                                  f"({exc.__class__.__name__})")) from exc
                delay, reason, status = min(2.0 ** (attempt - 1), 30.0), exc.__class__.__name__, None
            if attempt == MAX_ATTEMPTS:
                raise GitHubError(self.redact(f"GitHub could not {what}: {reason} after {attempt} attempts"), status)
            log.warning("GitHub %s: %s; retrying in %.1f s (attempt %d of %d)", what, reason, delay, attempt + 1,
                        MAX_ATTEMPTS)
            self._sleep(delay)
            waited += delay
        raise AssertionError("unreachable: the loop returns or raises")

    def redact(self, text: str) -> str:
        """``text`` through the one redaction rule, with the configured secrets and the installation token."""
        token = self.secrets_from.last_token if self.secrets_from is not None else None
        return redact(text, Redactor.of((*self._secrets, token)).secrets)


def _installation_for(settings: Settings, owner: str, name: str, policy: _Retrying,
                      common: dict[str, Any]) -> _Installation:
    app_id = str(settings.github_app_id)
    repo_key = (settings.github_api_url, app_id, f"{owner}/{name}".lower())
    with _CACHE_LOCK:
        found = _INSTALLATIONS.get(repo_key)
        integration = _INTEGRATIONS.get(repo_key[:2])
        if integration is None:
            assert settings.github_private_key is not None
            integration = GithubIntegration(auth=Auth.AppAuth(app_id, settings.github_private_key), **common)
            _INTEGRATIONS[repo_key[:2]] = integration
    if found is not None:
        return found
    try:
        installed = policy.call(f"find the App's installation on {owner}/{name}",
                                lambda: integration.get_repo_installation(owner, name))
    except GitHubError as exc:
        if exc.status == 404:
            raise GitHubError(f"the GitHub App (id {app_id}) is not installed on {owner}/{name}: install it on "
                              "the repository (Settings → GitHub Apps)", 404) from exc
        raise
    slug = installed.app_slug
    if not slug:  # older GitHub Enterprise Server versions omit it: ask for the App itself
        slug = policy.call("read the App", lambda: integration.get_app().slug)
    with _CACHE_LOCK:
        # Repositories of one installation share its token.
        shared = next((i for (api, aid, _), i in _INSTALLATIONS.items()
                       if api == repo_key[0] and aid == app_id and i.installation_id == installed.id), None)
        installation = shared or _Installation(integration, int(installed.id), str(slug))
        return _INSTALLATIONS.setdefault(repo_key, installation)


def _message(data: Any) -> str:
    if isinstance(data, dict):
        return str(data.get("message") or data)[:300]
    return str(data)[:300]


__all__ = ["COMMENT_LIMIT", "OUTPUT_LIMIT", "GitHub", "GitHubError", "PullInfo", "Review",
           "forget_cached_installations", "truncate"]
