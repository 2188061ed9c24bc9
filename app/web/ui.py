"""The operator dashboard at ``/ui/``: server-rendered pages over states, reservations and apply runs.

Authentication is the API's: the login form's token is resolved to a Principal by
``app.web.auth.principal_for``. The session (a signed, HttpOnly, SameSite=Lax cookie scoped to
``/ui``, Secure over https) keeps only what identifies that principal again — the token's internal
id (database mode, re-checked each request so a revoked token ends its sessions) or a keyed
fingerprint of ``KL_AUTH_TOKEN`` (static mode) — never a secret. Every POST carries the session's
CSRF token. Pages render through Jinja's autoescaping and never show a state body: one resource's
attribute diffs at most, with sensitive values masked, and outputs whose sensitive values never
leave the database.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import (
    Blueprint,
    Flask,
    Response,
    current_app,
    flash,
    g,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from flask.sessions import SecureCookieSessionInterface
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response as Redirect

from app.config import AuthMode, Settings
from app.domain.attributes import AttributeChange, attribute_diff, sensitive_paths
from app.domain.backend_blocks import scoped_backend_block
from app.domain.principal import Principal, default_principal
from app.domain.reservations import format_duration
from app.domain.scopes import PLAN_ONLY, scope_set
from app.errors import BadRequestError, ConflictError, ForbiddenError, KlError, RunClosedError, UnauthorizedError
from app.store import Database, dashboard, drift_reports, graph, manual_holds, pr_holds, runs, tenancy
from app.store.secrets import SESSION_SECRET, shared_secret
from app.web import errors, metrics, timeline
from app.web.auth import Credentials, principal_for
from app.web.context import principal, services, state_name
from app.web.control import check_control_token, public_base_url, require_control_mode

log = logging.getLogger("kilolock.ui")

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates", static_folder="static",
               static_url_path="/static")

SESSION_LIFETIME = timedelta(hours=12)
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'")
_OPEN_PAGES = frozenset({"ui.login", "ui.static"})
MAX_ROWS = 500


class _Sessions(SecureCookieSessionInterface):
    """Flask's signed-cookie sessions, Secure whenever the dashboard is served over https."""

    def __init__(self, always_secure: bool) -> None:
        self.always_secure = always_secure

    def get_cookie_secure(self, app: Flask) -> bool:
        return self.always_secure or request.is_secure


def session_secret(settings: Settings, db: Database) -> str:
    """KL_SESSION_SECRET; in static mode a key derived from KL_AUTH_TOKEN (rotating the token ends
    the sessions); otherwise a key generated on first start and kept in the database, so every
    process and host serving it signs and accepts the same sessions, across restarts."""
    if settings.session_secret:
        return settings.session_secret
    if settings.auth_mode is AuthMode.STATIC and settings.auth_token:
        return hmac.new(settings.auth_token.encode(), b"kilolock dashboard sessions v1", hashlib.sha256).hexdigest()
    return shared_secret(db, SESSION_SECRET)


def init_app(app: Flask, settings: Settings) -> None:
    """Configure signed sessions and register the dashboard blueprint."""
    app.secret_key = session_secret(settings, app.extensions["kilolock"].db)
    app.config.update(
        SESSION_COOKIE_NAME="kl_session", SESSION_COOKIE_PATH="/ui", SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax", PERMANENT_SESSION_LIFETIME=SESSION_LIFETIME,
    )
    app.session_interface = _Sessions(always_secure=(settings.public_url or "").startswith("https://"))
    app.register_blueprint(bp)


# --- sessions, CSRF and the gate ---------------------------------------------------------------------------

def _fingerprint(token: str, purpose: bytes = b"static-token:") -> str:
    key = str(current_app.secret_key)
    return hmac.new(key.encode(), purpose + token.encode(), hashlib.sha256).hexdigest()[:32]


def _csrf_token() -> str:
    token = session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session["csrf"] = token
        session.permanent = True
    return token


def _check_csrf() -> None:
    expected = session.get("csrf")
    presented = request.form.get("csrf_token", "")
    if not isinstance(expected, str) or not hmac.compare_digest(presented.encode(), expected.encode()):
        raise ForbiddenError("missing or stale CSRF token: reload the page and try again")


