"""Resource rows: the lifecycle projection of each state version, and the reads over it.

A write closes and opens only what changed (one UPDATE, one COPY); point-in-time reads are a
range predicate on ``[create_serial, delete_serial)``. The live rows a write compares against come
from ``opencache`` when it holds the state's exact head, else from the table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any

import psycopg
from psycopg.rows import class_row

from analyzer.gcpause import gc_paused
from analyzer.state import InstanceObjectAddress, InstanceRow, OutputRow
from analyzer.state_assembly import AssemblyRow
from app.domain.lifecycle import LifecycleDelta, OpenRow, lifecycle_delta
from app.store.opencache import OPEN_SETS, HeadKey, OpenSet

_LOAD_OPEN = """
SELECT id, address, deposed, attributes_hash FROM resources
WHERE state_id = %s AND delete_serial IS NULL
"""
_NEXT_ID = "SELECT nextval(pg_get_serial_sequence('resources', 'id'))"
_LAST_ID = "SELECT currval(pg_get_serial_sequence('resources', 'id'))"
# The state's head as of now (the caller holds the row lock), and the version the caller inserted at this
# serial, which becomes the head, stamped updated_at = now(), when the transaction commits.
_HEADS = """
SELECT s.head_version_id, s.updated_at, v.id, now()
FROM states s LEFT JOIN state_versions v ON v.state_id = s.id AND v.serial = %s
WHERE s.id = %s
"""
# Ids for the rows about to be COPYed, so the new open set is known without reading it back.
_RESERVE_IDS = """
WITH seq AS MATERIALIZED (SELECT pg_get_serial_sequence('resources', 'id')::regclass AS name)
SELECT nextval(seq.name) FROM seq, generate_series(1, %s)
"""
_CLOSE = "UPDATE resources SET delete_serial = %s WHERE id = ANY(%s)"
_CLOSE_ALL = "UPDATE resources SET delete_serial = %s WHERE state_id = %s AND delete_serial IS NULL"
_COPY_RESOURCES = """
COPY resources (tenant_id, state_id, address, resource_address, module, mode, type, name, index_key,
                deposed, status, provider, instance, attributes_hash, dependencies, create_serial)
FROM STDIN
"""
_COPY_NEW_ROWS = """
COPY resources (id, tenant_id, state_id, address, resource_address, module, mode, type, name, index_key,
                deposed, status, provider, instance, attributes_hash, dependencies, create_serial)
FROM STDIN
"""
# The rows a commit opens, in one statement that can share a pipeline with the rest of the commit (COPY cannot).
_INSERT_ROWS = """
INSERT INTO resources (tenant_id, state_id, address, resource_address, module, mode, type, name, index_key,
                       deposed, status, provider, instance, attributes_hash, dependencies, create_serial)
SELECT %s, %s, u.address, u.resource_address, u.module, u.mode, u.type, u.name, u.index_key::jsonb, u.deposed,
       u.status, u.provider, u.instance::jsonb, u.attributes_hash,
       ARRAY(SELECT jsonb_array_elements_text(u.dependencies::jsonb)), %s
FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],
            %s::text[], %s::text[], %s::text[], %s::text[], %s::text[])
     AS u(address, resource_address, module, mode, type, name, index_key, deposed, status, provider, instance,
          attributes_hash, dependencies)
"""
_COPY_OUTPUTS = """
COPY outputs (state_version_id, state_id, tenant_id, name, value, type, sensitive) FROM STDIN
"""
_ALIVE_AT = "create_serial <= %(serial)s AND (delete_serial IS NULL OR delete_serial > %(serial)s)"
_PREFIX = r"(address = %(prefix)s OR address LIKE %(like_dot)s OR address LIKE %(like_key)s)"
_LIST = f"""
SELECT address, resource_address, module, mode, type, name, index_key, deposed, status, provider,
       attributes_hash, dependencies, create_serial, delete_serial{{instance}}
