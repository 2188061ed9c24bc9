"""Reads over the resource rows for the engine lane: listings, histories, edges, re-assembly."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from analyzer.addresses import AddressError, InstanceAddress, has_prefix, parse_instance_address
from analyzer.globs import Glob, GlobError, canonical, intersects, matches, parse_glob
from analyzer.state import InstanceRow
from analyzer.state_assembly import AssemblyRow, assemble_state, row_order, stream_state
from app.domain import scopes
from app.domain.principal import Principal
from app.domain.reservations import Mode
from app.errors import BadRequestError, NotFoundError, StateNotFoundError
from app.store import assembly, history, resources, states
from app.store.db import Database
from app.store.resources import Edge, ResourceRow


@dataclass(frozen=True, slots=True)
class Listing:
    state: str
    serial: int
    resources: list[ResourceRow]


def _resolve_serial(head: int | None, serial: int | None, name: str) -> int:
    if head is None:
        raise StateNotFoundError(f"state {name!r} has no versions yet")
    if serial is None:
        return head
    if serial < 0:
        raise BadRequestError("serial must be zero or more")
    return serial


def _check_address(text: str, what: str) -> None:
    try:
        parse_instance_address(text)
    except AddressError as exc:
        raise BadRequestError(f"invalid {what} {text!r}: {exc}") from exc


def list_resources(
    db: Database, principal: Principal, name: str, *, serial: int | None = None,
    prefix: str | None = None, with_instance: bool = False,
) -> Listing:
    """Resources alive at ``serial`` (default: the head), optionally under an address prefix."""
    if prefix:
        _check_prefix(prefix)
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        at = _resolve_serial(row.current_serial, serial, name)
        found = resources.list_at(conn, state_id=row.id, serial=at, prefix=prefix, with_instance=with_instance)
    if prefix:
        # SQL narrows by string shape; the structured rule has the last word.
        found = [r for r in found if has_prefix(r.address, prefix)]
    if principal.scopes is not None:  # a scoped token lists only what its read scopes cover
        found = [r for r in found if scopes.can_read(principal.scopes, r.address)]
    return Listing(state=name, serial=at, resources=found)


def _check_prefix(prefix: str) -> None:
    try:
        has_prefix("terraform_data.probe", prefix)  # parses the prefix; the answer is irrelevant
    except AddressError as exc:
        raise BadRequestError(f"invalid address prefix {prefix!r}: {exc}") from exc


def resource_history(db: Database, principal: Principal, name: str, address: str) -> list[ResourceRow]:
    """Every lifecycle of one instance address, oldest first."""
    _check_address(address, "address")
    scopes.check_readable(principal.scopes, name, address)
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        found = resources.history(conn, state_id=row.id, address=address)
    if not found:
        raise NotFoundError(f"state {name!r} has never held {address!r}")
    return found


def dependency_edges(db: Database, principal: Principal, name: str, *, serial: int | None = None) -> list[Edge]:
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        at = _resolve_serial(row.current_serial, serial, name)
        edges = resources.edges_at(conn, state_id=row.id, serial=at)
    return [e for e in edges if _readable_edge(principal, e.address, e.depends_on)]


def _readable_edge(principal: Principal, address: str, depends_on: str) -> bool:
    """A scoped token sees an edge when it may read both ends."""
    return scopes.can_read(principal.scopes, address) and scopes.can_read_resource(principal.scopes, depends_on)


def assemble(db: Database, principal: Principal, name: str, *, serial: int | None = None) -> bytes:
    """Re-assemble a v4 state from the rows alive at ``serial`` and that version's outputs (the whole state:
    a scoped token needs '*:read', and slices instead)."""
    scopes.check_whole_state(principal.scopes, name, Mode.READ, "assembling")
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        at = _resolve_serial(row.current_serial, serial, name)
        version = states.version_at(conn, row.id, at)
        if version is None:
            raise NotFoundError(f"state {name!r} has no version at or below serial {at}")
        if version.encrypted:
            raise BadRequestError(f"serial {version.serial} of {name!r} is encrypted; it has no rows to assemble")
        cached = assembly.apply_version_bytes(conn, version.id)  # a commit's version: assembled once, then kept
        if cached is not None:
            return cached
        instances = resources.instances_at(conn, state_id=row.id, serial=version.serial)
        outputs = resources.outputs_of(conn, version_id=version.id)
    return assemble_state(
        serial=version.serial, lineage=version.lineage, terraform_version=version.terraform_version,
        instances=instances, outputs=outputs,
    )


_ASSEMBLY_COLUMNS = """r.address, r.resource_address, r.module, r.mode, r.type, r.name, r.index_key, r.deposed,
       r.provider, r.instance::text AS instance_json, r.attributes_hash, r.dependencies, r.status"""
# Exact addresses and prefixes through the unique index of the live rows, a prefix as one range scan
# (text_pattern_ops: ``~>=~``/``~<~`` compare bytes, and U+10FFFF sorts after any continuation of a prefix).
# Each lookup is a LATERAL subquery fenced with OFFSET 0, so the planner cannot flatten it into a
# join that scans the whole state (it did, whenever the table's statistics lagged a large write).
_UNDER_GLOBS = f"""
SELECT {_ASSEMBLY_COLUMNS} FROM unnest(%(exact)s::text[]) AS e(address)
CROSS JOIN LATERAL (
    SELECT * FROM resources x
    WHERE x.state_id = %(state)s AND x.delete_serial IS NULL AND x.address = e.address OFFSET 0
) r
UNION ALL
SELECT {_ASSEMBLY_COLUMNS} FROM unnest(%(prefixes)s::text[]) AS p(prefix)
CROSS JOIN LATERAL (
    SELECT * FROM resources x
    WHERE x.state_id = %(state)s AND x.delete_serial IS NULL
      AND x.address ~>=~ p.prefix AND x.address ~<~ (p.prefix || chr(1114111)) OFFSET 0
) r
"""
# ``state_id + 0``: the state is a filter on the rows the GIN index finds, never an index condition of its own
# (through the state's btree the lookup would read every row of the state; see ``_dependents``). The
# ``cardinality`` condition is the index's own predicate (it holds only the rows that name a dependency, the
# only ones ``&&`` can match), stated so the planner may use it.
_DEPENDENTS = """
SELECT r.address, r.dependencies FROM resources r
WHERE r.state_id + 0 = %(state)s AND r.delete_serial IS NULL AND cardinality(r.dependencies) > 0
  AND r.dependencies && %(names)s::text[]
