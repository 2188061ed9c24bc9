"""Every SQL statement of the service lives under this package.

``Database`` owns the connection pool; each store operation runs in one ``transaction()``,
serialises on the state row it touches, calls the pure rules in ``app.domain``, then writes
and records an audit event. Nothing outside this package talks to Postgres.
"""

from app.store.db import Database

__all__ = ["Database"]
