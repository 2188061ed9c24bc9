"""The dashboard in a real browser (headless Debian chromium through Selenium): log in, open a
state, filter its resources, read a resource's history, see overlapping apply runs drawn
overlapping, and abort a run so its reservations disappear. Screenshots go to test-artifacts/ui/."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.ui.conftest import REQUIRE

if not REQUIRE:  # on CI a missing selenium fails at import, like a missing browser fails in the fixture
    pytest.importorskip("selenium", reason="browser tests need selenium: pip install -e '.[test]'")

from selenium.common.exceptions import NoAlertPresentException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

from app.config import AuthMode
from app.domain.principal import default_principal
from tests.ui.conftest import ARTIFACTS, DB_PASSWORD, SCRIPT, SECRET_OUTPUT, SESSION_SECRET, TOKEN, Seeded, seed

pytestmark = pytest.mark.browser


@pytest.fixture
def site(live_server_factory: Any) -> Any:
    return live_server_factory(auth_mode=AuthMode.STATIC, auth_token=TOKEN, session_secret=SESSION_SECRET)


@pytest.fixture
def runs_seeded(site: Any) -> Seeded:
    from app.store import Database

    db = Database(site.settings.database_url, pool_size=2)
    try:
        return seed(db, default_principal(actor="seed"))
    finally:
        db.close()


def shot(browser: Any, name: str) -> None:
    """Save the page (cropped to its content) as a test artifact."""
    browser.find_element(By.TAG_NAME, "body").screenshot(str(ARTIFACTS / f"{name}.png"))


def wait_for(browser: Any, css: str) -> Any:
    return WebDriverWait(browser, 10).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def log_in(browser: Any, site: Any) -> None:
    browser.delete_all_cookies()
    browser.get(f"{site.url}/ui/")
    wait_for(browser, "#login-form")
    assert "/ui/login" in browser.current_url
    shot(browser, "01-login")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "name").send_keys("dana")
    browser.find_element(By.ID, "login").click()
    wait_for(browser, "#states")


def no_alert(browser: Any) -> bool:
    try:
        browser.switch_to.alert.text  # noqa: B018 - reading it raises when no alert is open
    except NoAlertPresentException:
        return True
    return False


def test_an_operator_logs_in_opens_a_state_filters_it_and_reads_a_history(browser, site, runs_seeded):
    log_in(browser, site)
    assert browser.find_element(By.ID, "who").text == "dana"
    row = browser.find_element(By.CSS_SELECTOR, "#states tbody tr")
    assert row.find_elements(By.TAG_NAME, "td")[1].text == "2"  # head serial after the commit
    shot(browser, "02-states")

    browser.find_element(By.LINK_TEXT, "prod").click()
    wait_for(browser, "#resources")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#resources tbody tr")) == 6
    outputs = browser.find_element(By.ID, "outputs").text
    assert "(sensitive)" in outputs and SECRET_OUTPUT not in browser.page_source
    box = browser.find_element(By.ID, "filter")
    box.send_keys("web")
    box.submit()
    wait_for(browser, "#resource-count")
    addresses = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#resources .resource-link")]
    assert addresses == ['terraform_data.web["<script>alert(1)</script>"]', 'terraform_data.web["blue"]',
                         'terraform_data.web["green"]']
    assert no_alert(browser)
    shot(browser, "03-state-filtered")

    browser.find_element(By.LINK_TEXT, addresses[0]).click()
    wait_for(browser, "#history")
    assert browser.find_element(By.ID, "address").text == addresses[0]
    assert no_alert(browser)
    assert "module.a.terraform_data.x" in browser.find_element(By.ID, "depends-on").text
    shot(browser, "03b-resource-script-address")

    browser.get(f"{site.url}/ui/states/prod/resource?address=module.a.terraform_data.x")
    wait_for(browser, "#history")
    cycles = browser.find_elements(By.CSS_SELECTOR, "#history > li")
    assert len(cycles) == 2
    assert "serial 2 → now" in cycles[0].text and '"A2"' in cycles[0].text and '"a"' in cycles[0].text
    assert "terraform_data.web" in browser.find_element(By.ID, "dependents").text
    shot(browser, "04-resource-history")

    browser.get(f"{site.url}/ui/states/prod/resource?address=terraform_data.db")
    wait_for(browser, "#history")
    assert "(sensitive)" in browser.find_element(By.ID, "history").text and DB_PASSWORD not in browser.page_source
    shot(browser, "04b-resource-sensitive")


def test_overlapping_runs_are_drawn_overlapping_and_an_abort_frees_the_reservations(browser, site, runs_seeded):
    log_in(browser, site)
    browser.get(f"{site.url}/ui/states/prod/runs")
    wait_for(browser, "#timeline")

    def bar(run_id: str) -> dict[str, float]:
        return browser.find_element(By.CSS_SELECTOR, f'rect.bar[data-run="{run_id}"]').rect  # type: ignore[no-any-return]

    committed, running, failed = bar(runs_seeded.committed), bar(runs_seeded.running), bar(runs_seeded.failed)
    assert committed["width"] > 20 and running["width"] > 20
    # alice's committed run (-10 → -2 min) and bob's live run (-6 min → now) overlap horizontally...
    assert committed["x"] < running["x"] < committed["x"] + committed["width"] < running["x"] + running["width"]
    # ...on separate rows, while carol's failed run (-20 → -15 min) ended before either began.
    assert committed["y"] + committed["height"] <= running["y"]
    assert failed["x"] + failed["width"] < committed["x"]
    colours = {run: browser.find_element(By.CSS_SELECTOR, f'rect.bar[data-run="{run}"]').value_of_css_property("fill")
               for run in (runs_seeded.committed, runs_seeded.running, runs_seeded.failed)}
    assert len(set(colours.values())) == 3
    assert "#2" in browser.find_element(By.ID, "timeline").text  # the serial the commit wrote
    shot(browser, "05-timeline")

    browser.get(f"{site.url}/ui/runs/{runs_seeded.failed}")
    wait_for(browser, "#error-summary")
    assert SCRIPT in browser.find_element(By.ID, "error-summary").text and no_alert(browser)
    shot(browser, "06-run-failed")

    browser.get(f"{site.url}/ui/reservations")
    wait_for(browser, "#reservations")
    rows = browser.find_elements(By.CSS_SELECTOR, f'#reservations tr[data-run="{runs_seeded.running}"]')
    assert len(rows) == 1 and "module.b.*" in rows[0].text and "bob" in rows[0].text
    shot(browser, "07-reservations")
    rows[0].find_element(By.CSS_SELECTOR, "button.abort-run").click()
    WebDriverWait(browser, 10).until(ec.alert_is_present())
    browser.switch_to.alert.accept()
    wait_for(browser, ".flash.ok")
    assert "aborted" in browser.find_element(By.CSS_SELECTOR, ".flash.ok").text
    assert not browser.find_elements(By.CSS_SELECTOR, f'#reservations tr[data-run="{runs_seeded.running}"]')
    with psycopg.connect(site.settings.database_url) as conn:
        left = conn.execute("SELECT count(*) FROM resource_reservations WHERE run_id = %s",
                            (runs_seeded.running,)).fetchone()
    assert left == (0,)
    shot(browser, "08-after-abort")

    browser.get(f"{site.url}/ui/runs/{runs_seeded.running}")
    wait_for(browser, "#run-status")
    assert browser.find_element(By.ID, "run-status").text == "aborted"
    assert browser.find_elements(By.ID, "no-reservations")
    assert "run_abort" in browser.find_element(By.ID, "events").text
    shot(browser, "09-run-aborted")

    browser.get(f"{site.url}/ui/runs")
    wait_for(browser, ".gantt")
    shot(browser, "10-all-runs")
    browser.get(f"{site.url}/ui/pulls")
    assert "not set up" in wait_for(browser, "#pulls-empty").text
    shot(browser, "11-pulls")


def test_first_day_edges_in_a_browser(browser: Any, site: Any) -> None:
    """A refused login keeps the name; open pull requests and their overlaps; a dry run drawn as one."""
    from datetime import timedelta

    from app.domain.reservations import RunStatus, parse_wanted
    from app.store import Database, bot, runs, states
    from tests.ui.conftest import prod_state

    browser.delete_all_cookies()
    browser.get(f"{site.url}/ui/login")
    wait_for(browser, "#login-form")
    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.ID, "name").send_keys("olga")
    browser.find_element(By.ID, "login").click()
    wait_for(browser, ".flash.error")
    assert browser.find_element(By.ID, "name").get_attribute("value") == "olga"

    db = Database(site.settings.database_url, pool_size=2)
    try:
        who = default_principal(actor="seed")
        states.write_state(db, who, "prod", prod_state(), lock_id=None)
        rehearsal = runs.open_run(db, who, "prod", actor="dora", wanted=parse_wanted([("*", "write")]),
                                  lease=timedelta(minutes=5), info={"dry_run": True})
        runs.close_run(db, who, rehearsal.id, holder="dora", status=RunStatus.ABORTED,
                       error_summary="dry run: reservations released")
        for number, sha in ((4, "a" * 40), (5, "b" * 40)):
            bot.save_footprint(db, bot.PrFootprint("acme/infra", number, "net", "prod", sha, ("net.tf",),
                                                   ("module.a.*",)))
    finally:
        db.close()
    log_in(browser, site)
    browser.get(f"{site.url}/ui/pulls")
    row = wait_for(browser, 'tr.pull[data-number="4"]')
    assert row.find_element(By.CSS_SELECTOR, "a.pr-link").get_attribute("href") == \
        "https://github.com/acme/infra/pull/4"
    assert "#5" in row.find_element(By.CSS_SELECTOR, "td.overlaps").text
    shot(browser, "12-pulls-open")
    browser.get(f"{site.url}/ui/runs/{rehearsal.id}")
    assert wait_for(browser, "#run-status").text == "dry-run"
    assert "Nothing was applied" in browser.find_element(By.ID, "dry-run-note").text
    browser.get(f"{site.url}/ui/states/prod/runs")
    bar = wait_for(browser, f'rect.bar[data-run="{rehearsal.id}"]')
    assert bar.get_attribute("data-status") == "dry-run"