"""
_DEPENDENTS_BY_PREFIX = """
SELECT r.address, r.dependencies FROM resources r
WHERE r.state_id = %(state)s AND r.delete_serial IS NULL
  AND EXISTS (SELECT 1 FROM unnest(r.dependencies) d, unnest(%(prefixes)s::text[]) p(prefix)
              WHERE d ~>=~ p.prefix AND d ~<~ (p.prefix || chr(1114111)))
"""


@dataclass(frozen=True, slots=True)
class GlobLookup:
    """How to find the rows under a set of globs: exact addresses, address prefixes, or everything.
    It may over-select (the structured ``matches`` has the last word), never under-select."""

    exact: tuple[str, ...]
    prefixes: tuple[str, ...]
    everything: bool


def glob_lookup(globs: Iterable[Glob]) -> GlobLookup:
    exact: set[str] = set()
    prefixes: set[str] = set()
    for glob in globs:
        if glob.is_everything:
            return GlobLookup((), (), True)
        text = canonical(glob)
        if glob.is_exact:
            exact.add(text)
            continue
        if glob.resource_type is not None and glob.module:
            # Over-select the whole first module call: its keyless steps stand for any key.
            prefixes.update((f"module.{glob.module[0].name}.", f"module.{glob.module[0].name}["))
            continue
        stem = text[:-2]  # drop ".*"
        exact.add(stem)
        prefixes.update((stem + ".", stem + "["))
        # A keyless module step also covers keyed instances: module.web.* covers module.web["a"].x
        if glob.module:
            prefixes.add(f"module.{glob.module[0].name}[")
    return GlobLookup(tuple(sorted(exact)), tuple(sorted(prefixes)), False)


def _parse_globs(globs: Sequence[str]) -> list[Glob]:
    try:
        return [parse_glob(g) for g in globs]
    except GlobError as exc:
        raise BadRequestError(f"invalid glob: {exc}") from exc


def _rows_under(conn: psycopg.Connection, state_id: int, lookup: GlobLookup) -> list[InstanceRow]:
    rows = conn.execute(_UNDER_GLOBS, {"state": state_id, "exact": list(lookup.exact),
                                       "prefixes": list(lookup.prefixes)}).fetchall()
    unique = {(r[0], r[7]): r for r in rows}  # an address can come from an exact match and a prefix
    return [resources.instance_row(r) for r in unique.values()]


def slice_state(db: Database, principal: Principal, name: str, globs: Sequence[str]) -> list[bytes]:
    """A v4 state holding the head's instances under ``globs`` (and the head's outputs), at the
    head's serial and lineage: what a file-scoped workspace starts from. The file comes as its pieces
    (never joined: the slice of a whole state is as large as the state)."""
    parsed = _parse_globs(globs)
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        head = _resolve_serial(row.current_serial, None, name)
        version = states.version_at(conn, row.id, head)
        if version is None or version.encrypted:
            raise BadRequestError(f"state {name!r} has no readable head version to slice")
        lookup = glob_lookup(parsed)
        outputs = resources.outputs_of(conn, version_id=version.id)
        if principal.scopes is not None:  # a scoped token's slice holds only what its read scopes cover
            outputs = [o for o in outputs if scopes.can_read_output(principal.scopes, o.name)]
        stream: Generator[AssemblyRow, None, None] | None = None
        rows: Iterable[InstanceRow | AssemblyRow]
        if lookup.everything:  # the whole state: streamed from the cursor, never all rows at once
            rows = stream = resources.stream_assembly_rows(conn, state_id=row.id, serial=head)
        else:
            rows = sorted(_rows_under(conn, row.id, lookup), key=row_order)
        wanted = (i for i in rows if any(matches(g, i.address) for g in parsed)
                  and (principal.scopes is None or scopes.can_read(principal.scopes, i.address)))
        try:
            return list(stream_state(serial=version.serial, lineage=version.lineage, plain_numbers=True,
                                     terraform_version=version.terraform_version, instances=wanted,
                                     outputs=outputs))
        finally:
            if stream is not None:
                stream.close()  # in this transaction, should the assembly fail: it ends its pipeline and cursor


def edges_touching(db: Database, principal: Principal, name: str, globs: Sequence[str]) -> list[tuple[str, str]]:
    """Recorded dependencies (instance address, resource address it depends on) at the head where
    either end lies under ``globs``: what a file-scoped footprint adds from the trunk's graph."""
    parsed = _parse_globs(globs)
    lookup = glob_lookup(parsed)
    found: set[tuple[str, str]] = set()
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        if lookup.everything:
            rows = resources.instances_at(conn, state_id=row.id, serial=row.current_serial or 0)
            return sorted({(r.address, d) for r in rows for d in r.dependencies
                           if _readable_edge(principal, r.address, d)})
        for r in _rows_under(conn, row.id, lookup):
            found.update((r.address, d) for d in r.dependencies)
        # Dependencies name resources without instance keys: a glob's keyless stem is such a name.
        names = sorted({_keyless(e) for e in lookup.exact})
        dependents = _dependents(conn, row.id, names) if names else []
        module_prefixes = [p for p in lookup.prefixes if p.startswith("module.")]
        if module_prefixes:
            dependents += conn.execute(_DEPENDENTS_BY_PREFIX,
                                       {"state": row.id, "prefixes": module_prefixes}).fetchall()
        found.update((address, d) for address, deps in dependents for d in deps)
    # Resource-level ends (no instance key) match a glob when the glob covers any of their instances.
    # Each end is parsed once, however many edges and globs it meets.
    ends: dict[str, _End] = {}

    def end(address: str) -> _End:
        known = ends.get(address)
        if known is None:
            known = ends[address] = _End.of(address)
        return known

    return sorted((a, d) for a, d in found if any(end(a).touched_by(g) or end(d).touched_by(g) for g in parsed)
                  and _readable_edge(principal, a, d))


