"""Resource rows: the lifecycle projection of each state version, and the reads over it.

A write closes and opens only what changed (one UPDATE, one COPY); point-in-time reads are a
range predicate on ``[create_serial, delete_serial)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row

from analyzer.state import InstanceRow, OutputRow
from app.domain.lifecycle import LifecycleDelta, OpenRow, lifecycle_delta

_LOAD_OPEN = """
SELECT id, address, deposed, attributes_hash FROM resources
WHERE state_id = %s AND delete_serial IS NULL
"""
_CLOSE = "UPDATE resources SET delete_serial = %s WHERE id = ANY(%s)"
_CLOSE_ALL = "UPDATE resources SET delete_serial = %s WHERE state_id = %s AND delete_serial IS NULL"
_COPY_RESOURCES = """
COPY resources (tenant_id, state_id, address, resource_address, module, mode, type, name, index_key,
                deposed, status, provider, instance, attributes_hash, dependencies, create_serial)
FROM STDIN
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


@dataclass(frozen=True, slots=True)
class ResourceRow:
    """One lifecycle of one instance object, as the read API reports it."""

    address: str
    resource_address: str
    module: str
    mode: str
    type: str
    name: str
    index_key: int | str | None
    deposed: str
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
    open new or changed ones."""
    open_rows = {
        (address, deposed): OpenRow(row_id, digest)
        for row_id, address, deposed, digest in conn.execute(_LOAD_OPEN, (state_id,))
    }
    delta = lifecycle_delta(open_rows, instances)
    if delta.close_ids:
        conn.execute(_CLOSE, (serial, list(delta.close_ids)))
    if delta.inserts:
        insert_rows(conn, tenant_id=tenant_id, state_id=state_id, serial=serial, rows=delta.inserts)
    return delta


def insert_rows(
    conn: psycopg.Connection, *, tenant_id: int, state_id: int, serial: int, rows: Iterable[InstanceRow]
) -> None:
    with conn.cursor() as cur, cur.copy(_COPY_RESOURCES) as copy:
        for r in rows:
            copy.write_row(
                (
                    tenant_id, state_id, r.address, r.resource_address, r.module, r.mode, r.type, r.name,
                    None if r.index_key is None else json.dumps(r.index_key), r.deposed, r.status,
                    r.provider, r.instance_json, r.attributes_hash, list(r.dependencies), serial,
                )
            )


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
    return [
        InstanceRow(
            address=address, resource_address=resource_address, module=module, mode=mode, type=type_,
            name=name, index_key=index_key, deposed=deposed, provider=provider, instance_json=instance_json,
            attributes_hash=attributes_hash, dependencies=tuple(dependencies), status=status,
        )
        for (address, resource_address, module, mode, type_, name, index_key, deposed, provider,
             instance_json, attributes_hash, dependencies, status) in rows
    ]


def outputs_of(conn: psycopg.Connection, *, version_id: int) -> list[OutputRow]:
    with conn.cursor(row_factory=class_row(OutputRow)) as cur:
        return cur.execute(_OUTPUTS_AT, (version_id,)).fetchall()