FROM resources
WHERE state_id = %(state_id)s AND {_ALIVE_AT} {{prefix}}
ORDER BY address, deposed
"""
_HISTORY = """
SELECT address, resource_address, module, mode, type, name, index_key, deposed, status, provider,
       attributes_hash, dependencies, create_serial, delete_serial, instance
FROM resources WHERE state_id = %s AND address = %s
ORDER BY create_serial, deposed
"""
_EDGES = """
SELECT d.address, d.depends_on, t.address AS depends_on_address
FROM resource_dependencies d
JOIN resources t ON t.state_id = d.state_id AND t.resource_address = d.depends_on AND t.deposed = ''
WHERE d.state_id = %(state_id)s
  AND d.create_serial <= %(serial)s AND (d.delete_serial IS NULL OR d.delete_serial > %(serial)s)
  AND t.create_serial <= %(serial)s AND (t.delete_serial IS NULL OR t.delete_serial > %(serial)s)
ORDER BY d.address, t.address
"""
_OUTPUTS_AT = """
SELECT o.name, o.value::text AS value_json, o.type::text AS type_json, o.sensitive
FROM outputs o WHERE o.state_version_id = %s ORDER BY o.name
"""
_ROWS_FOR_ASSEMBLY = f"""
SELECT address, resource_address, module, mode, type, name, index_key, deposed, provider,
       instance::text AS instance_json, attributes_hash, dependencies, status
FROM resources WHERE state_id = %(state_id)s AND {_ALIVE_AT}
"""
# The same rows in the order of an assembled state (``analyzer.state_assembly.row_order``): "C" collation
# compares UTF-8 text by code point, as Python compares strings.
_ORDER_FOR_ASSEMBLY = """
ORDER BY module COLLATE "C", mode COLLATE "C", type COLLATE "C", name COLLATE "C",
         CASE jsonb_typeof(index_key) WHEN 'number' THEN 1 WHEN 'string' THEN 2 ELSE 0 END,
         CASE WHEN jsonb_typeof(index_key) = 'number' THEN (index_key)::numeric END,
         CASE WHEN jsonb_typeof(index_key) = 'string' THEN index_key #>> '{}' END COLLATE "C",
         deposed COLLATE "C"
"""
# The rows of a streamed assembly, with only what the assembly writes: the instance's text as UTF-8 bytes
# (no decoding), its key as text with its JSON type (no JSON parse per row). The order is
# ``_ORDER_FOR_ASSEMBLY``'s with an integer key sorted by a bigint before its numeric (clamped, so never
# out of order; the numeric decides ties): the sort compares numerics only where the bigints are equal.
# The sort carries the stored values and the text is made above it (``OFFSET 0`` keeps the subquery, and
# its order, as it is), so Postgres writes the text of each row as it sends it rather than all of it
# before the first row.
_KEY_NUMBER = "CASE WHEN jsonb_typeof(index_key) = 'number' THEN (index_key)::numeric END"
_STREAM_FOR_ASSEMBLY = f"""
SELECT module, mode, type, name, address, index_key #>> '{{}}', jsonb_typeof(index_key), deposed, provider,
       convert_to(instance::text, 'UTF8')
FROM (SELECT module, mode, type, name, address, index_key, deposed, provider, instance
      FROM resources WHERE state_id = %(state_id)s AND {_ALIVE_AT}
      ORDER BY module COLLATE "C", mode COLLATE "C", type COLLATE "C", name COLLATE "C",
               CASE jsonb_typeof(index_key) WHEN 'number' THEN 1 WHEN 'string' THEN 2 ELSE 0 END,
               least(greatest({_KEY_NUMBER}, -9e18), 9e18)::bigint, {_KEY_NUMBER},
               CASE WHEN jsonb_typeof(index_key) = 'string' THEN index_key #>> '{{}}' END COLLATE "C",
               deposed COLLATE "C"
      OFFSET 0) AS sorted
