"""Contract tests: the real Terraform CLI (the embedded ``kl-terraform``) against the backend lane over HTTP.

Each test starts a threaded server over the Flask app and drives it with stock ``backend "http"``
configurations built from ``terraform_data`` only (no provider downloads). They follow terraform's
``internal/backend/testing.go`` (two clients fighting over one lock, force-unlock) and the real-CLI list
in the http-backend notes. Byte-level claims go through a recording proxy that sits between Terraform
and the server and keeps every request body and answer status.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.serving import make_server
from werkzeug.wrappers import Request

from app.config import AuthMode
from tests.conftest import LiveServer, Terraform, kl_terraform_bin, wait_for

pytestmark = pytest.mark.terraform

ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --- helpers -----------------------------------------------------------------------------------

def plain(text: str) -> str:
    """Terraform output without colour codes (the CLI colours even with NO_COLOR set)."""
    return ANSI.sub("", text)


def backend_block(address: str, **extra: str) -> str:
    settings = {
        "address": address, "lock_address": address, "unlock_address": address,
        "lock_method": "LOCK", "unlock_method": "UNLOCK",
        **extra,
    }
    lines = "\n".join(f"    {key} = {json.dumps(value)}" for key, value in settings.items())
    return f'terraform {{\n  backend "http" {{\n{lines}\n  }}\n}}\n'


def slow_config(address: str, seconds: int, value: str = "v1") -> str:
    return backend_block(address) + f"""
resource "terraform_data" "slow" {{
  input = "{value}"
  provisioner "local-exec" {{
    command = "sleep {seconds}"
  }}
}}
"""


def one_resource_config(address: str, **extra: str) -> str:
    return backend_block(address, **extra) + """
variable "value" {
  type    = string
  default = "v1"
}

resource "terraform_data" "one" {
  input = var.value
}
"""


def pulled_state(tf: Terraform) -> bytes:
    """The state ``terraform state pull`` prints, as raw bytes (the runner decodes text).

    The command writes the state file (``statefile.Write``: indented JSON ending in a newline) through
    ``Ui.Output``, which appends one more newline; exactly that newline is dropped here.
    """
    proc = subprocess.run([kl_terraform_bin(), "state", "pull"], cwd=tf.workdir, env=tf.env,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert proc.stdout.endswith(b"}\n\n"), proc.stdout[-20:]
    return proc.stdout[:-1]


def state_list(tf: Terraform) -> list[str]:
    return sorted(tf("state", "list").stdout.split())


def head(server: LiveServer, name: str, **kwargs: Any) -> requests.Response:
    return requests.get(server.state_url(name), timeout=30, **kwargs)


def engine_addresses(server: LiveServer, name: str) -> list[str]:
    response = requests.get(f"{server.url}/v1/engine/states/{name}/resources", timeout=30)
    assert response.status_code == 200, response.text
    return sorted(row["address"] for row in response.json()["resources"])


def engine_addresses_at(server: LiveServer, name: str, serial: int) -> list[str]:
    response = requests.get(f"{server.url}/v1/engine/states/{name}/resources", params={"serial": serial},
                            timeout=30)
    assert response.status_code == 200, response.text
    return sorted(row["address"] for row in response.json()["resources"])


def events(server: LiveServer, name: str, **kwargs: Any) -> list[dict[str, Any]]:
    """The state's audit events, oldest first."""
    response = requests.get(f"{server.url}/v1/engine/states/{name}/events", params={"limit": 1000},
                            timeout=30, **kwargs)
    assert response.status_code == 200, response.text
    return list(reversed(response.json()["events"]))


def assert_server_matches_terraform(tf: Terraform, server: LiveServer, name: str) -> bytes:
    """state pull == the server's GET body, and the read API lists exactly ``terraform state list``."""
    got = head(server, name)
    assert got.status_code == 200, got.text
    assert pulled_state(tf) == got.content
    assert engine_addresses(server, name) == state_list(tf)
    return got.content


def lock_body(lock_id: str, who: str, **fields: str) -> bytes:
    return json.dumps({"ID": lock_id, "Who": who, **fields}).encode()


