"""Pull-request holds in the store: reservations under the pull request's name that no lease ends, refused
and listed by the ordinary reservation paths, ended by release."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.principal import default_principal
from app.domain.reservations import Mode, parse_wanted
from app.errors import BadRequestError, ReservationConflictError
from app.store import pr_holds, runs

REPO = "octo-org/infra"


def take(db, number: int, globs: list[str], *, max_globs: int = 100) -> pr_holds.PrHold:  # type: ignore[no-untyped-def]
    return pr_holds.take(db, default_principal("kilolock-bot"), repo=REPO, number=number, project="infra",
                         state_name="infra", write_globs=globs, head_sha="a" * 40, applied_serial=2,
                         applied_run_id="ar_applied", max_globs=max_globs)


def test_a_hold_is_a_write_reservation_named_after_the_pull_request_that_does_not_lapse(bot_db):
    hold = take(bot_db, 1, ["terraform_data.db", "terraform_data.db.*"])

    listed = runs.list_reservations(bot_db, default_principal())
    assert [(r.glob, r.mode, r.holder) for r in listed] == [
        ("terraform_data.db", "write", f"{REPO}#1"), ("terraform_data.db.*", "write", f"{REPO}#1")]
    assert all(r.expires_at and r.expires_at > datetime.now(UTC) + timedelta(days=365 * 50) for r in listed)
    assert hold.live and hold.holder == f"{REPO}#1" and hold.applied_serial == 2
    run = runs.get_run(bot_db, default_principal(), hold.run_id)
    assert run.status == "reserved" and run.info["pr_hold"]["number"] == 1
    pr_holds.release(bot_db, hold, "#1 was closed")
    with bot_db.transaction() as conn:
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events WHERE kind LIKE 'pr_hold_%' ORDER BY id")]
    assert kinds == ["pr_hold_taken", "pr_hold_released"]


def test_an_intersecting_run_or_hold_is_refused_naming_the_pull_request_and_a_disjoint_one_is_not(bot_db):
    take(bot_db, 1, ["terraform_data.db"])

    with pytest.raises(ReservationConflictError) as caught:
        runs.open_run(bot_db, default_principal("bob"), "infra", actor="bob", lease=timedelta(minutes=5),
                      wanted=parse_wanted([("terraform_data.db.*", Mode.READ.value)]))
    assert f"held by {REPO}#1" in caught.value.message
    with pytest.raises(ReservationConflictError):
        take(bot_db, 2, ["terraform_data.db"])
    assert pr_holds.of_pull_request(bot_db, REPO, 2) == []
    take(bot_db, 2, ["terraform_data.queue"])
    assert [h.number for h in pr_holds.on_state(bot_db, REPO, "infra")] == [1, 2]


def test_release_ends_the_run_and_frees_the_addresses(bot_db):
    hold = take(bot_db, 1, ["terraform_data.db"])

    pr_holds.release(bot_db, hold, "#1 was merged")

    assert pr_holds.of_repo(bot_db, REPO) == [] and runs.list_reservations(bot_db, default_principal()) == []
    run = runs.get_run(bot_db, default_principal(), hold.run_id)
    assert (run.status, run.error_summary) == ("aborted", "#1 was merged")
    take(bot_db, 2, ["terraform_data.db"])


def test_a_hold_aborted_by_an_operator_is_no_longer_live_and_releases_quietly(bot_db):
    hold = take(bot_db, 1, ["terraform_data.db"])
    runs.abort(bot_db, default_principal("operator"), hold.run_id, reason="stuck")

    [stale] = pr_holds.of_pull_request(bot_db, REPO, 1)
    assert not stale.live
    pr_holds.release(bot_db, stale, "#1 was closed")
    assert pr_holds.of_repo(bot_db, REPO) == []


def test_a_hold_has_the_per_run_glob_cap_and_a_refused_one_holds_nothing(bot_db):
    with pytest.raises(BadRequestError) as caught:
        take(bot_db, 1, [f"terraform_data.web[{i}]" for i in range(4)], max_globs=3)

    assert "4 write globs" in caught.value.message and "KL_MAX_GLOBS_PER_RUN" in caught.value.message
    assert runs.list_reservations(bot_db, default_principal()) == []
    assert pr_holds.of_pull_request(bot_db, REPO, 1) == []
    assert take(bot_db, 1, [f"terraform_data.web[{i}]" for i in range(3)], max_globs=3).live


def test_holds_are_counted_apart_from_live_runs_so_an_old_hold_is_no_stuck_apply(bot_db):
    from app.store import gauges

    later = datetime.now(UTC) + timedelta(days=3)
    hold = take(bot_db, 7, ["terraform_data.db"])
    before = gauges.read_gauges(bot_db, now=later, waiter_fresh=later)
    assert before.pr_holds == 1 and before.oldest_pr_hold_seconds > 2 * 86400
    assert before.oldest_live_run_seconds == 0.0 and dict(before.runs_by_status).get("reserved", 0) == 0

    run = runs.open_run(bot_db, default_principal("bob"), "infra", actor="bob", lease=timedelta(minutes=5),
                        wanted=parse_wanted([("terraform_data.queue", Mode.WRITE.value)]))
    during = gauges.read_gauges(bot_db, now=later, waiter_fresh=later)
    assert during.oldest_live_run_seconds > 2 * 86400 and dict(during.runs_by_status)["reserved"] == 1
    assert [h.run_id for h in pr_holds.of_tenant(bot_db, default_principal())] == [hold.run_id]
    assert run.id != hold.run_id