"""
_DECLARE_ASSEMBLY = f"DECLARE kl_assembly_rows NO SCROLL CURSOR FOR {_STREAM_FOR_ASSEMBLY}"
_CLOSE_ASSEMBLY = "CLOSE kl_assembly_rows"
# The instance objects whose rows opened or closed after one serial, up to another.
_CHANGED_BETWEEN = """
SELECT DISTINCT address, deposed, module, mode, type, name, index_key FROM resources
WHERE state_id = %(state_id)s AND ((create_serial > %(after)s AND create_serial <= %(upto)s)
                                OR (delete_serial > %(after)s AND delete_serial <= %(upto)s))
LIMIT %(limit)s
"""
_AMONG = """
  AND (address, deposed) IN (SELECT * FROM unnest(%(addresses)s::text[], %(deposed)s::text[]))
"""
# Rows a streamed assembly fetches at a time: under a megabyte of instance text for Terraform's usual
# instances, small beside the pieces a first GET keeps until its cache write.
STREAM_BATCH = 1000


@dataclass(frozen=True, slots=True)
class ResourceRow(InstanceObjectAddress):
    """One lifecycle of one instance object, as the read API reports it."""

    status: str
    provider: str
    attributes_hash: str
    dependencies: list[str]
    create_serial: int
    delete_serial: int | None
    instance: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Edge:
    address: str
    depends_on: str
    depends_on_address: str


def project(
    conn: psycopg.Connection, *, tenant_id: int, state_id: int, serial: int, instances: Iterable[InstanceRow]
) -> LifecycleDelta:
    """Write the lifecycle delta of a new version at ``serial``: close changed or removed rows,
    open new or changed ones.

    The caller holds the state row lock and has inserted the version at ``serial``, which this
    transaction then makes the head (``states.write_state``). The open set comes from ``OPEN_SETS``
    when it holds the current head; the new one is stored there under the head this transaction
    creates, where only a transaction that finds it committed can use it (see ``app.store.opencache``).
    The cyclic garbage collector is paused while it runs (see ``analyzer.gcpause``).
    """
    with gc_paused():
        return _project(conn, tenant_id, state_id, serial, tuple(instances))


def _project(
    conn: psycopg.Connection, tenant_id: int, state_id: int, serial: int, instances: tuple[InstanceRow, ...]
) -> LifecycleDelta:
    database = database_identity(conn)
    head_id, updated_at, new_version_id, now = conn.execute(_HEADS, (serial, state_id)).fetchone() or (
        None, None, None, None)
    open_rows = None
    if head_id is not None:
        open_rows = OPEN_SETS.get(HeadKey(database, state_id, head_id, updated_at))
    cached = open_rows is not None
    if open_rows is None:
        open_rows = load_open_set(conn, state_id=state_id)
    delta = lifecycle_delta(open_rows, instances)
    if delta.close_ids:
        conn.execute(_CLOSE, (serial, list(delta.close_ids)))
    ids: list[int] = []
    if delta.inserts:
        ids = [row_id for (row_id,) in conn.execute(_RESERVE_IDS, (len(delta.inserts),))]
        copy_new_rows(conn, tenant_id=tenant_id, state_id=state_id, serial=serial, rows=delta.inserts, ids=ids)
    # A state larger than the cache holds is not kept: building its next open set would only cost memory.
    if new_version_id is not None and new_version_id != head_id and len(instances) <= OPEN_SETS.max_rows:
        following = _following_open_set(open_rows, instances, delta, ids, copy=cached)
        OPEN_SETS.put(HeadKey(database, state_id, new_version_id, now), following)
    return delta


def last_row_id(conn: psycopg.Connection, *, advance: bool) -> int:
    """The last id this session took from the rows' sequence; with ``advance``, a new one taken now."""
    (row_id,) = conn.execute(_NEXT_ID if advance else _LAST_ID).fetchone() or (0,)
    return int(row_id)


