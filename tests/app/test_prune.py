"""Retention: old versions lose their raw bytes, never their rows; the head and live runs' bases keep them;
pruned versions still read as documented (docs/data-model.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from app.config import Settings
from app.store import prune
from app.store.db import Database
from app.web import pruning
from tests.app.test_lazy_state import commit_one, open_run
from tests.helpers import counted_state

STATE = "/v1/states/big"


def bytes_by_serial(url: str) -> dict[int, tuple[bool, bool]]:
    """serial -> (holds bytes, marked pruned)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT serial, raw_state IS NOT NULL, pruned_at IS NOT NULL FROM state_versions "
                            "ORDER BY serial").fetchall()
    return {s: (has, pruned) for s, has, pruned in rows}


def history_of(client) -> list[bytes]:  # type: ignore[no-untyped-def]
    """POST serials 1..6, then commit serials 7 and 8 (read once each, so both hold bytes)."""
    posted = [counted_state(s, 20, changed=s) for s in range(1, 7)]
    for body in posted:
        assert client.post(STATE, data=body).status_code == 200
    commit_one(client, "", 1, "kl-7", 6)
    client.get("/v1/engine/states/big/assembled?serial=7")
    commit_one(client, "", 2, "kl-8", 7)
    assert client.get(STATE).data  # the streamed body: the head is cached once it has been read whole
    return posted


def test_prune_keeps_the_newest_the_head_and_live_bases_and_every_row(client, clean_db, db):
    posted = history_of(client)
    listings = {s: client.get(f"/v1/engine/states/big/resources?serial={s}").get_json() for s in range(1, 9)}
    rebuilt = {s: client.get(f"/v1/engine/states/big/assembled?serial={s}").data for s in range(1, 9)}
    head_before = client.get(STATE).data
    live_base = open_run(client, "", "carol", "terraform_data.item[9]", 2)  # a live run planned on serial 2
    assert live_base

    report = prune.prune(db, prune.RetentionPolicy(keep_versions=2))
    assert (report.versions, report.states) == (5, 1)  # serials 1, 3, 4, 5, 6
    assert bytes_by_serial(clean_db) == {1: (False, True), 2: (True, False), 3: (False, True), 4: (False, True),
                                         5: (False, True), 6: (False, True), 7: (True, False), 8: (True, False)}
    # Nothing else changed: the head's bytes, every listing and every rebuilt state are as before.
    assert client.get(STATE).data == head_before
    for s in range(1, 9):
        assert client.get(f"/v1/engine/states/big/resources?serial={s}").get_json() == listings[s]
        assert client.get(f"/v1/engine/states/big/assembled?serial={s}").data == rebuilt[s]
    assert json.loads(rebuilt[3])["serial"] == 3 and rebuilt[3] != posted[2]  # rebuilt, not the POSTed bytes
    # Idempotent.
    assert prune.prune(db, prune.RetentionPolicy(keep_versions=2)).versions == 0
    # Once the run is gone, Terraform's next POST is compared against the head as before.
    assert client.post(f"/v1/engine/runs/{live_base}/abort", json={"reason": "done"}).status_code == 200
    assert client.post(STATE, data=counted_state(9, 20)).status_code == 200


def test_a_pruned_apply_version_is_rebuilt_on_read_without_being_cached_again(client, clean_db, db):
    history_of(client)
    cached = client.get("/v1/engine/states/big/assembled?serial=7").data
    prune.prune(db, prune.RetentionPolicy(keep_versions=1))
    assert bytes_by_serial(clean_db)[7] == (False, True)
    assert client.get("/v1/engine/states/big/assembled?serial=7").data == cached  # the same bytes, from rows
    assert bytes_by_serial(clean_db)[7] == (False, True)  # and retention is not undone


def test_the_age_rule_prunes_only_versions_older_than_it(client, clean_db, db):
    history_of(client)
    week = prune.RetentionPolicy(keep_age=timedelta(days=7))
    assert prune.prune(db, week).versions == 0  # everything is younger than a week
    dry = prune.prune(db, week, dry_run=True, now=datetime.now(UTC) + timedelta(days=8))
    assert (dry.versions, dry.dry_run) == (7, True) and all(has for has, _ in bytes_by_serial(clean_db).values())
    both = prune.RetentionPolicy(keep_versions=3, keep_age=timedelta(days=7))
    assert prune.prune(db, both, now=datetime.now(UTC) + timedelta(days=8)).versions == 5
    assert [s for s, (has, _) in bytes_by_serial(clean_db).items() if has] == [6, 7, 8]


def test_kl_prune_uses_the_settings_and_reports(client, clean_db):
    history_of(client)
    env = {**os.environ, "KL_DATABASE_URL": clean_db, "KL_RETAIN_VERSIONS": "4"}
    kl = str(Path(sys.executable).with_name("kl"))
    dry = subprocess.run([kl, "prune", "--dry-run", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["versions"] == 4 and json.loads(dry.stdout)["dry_run"] is True
    done = subprocess.run([kl, "prune", "--keep", "6"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "removed the raw bytes of 2 versions in 1 states" in done.stdout
    off = subprocess.run([kl, "prune"], env={**env, "KL_RETAIN_VERSIONS": "0"}, capture_output=True, text=True,
                         timeout=120)
    assert off.returncode == 3 and "retention is off" in off.stderr


def test_the_server_prunes_on_its_timer(client, clean_db, settings):
    history_of(client)
    database = Database(clean_db, pool_size=2)
    stop = pruning.start(replace(settings, retain_versions=2, prune_interval_seconds=1), database)
    try:
        assert stop is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and bytes_by_serial(clean_db)[6][0]:
            time.sleep(0.2)
        assert [s for s, (has, _) in bytes_by_serial(clean_db).items() if has] == [7, 8]
    finally:
        if stop is not None:
            stop.set()
        time.sleep(0.1)
        database.close()
    assert pruning.start(Settings(database_url=clean_db), database) is None  # retention off: no timer


def test_retention_settings_are_read_from_the_environment():
    got = Settings.from_env({"KL_RETAIN_VERSIONS": "10", "KL_RETAIN_DAYS": "30", "KL_PRUNE_INTERVAL_SECONDS": "0"})
    assert (got.retain_versions, got.retain_days, got.prune_interval_seconds) == (10, 30, 0)
    assert pruning.policy(got) == prune.RetentionPolicy(keep_versions=10, keep_age=timedelta(days=30))
    assert pruning.policy(Settings()).enabled is False
