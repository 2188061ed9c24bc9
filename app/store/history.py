"""Per-address history: which versions created, changed and destroyed each instance object, who wrote
them (run, actor, token, lane, and a bot apply's pull request), and which top-level attribute names a
change touched.

Everything is read from indexes: lifecycle rows by (state, address), the versions at the serials those
rows name, and the runs that committed them. The changed attribute names are computed once, when a
write opens a row that replaces an earlier lifecycle (``record_changed_names``), inside Postgres, after
that write commits: just after it for a commit and a small whole-state write, on the server's upkeep thread
after the answer for a whole-state write that replaced many rows (``states.write_state``). A read that finds
a replacing lifecycle with no names recorded (not yet, or never: the recording failed) derives them from the
two rows with the same comparison, so what it shows does not depend on when the recording ran.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from app.domain.attributes import SECRET_NAME_PATTERN
from app.domain.durations import format_duration
from app.domain.runkinds import RunKind, run_kind

log = logging.getLogger("kilolock.store")

# The attribute names that differ between a lifecycle row ``n`` and the row ``o`` it replaced (closed at
# ``n``'s create_serial, same address and deposed key): the new object's keys whose value differs from the
# old one's (or that the old one lacks) and the old object's keys the new one lacks, two key scans and
# lookups per pair, no join (a FULL JOIN of two jsonb_each scans builds a hash table per pair and costs twice
# as much). A name Terraform lists as sensitive (first step of a sensitive_attributes path) or that looks like
# a secret is counted (``hidden``), never named. ``OFFSET 0`` keeps each pair's attribute objects computed
# once rather than once per key. Shared by the statement that records the names and by the read that
# derives them for a lifecycle not yet recorded.
_DIFFER = """
CROSS JOIN LATERAL (
    SELECT CASE jsonb_typeof(n.instance -> 'attributes') WHEN 'object' THEN n.instance -> 'attributes'
                ELSE '{}' END AS new,
           CASE jsonb_typeof(o.instance -> 'attributes') WHEN 'object' THEN o.instance -> 'attributes'
                ELSE '{}' END AS old
    OFFSET 0
) v
CROSS JOIN LATERAL (
    SELECT coalesce(array_agg(x.k ORDER BY x.k) FILTER (WHERE NOT x.hidden), '{}') AS names,
           count(*) FILTER (WHERE x.hidden) AS hidden
    FROM (
        SELECT c.k,
               c.k ~* %(secret)s OR c.k IN (
                   SELECT p -> 0 ->> 'value'
                   FROM jsonb_array_elements(
                       CASE jsonb_typeof(n.instance -> 'sensitive_attributes') WHEN 'array'
                            THEN n.instance -> 'sensitive_attributes' ELSE '[]' END
                       || CASE jsonb_typeof(o.instance -> 'sensitive_attributes') WHEN 'array'
                               THEN o.instance -> 'sensitive_attributes' ELSE '[]' END) p
                   WHERE jsonb_typeof(p) = 'array') AS hidden
        FROM (SELECT a.k FROM jsonb_object_keys(v.new) a(k) WHERE v.new -> a.k IS DISTINCT FROM v.old -> a.k
              UNION ALL
              SELECT b.k FROM jsonb_object_keys(v.old) b(k) WHERE NOT v.new ? b.k) c
    ) x
) d
"""
# Every row a write opened at ``serial`` that replaced a row it closed at ``serial``: the rows each side
# are found by (state_id, create_serial) and (state_id, delete_serial), and paired by a join on (address,
# deposed). Given fresh statistics, a write that replaced every row of a large state is paired by one hash
# join of the two sets (200,000 index probes by address, each reading the address's lifecycles from a
# random page, took 10 s where the hash join takes 1.7 s under the same load), and a commit's few rows by
# their indexes. A row a later write has closed since is still found: its create_serial does not change.
_CHANGED_NAMES = """
INSERT INTO resource_changes (resource_id, names, sensitive)
SELECT n.id, d.names, d.hidden
FROM resources n
JOIN resources o ON o.state_id = %(state)s AND o.delete_serial = %(serial)s AND o.address = n.address
                AND o.deposed = n.deposed
