"""Open mode stays on the machine: with ``KL_AUTH_MODE=open`` the app answers only loopback clients,
whatever server runs it (``kl serve``, gunicorn, any WSGI server), unless the operator opts in with
``KL_ALLOW_OPEN_ON_NETWORK=true``.

The bind address is the server's business and the app cannot see it, so the rule is enforced where
the app can: every request from a non-loopback peer, or relayed by a proxy for one (``Forwarded`` /
``X-Forwarded-For``), is refused with 403 before it reaches a lane. ``/healthz`` stays answerable.
"""

from __future__ import annotations

import logging

from flask import Flask, request

from app.config import AuthMode, Settings
from app.domain.network import is_loopback
from app.errors import ForbiddenError

log = logging.getLogger("kilolock.web")

MESSAGE = ("this Kilolock runs with KL_AUTH_MODE=open (no authentication) and answers only clients on its own "
           "machine; set KL_AUTH_MODE=static with KL_AUTH_TOKEN (or database), or, on a network you trust, "
           "KL_ALLOW_OPEN_ON_NETWORK=true")


class OpenModeNetworkError(ForbiddenError):
    """Open mode refusing a client beyond this machine."""


def _relayed_for() -> list[str]:
    found = [part.strip() for part in request.headers.get("X-Forwarded-For", "").split(",") if part.strip()]
    for element in request.headers.get("Forwarded", "").split(","):
        for pair in element.split(";"):
            key, _, value = pair.strip().partition("=")
            if key.lower() == "for" and value:
                found.append(value)
    return found


def init_app(app: Flask, settings: Settings) -> None:
    if settings.auth_mode is not AuthMode.OPEN:
        return
    if settings.allow_open_on_network:
        log.warning("KL_AUTH_MODE=open with KL_ALLOW_OPEN_ON_NETWORK=true: anyone who reaches this server can "
                    "read and rewrite every state")
        return

    @app.before_request
    def _loopback_only() -> None:
        if request.path == "/healthz":
            return
        if not all(is_loopback(p) for p in [request.remote_addr, *_relayed_for()]):
            raise OpenModeNetworkError(MESSAGE)