# --- a recording proxy -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Exchange:
    method: str
    path: str
    body: bytes
    status: int
    answer: bytes


_FORWARDED_HEADERS = ("authorization", "content-type", "content-md5")


@dataclass
class RecordingProxy:
    """A pass-through WSGI proxy to the live server that records what Terraform sent and got back."""

    upstream: str
    url: str = ""
    exchanges: list[Exchange] = field(default_factory=list)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def state_url(self, name: str) -> str:
        return f"{self.url}/v1/states/{name}"

    def sent(self, method: str) -> list[Exchange]:
        with self._guard:
            return [x for x in self.exchanges if x.method == method]

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        request = Request(environ)
        body = request.get_data()
        query = request.query_string.decode()
        path = request.path + (f"?{query}" if query else "")
        headers = {k: v for k, v in request.headers.items() if k.lower() in _FORWARDED_HEADERS}
        answer = requests.request(request.method, self.upstream + path, data=body, headers=headers,
                                  timeout=60, allow_redirects=False)
        with self._guard:
            self.exchanges.append(Exchange(request.method, path, body, answer.status_code, answer.content))
        reason = HTTP_STATUS_CODES.get(answer.status_code, "Unknown")
        start_response(f"{answer.status_code} {reason}", [
            ("Content-Type", answer.headers.get("Content-Type", "text/plain")),
            ("Content-Length", str(len(answer.content))),
        ])
        return [answer.content]


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[str], RecordingProxy]]:
    """Start recording proxies in front of live servers (one per call)."""
    started: list[tuple[Any, threading.Thread]] = []

    def start(upstream: str) -> RecordingProxy:
        proxy = RecordingProxy(upstream=upstream)
        server = make_server("127.0.0.1", 0, proxy, threaded=True)
        proxy.url = f"http://127.0.0.1:{server.server_port}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        started.append((server, thread))
        return proxy

    yield start
    for server, thread in started:
        server.shutdown()
        thread.join(timeout=5)


@pytest.fixture
def recording_proxy(live_server: LiveServer,
                    proxy_factory: Callable[[str], RecordingProxy]) -> RecordingProxy:
    return proxy_factory(live_server.url)


# --- 1. the whole lifecycle --------------------------------------------------------------------

ROOT_MODULE = """
variable "label" {
  type    = string
  default = "blue"
}

variable "items" {
  type    = number
  default = 3
}

resource "terraform_data" "base" {
  input = var.label
}

resource "terraform_data" "item" {
  count = var.items
  input = "${terraform_data.base.output}-${count.index}"
}

module "child" {
  source = "./modules/child"
  names  = ["a", "b"]
  label  = var.label
}

output "child_ids" {
  value = module.child.ids
}
"""

CHILD_MODULE = """
variable "names" {
  type = list(string)
}

variable "label" {
  type = string
}

resource "terraform_data" "tag" {
  for_each = toset(var.names)
  input    = "${var.label}-${each.key}"
}

output "ids" {
  value = [for tag in terraform_data.tag : tag.id]
}
"""


def test_init_apply_plan_change_and_destroy_keep_the_server_equal_to_terraforms_view(
        live_server, terraform_factory):
    tf = terraform_factory()
    name = "lifecycle"
    tf.write("main.tf", backend_block(live_server.state_url(name)) + ROOT_MODULE)
    (tf.workdir / "modules" / "child").mkdir(parents=True)
    tf.write("modules/child/main.tf", CHILD_MODULE)

    tf("init")
    assert head(live_server, name).status_code == 404  # init stores nothing

    tf("apply", "-auto-approve")
    first = assert_server_matches_terraform(tf, live_server, name)
    assert state_list(tf) == [
        'module.child.terraform_data.tag["a"]', 'module.child.terraform_data.tag["b"]',
        "terraform_data.base", "terraform_data.item[0]", "terraform_data.item[1]", "terraform_data.item[2]",
    ]

    no_changes = tf("plan", "-detailed-exitcode", check=False)
    assert no_changes.returncode == 0, plain(no_changes.output)
    assert assert_server_matches_terraform(tf, live_server, name) == first  # a plan writes nothing

    tf("apply", "-auto-approve", "-var", "label=green", "-var", "items=2")
    second = assert_server_matches_terraform(tf, live_server, name)
    assert json.loads(second)["serial"] > json.loads(first)["serial"]
    assert "terraform_data.item[2]" not in state_list(tf)
    changed = tf("plan", "-detailed-exitcode", "-var", "label=green", "-var", "items=2", check=False)
    assert changed.returncode == 0, plain(changed.output)
    assert assert_server_matches_terraform(tf, live_server, name) == second

    tf("destroy", "-auto-approve", "-var", "label=green", "-var", "items=2")
    assert_server_matches_terraform(tf, live_server, name)
    assert state_list(tf) == []
    kinds = [e["kind"] for e in events(live_server, name)]
    assert kinds.count("lock") == kinds.count("unlock") == 5  # two applies, two plans, one destroy
    assert "lock_conflict" not in kinds and "lock_force_release" not in kinds


