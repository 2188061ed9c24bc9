"""A bulk write leaves the dependencies index with nothing pending.

New entries of a GIN index wait in its pending list until vacuum folds them in, and every dependents
lookup (``edges``) reads that whole list. After a write that opens ``BULK_ROWS`` rows or more the store
folds the list in at once, with the statistics; a smaller write leaves it to vacuum. The probe is
Postgres's own ``gin_clean_pending_list``, which returns how many pending pages it had to fold.
"""

from __future__ import annotations

import psycopg

from app.domain.principal import default_principal
from app.store import Database, states
from tests.helpers import instance, resource, state

WHO = default_principal("upkeep-test")
_PENDING = "SELECT gin_clean_pending_list('resources_alive_deps_gin'::regclass)"


def _body(serial: int, count: int) -> bytes:
    rows = [instance(i, f"v-{i}", deps=[f"terraform_data.dep[{i % 7}]"]) for i in range(count)]
    return state(serial, [resource("item", rows)])


def _pending_pages(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(_PENDING).fetchone()
    assert row is not None
    return int(row[0])


def test_a_small_write_leaves_pending_entries_to_vacuum(db: Database, clean_db: str) -> None:
    states.write_state(db, WHO, "small", _body(1, 200), lock_id=None)
    assert _pending_pages(clean_db) > 0


def test_a_bulk_write_folds_the_pending_list_in(db: Database, clean_db: str) -> None:
    states.write_state(db, WHO, "bulk", _body(1, states.BULK_ROWS), lock_id=None)
    assert _pending_pages(clean_db) == 0
