"""Row-level commit of a sliced apply: the one place where an apply run's result enters the trunk.

One transaction, serialised on the state row: the run must be live, its caller's, and its lease
unexpired; every changed address must lie inside its write reservations; nothing it reserved may
have changed since its base serial. Then only the write set's rows change, a version row
(source ``apply``) and its outputs are written at the next serial, the run closes as committed
and its reservations are released. Disjoint committers simply land at consecutive serials.

Nothing here is proportional to the whole state: the base rows read are the slice's addresses,
the staleness check reads the rows changed since the base serial (indexed by serial), and the
version stores no raw bytes. Its v4 state is assembled from the rows on first read and cached
(``app.store.assembly``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from analyzer.state import EncryptedState
from app.domain import commit as rules
from app.domain.principal import Principal
from app.errors import BadRequestError, StateLockedError, WriteOutsideReservationError
from app.store import events, holds, resources, runs, states
from app.store.db import Database

_STATE_HEAD = """
SELECT s.lock_id, s.lock_info, s.current_serial, s.lineage, s.head_version_id, v.terraform_version
FROM states s LEFT JOIN state_versions v ON v.id = s.head_version_id WHERE s.id = %s
"""
_RUN = "SELECT base_serial, actor FROM apply_runs WHERE id = %s"
_RUN_GLOBS = "SELECT glob, mode FROM resource_reservations WHERE run_id = %s"
_BASE_ROWS = """
SELECT address, deposed, attributes_hash FROM resources
WHERE state_id = %s AND address = ANY(%s)
  AND create_serial <= %s AND (delete_serial IS NULL OR delete_serial > %s)
"""
_CLOSE_KEYS = """
UPDATE resources SET delete_serial = %s
FROM unnest(%s::text[], %s::text[]) AS k(address, deposed)
WHERE resources.state_id = %s AND resources.delete_serial IS NULL
  AND resources.address = k.address AND resources.deposed = k.deposed