# --- 2. two clients, one lock ------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_client_is_refused_while_the_first_applies_and_waits_with_lock_timeout(
        live_server, terraform_factory):
    name = "contended"
    first, second = terraform_factory("first"), terraform_factory("second")
    for tf in (first, second):
        tf.write("main.tf", slow_config(live_server.state_url(name), seconds=6))
        tf("init")

    applying = first.popen("apply", "-auto-approve")
    try:
        lock = wait_for(lambda: [e for e in events(live_server, name) if e["kind"] == "lock"],
                        "the first client's lock", timeout=30, every=0.1)[0]

        refused = second("plan", check=False)
        output = plain(refused.output)
        assert refused.returncode == 1, output
        assert "Error acquiring the state lock" in output
        # Terraform >= 1.15 prints the holder's LockInfo from the 423 body, not its own.
        assert re.search(rf"ID:\s+{re.escape(lock['lock_id'])}", output), output
        assert re.search(rf"Who:\s+{re.escape(lock['detail']['who'])}", output), output
        assert re.search(r"Operation:\s+OperationTypeApply", output), output

        assert applying.poll() is None, "the first apply ended before the second client started waiting"
        waited = second("plan", "-lock-timeout=30s", "-detailed-exitcode", check=False)
        first_output, _ = applying.communicate(timeout=60)
    finally:
        if applying.poll() is None:
            applying.kill()
            applying.wait()
    assert applying.returncode == 0, plain(first_output)
    # The wait ended with the first client's state: the same configuration has nothing left to do.
    assert waited.returncode == 0, plain(waited.output)

    trail = events(live_server, name)
    first_unlock = next(e["id"] for e in trail if e["kind"] == "unlock" and e["lock_id"] == lock["lock_id"])
    conflicts = [e for e in trail if e["kind"] == "lock_conflict"]
    assert {e["detail"]["holder"] for e in conflicts} == {lock["lock_id"]}
    assert len({e["lock_id"] for e in conflicts}) == 2  # the refused plan, then the waiting one
    waiting_id = conflicts[-1]["lock_id"]
    waiting_lock = next(e for e in trail if e["kind"] == "lock" and e["lock_id"] == waiting_id)
    assert conflicts[-1]["id"] < first_unlock < waiting_lock["id"]


# --- 3. force-unlock ---------------------------------------------------------------------------

def test_force_unlock_releases_a_hand_taken_lock_and_is_audited(live_server, terraform_factory):
    name = "stuck"
    url = live_server.state_url(name)
    tf = terraform_factory()
    tf.write("main.tf", one_resource_config(url))
    tf("init")
    lock_id = "8f2b7c1e-0d4a-4f3b-9a61-3c5e2d7b9f10"
    taken = requests.request("LOCK", url, timeout=30, data=lock_body(
        lock_id, "ci-runner@build-7", Operation="OperationTypeApply", Info="", Version="1.15.5",
        Created="2026-11-30T10:00:00.123456789Z", Path=""))
    assert taken.status_code == 200
    locked_out = tf("plan", check=False)
    assert locked_out.returncode == 1
    assert re.search(rf"ID:\s+{lock_id}", plain(locked_out.output)), plain(locked_out.output)

    unlocked = tf("force-unlock", "-force", lock_id)
    assert "successfully unlocked" in plain(unlocked.output)

    released = [e for e in events(live_server, name) if e["kind"] == "lock_force_release"]
    assert [e["lock_id"] for e in released] == [lock_id]
    # Terraform's force-unlock sends an empty body (terraform#28421), so the server never sees the ID.
    assert released[0]["detail"]["presented_id"] is None
    assert tf("plan", "-detailed-exitcode", check=False).returncode == 2  # unlocked: the plan runs


