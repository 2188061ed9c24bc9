"""The engine client retries reads the way Terraform's HTTP backend client does and never re-sends a change:
a real HTTP server answers 503 (or drops the connection) a set number of times before answering."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from runner.core.config import ClientConfig
from runner.core.engine_client import EngineClient, EngineError


class Flaky(ThreadingHTTPServer):
    """Answers the first ``failures`` requests with ``status`` (0: closes the connection unanswered)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.failures = 0
        self.status = 503
        self.seen: list[tuple[str, str]] = []


class _Handler(BaseHTTPRequestHandler):
    server: Flaky

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.server.seen.append((self.command, self.path))
        if self.server.failures > 0:
            self.server.failures -= 1
            if self.server.status == 0:
                self.close_connection = True
                self.connection.close()
                return
            self._send(self.server.status, {"error": {"code": "unavailable", "message": "busy"}})
            return
        if self.path.endswith("/edges"):
            self._send(200, {"edges": [{"address": "a.b", "depends_on": "c.d"}]})
        elif self.path.endswith("/states"):
            self._send(200, {"states": [{"name": "prod"}]})
        else:
            self._send(200, {"run": {"id": "ar_1"}, "committed": True})

    def _send(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer


@pytest.fixture
def flaky() -> Iterator[Flaky]:
    server = Flaky()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def client(server: Flaky) -> EngineClient:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    return EngineClient(ClientConfig(base_url=url, state="prod", username=None, token=None), timeout=30)


@pytest.mark.parametrize("status", [503, 502, 429, 0])
def test_a_read_is_retried_until_it_is_answered(flaky: Flaky, status: int) -> None:
    flaky.failures, flaky.status = 1, status
    assert client(flaky).list_states() == [{"name": "prod"}]
    assert flaky.seen == [("GET", "/v1/engine/states")] * 2


def test_the_glob_queries_are_reads_too(flaky: Flaky) -> None:
    flaky.failures = 1
    assert client(flaky).edges("prod", ["a.*"]) == [("a.b", "c.d")]
    assert [method for method, _ in flaky.seen] == ["POST", "POST"]


def test_a_read_gives_up_after_two_retries_with_the_servers_error(flaky: Flaky) -> None:
    flaky.failures = 10
    with pytest.raises(EngineError) as refused:
        client(flaky).list_states()
    assert refused.value.status == 503
    assert len(flaky.seen) == 3


def test_501_is_not_retried(flaky: Flaky) -> None:
    flaky.failures, flaky.status = 1, 501
    with pytest.raises(EngineError):
        client(flaky).list_states()
    assert len(flaky.seen) == 1


@pytest.mark.parametrize("status", [503, 0])
def test_a_change_is_sent_once(flaky: Flaky, status: int) -> None:
    flaky.failures, flaky.status = 1, status
    with pytest.raises(EngineError):
        client(flaky).commit("ar_1", holder="me", state={"version": 4}, slice_addresses=[])
    assert flaky.seen == [("POST", "/v1/engine/runs/ar_1/commit")]