def _session_principal() -> Principal | None:
    settings = services().settings
    if settings.auth_mode is AuthMode.OPEN:
        return default_principal(actor=str(session.get("actor") or "dashboard"))
    if session.get("mode") != settings.auth_mode.value:
        return None
    if settings.auth_mode is AuthMode.STATIC:
        presented = session.get("fp")
        expected = _fingerprint(settings.auth_token or "")
        if not isinstance(presented, str) or not hmac.compare_digest(presented.encode(), expected.encode()):
            return None
        return default_principal(actor=str(session.get("actor") or "dashboard"))
    token_id = session.get("tid")
    token = dashboard.session_token(services().db, token_id) if isinstance(token_id, int) else None
    if token is None:
        return None
    return Principal.for_token(tenant_id=token.tenant_id, name=token.name, scope=token.scope, token_id=token.id,
                               scopes=scope_set(tuple(token.scopes)))


def _wants_html() -> bool:
    """A browser names HTML in its Accept header; a client that accepts anything (``*/*``: curl, requests)
    or sends none gets the API's answers (401 and the JSON envelope), not a redirect to a form."""
    return any(value in ("text/html", "application/xhtml+xml") and quality > 0
               for value, quality in request.accept_mimetypes)


@bp.before_request
def _gate() -> Redirect | None:
    g.now = datetime.now(UTC)
    if request.endpoint in _OPEN_PAGES:
        return None
    who = _session_principal()
    if who is None:
        if "mode" in session:
            session.clear()  # revoked token, rotated KL_AUTH_TOKEN or changed auth mode: log out
        if _wants_html():
            target = request.full_path if request.method == "GET" else None
            return redirect(url_for("ui.login", next=target))
        raise UnauthorizedError("the dashboard needs a session: log in at /ui/login")
    g.principal = who  # app.web.context.principal() answers with the session's principal
    if request.method == "POST":
        _check_csrf()
    return None


@bp.after_request
def _headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = _CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    if request.endpoint != "ui.static":
        response.headers["Cache-Control"] = "no-store"
    return response


@bp.errorhandler(KlError)
def _kl_error(error: KlError) -> Response:
    if not _wants_html():
        return errors.error_response(error)
    response = make_response(render_template("ui/error.html", error=error, nav=""), error.status)
    errors.add_retry_after(response, error)  # a throttled login (429) says when to try again, like the API
    return response


@bp.errorhandler(HTTPException)
def _http_error(error: HTTPException) -> Response:
    return _kl_error(errors.from_http_exception(error))


@bp.app_context_processor
def _template_globals() -> dict[str, Any]:
    if request.blueprint != "ui":
        return {}
    return {"csrf_token": _csrf_token, "who": g.get("principal"), "mode": services().settings.auth_mode.value,
            "now": g.get("now"), "manages_tokens": "control" in current_app.blueprints}


# --- time formatting -------------------------------------------------------------------------------------

def _span(seconds: float) -> str:
    return format_duration(timedelta(seconds=abs(seconds)))


@bp.app_template_filter("kl_ago")
def _ago(at: datetime | None) -> str:
    if at is None:
        return "—"
    return _span((g.now - at).total_seconds()) + " ago"


@bp.app_template_filter("kl_left")
def _left(at: datetime | None) -> str:
    if at is None:
        return "no lease"
    seconds = (at - g.now).total_seconds()
    return f"{_span(seconds)} left" if seconds > 0 else f"lapsed {_span(seconds)} ago"


@bp.app_template_filter("kl_utc")
def _utc(at: datetime | None) -> str:
    return "—" if at is None else at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@bp.app_template_filter("kl_status")
def _status(run: runs.Run) -> str:
    return timeline.shown_status(run.status, run.info)


@bp.app_template_filter("kl_duration")
def _duration(run: runs.Run) -> str:
    return _span(((run.finished_at or g.now) - run.created_at).total_seconds())


# --- login -----------------------------------------------------------------------------------------------

def _safe_next(target: str | None) -> str:
    """Only a path inside the dashboard: never another host (``//evil``) or scheme."""
    if (target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target
            and target.isprintable() and len(target) <= 2000):
        return target
    return url_for("ui.states")


