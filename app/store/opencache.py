"""The open sets of recently written states, kept in process memory between writes.

Owns ``OpenSets``: for each state, the ``{(address, deposed): OpenRow}`` map of its live resource rows that
``resources.project`` would otherwise load from the table on every write (50,000 rows are a query plus
50,000 objects). Terraform writes one state many times during an apply, so its next write usually finds
the open set here. Owns no SQL: ``resources.project`` reads the keys and hands the maps over.

An open set is only ever handed out for the exact head it describes. Its ``HeadKey`` names the database,
the state, and the state row's ``head_version_id`` and ``updated_at``; a lookup uses those read from the
state row under its ``FOR UPDATE`` lock, so it sees every committed write and none in progress. The
rules that make a match mean "current":

- Every change to a state's live rows happens in a transaction that makes a newly inserted version the
  head and sets ``updated_at = now()`` (``states.write_state``, ``commit.commit_run``). Version ids come
  from a sequence, so a head never comes back, and a deleted state's name gets a new state id. Code that
  changes live rows without that would make entries stale: it must move the head too.
- A write stores its new open set under the head *its* transaction creates, before it commits (the store
  has no after-commit hook). Only a later transaction that reads that head under the row lock can use
  it, which is proof the write committed; a write that rolled back left a head nobody will ever read, so
  its entry is dropped at the state's next lookup, which loads from the table.
- ``updated_at`` guards against ids that come back after all (``TRUNCATE ... RESTART IDENTITY`` under a
  running server, as the tests and benchmarks do): it is the writing transaction's start time.

Other processes writing the same state are seen by the key check: their write moves the head, so this
process's entry no longer matches and the next write here loads from the table.

Must not: talk to the database, mutate a map after storing it, or return a map for any other head.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from app.domain.lifecycle import OpenRow

OpenSet = Mapping[tuple[str, str], OpenRow]

# About 400 bytes a row (key tuple, address text, OpenRow, hex digest, dict slot), so some 40 MB per process
# at most: room for two 50,000-instance states, or many small ones.
DEFAULT_MAX_ROWS = 100_000


@dataclass(frozen=True, slots=True)
class HeadKey:
    """A state's head as its row reads under the row lock: which open set is exactly current."""

    database: str  # host, port and database name: one process may serve several databases (tests do)
    state_id: int
    version_id: int
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class CacheStats:
    hits: int
    misses: int
    states: int
    rows: int


class OpenSets:
    """A bounded LRU of open sets, one per state and at most ``max_rows`` rows in all; thread-safe.

    A state larger than ``max_rows`` is not kept.
    """

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._states: OrderedDict[tuple[str, int], tuple[HeadKey, OpenSet]] = OrderedDict()
        self._rows = 0
        self._hits = 0
        self._misses = 0

    def get(self, head: HeadKey) -> OpenSet | None:
        """The open set stored for exactly ``head``, or None. An entry for any other head of the state is
        dropped: that head is in the past, or was never committed, so it can never match again."""
        slot = (head.database, head.state_id)
        with self._lock:
            entry = self._states.get(slot)
            if entry is not None and entry[0] == head:
                self._states.move_to_end(slot)
                self._hits += 1
                return entry[1]
            if entry is not None:
                del self._states[slot]
                self._rows -= len(entry[1])
            self._misses += 1
            return None

    def put(self, head: HeadKey, rows: OpenSet) -> None:
        """Store the open set of ``head`` in place of the state's entry, evicting the least recently used
        states beyond ``max_rows``. The caller must not change ``rows`` afterwards."""
        slot = (head.database, head.state_id)
        with self._lock:
            old = self._states.pop(slot, None)
            if old is not None:
                self._rows -= len(old[1])
            if len(rows) > self.max_rows:
                return
            self._states[slot] = (head, rows)
            self._rows += len(rows)
            while self._rows > self.max_rows:  # never reaches the new entry: it fits on its own
                _, (_, evicted) = self._states.popitem(last=False)
                self._rows -= len(evicted)

    def head_of(self, database: str, state_id: int) -> HeadKey | None:
        """The head the state's entry was stored for, if any (for diagnostics: counts as no lookup)."""
        with self._lock:
            entry = self._states.get((database, state_id))
            return None if entry is None else entry[0]

    def clear(self) -> None:
        with self._lock:
            self._states.clear()
            self._rows = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(hits=self._hits, misses=self._misses, states=len(self._states), rows=self._rows)


# The process's cache: gunicorn workers and RQ jobs each have their own, kept apart by the key check.
OPEN_SETS = OpenSets()