"""
# The version row (no raw_state, sha256 or size_bytes: the first read assembles and caches them), its
# outputs, and the state's head, in one statement.
_INSERT_VERSION = """
WITH v AS (
    INSERT INTO state_versions (tenant_id, state_id, serial, lineage, terraform_version, encrypted, source, actor)
    VALUES (%s, %s, %s, %s, %s, false, 'apply', %s)
    RETURNING id, tenant_id, state_id
), o AS (
    INSERT INTO outputs (state_version_id, state_id, tenant_id, name, value, type, sensitive)
    SELECT v.id, v.state_id, v.tenant_id, x.name, x.value::jsonb, x.type::jsonb, x.sensitive
    FROM v, unnest(%s::text[], %s::text[], %s::text[], %s::boolean[]) AS x(name, value, type, sensitive)
)
UPDATE states SET current_serial = %s, head_version_id = v.id, updated_at = now()
FROM v WHERE states.id = %s
"""
_FINISH = """
UPDATE apply_runs SET status = 'committed', committed_serial = %s, finished_at = %s, counters = counters || %s
WHERE id = %s
"""
_RELEASE = "DELETE FROM resource_reservations WHERE run_id = %s"


@dataclass(frozen=True, slots=True)
class CommitResult:
    run_id: str
    serial: int | None  # None: nothing changed, no new version
    created: int
    updated: int
    deleted: int
    addresses: tuple[str, ...]
    outputs_changed: tuple[str, ...]


def commit_run(
    db: Database, principal: Principal, run_id: str, *, holder: str, state_body: bytes,
    slice_addresses: Sequence[str], prune_outputs: bool = True, clock: runs.Clock = runs.utcnow,
) -> CommitResult:
    """Commit the post-apply state of a run's slice. Raises WriteOutsideReservationError,
    StalePlanError, LeaseExpiredError, RunClosedError, NotRunHolderError; refusals write nothing."""
    slice_addresses = rules.check_addresses(slice_addresses, "slice_addresses")
    parsed = states.parse_body(state_body)
    if isinstance(parsed, EncryptedState):
        raise BadRequestError("an encrypted state cannot be committed row by row")
    now = clock()
    with db.transaction() as conn:
        state_name, state_id = runs.locked_live_run(conn, principal, run_id, holder, now)
        with conn.pipeline():  # three independent reads in one round trip, under the row lock
            head_read = conn.execute(_STATE_HEAD, (state_id,))
            run_read = conn.execute(_RUN, (run_id,))
            globs_read = conn.execute(_RUN_GLOBS, (run_id,))
        lock_id, lock_info, head_serial, lineage, head_version_id, tf_version = head_read.fetchone() or (
            None, None, None, None, None, None)
        if lock_id is not None:
            raise StateLockedError(f"state {state_name!r} is locked by Terraform; the commit must wait",
                                   lock_info=bytes(lock_info or b"{}"))
        (base_serial, actor) = run_read.fetchone() or (None, "")
        if base_serial is None:
            raise BadRequestError(f"apply run {run_id} has no base serial: open runs that commit with the serial "
                                  "their plan was made against (0 for a state with no versions yet)")
        head_serial = head_serial or 0
        reserved = globs_read.fetchall()
        write_globs = rules.parse_globs(g for g, mode in reserved if mode == "write")

        addresses = sorted({r.address for r in parsed.instances} | set(slice_addresses))
        base = {(a, d): h for a, d, h in conn.execute(_BASE_ROWS, (state_id, addresses, base_serial, base_serial))}
        delta = rules.commit_delta(base, parsed.instances, slice_addresses, skip=rules.unreserved_read(write_globs))
        version = states.version_at(conn, state_id, base_serial)
        base_outputs = resources.outputs_of(conn, version_id=version.id) if version else []
        changed_outputs = rules.changed_outputs(base_outputs, parsed.outputs, prune=prune_outputs)
        outside = rules.outside(delta.addresses, write_globs) + [
            f"output.{n}" for n in rules.outputs_outside(changed_outputs, write_globs)]
        if outside:
            shown = ", ".join(outside[:20]) + (f" and {len(outside) - 20} more" if len(outside) > 20 else "")
            raise WriteOutsideReservationError(
                f"the apply changed addresses outside its write reservations: {shown}; nothing was committed "
                "(reserve root outputs with 'output.NAME' or 'output.*')",
                addresses=outside[:200],
            )
        holds.check_stale(conn, state_id, base_serial, [g for g, _ in reserved])

        head_outputs = resources.outputs_of(conn, version_id=head_version_id) if head_version_id else []
        outputs = rules.merge_outputs(head_outputs, base_outputs, parsed.outputs, prune=prune_outputs)
        before, after = {o.name: o for o in head_outputs}, {o.name: o for o in outputs}
        outputs_changed = tuple(sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n)))

        counters = {"created": delta.created, "updated": delta.updated, "deleted": len(delta.deletes)}
        if delta.is_empty and not outputs_changed:
            conn.execute(_FINISH, (None, now, json.dumps(counters), run_id))
            conn.execute(_RELEASE, (run_id,))
            events.record(conn, principal, "run_commit", state_id=state_id, state_name=state_name, run_id=run_id,
                          holder=actor, **counters, serial_written=False)
            return CommitResult(run_id, None, 0, 0, 0, (), ())

        serial = head_serial + 1
        closing = [(a, d) for a, d in delta.deletes] + [(r.address, r.deposed) for r in delta.upserts]
        # Every write below is sent in one pipeline (one round trip, then COMMIT): the state's row lock is
        # held for the checks above and the change's few statements, not for a conversation per statement.
        with conn.pipeline():
            if closing:
                conn.execute(_CLOSE_KEYS, (serial, [a for a, _ in closing], [d for _, d in closing], state_id))
            if delta.upserts:
                resources.insert_rows_at(conn, tenant_id=principal.tenant_id, state_id=state_id, serial=serial,
                                         rows=delta.upserts)
            conn.execute(_INSERT_VERSION, (
                principal.tenant_id, state_id, serial, lineage or parsed.lineage,
                parsed.terraform_version or tf_version or "", actor, *resources.output_columns(outputs),
                serial, state_id))
            conn.execute(_FINISH, (serial, now, json.dumps(counters), run_id))
            conn.execute(_RELEASE, (run_id,))
            events.record(conn, principal, "run_commit", state_id=state_id, state_name=state_name, run_id=run_id,
                          serial=serial, holder=actor, **counters, addresses=list(delta.addresses)[:200])
        return CommitResult(run_id, serial, delta.created, delta.updated, len(delta.deletes), delta.addresses,
                            outputs_changed)