# --- 4. persists during a long apply -----------------------------------------------------------

# Terraform persists state mid-apply at most every 20 s. TF_STATE_PERSIST_INTERVAL can only raise that:
# Terraform 1.15 ignores values below the 20 s default (checked with this build: "1" still gives a single
# write), so the apply has to outlast 20 s. The clock starts at the first resource's state update; the
# 21 s resource's update is the first one past the interval and persists; the last resource makes the
# final state differ, so the end of the apply writes again.
PERSIST_CONFIG = """
resource "terraform_data" "first" {
  input = "first"
}

resource "terraform_data" "long" {
  input      = "long"
  depends_on = [terraform_data.first]
  provisioner "local-exec" {
    command = "sleep 21"
  }
}

resource "terraform_data" "last" {
  input      = "last"
  depends_on = [terraform_data.long]
}
"""


@pytest.mark.slow
def test_a_long_apply_persists_state_mid_apply_under_one_lock(live_server, terraform_factory):
    name = "persisting"
    tf = terraform_factory()
    tf.write("main.tf", backend_block(live_server.state_url(name)) + PERSIST_CONFIG)
    tf("init")
    tf("apply", "-auto-approve", timeout=120)

    trail = events(live_server, name)
    (lock,) = [e for e in trail if e["kind"] == "lock"]
    writes = [e for e in trail if e["kind"] == "state_write"]
    assert len(writes) == 2
    assert {w["lock_id"] for w in writes} == {lock["lock_id"]}
    intermediate, final = writes
    assert intermediate["serial"] < final["serial"]
    assert engine_addresses_at(live_server, name, intermediate["serial"]) == [
        "terraform_data.first", "terraform_data.long"]
    assert_server_matches_terraform(tf, live_server, name)
    assert json.loads(head(live_server, name).content)["serial"] == final["serial"]


# --- 5. pull and push --------------------------------------------------------------------------

def test_state_pull_is_the_last_post_byte_for_byte(live_server, recording_proxy, terraform_factory):
    name = "pulled"
    tf = terraform_factory()
    tf.write("main.tf", one_resource_config(recording_proxy.state_url(name)))
    tf("init")
    tf("apply", "-auto-approve")
    tf("apply", "-auto-approve", "-var", "value=v2")

    posts = recording_proxy.sent("POST")
    assert [p.status for p in posts] == [200, 200]
    assert pulled_state(tf) == posts[-1].body == head(live_server, name).content