@bp.route("/login", methods=["GET", "POST"])
def login() -> Redirect | tuple[str, int] | str:
    settings = services().settings
    if settings.auth_mode is AuthMode.OPEN:
        return redirect(_safe_next(request.args.get("next")))
    if request.method == "GET":
        return render_template("ui/login.html", next=request.args.get("next", ""), error=None, name="", nav="")
    _check_csrf()
    secret = request.form.get("token", "").strip()
    name = "".join(ch for ch in request.form.get("name", "").strip() if ch.isprintable())[:100]
    creds = Credentials(username=(name or "dashboard") if settings.auth_mode is AuthMode.STATIC else "",
                        secret=secret, scheme="bearer")
    try:
        who = principal_for(creds, request, settings, services().db)
    except (UnauthorizedError, ForbiddenError) as refused:
        metrics.DASHBOARD_LOGINS.labels("refused").inc()
        message = "enter a token" if isinstance(refused, UnauthorizedError) else "that token was refused"
        return render_template("ui/login.html", next=request.form.get("next", ""), error=message, name=name,
                               nav=""), refused.status
    session.clear()
    session.permanent = True
    session.update(mode=settings.auth_mode.value, actor=who.actor, csrf=secrets.token_urlsafe(32))
    if settings.auth_mode is AuthMode.STATIC:
        session["fp"] = _fingerprint(settings.auth_token or "")
    else:
        session["tid"] = dashboard.token_id_for_secret(services().db, secret)
    metrics.DASHBOARD_LOGINS.labels("ok").inc()
    log.info("dashboard login by %s", who.actor)
    return redirect(_safe_next(request.form.get("next")))


@bp.post("/logout")
def logout() -> Redirect:
    session.clear()
    return redirect(url_for("ui.login"))


# --- pages -----------------------------------------------------------------------------------------------

@bp.get("/")
def states() -> str:
    found = dashboard.state_overviews(services().db, principal(), now=g.now)
    drifted = drift_reports.drifted_by_state(services().db, principal())
    return render_template("ui/states.html", states=found, drifted=drifted, nav="states")


@bp.get("/states/<path:name>")
def state(name: str) -> str:
    name = state_name(name)
    query = request.args.get("q", "").strip()[:200]
    head = dashboard.state_head(services().db, principal(), name)
    page = dashboard.head_resources(services().db, principal(), name, contains=query or None, limit=MAX_ROWS)
    outputs = dashboard.head_outputs(services().db, principal(), name)
    drift = next(iter(drift_reports.reports(services().db, principal(), name, limit=1)), None)
    return render_template("ui/state.html", head=head, page=page, outputs=outputs, query=query, drift=drift,
                           nav="states")


def _lifecycle_views(found: list[dashboard.Lifecycle]) -> list[dict[str, Any]]:
    """Each lifecycle with the attribute changes from the previous one of the same object."""
    views: list[dict[str, Any]] = []
    previous: dict[str, dashboard.Lifecycle] = {}
    for cycle in found:
        before = previous.get(cycle.deposed)
        masked = sensitive_paths(cycle.sensitive_attributes) | (
            sensitive_paths(before.sensitive_attributes) if before else frozenset())
        changes: tuple[AttributeChange, ...] = attribute_diff(
            before.attributes if before else None, cycle.attributes, masked=masked)
        views.append({"cycle": cycle, "changes": changes[:MAX_ROWS], "more": max(len(changes) - MAX_ROWS, 0),
                      "first": before is None})
        previous[cycle.deposed] = cycle
    return list(reversed(views))


@bp.get("/states/<path:name>/resource")
def resource(name: str) -> str:
    name = state_name(name)
    address = request.args.get("address", "").strip()
    if not address:
        raise BadRequestError("query parameter address is required, e.g. ?address=terraform_data.web[0]")
    head = dashboard.state_head(services().db, principal(), name)
    found = dashboard.lifecycles(services().db, principal(), name, address)
    near = dashboard.neighbourhood(services().db, principal(), name, address)
    blamed = graph.blame(services().db, principal(), name, address, limit=1, changes=graph.BLAME_CHANGES_MAX)
    writers = {c.serial: c.by for i in blamed.instances for c in i.changes if c.by is not None}
    return render_template("ui/resource.html", head=head, address=address, lifecycles=_lifecycle_views(found),
                           near=near, alive=any(c.delete_serial is None for c in found), writers=writers,
                           github=github_web_url(services().settings.github_api_url), nav="states")


