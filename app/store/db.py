"""The connection pool and the transaction helper."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from app.domain.reservations import LIVE_STATUSES
from app.errors import ServiceUnavailableError, UnstorableValueError

log = logging.getLogger("kilolock.store")
# libpq's input buffer grows to the largest message a connection has received and is only freed when the
# connection closes: a pooled connection that read one large value would keep that much memory for its life.
LARGE_VALUE_BYTES = 8 * 1024 * 1024


def retire(conn: psycopg.Connection) -> None:
    """Close a pooled connection that has just read a value of LARGE_VALUE_BYTES or more, inside its
    ``transaction()`` block (the block then neither commits nor rolls back: use it only after reads); the pool
    replaces it with a new one instead of keeping its input buffer."""
    conn._kl_retired = True  # type: ignore[attr-defined]
    conn.close()


class _RetiredFilter(logging.Filter):
    """The pool warns of every closed connection handed back to it; a retired one is closed on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(getattr(arg, "_kl_retired", False) for arg in args)


logging.getLogger("psycopg.pool").addFilter(_RetiredFilter())


def sql_text_list(values: Iterable[str]) -> str:
    """``('a', 'b')``: string constants of the code itself (enum values) as a SQL list, spelled out so the
    planner can match a partial index's predicate. A request's values always go in parameters instead."""
    return "(" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + ")"


# ``status IN LIVE_STATUSES_SQL``: a run that holds its reservations (the apply_runs_live_ix predicate).
LIVE_STATUSES_SQL = sql_text_list(LIVE_STATUSES)


def _configure(conn: psycopg.Connection) -> None:
    """Session settings of every pooled connection, set once when the pool opens it.

    JIT compilation off: Postgres compiles a statement's expressions with LLVM once the planner's cost
    estimate passes ``jit_above_cost`` (and inlines and optimizes them past ``jit_inline_above_cost`` and
    ``jit_optimize_above_cost``). Our lookups by index are estimated in proportion to the state's rows
    (a range over address prefixes is guessed as a fixed share of them), so on a large state the slice and
    edges lookup, 100 rows read in a millisecond, crossed all three thresholds and spent about 0.3 s
    compiling; the bulk reads stream rows whose cost is their bytes, which compiled expressions do not
    shorten. Other session settings (``options`` in the URL, ``PGOPTIONS``) are kept."""
    conn.execute("SET jit = off")
    conn.commit()


class Database:
    """A psycopg 3 pool. ``transaction()`` yields a connection inside one transaction that
    commits when the block ends and rolls back if it raises."""

    def __init__(self, url: str, *, pool_size: int = 10, timeout: float = 10.0) -> None:
        self.url = url
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max(pool_size, 1),
            timeout=timeout,
            open=False,
            kwargs={"autocommit": False},
            configure=_configure,
            name="kilolock",
        )
        self._pool.open(wait=False)

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection]:
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.errors.DataError, psycopg.errors.ProgramLimitExceeded) as exc:
            # Class 22 (data exception) and 54 (a value too large for an index): the request carried a
            # value the database cannot hold. The message and diagnostics quote row data (state content),
            # so only the SQLSTATE is kept; nothing was written (the transaction rolled back).
            log.warning("database refused a value: SQLSTATE %s (%s)", exc.sqlstate, exc.__class__.__name__)
            raise UnstorableValueError(
                f"a value in the request cannot be stored (SQLSTATE {exc.sqlstate}): check for oversized "
                "identifiers, out-of-range numbers or characters that are not text") from None
        except PoolTimeout as exc:
            raise ServiceUnavailableError("database unavailable: no connection within the pool timeout") from exc
        except psycopg.OperationalError as exc:
            log.error("database error: %s", exc.__class__.__name__)
            raise ServiceUnavailableError("database unavailable; check KL_DATABASE_URL and the server") from exc

    def ping(self) -> bool:
        """True when a trivial query succeeds within the pool timeout."""
        try:
            with self.transaction() as conn:
                conn.execute("SELECT 1")
            return True
        except ServiceUnavailableError:
            return False

    def close(self) -> None:
        self._pool.close()