def test_state_push_of_a_stale_file_is_refused_even_with_force(
        live_server, recording_proxy, terraform_factory):
    name = "pushed"
    tf = terraform_factory()
    tf.write("main.tf", one_resource_config(recording_proxy.state_url(name)))
    tf("init")
    tf("apply", "-auto-approve")
    old = tf.workdir / "old.tfstate"
    old.write_bytes(pulled_state(tf))
    assert json.loads(old.read_bytes())["serial"] == 1
    tf("apply", "-auto-approve", "-var", "value=v2")
    current = head(live_server, name).content
    assert json.loads(current)["serial"] == 2
    posts_before = len(recording_proxy.sent("POST"))

    # Without -force Terraform refuses the older serial itself: nothing reaches the server.
    refused = tf("state", "push", str(old), check=False)
    assert refused.returncode == 1
    assert "cannot import state with serial 1 over newer state with serial 2" in plain(refused.output)
    assert len(recording_proxy.sent("POST")) == posts_before
    assert head(live_server, name).content == current

    # With -force Terraform skips that check and POSTs the old contents with the old serial plus one
    # (2 here, the head's serial); a forced push carries no marker, so it looks like any other POST.
    # The server refuses any serial at or below the head, forced or not: accepting it would silently
    # roll the state back. Terraform discards the answer's body and prints only the status.
    forced = tf("state", "push", "-force", str(old), check=False)
    assert forced.returncode == 1
    assert "HTTP error: 409" in plain(forced.output)
    (same_serial,) = recording_proxy.sent("POST")[posts_before:]
    assert same_serial.status == 409 and json.loads(same_serial.body)["serial"] == 2
    assert b"already has serial 2" in same_serial.answer
    assert head(live_server, name).content == current

    # Once the head has moved on, the same forced push lands below it: refused as stale.
    tf("apply", "-auto-approve", "-var", "value=v3")
    current = head(live_server, name).content
    posts_before = len(recording_proxy.sent("POST"))
    forced = tf("state", "push", "-force", str(old), check=False)
    assert forced.returncode == 1
    assert "HTTP error: 409" in plain(forced.output)
    (below,) = recording_proxy.sent("POST")[posts_before:]
    assert below.status == 409 and json.loads(below.body)["serial"] == 2
    assert b"stale state" in below.answer
    assert head(live_server, name).content == current
    assert_server_matches_terraform(tf, live_server, name)


# --- 6. a holder that is not Terraform ---------------------------------------------------------

def test_a_lock_held_by_a_non_terraform_client_is_shown_in_terraforms_error(live_server, terraform_factory):
    name = "scripted"
    url = live_server.state_url(name)
    tf = terraform_factory()
    tf.write("main.tf", one_resource_config(url))
    tf("init")
    # A script's lock: an ID and a few words, no Created. The server adds an RFC 3339 Created so that
    # Terraform can read the conflict answer (it cannot parse a LockInfo without one).
    taken = requests.request("LOCK", url, timeout=30,
                             data=lock_body("db-migration-42", "nightly-cron", Info="schema migration"))
    assert taken.status_code == 200

    refused = tf("plan", "-lock-timeout=2s", check=False)
    output = plain(refused.output)
    assert refused.returncode == 1, output
    assert "Error acquiring the state lock" in output
    assert "failed to unmarshal" not in output
    assert re.search(r"ID:\s+db-migration-42", output), output
    assert re.search(r"Who:\s+nightly-cron", output), output
    assert re.search(r"Info:\s+schema migration", output), output
    assert re.search(r"Created:\s+\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", output), output
    # The holder's info parsed, so -lock-timeout kept retrying instead of giving up on the first 423.
    conflicts = [e for e in events(live_server, name) if e["kind"] == "lock_conflict"]
    assert len(conflicts) >= 2
    assert {e["detail"]["holder"] for e in conflicts} == {"db-migration-42"}


# --- 7. static token auth ----------------------------------------------------------------------

@pytest.fixture
def guarded(live_server_factory, proxy_factory) -> RecordingProxy:  # type: ignore[no-untyped-def]
    """A static-token server, behind a recording proxy so the tests see the statuses Terraform got."""
    server = live_server_factory(auth_mode=AuthMode.STATIC, auth_token="t0ken")
    return proxy_factory(server.url)


def test_static_auth_refuses_missing_credentials_with_401(guarded, terraform_factory):
    url = guarded.state_url("guarded")
    anonymous = terraform_factory("anonymous")
    anonymous.write("main.tf", one_resource_config(url))
    failed = anonymous("init", check=False)
    output = plain(failed.output)
    assert failed.returncode == 1, output
    assert "HTTP remote state endpoint requires auth" in output  # Terraform's words for a 401
    assert {x.status for x in guarded.exchanges} == {401}

    # Terraform sends Basic auth only when a username is set: a password alone is never sent.
    password_only = terraform_factory("password-only")
    password_only.write("main.tf", one_resource_config(url, password="t0ken"))
    failed = password_only("init", check=False)
    assert failed.returncode == 1
    assert "HTTP remote state endpoint requires auth" in plain(failed.output)
    assert {x.status for x in guarded.exchanges} == {401}