""" + _DIFFER + """
WHERE n.state_id = %(state)s AND n.create_serial = %(serial)s
"""
_SET_TOKEN = "UPDATE state_versions SET token_name = %s WHERE id = %s"


def record_changed_names(conn: psycopg.Connection, *, state_id: int, serial: int) -> None:
    """Record the changed attribute names of every row a write at ``serial`` opened where it closed an
    earlier row of the same object (pipeline-friendly: one statement)."""
    conn.execute(_CHANGED_NAMES, {"secret": SECRET_NAME_PATTERN, "state": state_id, "serial": serial})


def record_changed_names_after_commit(conn: psycopg.Connection, *, state_id: int, serial: int) -> None:
    """:func:`record_changed_names` in a transaction of its own, once the write that opened the rows has
    committed and released the state's row lock (the rows it compares no longer change). The write is
    already durable, so a failure here only leaves that change's names to be derived when read
    (:func:`histories`): logged, never raised."""
    try:
        record_changed_names(conn, state_id=state_id, serial=serial)
        conn.commit()
    except psycopg.Error as exc:
        conn.rollback()
        log.warning("changed attribute names not recorded for serial %s of state %s: %s", serial, state_id,
                    type(exc).__name__)


def record_token(conn: psycopg.Connection, *, version_id: int, token_name: str) -> None:
    if token_name:
        conn.execute(_SET_TOKEN, (token_name, version_id))


# The distinct addresses (destroyed ones too) under one prefix after a cursor, in byte order: a skip scan
# of resources_history_prefix_ix, one index probe per address however many lifecycles each has.
_UNDER_PREFIX = """
WITH RECURSIVE walk(a, n) AS (
    (SELECT r.address, 1 FROM resources r
     WHERE r.state_id = %(state)s AND r.address ~>=~ %(prefix)s AND r.address ~<~ (%(prefix)s || chr(1114111))
       AND r.address ~>~ %(after)s
     ORDER BY r.address USING ~<~ LIMIT 1)
    UNION ALL
    SELECT x.address, walk.n + 1 FROM walk CROSS JOIN LATERAL (
        SELECT r.address FROM resources r
        WHERE r.state_id = %(state)s AND r.address ~>~ walk.a AND r.address ~<~ (%(prefix)s || chr(1114111))
        ORDER BY r.address USING ~<~ LIMIT 1) x
    WHERE walk.n < %(limit)s
)
SELECT a FROM walk
"""
_EXACT = """
SELECT e.address FROM unnest(%(exact)s::text[]) AS e(address)
WHERE e.address ~>~ %(after)s
  AND EXISTS (SELECT 1 FROM resources r WHERE r.state_id = %(state)s AND r.address = e.address)
"""
# The newest ``per`` lifecycles of each address (one more, to know whether older ones exist), with the
# attribute names each one changed: as recorded, or, for a lifecycle that replaced an earlier row and has
# no names recorded yet (a large write's names are recorded after its answer, ``app.web.upkeep``), derived
# here from the two rows by the recording statement's own comparison. So a reader never sees such a
# change without its names, whenever it reads. The replaced row is looked up only for a lifecycle with no
# names recorded (``OFFSET 0`` keeps the test a one-time filter rather than a join filter after the lookup),
# newest first on the address's own index: by ``delete_serial`` the planner would scan every row the write
# closed for each lifecycle.
_LIFECYCLES = """
SELECT x.address, x.deposed, x.status, x.create_serial, x.delete_serial, coalesce(c.names, f.names),
       coalesce(c.sensitive, f.hidden, 0)
