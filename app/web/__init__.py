"""The WSGI application: the backend lane, the engine lane and health, in one Flask app.

``create_app(settings=None)`` reads the environment when no settings are given, starts the
embedded Postgres when no ``KL_DATABASE_URL`` is set, applies migrations, and wires the lanes.
Production: ``gunicorn 'app.web:create_app()'``.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from datetime import date, datetime
from typing import Any

from flask import Flask, Response, g, jsonify, redirect, request
from flask.json.provider import DefaultJSONProvider
from flask.testing import FlaskClient
from werkzeug.routing import PathConverter
from werkzeug.test import TestResponse

from app.config import AuthMode, Settings
from app.errors import ConfigError
from app.store import Database
from app.store.migrate import migrate
from app.web import (
    backend,
    control,
    drift_reports,
    engine,
    errors,
    exposure,
    inputs,
    manual_holds,
    metrics,
    openapi,
    pruning,
    runs,
    splicebases,
    ui,
    upkeep,
    webhook,
)
from app.web.context import Services, services
from app.web.logs import configure_logging

log = logging.getLogger("kilolock.web")
# A client-supplied X-Request-Id is kept only when it is short and plain, so it cannot forge log lines.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


class _JSONProvider(DefaultJSONProvider):
    """ISO 8601 times (with offset) instead of Flask's HTTP dates."""

    @staticmethod
    def default(o: Any) -> Any:
        if isinstance(o, datetime | date):
            return o.isoformat()
        if isinstance(o, bytes | memoryview):
            return bytes(o).decode("utf-8", "replace")
        return DefaultJSONProvider.default(o)

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        """Request bodies parsed with bounded depth and storable strings (``app.web.inputs``)."""
        return inputs.json_loads(s)


class _PathConverter(PathConverter):
    """``<path:…>`` for every route: anything after the prefix, even a leading slash or a newline, so a
    malformed state name reaches the name rules (400) instead of missing every route (a 404 Terraform
    would read as "no state") or being merged into another URL by a redirect."""

    regex = "(?s:.+?)"
    part_isolating = False


def resolve_database_url(settings: Settings) -> str:
    """KL_DATABASE_URL, or the embedded Postgres under KL_DATA_DIR."""
    if settings.database_url:
        return settings.database_url
    from app.embedded import start_embedded_postgres

    return start_embedded_postgres(settings.data_root)


class _TestClient(FlaskClient):
    """Flask's test client, closing each response once it has read it as a WSGI server does once it has
    sent it (werkzeug's client closes only what it buffers): what a response does at close (a first GET's
    cache write) has happened when the call returns."""

    def open(self, *args: Any, buffered: bool = True, **kwargs: Any) -> TestResponse:
        return super().open(*args, buffered=buffered, **kwargs)


def create_app(settings: Settings | None = None, *, lanes: str = "all") -> Flask:
    """The WSGI app. ``lanes``: ``all`` (default), ``public`` (everything but the control API) or
    ``control`` (only the control API and health), for serving the control API on its own port."""
    if lanes not in ("all", "public", "control"):
        raise ConfigError([f"unknown lanes {lanes!r}: use all, public or control"])
    settings = settings or Settings.from_env()
    configure_logging(settings)
    if settings.auth_mode is AuthMode.OPEN:
        log.warning("KL_AUTH_MODE=open: no authentication; only clients on this machine are answered")
    url = resolve_database_url(settings)
    if settings.auto_migrate:
        applied = migrate(url)
        if applied:
            log.info("applied migrations: %s", ", ".join(f"{m.version:04d}_{m.name}" for m in applied))
    app = Flask("kilolock")
    app.test_client_class = _TestClient
    app.json = _JSONProvider(app)
    # Never merge "//" by redirecting: a redirect's Location is built from the Host header, and it turns
    # Terraform's LOCK or POST into a bodiless GET. Doubled slashes reach the name rules instead (400).
    app.url_map.merge_slashes = False
    app.url_map.converters["path"] = _PathConverter
    inputs.init_app(app, settings)
    db = Database(url, pool_size=settings.db_pool_size)
    app.extensions["kilolock"] = Services(settings=settings, db=db,
                                          splice_bases=splicebases.Builder(db) if settings.splice_base_bytes else None,
                                          upkeep=upkeep.Upkeep(db))
    errors.register(app)
    exposure.init_app(app, settings)  # open mode answers loopback clients only, unless opted in
    # Metrics for every lane; /metrics and the dashboard (/ui/) with the public lanes.
    metrics.init_app(app, serve=lanes in ("all", "public"))
    if lanes in ("all", "public"):
        ui.init_app(app, settings)

        @app.get("/")
        def root() -> Response:
            return redirect("/ui/")  # type: ignore[return-value]
    if lanes in ("all", "public"):
        app.register_blueprint(backend.bp)
        app.register_blueprint(engine.bp)
        app.register_blueprint(runs.bp)
        app.register_blueprint(manual_holds.bp)
        app.register_blueprint(drift_reports.bp)
        webhook.init_app(app, settings)  # always registered: with no secret it refuses every delivery
    if lanes in ("all", "control"):
        app.register_blueprint(control.bp)
    openapi.init_app(app)

    pruning.start(settings, app.extensions["kilolock"].db)  # retention on a timer, when configured

    @app.get("/healthz")
    def healthz() -> tuple[Response, int]:
        healthy = services().db.ping()
        return jsonify({"ok": healthy, "database": "ok" if healthy else "unreachable"}), 200 if healthy else 503

    @app.before_request
    def _start() -> None:
        presented = request.headers.get("X-Request-Id", "")
        g.request_id = presented if _REQUEST_ID.fullmatch(presented) else uuid.uuid4().hex[:16]
        g.started = time.perf_counter()

    app.before_request(inputs.check_request)

    @app.after_request
    def _finish(response: Response) -> Response:
        response.headers["X-Request-Id"] = g.get("request_id", "")
        elapsed_ms = (time.perf_counter() - g.get("started", time.perf_counter())) * 1000
        # Method, path and status only: bodies (states, lock info, tokens) never reach the log.
        log.info("request id=%s %s %s -> %s %.1fms", g.get("request_id"), request.method, request.path,
                 response.status_code, elapsed_ms,
                 extra={"request_id": g.get("request_id"), "method": request.method, "path": request.path,
                        "status": response.status_code, "duration_ms": round(elapsed_ms, 1)})
        return response

    return app
