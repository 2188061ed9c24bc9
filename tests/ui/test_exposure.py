"""Open mode answers only its own machine, whatever WSGI server runs the app, unless the operator opts in."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import requests

from app.web.exposure import is_loopback

BIN = Path(sys.executable).parent


def test_network_clients_are_refused_in_open_mode_and_the_refusal_says_what_to_set(settings):
    from app.web import create_app

    app = create_app(settings)
    try:
        client = app.test_client()
        assert client.get("/v1/engine/states").status_code == 200
        far = client.get("/v1/engine/states", environ_base={"REMOTE_ADDR": "192.0.2.50"})
        assert far.status_code == 403
        body = far.get_json()
        assert body["code"] == "open_mode_network" and "KL_ALLOW_OPEN_ON_NETWORK" in body["error"]
        relayed = client.get("/v1/states/x", headers={"X-Forwarded-For": "203.0.113.9, 127.0.0.1"})
        assert relayed.status_code == 403
        assert client.get("/v1/states/x", headers={"Forwarded": 'for="[2001:db8::1]:443"'}).status_code == 403
        assert client.post("/v1/states/x", data=b"{}", environ_base={"REMOTE_ADDR": "192.0.2.50"}).status_code == 403
        assert client.get("/healthz", environ_base={"REMOTE_ADDR": "192.0.2.50"}).status_code == 200
    finally:
        app.extensions["kilolock"].db.close()
    opted = create_app(replace(settings, allow_open_on_network=True))
    try:
        assert opted.test_client().get("/v1/engine/states", environ_base={"REMOTE_ADDR": "192.0.2.50"}).status_code \
            == 200
    finally:
        opted.extensions["kilolock"].db.close()


def test_loopback_forms():
    assert all(is_loopback(a) for a in ("127.0.0.1", "::1", "localhost", "[::1]:8080", "127.0.0.5:80"))
    assert not any(is_loopback(a) for a in ("192.0.2.1", "", None, "unknown", "10.0.0.1:80", '"[2001:db8::1]"'))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def _own_address() -> str | None:
    """An address of this machine that is not loopback, to reach the server as a network client would."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            address = str(s.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


@pytest.mark.slow
def test_gunicorn_on_all_interfaces_in_open_mode_refuses_network_clients(clean_db, tmp_path):
    own = _own_address()
    if own is None:
        pytest.skip("this machine has no non-loopback IPv4 address to test from")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KL_")}
    env.update(KL_DATABASE_URL=clean_db, KL_AUTH_MODE="open", KL_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([str(BIN / "gunicorn"), "-b", f"0.0.0.0:{port}", "-w", "1", "app.web:create_app()"],
                            env=env, cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else "gunicorn exited"
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200:
                    break
            except (requests.ConnectionError, requests.Timeout):
                pass
            assert time.monotonic() < deadline, "gunicorn never became healthy"
            time.sleep(0.3)
        assert requests.get(f"http://127.0.0.1:{port}/v1/engine/states", timeout=10).status_code == 200
        far = requests.get(f"http://{own}:{port}/v1/engine/states", timeout=10)
        assert far.status_code == 403 and far.json()["code"] == "open_mode_network"
        assert requests.post(f"http://{own}:{port}/v1/states/stolen", data=b"{}", timeout=10).status_code == 403
        listed = requests.get(f"http://127.0.0.1:{port}/v1/engine/states", timeout=10).json()
        assert "stolen" not in str(listed)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