FROM unnest(%(addresses)s::text[]) AS e(address)
CROSS JOIN LATERAL (
    SELECT r.id, r.address, r.deposed, r.status, r.create_serial, r.delete_serial, r.instance
    FROM resources r WHERE r.state_id = %(state)s AND r.address = e.address
    ORDER BY r.create_serial DESC LIMIT %(per)s
) x
LEFT JOIN resource_changes c ON c.resource_id = x.id
LEFT JOIN LATERAL (
    SELECT d.names, d.hidden
    FROM (SELECT x.instance) n(instance)
    CROSS JOIN LATERAL (
        SELECT p.instance FROM resources p
        WHERE p.state_id = %(state)s AND p.address = x.address AND p.create_serial < x.create_serial
          AND p.deposed = x.deposed AND p.delete_serial = x.create_serial
        ORDER BY p.create_serial DESC LIMIT 1
    ) o
    """ + _DIFFER + """
    WHERE c.resource_id IS NULL
    OFFSET 0
) f ON true
"""
# Who wrote the versions at some serials.
_WRITERS = """
SELECT v.serial, v.created_at, v.source, v.actor, v.token_name, v.run_id, r.actor, r.info
FROM state_versions v LEFT JOIN apply_runs r ON r.id = v.run_id
WHERE v.state_id = %s AND v.serial = ANY(%s)
"""


class Lane:
    """How a version was written."""

    RUN = "kl run"
    BOT = "bot apply"
    TERRAFORM = "terraform"
    REFRESH = "refresh"
    RECOVER = "recover"


@dataclass(frozen=True, slots=True)
class Writer:
    """Who wrote one version. ``pull_request`` and friends are set for a bot apply of a merge."""

    serial: int
    at: datetime
    lane: str
    actor: str
    token: str
    run_id: str | None = None
    repository: str | None = None
    pull_request: int | None = None
    merge_commit: str | None = None
    pull_request_author: str | None = None


@dataclass(frozen=True, slots=True)
class InstanceChange:
    """One step of an instance object's history: ``created``, ``changed`` or ``destroyed`` at ``serial``.
    ``attributes`` are the top-level names that changed (never values); ``sensitive`` how many more did that
    are not named. ``attributes`` is None for a lifecycle that replaced no earlier row."""

    kind: str
    serial: int
    by: Writer | None
    attributes: list[str] | None = None
    sensitive: int = 0
    status: str = ""


@dataclass(frozen=True, slots=True)
class InstanceHistory:
    """An instance object's changes, newest first; ``more`` when older ones were left out."""

    address: str
    deposed: str
    changes: list[InstanceChange]
    more: bool


@dataclass(frozen=True, slots=True)
class Page:
    instances: list[InstanceHistory]
    next_after: str | None  # pass as ``after`` for the next page; None on the last


def addresses_under(
    conn: psycopg.Connection, *, state_id: int, exact: Sequence[str], prefixes: Sequence[str], everything: bool,
    after: str, limit: int,
) -> list[str]:
    """Up to ``limit`` distinct addresses the state ever held at or under the lookup, after ``after``."""
    params: dict[str, Any] = {"state": state_id, "exact": list(exact), "after": after, "limit": limit}
    if everything:
        return [a for (a,) in conn.execute(_UNDER_PREFIX, {**params, "prefix": ""}).fetchall()]
    found = {a for (a,) in conn.execute(_EXACT, params).fetchall()}
    for prefix in prefixes:
        found.update(a for (a,) in conn.execute(_UNDER_PREFIX, {**params, "prefix": prefix}).fetchall())
    return sorted(found, key=lambda a: a.encode())[:limit]