def remember_open_set(conn: psycopg.Connection, *, state_id: int, version_id: int,
                      rows: Sequence[InstanceRow], after_id: int) -> None:
    """Keep in ``OPEN_SETS`` the open set of a state whose every live row this transaction opened, ``rows``
    in the order of one COPY that took their ids from the table's sequence after ``after_id``
    (``last_row_id``), under the head ``version_id`` the transaction is about to make.

    The COPY took one id per row, in order: when the sequence's last id is then ``after_id`` plus the number
    of rows, no other session took one in between and the ids are exactly the ones after ``after_id``, so
    nothing is read back. Otherwise, and for a state larger than the cache holds, nothing is kept (the next
    write reads the open set from the table)."""
    if len(rows) > OPEN_SETS.max_rows or last_row_id(conn, advance=False) != after_id + len(rows):
        return
    (now,) = conn.execute("SELECT now()").fetchone() or (None,)
    following = {(r.address, r.deposed): OpenRow(row_id, r.attributes_hash)
                 for row_id, r in enumerate(rows, start=after_id + 1)}
    OPEN_SETS.put(HeadKey(database_identity(conn), state_id, version_id, now), following)


def load_open_set(conn: psycopg.Connection, *, state_id: int) -> dict[tuple[str, str], OpenRow]:
    """The state's live rows by (address, deposed), read from the table."""
    rows = conn.execute(_LOAD_OPEN, (state_id,)).fetchall()  # in one go: cheaper than row by row
    return {(address, deposed): OpenRow(row_id, digest) for row_id, address, deposed, digest in rows}


def copy_new_rows(
    conn: psycopg.Connection, *, tenant_id: int, state_id: int, serial: int, rows: Sequence[InstanceRow],
    ids: Sequence[int],
) -> None:
    """COPY ``rows`` opened at ``serial`` under ids reserved from the table's sequence."""
    with conn.cursor() as cur, cur.copy(_COPY_NEW_ROWS) as copy:
        for row_id, r in zip(ids, rows, strict=True):
            copy.write_row(
                (
                    row_id, tenant_id, state_id, r.address, r.resource_address, r.module, r.mode, r.type,
                    r.name, index_key_json(r.index_key), r.deposed, r.status,
                    r.provider, r.instance_json, r.attributes_hash, dependencies_copy(r.dependencies), serial,
                )
            )


def _following_open_set(
    open_rows: OpenSet, instances: Sequence[InstanceRow], delta: LifecycleDelta, ids: Sequence[int], *,
    copy: bool,
) -> dict[tuple[str, str], OpenRow]:
    """The live rows once ``delta`` is written: ``open_rows`` with the inserted rows under their new ids
    and without the closed rows no instance replaced. Copies ``open_rows`` when ``copy`` (a cached
    map is shared and never changed)."""
    following = dict(open_rows) if copy or not isinstance(open_rows, dict) else open_rows
    for row, row_id in zip(delta.inserts, ids, strict=True):
        following[(row.address, row.deposed)] = OpenRow(row_id, row.attributes_hash)
    if len(following) != len(instances):  # some rows closed for good: their instances are gone
        live = {(row.address, row.deposed) for row in instances}
        for key in [key for key in following if key not in live]:
            del following[key]
    return following


def database_identity(conn: psycopg.Connection) -> str:
    """Which database ``conn`` talks to, as ``OPEN_SETS`` keys it (one process may serve several)."""
    info = conn.info
    return f"{info.host}:{info.port}/{info.dbname}"


def insert_rows(
    conn: psycopg.Connection, *, tenant_id: int, state_id: int, serial: int, rows: Iterable[InstanceRow]
) -> None:
    with row_copy(conn, tenant_id=tenant_id, state_id=state_id, serial=serial) as put:
        for r in rows:
            put(r)


