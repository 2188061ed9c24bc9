"""What a pull request's code can reach, end to end over the real bot: Terraform (the embedded one, with
provisioners that dump their environment) sees an allowlist and the provider variables the default branch
names, never the worker's secrets; the engine token goes only to the trusted server, whatever the head's
backend block says; and what the bot posts is redacted and escaped."""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.store import Database, pr_holds
from bench.common import http_backend
from runner.bot import jobs
from runner.bot.render import MARKER
from tests.bot.botworld import FILES, REPO, World, comment_globs, fast_github, world_factory  # noqa: F401

pytestmark = pytest.mark.terraform

DB_V2 = FILES["db.tf"].replace("db-v1", "db-v2")
OPEN = "apply_on_comment: true\napply_requirements: []\n"
BOT_TOKEN = "klbot_" + "B" * 32
SECRETS = {
    "KL_GITHUB_TOKEN": "ghp_" + "G" * 36,
    "KL_BOT_TOKEN": BOT_TOKEN,
    "KL_GITHUB_WEBHOOK_SECRET": "webhook-secret-" + "w" * 24,
    "KL_DATABASE_URL": "postgresql://kilolock:db-password-4711@db.internal:5432/kilolock",
    "KL_AUTH_TOKEN": "auth-token-" + "a" * 24,
}
_ids = itertools.count(9101)


def spy(name: str, path: Path) -> str:
    """A resource whose creation writes the provisioner's whole environment to ``path``."""
    return (f'resource "terraform_data" "{name}" {{\n  input = "spy"\n'
            f'  provisioner "local-exec" {{\n    command = "env > {path}"\n  }}\n}}\n')


def secrets_in_env(monkeypatch: pytest.MonkeyPatch, **extra: str) -> None:
    for key, value in {**SECRETS, **extra}.items():
        monkeypatch.setenv(key, value)


def sent(w: World) -> list[str]:
    return [str(c.body) for c in w.sim.calls if c.body]


def outside_fences(text: str) -> str:
    return re.sub(r"(`{3,})\n.*?\n\1", "", text, flags=re.S)


def test_terraform_run_by_the_bot_sees_the_allowlist_and_the_default_branchs_env_only(
        world_factory, tmp_path, monkeypatch):  # noqa: F811
    secrets_in_env(monkeypatch, AWS_PROFILE="team-prod", UNLISTED_CREDENTIAL="not-for-terraform-" + "u" * 12)
    w = world_factory(kilolock_yml=OPEN + "env: [AWS_PROFILE]\n")
    dump = tmp_path / "env-of-terraform.txt"
    head = w.open_pr(1, "spy", {"spy.tf": spy("spy", dump)})
    w.run_jobs()
    w.deliver_comment(1, "kilolock apply", login="alice", comment_id=next(_ids))
    w.run_jobs()

    assert dump.is_file(), f"the provisioner did not run: {[c['body'] for c in w.sim.pr_comments(1)]}"
    seen = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert seen.get("AWS_PROFILE") == "team-prod" and seen.get("PATH")
    assert not [k for k in seen if k.startswith(("KL_", "TF_HTTP_"))], sorted(seen)
    assert "UNLISTED_CREDENTIAL" not in seen
    text = dump.read_text()
    every_secret = [*SECRETS.values(), w.settings.github_private_key or "", "not-for-terraform-"]
    assert not [s for s in every_secret if s and s in text]
    assert [h.head_sha for h in _holds(w, 1)] == [head]


def test_a_backend_block_in_the_pull_request_never_receives_the_bot_token(world_factory, monkeypatch):  # noqa: F811
    w = world_factory()
    jobs.configure(replace(w.settings, bot_token=BOT_TOKEN), github=fast_github)
    with _receiver() as (url, received):
        attacker = http_backend(f"{url}/v1/states/infra")
        w.open_pr(1, "elsewhere", {"backend.tf": attacker, "db.tf": DB_V2})
        w.run_jobs()

        assert received == [], received
    body = w.sim.bot_comment(1)
    # Predicted and planned against the trusted server (the default branch's backend block).
    assert "terraform_data.db" in comment_globs(body)["write"], body
    assert "| update | `terraform_data.db` |" in body
    assert not any(BOT_TOKEN in text for text in sent(w))


def test_preview_errors_and_config_problems_reach_github_redacted_and_escaped(
        world_factory, monkeypatch):  # noqa: F811
    value = "VALUE-" + "k" * 20
    secrets_in_env(monkeypatch, TF_VAR_x_api_key=value)
    w = world_factory(kilolock_yml='env: ["TF_VAR_*"]\n')
    token_shape = "ghp_" + "Q" * 36
    w.open_pr(1, "api", {"api.tf": (
        'variable "x_api_key" {\n  type = string\n  validation {\n    condition     = length(var.x_api_key) < 3\n'
        f'    error_message = "ping @octocat, see [docs](https://evil.example/x) <img src=x> {token_shape}"\n'
        '  }\n}\n\nresource "terraform_data" "api" {\n  input = var.x_api_key\n}\n')})
    w.open_pr(2, "yml", {".kilolock.yml": 'env: ["TF_VAR_*"]\n"@octocat [x](https://evil.example) <b>": 1\n'})
    w.run_jobs()

    texts = sent(w)
    plan = w.sim.runs("kilolock/plan")
    assert plan and plan[-1]["conclusion"] == "failure", plan
    shown = str(plan[-1]["output"])
    assert "x_api_key" in shown and "[redacted]" in shown, shown
    for secret in (value, token_shape, *SECRETS.values()):
        assert not any(secret in text for text in texts), secret
    outputs = [str((r.get("output") or {}).get(part) or "") for r in w.sim.runs() for part in ("summary", "text")]
    for body in (w.sim.bot_comment(1), w.sim.bot_comment(2), *outputs):
        live = outside_fences(body.replace(MARKER, ""))
        assert "@octocat" not in live and "](https://" not in live and "<img" not in live and "<b>" not in live
    assert "unknown key" in w.sim.bot_comment(2)


def _holds(w: World, number: int) -> list[pr_holds.PrHold]:
    db = Database(w.settings.database_url or "", pool_size=1)
    try:
        return pr_holds.of_pull_request(db, REPO, number)
    finally:
        db.close()


class _Recorder(BaseHTTPRequestHandler):
    received: list[str]

    def _record(self) -> None:
        self.received.append(f"{self.command} {self.path} {self.headers.get('Authorization', '')}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = do_PUT = do_DELETE = do_LOCK = do_UNLOCK = _record  # noqa: N815

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass


@contextmanager
def _receiver() -> Iterator[tuple[str, list[str]]]:
    """A tiny HTTP server on 127.0.0.1 standing in for the attacker's host: it records every request."""
    received: list[str] = []
    handler = type("Recorder", (_Recorder,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