@bp.get("/states/<path:name>/blame")
def blame(name: str) -> str:
    """Search the state's addresses (ever held) by glob: each with its newest change, a page at a time."""
    name = state_name(name)
    glob = request.args.get("glob", "").strip()[:500] or "*"
    after = request.args.get("after", "")[:2048]
    head = dashboard.state_head(services().db, principal(), name)
    page = graph.blame(services().db, principal(), name, glob, after=after, limit=MAX_ROWS, changes=1)
    return render_template("ui/blame.html", head=head, glob=glob, page=page,
                           github=github_web_url(services().settings.github_api_url), nav="states")


@bp.get("/states/<path:name>/runs")
def state_runs(name: str) -> str:
    name = state_name(name)
    head = dashboard.state_head(services().db, principal(), name)
    found = runs.list_runs(services().db, principal(), state=name, limit=100)
    return render_template("ui/state_runs.html", head=head, runs=found, chart=timeline.layout(found, g.now),
                           nav="runs")


@bp.get("/runs")
def all_runs() -> str:
    found = runs.list_runs(services().db, principal(), limit=300)
    by_state: dict[str, list[runs.Run]] = {}
    for run in found:
        by_state.setdefault(run.state, []).append(run)
    charts = [(name, timeline.layout(items, g.now), items) for name, items in sorted(by_state.items())]
    return render_template("ui/runs.html", charts=charts, nav="runs")


@bp.get("/runs/<run_id>")
def run(run_id: str) -> str:
    found = runs.get_run(services().db, principal(), run_id)
    held = runs.run_reservations(services().db, principal(), run_id)
    tail = dashboard.run_events(services().db, principal(), run_id, limit=50)
    return render_template("ui/run.html", run=found, reservations=held, events=tail, nav="runs")


@bp.post("/runs/<run_id>/abort")
def abort(run_id: str) -> Redirect:
    reason = "".join(ch for ch in request.form.get("reason", "").strip() if ch.isprintable())[:500]
    try:
        done = runs.abort(services().db, principal(), run_id, reason=reason or "from the dashboard")
    except RunClosedError as closed:
        flash(closed.message, "error")
    else:
        metrics.record_run_finished(done.status, done.created_at, done.finished_at)
        flash(f"apply run {run_id} aborted; its reservations are released", "ok")
    target = request.form.get("next")
    return redirect(_safe_next(target) if target else url_for("ui.run", run_id=run_id))


@bp.get("/reservations")
def reservations() -> str:
    state = request.args.get("state", "").strip()
    chosen = state_name(state) if state else None
    found = runs.list_reservations(services().db, principal(), state=chosen)
    held = manual_holds.list_holds(services().db, principal(), state=chosen)
    return render_template("ui/reservations.html", reservations=found, holds=held, state=state, nav="reservations")


def github_web_url(api_url: str) -> str:
    """github.com for the public API, ``https://HOST`` for GitHub Enterprise Server's ``https://HOST/api/v3``."""
    base = api_url.rstrip("/")
    if base == "https://api.github.com":
        return "https://github.com"
    return base[: -len("/api/v3")] if base.endswith("/api/v3") else base


@bp.get("/pulls")
def pulls() -> str:
    settings = services().settings
    found = dashboard.open_pull_requests(services().db, principal())
    by_repo: dict[str, list[dashboard.PullRequest]] = {}
    for pr in found:
        by_repo.setdefault(pr.repo, []).append(pr)
    held = pr_holds.of_tenant(services().db, principal())
    return render_template("ui/pulls.html", repos=sorted(by_repo.items()), github=github_web_url(
        settings.github_api_url), bot_enabled=settings.github_enabled,
        webhook_ready=bool(settings.github_webhook_secret), holds=held,
        bot_seen=not found and dashboard.bot_has_records(services().db), nav="pulls")


# --- tokens: the control API's rule, for operators ---------------------------------------------------------

_OPERATOR = "op"


def _operator_proof() -> str:
    return _fingerprint(services().settings.control_token or "", b"control-token:")


def _is_operator() -> bool:
    presented = session.get(_OPERATOR)
    return isinstance(presented, str) and hmac.compare_digest(presented.encode(), _operator_proof().encode())