def test_static_auth_refuses_a_wrong_password_with_403(guarded, terraform_factory):
    tf = terraform_factory()
    tf.write("main.tf", one_resource_config(guarded.state_url("guarded"), username="ci", password="nope"))
    failed = tf("init", check=False)
    output = plain(failed.output)
    assert failed.returncode == 1, output
    assert "HTTP remote state endpoint invalid auth" in output  # Terraform's words for a 403
    assert {x.status for x in guarded.exchanges} == {403}


def test_static_auth_accepts_the_token_as_password_with_any_username(guarded, terraform_factory):
    name = "guarded"
    tf = terraform_factory()
    tf.write("main.tf", one_resource_config(guarded.state_url(name), username="any-name", password="t0ken"))
    tf("init")
    tf("apply", "-auto-approve")
    assert {x.status for x in guarded.exchanges} <= {200, 404}
    got = requests.get(guarded.state_url(name), auth=("someone-else", "t0ken"), timeout=30)
    assert got.status_code == 200
    assert pulled_state(tf) == got.content
    trail = requests.get(f"{guarded.url}/v1/engine/states/{name}/events", auth=("x", "t0ken"), timeout=30)
    assert {e["actor"] for e in trail.json()["events"]} == {"any-name"}


# --- beyond the list: other real-CLI paths from the acceptance checklist -------------------------

def test_an_apply_with_lock_false_cannot_write_while_another_client_holds_the_lock(
        live_server, terraform_factory):
    name = "unlocked-writer"
    url = live_server.state_url(name)
    tf = terraform_factory()
    tf.write("main.tf", one_resource_config(url))
    tf("init")
    taken = requests.request("LOCK", url, timeout=30, data=lock_body("holder-1", "ops@bastion"))
    assert taken.status_code == 200

    blind = tf("apply", "-auto-approve", "-lock=false", check=False)
    output = plain(blind.output)
    assert blind.returncode == 1, output
    # The POST carried no lock ID while another ID holds the lock: 423, and Terraform keeps its result
    # in errored.tfstate instead of losing it.
    assert "HTTP error: 423" in output, output
    assert (tf.workdir / "errored.tfstate").exists()
    assert head(live_server, name).status_code == 404
    assert [e["kind"] for e in events(live_server, name)] == ["lock"]


def test_init_migrate_state_copies_a_local_state_to_the_server(live_server, terraform_factory):
    name = "migrated"
    tf = terraform_factory()
    tf.write("main.tf", one_resource_config(live_server.state_url(name)).split("\n}\n", 1)[1])
    tf("init")
    tf("apply", "-auto-approve")
    local = json.loads((tf.workdir / "terraform.tfstate").read_bytes())

    tf.write("main.tf", one_resource_config(live_server.state_url(name)))
    tf("init", "-migrate-state", "-force-copy")
    migrated = assert_server_matches_terraform(tf, live_server, name)
    # Terraform copies the state's contents; it writes them through WriteState, which starts a new
    # lineage for a destination that has none, so only the resources are compared.
    assert json.loads(migrated)["resources"] == local["resources"]
    assert state_list(tf) == ["terraform_data.one"]
    assert tf("plan", "-detailed-exitcode", check=False).returncode == 0


def test_terraform_remote_state_reads_outputs_through_the_backend(live_server, terraform_factory):
    url = live_server.state_url("producer")
    producer = terraform_factory("producer")
    producer.write("main.tf", one_resource_config(url) + """
output "endpoint" {
  value = "db.internal:${terraform_data.one.output}"
}
""")
    producer("init")
    producer("apply", "-auto-approve", "-var", "value=5432")

    consumer = terraform_factory("consumer")
    consumer.write("main.tf", f"""
data "terraform_remote_state" "producer" {{
  backend = "http"
  config = {{
    address = "{url}"
  }}
}}

output "seen" {{
  value = data.terraform_remote_state.producer.outputs.endpoint
}}
""")
    consumer("init")
    consumer("apply", "-auto-approve")
    assert consumer("output", "-raw", "seen").stdout == "db.internal:5432"
