"""Pull-request holds are bounded, end to end over the real bot: ``hold_expiry`` of the default branch's
``.kilolock.yml`` releases an old hold at the next reconciliation, ``/metrics`` counts holds apart from live
runs (an old hold is no stuck apply), and the dashboard lists them with their age."""

from __future__ import annotations

import re

import pytest
import requests

from app.store import Database, pr_holds
from runner.bot.render import MARKER
from tests.bot.botworld import FILES, REPO, World, world_factory  # noqa: F401

pytestmark = pytest.mark.terraform

DB_V2 = FILES["db.tf"].replace("db-v1", "db-v2")
QUEUE_V2 = FILES["queue.tf"].replace("v1", "v2")


def _holds(w: World, number: int) -> list[pr_holds.PrHold]:
    db = Database(w.settings.database_url or "", pool_size=1)
    try:
        return pr_holds.of_pull_request(db, REPO, number)
    finally:
        db.close()


def _age_holds(w: World, hours: int) -> None:
    """Make the holds (and their runs) ``hours`` older, as if that time had passed."""
    db = Database(w.settings.database_url or "", pool_size=1)
    try:
        with db.transaction() as conn:
            conn.execute("UPDATE pull_request_holds SET created_at = created_at - make_interval(hours => %s)",
                         (hours,))
            conn.execute("UPDATE apply_runs SET created_at = created_at - make_interval(hours => %s) "
                         "WHERE info ? 'pr_hold'", (hours,))
    finally:
        db.close()


def _gauge(text: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    assert match, f"{name} is not exposed"
    return float(match.group(1))


def test_an_old_hold_is_no_stuck_run_is_listed_with_its_age_and_expires_by_the_default_branchs_rule(
        world_factory):  # noqa: F811
    w = world_factory(kilolock_yml="apply_on_comment: true\napply_requirements: []\nhold_expiry: 24h\n")
    w.open_pr(1, "db-v2", {"db.tf": DB_V2})
    w.run_jobs()
    w.deliver_comment(1, "kilolock apply", login="alice", comment_id=8101)
    w.run_jobs()
    assert [h.project for h in _holds(w, 1)] == ["infra"]
    assert "### Applied before merge" in _comment(w, 1)

    _age_holds(w, 3)
    metrics = requests.get(f"{w.server_url}/metrics", timeout=10).text
    assert _gauge(metrics, "kilolock_pull_request_holds") == 1
    assert _gauge(metrics, "kilolock_oldest_pull_request_hold_age_seconds") > 2 * 3600
    assert _gauge(metrics, "kilolock_oldest_live_run_age_seconds") == 0  # KilolockStuckApplyRun stays quiet
    page = requests.get(f"{w.server_url}/ui/pulls", timeout=10)
    assert page.status_code == 200, page.text[:500]
    row = re.search(r'<tr class="hold" data-number="1".*?</tr>', page.text, re.S)
    assert row and re.search(r'class="age">3h\d\dm ago<', row.group(0)), page.text[-3000:]

    # Not expired yet at 3 h: a reconciliation keeps it.
    w.connection().delete(f"kilolock:reconcile:{REPO}")
    w.open_pr(2, "queue-v2", {"queue.tf": QUEUE_V2})
    w.run_jobs()
    assert _holds(w, 1)

    _age_holds(w, 22)
    w.connection().delete(f"kilolock:reconcile:{REPO}")
    w.push_pr(2, {"queue.tf": QUEUE_V2.replace("v2", "v3")})
    w.run_jobs()

    assert _holds(w, 1) == []
    reservations = requests.get(f"{w.server_url}/v1/engine/reservations?state=infra", timeout=10).json()
    assert [r for r in reservations["reservations"] if r["holder"] == f"{REPO}#1"] == []
    comment = _comment(w, 1)
    assert "### Applied before merge" not in comment and "terraform_data.db" in comment


def _comment(w: World, number: int) -> str:
    [body] = [str(c["body"]) for c in w.sim.pr_comments(number) if c["user"] == w.sim.bot_login
              and MARKER in c["body"]]
    return body