def _token_tenant(*, unlocked: bool = True) -> str:
    """The slug of the tenant whose tokens this session manages. The control API's rule: database mode with
    KL_CONTROL_TOKEN, and the control token presented (once a session, which keeps only its keyed
    fingerprint, so rotating KL_CONTROL_TOKEN ends it). A session of a token with address scopes never
    manages tokens: it could grant more than its own scopes. Where the control API is kept off this listener
    (``kl serve --control-port``), neither is token management."""
    require_control_mode()
    if "control" not in current_app.blueprints:
        raise ForbiddenError("this listener does not serve the control API (kl serve --control-port): manage "
                             "tokens there, with kl tokens or the control API")
    who = principal()
    if who.scopes is not None:
        raise ForbiddenError("a token with address scopes cannot manage tokens: log in with a whole-state token")
    if unlocked and not _is_operator():
        raise ForbiddenError("managing tokens needs the control token: enter KL_CONTROL_TOKEN on the tokens page")
    return tenancy.tenant_by_id(services().db, who.tenant_id).slug


def _operator_actor() -> str:
    return f"dashboard:{principal().actor}"


def _scope_lines(text: str) -> list[str]:
    """The scopes textarea: one ``GLOB:MODE`` a line, blank lines ignored (validated by the store)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def _tokens_page(slug: str, *, error: KlError | None = None, form: dict[str, str] | None = None,
                 status: int = 200) -> tuple[str, int]:
    found = tenancy.list_tokens(services().db, slug)
    return render_template("ui/tokens.html", tokens=found, tenant=slug, error=error, form=form or {},
                           plan_only=list(PLAN_ONLY), nav="tokens"), status


@bp.get("/tokens")
def tokens() -> tuple[str, int]:
    slug = _token_tenant(unlocked=False)
    if not _is_operator():
        return render_template("ui/tokens_unlock.html", error=None, nav="tokens"), 403
    return _tokens_page(slug)


@bp.post("/tokens/unlock")
def tokens_unlock() -> Redirect | tuple[str, int]:
    _token_tenant(unlocked=False)
    try:
        check_control_token(request.form.get("control_token", "").strip(), principal().actor)
    except (UnauthorizedError, ForbiddenError) as refused:
        return render_template("ui/tokens_unlock.html", error=refused, nav="tokens"), refused.status
    session[_OPERATOR] = _operator_proof()
    log.info("dashboard token management opened by %s", principal().actor)
    return redirect(url_for("ui.tokens"))


@bp.post("/tokens")
def create_token() -> tuple[str, int]:
    slug = _token_tenant()
    form = {key: request.form.get(key, "") for key in ("name", "environment", "workspace", "scopes")}
    try:
        scopes = tenancy.requested_scopes(_scope_lines(form["scopes"]), request.form.get("plan_only") == "on")
        secret, info = tenancy.create_token(
            services().db, slug, name=form["name"].strip(), environment=form["environment"].strip(),
            workspace=form["workspace"].strip() or "default", actor=_operator_actor(), scopes=scopes)
    except (BadRequestError, ConflictError) as refused:
        return _tokens_page(slug, error=refused, form=form, status=refused.status)
    log.info("dashboard: token %s created by %s", info.id, principal().actor)
    block = scoped_backend_block(public_base_url(), info.workspace_id, info.environment_id)
    return render_template("ui/token_created.html", token=info, secret=secret, block=block, nav="tokens"), 200


def _token_page(slug: str, token_id: str, *, error: KlError | None = None, typed: str | None = None,
                status: int = 200) -> tuple[str, int]:
    found = tenancy.get_token(services().db, slug, token_id)
    text = "\n".join(found.scopes) if typed is None else typed
    return render_template("ui/token.html", token=found, scopes_text=text, error=error, nav="tokens"), status


@bp.get("/tokens/<token_id>")
def token(token_id: str) -> tuple[str, int]:
    return _token_page(_token_tenant(), token_id)


@bp.post("/tokens/<token_id>/scopes")
def token_scopes(token_id: str) -> Redirect | tuple[str, int]:
    slug = _token_tenant()
    typed = request.form.get("scopes", "")
    try:
        done = tenancy.set_token_scopes(services().db, slug, token_id, _scope_lines(typed), actor=_operator_actor())
    except BadRequestError as refused:
        return _token_page(slug, token_id, error=refused, typed=typed, status=refused.status)
    held = f"{len(done.scopes)} scope(s)" if done.scopes else "no scopes: the whole state"
    flash(f"token {done.name} now has {held}", "ok")
    return redirect(url_for("ui.token", token_id=token_id))
