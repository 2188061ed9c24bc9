"""Fixtures for the dashboard: apps in each auth mode, a seeded state with overlapping apply runs,
logged-in test clients, and the headless Debian chromium driven by Selenium.

The browser is Debian's ``chromium`` with ``chromium-driver`` (nothing is downloaded at test time).
Without it the browser tests skip with the reason, unless ``KL_TEST_REQUIRE_SERVICES=1`` (CI), where
they fail.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.config import AuthMode, Settings
from app.domain.principal import Principal, default_principal
from app.domain.reservations import RunStatus, parse_wanted
from app.store import Database, runs, states
from app.store import commit as commit_store
from tests.helpers import instance, resource, state

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"
REQUIRE = os.environ.get("KL_TEST_REQUIRE_SERVICES") == "1"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
TOKEN = "static-dashboard-token-0123456789"
SESSION_SECRET = "a-session-secret-for-tests-only-0123456789"
CONTROL = "control-secret-token"
SCRIPT = "<script>alert(1)</script>"
DB_PASSWORD = "hunter2-db-password"
SECRET_OUTPUT = "s3cr3t-output-value"


def prod_state(serial: int = 1, a_value: str = "a") -> bytes:
    """A state with a module per team, a for_each whose key and value carry a script tag, a
    resource with sensitive attributes and a sensitive output."""
    masked = [[{"type": "get_attr", "value": "input"}], [{"type": "get_attr", "value": "output"}]]
    return state(serial, [
        resource("x", [instance(None, a_value)], module="module.a"),
        resource("x", [instance(None, "b")], module="module.b"),
        resource("web", [instance(k, f"web-{k}", deps=["module.a.terraform_data.x"])
                         for k in ("blue", "green", SCRIPT)]),
        resource("db", [instance(None, DB_PASSWORD, sensitive_attributes=masked)]),
    ], outputs={"endpoint": {"value": f"https://example.test/{SCRIPT}", "type": "string"},
                "db_password": {"value": SECRET_OUTPUT, "type": "string", "sensitive": True}})


@dataclass
class Seeded:
    committed: str  # opened 10 min ago, committed 2 min ago (serial 2)
    running: str    # opened 6 min ago, still holding module.b.*: overlaps ``committed``
    failed: str     # opened 20 min ago, failed 15 min ago: overlaps nothing


def seed(db: Database, who: Principal, name: str = "prod") -> Seeded:
    """Write serial 1 and three apply runs with chosen timings (the store takes a clock)."""
    states.write_state(db, who, name, prod_state(), lock_id=None)
    now = datetime.now(UTC)

    def at(minutes: float):  # type: ignore[no-untyped-def]
        return lambda: now - timedelta(minutes=minutes)

    lease = timedelta(minutes=15)
    failed = runs.open_run(db, who, name, actor="carol", wanted=parse_wanted([("module.b.*", "write")]),
                           lease=lease, base_serial=1, clock=at(20))
    runs.close_run(db, who, failed.id, holder="carol", status=RunStatus.FAILED, clock=at(15),
                   error_summary=f"terraform apply exited 1: {SCRIPT}", counters={"planned": 1, "applied": 0})
    committed = runs.open_run(db, who, name, actor="alice", wanted=parse_wanted([("module.a.*", "write")]),
                              lease=lease, base_serial=1, clock=at(10))
    running = runs.open_run(db, who, name, actor="bob", wanted=parse_wanted([("module.b.*", "write")]),
                            lease=lease, base_serial=1, clock=at(6))
    after = json.loads(prod_state(a_value="A2"))
    after["resources"] = [r for r in after["resources"] if r.get("module") == "module.a"]
    commit_store.commit_run(db, who, committed.id, holder="alice", state_body=json.dumps(after).encode(),
                            slice_addresses=["module.a.terraform_data.x"], clock=at(2))
    return Seeded(committed=committed.id, running=running.id, failed=failed.id)


@pytest.fixture
def static_settings(settings: Settings) -> Settings:
    return replace(settings, auth_mode=AuthMode.STATIC, auth_token=TOKEN, session_secret=SESSION_SECRET)


@pytest.fixture
def static_app(static_settings: Settings) -> Iterator[Any]:
    from app.web import create_app

    application = create_app(static_settings)
    yield application
    application.extensions["kilolock"].db.close()


@pytest.fixture
def anon(static_app: Any) -> Any:
    """A client with no session."""
    return static_app.test_client()


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


def login(client: Any, token: str, name: str = "operator") -> Any:
    page = client.get("/ui/login", headers={"Accept": "text/html"})
    return client.post("/ui/login", data={"csrf_token": csrf_of(page.get_data(as_text=True)), "token": token,
                                          "name": name}, headers={"Accept": "text/html"})


@pytest.fixture
def ui(static_app: Any) -> Any:
    """A client logged in to the dashboard (static mode), asking for HTML."""
    client = static_app.test_client()
    assert login(client, TOKEN).status_code == 302
    client.environ_base["HTTP_ACCEPT"] = "text/html"
    return client


@pytest.fixture
def seeded(static_app: Any) -> Seeded:
    return seed(static_app.extensions["kilolock"].db, default_principal(actor="seed"))


def page(client: Any, path: str, status: int = 200) -> str:
    response = client.get(path)
    assert response.status_code == status, (path, response.status_code, response.get_data(as_text=True)[:500])
    return response.get_data(as_text=True)


# --- database mode: tenants ----------------------------------------------------------------------------

CTL = {"Authorization": f"Bearer {CONTROL}"}


@pytest.fixture
def tenant_app(settings: Settings) -> Iterator[Any]:
    from app.web import create_app

    application = create_app(replace(settings, auth_mode=AuthMode.DATABASE, control_token=CONTROL,
                                     session_secret=SESSION_SECRET))
    yield application
    application.extensions["kilolock"].db.close()


def make_tenant(client: Any, slug: str, **token: Any) -> tuple[str, str]:
    """A tenant through the control API and its first token (``SLUG-ops`` in ``production``): secret and id."""
    assert client.post("/v1/api/tenants", json={"slug": slug}, headers=CTL).status_code == 201
    made = client.post(f"/v1/api/tenants/{slug}/tokens", headers=CTL,
                       json={"name": f"{slug}-ops", "environment": "production", **token}).get_json()
    return made["token_secret"], made["token"]["id"]


# --- the browser ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian chromium through Selenium and Debian's chromedriver."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package (pip install -e '.[test]')")
    if missing:
        reason = f"browser tests need {', '.join(missing)}: apt-get install -y chromium chromium-driver"
        if REQUIRE:
            pytest.fail(f"KL_TEST_REQUIRE_SERVICES=1 and {reason}")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()