def _dependents(conn: psycopg.Connection, state_id: int, names: list[str]) -> list[Any]:
    """The live rows whose dependencies name any of ``names``, through the GIN index on dependencies. The
    planner estimates ``&&`` against a long array as matching a large share of the table and would scan every
    row of every state instead (its cost then follows the table, not the answer); the index lookup costs one
    probe per name. With sequential scans off it would still read every row of a state that holds a small
    share of the table through the btree on ``state_id`` (a bitmap of the whole state, each row rechecked),
    which the query's ``state_id + 0`` rules out. The setting is local to the transaction and restored right
    after (a failed query aborts the transaction, which discards it)."""
    conn.execute("SET LOCAL enable_seqscan = off")
    rows = list(conn.execute(_DEPENDENTS, {"state": state_id, "names": names}).fetchall())
    conn.execute("SET LOCAL enable_seqscan = on")
    return rows


def _keyless(address: str) -> str:
    return address.split("[", 1)[0] if not address.startswith("module.") else address


@dataclass(frozen=True, slots=True)
class _End:
    """One end of a recorded edge, parsed: as an instance address, and as the prefix of what lies under it
    (None where the text is not one)."""

    address: InstanceAddress | None
    under: Glob | None

    @classmethod
    def of(cls, text: str) -> _End:
        try:
            address: InstanceAddress | None = parse_instance_address(text)
        except AddressError:
            address = None
        try:
            under: Glob | None = parse_glob(text + ".*")
        except (GlobError, AddressError):
            under = None
        return cls(address, under)

    def touched_by(self, glob: Glob) -> bool:
        """Whether ``glob`` covers this end, or some instance under it."""
        if self.address is None:
            return False
        try:
            return matches(glob, self.address) or (self.under is not None and intersects(glob, self.under))
        except (GlobError, AddressError):
            return False