def histories(
    conn: psycopg.Connection, *, state_id: int, addresses: Sequence[str], per_address: int
) -> list[InstanceHistory]:
    """The newest changes of each address's instance objects (``per_address`` lifecycles each)."""
    if not addresses:
        return []
    rows = conn.execute(_LIFECYCLES, {"state": state_id, "addresses": list(addresses), "per": per_address + 1,
                                      "secret": SECRET_NAME_PATTERN}).fetchall()
    grouped: dict[str, list[tuple[Any, ...]]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    serials: set[int] = set()
    for found in grouped.values():
        for row in found[:per_address]:
            serials.add(row[3])
            if row[4] is not None:
                serials.add(row[4])
    writers = writers_at(conn, state_id=state_id, serials=serials)
    result: list[InstanceHistory] = []
    for address in addresses:
        found = grouped.get(address, [])
        more = len(found) > per_address
        by_object: dict[str, list[tuple[Any, ...]]] = {}
        for row in found[:per_address]:
            by_object.setdefault(row[1], []).append(row)
        for deposed, lives in sorted(by_object.items()):
            result.append(InstanceHistory(address, deposed, _changes(lives, writers), more))
    return result


def _changes(lives: list[tuple[Any, ...]], writers: dict[int, Writer]) -> list[InstanceChange]:
    """Changes from lifecycles newest first: a row opened where its predecessor closed is a change."""
    opened = {row[3] for row in lives}
    changes: list[InstanceChange] = []
    for index, (_, _, status, create, delete, names, hidden) in enumerate(lives):
        if delete is not None and delete not in opened:
            changes.append(InstanceChange("destroyed", delete, writers.get(delete), status=status))
        older = lives[index + 1] if index + 1 < len(lives) else None
        replaced = older is not None and older[4] == create
        kind = "changed" if replaced or names is not None else "created"
        changes.append(InstanceChange(kind, create, writers.get(create), None if names is None else list(names),
                              hidden, status))
    return changes


def writers_at(conn: psycopg.Connection, *, state_id: int, serials: set[int]) -> dict[int, Writer]:
    if not serials:
        return {}
    rows = conn.execute(_WRITERS, (state_id, sorted(serials))).fetchall()
    return {row[0]: _writer(*row) for row in rows}


def _writer(serial: int, at: datetime, source: str, actor: str, token: str, run_id: str | None,
            run_actor: str | None, info: dict[str, Any] | None) -> Writer:
    if source != "apply" or run_id is None:
        return Writer(serial, at, Lane.TERRAFORM if source == "http" else source, actor, token)
    info = info or {}
    bot = info.get("bot") if isinstance(info.get("bot"), dict) else None
    kind = run_kind(info)
    lane = (Lane.BOT if bot else Lane.REFRESH if kind is RunKind.REFRESH
            else Lane.RECOVER if kind is RunKind.RECOVER else Lane.RUN)
    if bot is None:
        return Writer(serial, at, lane, run_actor or actor, token, run_id)
    number = bot.get("pull_request")
    return Writer(serial, at, lane, run_actor or actor, token, run_id,
                  repository=_text(bot.get("repository")), pull_request=number if isinstance(number, int) else None,
                  merge_commit=_text(bot.get("merge_commit")), pull_request_author=_text(bot.get("author")))


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


LAST_CHANGES_MAX = 1000  # drifted instances a drift answer names the last change of


def last_changes(conn: psycopg.Connection, *, state_id: int, addresses: Sequence[str]) -> dict[str, InstanceChange]:
    """The newest recorded change of each address (its newest lifecycle's opening or closing)."""
    found = histories(conn, state_id=state_id, addresses=list(dict.fromkeys(addresses))[:LAST_CHANGES_MAX],
                      per_address=1)
    newest: dict[str, InstanceChange] = {}
    for item in found:
        if item.changes and (item.address not in newest or item.changes[0].serial > newest[item.address].serial):
            newest[item.address] = item.changes[0]
    return newest


def describe(change: InstanceChange, now: datetime) -> str:
    """A change in words: "changed by PR #12 (acme/infra) at serial 40, 3d ago" or "created by token ci via
    terraform at serial 3, 2h ago"."""
    by = change.by
    if by is None:
        who = "an unrecorded writer"
    elif by.pull_request is not None:
        who = f"PR #{by.pull_request}" + (f" ({by.repository})" if by.repository else "")
    else:
        who = (f"token {by.token}" if by.token else by.actor or "anonymous") + f" via {by.lane}"
    age = f", {format_duration(now - by.at)} ago" if by is not None else ""
    return f"{change.kind} by {who} at serial {change.serial}{age}"