# The empty ``dependencies`` array as COPY's text: the array dumper, per row, costs more than the rest of a
# row's fields together, and most rows have no dependencies.
NO_DEPENDENCIES = "{}"


def dependencies_copy(deps: Sequence[str]) -> list[str] | str:
    """A row's ``dependencies`` as a COPY field: the list (psycopg's array dumper), or the empty array's text."""
    return list(deps) if deps else NO_DEPENDENCIES


def index_key_json(key: int | str | None) -> str | None:
    """A row's ``index_key`` as the JSON text of its ``jsonb`` column: ``json.dumps``'s text, without its
    encoder for an integer (0.9 us each, 0.2 s of a first write of 200,000 counted instances)."""
    if key is None:
        return None
    if type(key) is int:
        return int.__repr__(key)  # what json's encoder writes for an int
    if type(key) is str:
        return encode_basestring_ascii(key)  # what json.dumps writes for a str (ensure_ascii)
    return json.dumps(key)


@contextmanager
def row_copy(conn: psycopg.Connection, *, tenant_id: int, state_id: int,
             serial: int) -> Iterator[Callable[[InstanceRow], None]]:
    """A COPY of rows opened at ``serial`` (ids from the table's sequence), fed one row at a time by the
    function it yields: Postgres stores the rows sent so far while the caller makes the next. The COPY ends
    when the block does (and fails, writing nothing, when the block raises)."""
    with conn.cursor() as cur, cur.copy(_COPY_RESOURCES) as copy:
        write_row = copy.write_row
        key_json, deps_copy = index_key_json, dependencies_copy

        def put(r: InstanceRow) -> None:
            write_row((
                tenant_id, state_id, r.address, r.resource_address, r.module, r.mode, r.type, r.name,
                key_json(r.index_key), r.deposed, r.status,
                r.provider, r.instance_json, r.attributes_hash, deps_copy(r.dependencies), serial,
            ))

        yield put


def insert_rows_at(
    conn: psycopg.Connection, *, tenant_id: int, state_id: int, serial: int, rows: Sequence[InstanceRow]
) -> None:
    """Open ``rows`` at ``serial`` with one INSERT (pipeline-friendly; ``insert_rows`` COPYs instead)."""
    columns: list[list[str | None]] = [[] for _ in range(13)]
    for r in rows:
        for column, value in zip(columns, (
            r.address, r.resource_address, r.module, r.mode, r.type, r.name,
            index_key_json(r.index_key), r.deposed, r.status, r.provider,
            r.instance_json, r.attributes_hash, json.dumps(list(r.dependencies)),
        ), strict=True):
            column.append(value)
    conn.execute(_INSERT_ROWS, (tenant_id, state_id, serial, *columns))


def output_columns(outputs: Iterable[OutputRow]) -> tuple[list[str], list[str], list[str], list[bool]]:
    """Outputs as the four arrays an ``unnest`` insert takes: names, value JSON, type JSON, sensitive."""
    listed = list(outputs)
    return ([o.name for o in listed], [o.value_json for o in listed], [o.type_json for o in listed],
            [o.sensitive for o in listed])


def close_all(conn: psycopg.Connection, *, state_id: int, serial: int) -> int:
    """Close every live row (the new version cannot be projected, e.g. an encrypted state)."""
    return conn.execute(_CLOSE_ALL, (serial, state_id)).rowcount


def insert_outputs(
    conn: psycopg.Connection, *, tenant_id: int, state_id: int, version_id: int, outputs: Iterable[OutputRow]
) -> None:
    with conn.cursor() as cur, cur.copy(_COPY_OUTPUTS) as copy:
        for o in outputs:
            copy.write_row((version_id, state_id, tenant_id, o.name, o.value_json, o.type_json, o.sensitive))