BLAME_PAGE_MAX = 1000  # addresses per page
BLAME_CHANGES_MAX = 200  # lifecycles per address


def blame(
    db: Database, principal: Principal, name: str, glob: str, *, after: str = "", limit: int = 100,
    changes: int = 20,
) -> history.Page:
    """The history of every address the state ever held under ``glob`` (a parsed glob; an exact address is one
    too), a page of ``limit`` addresses after ``after``, each with its newest ``changes`` lifecycles. A scoped
    token sees only the addresses its read scopes cover."""
    parsed = _parse_globs([glob])[0]
    if not 1 <= limit <= BLAME_PAGE_MAX:
        raise BadRequestError(f"limit must be 1 to {BLAME_PAGE_MAX}")
    if not 1 <= changes <= BLAME_CHANGES_MAX:
        raise BadRequestError(f"changes must be 1 to {BLAME_CHANGES_MAX}")
    if parsed.is_exact:
        scopes.check_readable(principal.scopes, name, canonical(parsed))
    lookup = glob_lookup([parsed])
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        # The lookup over-selects; what the structured match or the scopes drop still advances the cursor.
        scanned = history.addresses_under(conn, state_id=row.id, exact=lookup.exact, prefixes=lookup.prefixes,
                                          everything=lookup.everything, after=after, limit=limit)
        wanted = [a for a in scanned if matches(parsed, a) and scopes.can_read(principal.scopes, a)]
        found = history.histories(conn, state_id=row.id, addresses=wanted, per_address=changes)
    if parsed.is_exact and not found:
        raise NotFoundError(f"state {name!r} has never held {glob!r}")
    return history.Page(found, scanned[-1] if len(scanned) == limit else None)
