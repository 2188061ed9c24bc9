"""Reads over the resource rows for the engine lane: listings, histories, edges, re-assembly."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from analyzer.addresses import AddressError, has_prefix, parse_instance_address
from analyzer.globs import Glob, GlobError, canonical, intersects, matches, parse_glob
from analyzer.state import assemble_state
from app.domain.principal import Principal
from app.errors import BadRequestError, NotFoundError, StateNotFoundError
from app.store import resources, states
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
    return Listing(state=name, serial=at, resources=found)


def _check_prefix(prefix: str) -> None:
    try:
        has_prefix("terraform_data.probe", prefix)  # parses the prefix; the answer is irrelevant
    except AddressError as exc:
        raise BadRequestError(f"invalid address prefix {prefix!r}: {exc}") from exc


def resource_history(db: Database, principal: Principal, name: str, address: str) -> list[ResourceRow]:
    """Every lifecycle of one instance address, oldest first."""
    _check_address(address, "address")
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
        return resources.edges_at(conn, state_id=row.id, serial=at)


def assemble(db: Database, principal: Principal, name: str, *, serial: int | None = None) -> bytes:
    """Re-assemble a v4 state from the rows alive at ``serial`` and that version's outputs."""
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        at = _resolve_serial(row.current_serial, serial, name)
        version = states.version_at(conn, row.id, at)
        if version is None:
            raise NotFoundError(f"state {name!r} has no version at or below serial {at}")
        if version.encrypted:
            raise BadRequestError(f"serial {version.serial} of {name!r} is encrypted; it has no rows to assemble")
        instances = resources.instances_at(conn, state_id=row.id, serial=version.serial)
        outputs = resources.outputs_of(conn, version_id=version.id)
    return assemble_state(
        serial=version.serial, lineage=version.lineage, terraform_version=version.terraform_version,
        instances=instances, outputs=outputs,
    )


_SLICE_ROWS = """
SELECT address, resource_address, module, mode, type, name, index_key, deposed, provider,
       instance::text AS instance_json, attributes_hash, dependencies, status
FROM resources
WHERE state_id = %s AND delete_serial IS NULL
  AND (address = ANY(%s) OR address LIKE ANY(%s))
"""


def _like(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def glob_patterns(globs: Iterable[Glob]) -> tuple[list[str], list[str], bool]:
    """SQL narrowing for globs: exact addresses, LIKE patterns, and whether everything is wanted.
    The narrowing may over-select (the structured ``matches`` has the last word), never under-select."""
    exact: list[str] = []
    patterns: list[str] = []
    for glob in globs:
        if glob.is_everything:
            return [], [], True
        text = canonical(glob)
        if glob.is_exact:
            exact.append(text)
            continue
        prefix = text[:-2]  # drop ".*"
        exact.append(prefix)
        patterns += [_like(prefix) + ".%", _like(prefix) + "[%"]
        # A keyless module step also matches keyed instances: module.web.* covers module.web["a"].x
        first = prefix.split(".", 2)
        if first[0] == "module" and len(first) > 1:
            patterns.append(_like(f"module.{first[1].split('[', 1)[0]}") + "[%")
    return exact, patterns, False


def slice_state(db: Database, principal: Principal, name: str, globs: Sequence[str]) -> bytes:
    """A v4 state holding the head's instances under ``globs`` (and the head's outputs), at the
    head's serial and lineage: what a file-scoped workspace starts from."""
    try:
        parsed = [parse_glob(g) for g in globs]
    except GlobError as exc:
        raise BadRequestError(f"invalid glob: {exc}") from exc
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        head = _resolve_serial(row.current_serial, None, name)
        version = states.version_at(conn, row.id, head)
        if version is None or version.encrypted:
            raise BadRequestError(f"state {name!r} has no readable head version to slice")
        exact, patterns, everything = glob_patterns(parsed)
        if everything:
            instances = resources.instances_at(conn, state_id=row.id, serial=head)
        else:
            instances = [resources.instance_row(r) for r in conn.execute(_SLICE_ROWS, (row.id, exact, patterns))]
        outputs = resources.outputs_of(conn, version_id=version.id)
    wanted = [i for i in instances if any(matches(g, i.address) for g in parsed)]
    return assemble_state(serial=version.serial, lineage=version.lineage,
                          terraform_version=version.terraform_version, instances=wanted, outputs=outputs)


_EDGES_TOUCHING = """
SELECT r.address, dep
FROM resources r, unnest(r.dependencies) AS dep
WHERE r.state_id = %(state)s AND r.delete_serial IS NULL
  AND (r.address = ANY(%(exact)s) OR r.address LIKE ANY(%(patterns)s)
       OR dep = ANY(%(exact)s) OR dep LIKE ANY(%(patterns)s) OR %(everything)s)
"""


def edges_touching(db: Database, principal: Principal, name: str, globs: Sequence[str]) -> list[tuple[str, str]]:
    """Recorded dependencies (instance address, resource address it depends on) at the head where
    either end lies under ``globs``: what a file-scoped footprint adds from the trunk's graph."""
    try:
        parsed = [parse_glob(g) for g in globs]
    except GlobError as exc:
        raise BadRequestError(f"invalid glob: {exc}") from exc
    exact, patterns, everything = glob_patterns(parsed)
    with db.transaction() as conn:
        row = states.find_state(conn, principal, name)
        found = conn.execute(_EDGES_TOUCHING, {"state": row.id, "exact": exact, "patterns": patterns,
                                               "everything": everything}).fetchall()
    # Resource-level ends (no instance key) match a glob when the glob covers any of their instances.
    return sorted({(a, d) for a, d in found if any(_touches(g, a) or _touches(g, d) for g in parsed)})


def _touches(glob: Glob, address: str) -> bool:
    try:
        return matches(glob, address) or intersects(glob, parse_glob(address + ".*"))
    except (GlobError, AddressError):
        return False