def list_at(
    conn: psycopg.Connection,
    *,
    state_id: int,
    serial: int,
    prefix: str | None = None,
    with_instance: bool = False,
) -> list[ResourceRow]:
    """Rows alive at ``serial``, optionally under a structured address prefix."""
    params: dict[str, Any] = {"state_id": state_id, "serial": serial}
    prefix_sql = ""
    if prefix:
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        params.update(prefix=prefix, like_dot=escaped + ".%", like_key=escaped + "[%")
        prefix_sql = "AND " + _PREFIX
    query = _LIST.format(instance=", instance" if with_instance else "", prefix=prefix_sql)
    with conn.cursor(row_factory=class_row(ResourceRow)) as cur:
        return cur.execute(query.encode(), params).fetchall()


def history(conn: psycopg.Connection, *, state_id: int, address: str) -> list[ResourceRow]:
    with conn.cursor(row_factory=class_row(ResourceRow)) as cur:
        return cur.execute(_HISTORY, (state_id, address)).fetchall()


def edges_at(conn: psycopg.Connection, *, state_id: int, serial: int) -> list[Edge]:
    with conn.cursor(row_factory=class_row(Edge)) as cur:
        return cur.execute(_EDGES, {"state_id": state_id, "serial": serial}).fetchall()


def instances_at(conn: psycopg.Connection, *, state_id: int, serial: int) -> list[InstanceRow]:
    """The rows alive at ``serial`` as analyzer rows, ready for re-assembly."""
    rows = conn.execute(_ROWS_FOR_ASSEMBLY, {"state_id": state_id, "serial": serial}).fetchall()
    return [instance_row(r) for r in rows]


def stream_assembly_rows(conn: psycopg.Connection, *, state_id: int, serial: int,
                         between: Callable[[], None] | None = None,
                         alone: bool = False) -> Generator[AssemblyRow, None, None]:
    """The rows alive at ``serial`` in assembly order, with only the columns the assembly writes (binary
    results, the instance's text as bytes), ``STREAM_BATCH`` rows at a time, so the caller holds one batch
    rather than the state. The caller's transaction must stay open while it iterates, and the caller closes
    an iteration it leaves early before that transaction ends.

    By default the rows come from a cursor, and the next batch's FETCH is sent, in pipeline mode, before
    this batch's rows are handed on, so Postgres writes the next batch while the caller encodes this one.
    Statements the caller runs on the connection between rows queue behind that FETCH (a statement whose
    result it reads waits for it); COPY, which a pipeline refuses, belongs in ``between``, called before
    each FETCH is sent, with none in flight.

    ``alone``: the caller runs nothing on the connection until the iteration ends. The rows then come from
    one statement read in chunks (``Cursor.stream``): Postgres sends them as fast as the caller takes them,
    with no round trip per batch, and may sort them with parallel workers, which it never gives a cursor's
    statement (the sort before the first row is most of the wait). Leaving early cancels the statement,
    which fails the transaction: the caller rolls it back."""
    if alone:
        if between is not None:
            raise ValueError("a streamed statement leaves no gap between rows for other statements")
        return _streamed_rows(conn, state_id, serial)
    return _cursor_rows(conn, state_id, serial, between)


def _streamed_rows(conn: psycopg.Connection, state_id: int, serial: int) -> Generator[AssemblyRow, None, None]:
    rows = conn.cursor(binary=True).stream(_STREAM_FOR_ASSEMBLY.encode(), {"state_id": state_id, "serial": serial},
                                           size=STREAM_BATCH)
    try:
        yield from _assembly_rows(rows)
    finally:
        rows.close()  # now, in this transaction: it cancels a statement still running


def _cursor_rows(conn: psycopg.Connection, state_id: int, serial: int,
                 between: Callable[[], None] | None) -> Generator[AssemblyRow, None, None]:
    conn.execute(_DECLARE_ASSEMBLY.encode(), {"state_id": state_id, "serial": serial})
    fetch = f"FETCH {STREAM_BATCH} FROM kl_assembly_rows".encode()
    try:
        batch = conn.cursor(binary=True).execute(fetch).fetchall()
        while batch:
            if between is not None:
                between()
            with conn.pipeline():
                ahead = conn.cursor(binary=True).execute(fetch)
                yield from _assembly_rows(batch)
                batch = ahead.fetchall()
    finally:
        # Closed in the transaction that declared it, so a second stream in it can declare it again; a
        # failed transaction has closed it already.
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            conn.execute(_CLOSE_ASSEMBLY)


def _assembly_rows(rows: Iterable[Sequence[Any]]) -> Iterator[AssemblyRow]:
    """``AssemblyRow``s of ``_STREAM_FOR_ASSEMBLY``'s rows."""
    new = tuple.__new__  # AssemblyRow._make without its length check: the query gives nine columns
    for module, mode, type_, name, address, key_text, key_type, deposed, provider, instance in rows:
        key = (key_text if key_type == "string" else int(key_text) if key_type == "number"
               and key_text.isdigit() else _index_key(key_text, key_type))
        yield new(AssemblyRow, (module, mode, type_, name, address, key, deposed, provider, instance))


def _index_key(text: str | None, json_type: str | None) -> Any:
    """An index key from its text (``#>> '{}'``) and its ``jsonb_typeof``: what ``json.loads`` of the
    jsonb gives, without parsing JSON for a string or an integer."""
    if text is None or json_type == "string":
        return text
    if json_type == "number":
        try:
            return int(text)
        except ValueError:
            pass  # a number with a fraction
    return json.loads(text)


@dataclass(frozen=True, slots=True)
class ChangedObject:
    """An instance object whose rows opened or closed within a span of serials."""

    address: str
    deposed: str
    module: str
    mode: str
    type: str
    name: str
    index_key: int | str | None


def changed_between(conn: psycopg.Connection, *, state_id: int, after: int, upto: int,
                    limit: int) -> list[ChangedObject]:
    """The instance objects whose rows opened or closed at a serial in (``after``, ``upto``], at most
    ``limit`` of them (through the ``create_serial`` and ``delete_serial`` indexes)."""
    with conn.cursor(row_factory=class_row(ChangedObject)) as cur:
        return cur.execute(_CHANGED_BETWEEN, {"state_id": state_id, "after": after, "upto": upto,
                                              "limit": limit}).fetchall()


def instances_among_at(conn: psycopg.Connection, *, state_id: int, serial: int,
                       objects: Sequence[ChangedObject]) -> list[InstanceRow]:
    """The rows alive at ``serial`` of the given instance objects, in assembly order."""
    if not objects:
        return []
    query = _ROWS_FOR_ASSEMBLY + _AMONG + _ORDER_FOR_ASSEMBLY
    rows = conn.execute(query.encode(), {"state_id": state_id, "serial": serial,
                                         "addresses": [o.address for o in objects],
                                         "deposed": [o.deposed for o in objects]}).fetchall()
    return [instance_row(r) for r in rows]


def instance_row(r: Sequence[Any]) -> InstanceRow:
    """An analyzer row from a SELECT of the assembly columns, in _ROWS_FOR_ASSEMBLY's order."""
    (address, resource_address, module, mode, type_, name, index_key, deposed, provider, instance_json,
     attributes_hash, dependencies, status) = r
    return InstanceRow(
        address=address, resource_address=resource_address, module=module, mode=mode, type=type_,
        name=name, index_key=index_key, deposed=deposed, provider=provider, instance_json=instance_json,
        attributes_hash=attributes_hash, dependencies=tuple(dependencies), status=status,
    )


def outputs_of(conn: psycopg.Connection, *, version_id: int) -> list[OutputRow]:
    with conn.cursor(row_factory=class_row(OutputRow)) as cur:
        return cur.execute(_OUTPUTS_AT, (version_id,)).fetchall()
