"""Statistics and index upkeep after bulk writes, off the request: one thread per server process.

A whole-state POST that opens ``states.BULK_ROWS`` rows or more leaves the planner's row counts of
``resources`` stale and the dependencies index's pending list full (``states.refresh_statistics``). The
backend lane hands that upkeep to ``request`` and answers; this process's ``kl-upkeep`` thread then runs it
on a pooled connection of its own, outside every state's row lock, so no client waits for it and the
embedded default needs no Redis or worker process. Both steps cover the whole table, not one state, so
requests coalesce: however many bulk writes ask while one refresh waits, that one covers them all, and one
asked for while a refresh runs follows it. Work handed on with ``later`` (the changed attribute names of a
write that replaced many rows, ``states.write_state``) joins the same queue, after the refresh its write
asked for, so it is planned with the refreshed statistics; the thread runs the queue in order, one item at a
time. Quick work that should see the refreshed statistics (the submission of the written version's splice
base, whose scan of the rows is then planned for the state's real size) is handed to ``then``, which queues
it behind a pending or running refresh and runs it at once when there is none. Until then, reads are
answered as before, with the plans the older statistics give (and history reads derive the names not yet
recorded). ``pending`` counts what is queued or running, for ``/metrics``. A failure is logged by its class
alone (the database's message may quote state content); the next bulk write asks again. The thread starts
with the first request (so a process forked after ``create_app`` starts its own), and a process that stops
loses what is queued: vacuum's own analyze and pending-list cleanup make up for a refresh, and history reads
for names never recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.store import states
from app.store.db import Database

log = logging.getLogger("kilolock.upkeep")


_REFRESH = None  # the queue's mark of a refresh (every other entry is work to run)


class Upkeep:
    """The process's queue of upkeep after bulk writes (refreshes and handed-on work), and the thread that
    runs it in order."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._changed = threading.Condition()
        self._queue: list[Callable[[], object] | None] = []  # _REFRESH or work, in the order they run
        self._current: Callable[[], object] | None | bool = False  # what runs now (False: nothing)
        self._stopping = False
        self._thread: threading.Thread | None = None  # started by the first request
        self.done = 0  # refreshes finished (successfully or not), for tests and benches

    def request(self) -> None:
        """Ask for a refresh after a bulk write; one already waiting (not started) absorbs this one."""
        with self._changed:
            self._start()
            if _REFRESH not in self._queue:
                self._queue.append(_REFRESH)
            self._changed.notify_all()

    def then(self, work: Callable[[], object]) -> None:
        """Run ``work`` once the refresh asked for before it has run (on the upkeep thread), or at once when
        none is pending or running. ``work`` should be quick, such as a submission to another queue."""
        with self._changed:
            if _REFRESH in self._queue or self._current is _REFRESH:
                self._queue.append(work)
                return
        work()

    def later(self, work: Callable[[], object]) -> None:
        """Run ``work`` on the upkeep thread, after everything asked for before it (the refresh of the bulk
        write that hands it on, in particular); never on the caller's thread. For work a client should not
        wait for, such as the changed attribute names of a write that replaced many rows."""
        with self._changed:
            self._start()
            self._queue.append(work)
            self._changed.notify_all()

    @property
    def running(self) -> bool:
        """Whether a refresh is running now."""
        with self._changed:
            return self._current is _REFRESH

    @property
    def pending(self) -> int:
        """Refreshes and handed-on work queued or running (0: idle), for ``/metrics``, tests and benches."""
        with self._changed:
            return len(self._queue) + (self._current is not False)

    def join(self, timeout: float) -> bool:
        """Wait until nothing is queued or running (for tests and benches); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._queue or self._current is not False:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def stop(self) -> None:
        """Run what is pending, then end the thread."""
        with self._changed:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._changed.notify_all()
        if thread is not None:
            thread.join()

    def _start(self) -> None:
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="kl-upkeep", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._queue and not self._stopping:
                    self._changed.wait()
                if not self._queue:
                    return
                item = self._current = self._queue.pop(0)
            try:
                if item is _REFRESH:
                    refresh(self._db)
                else:
                    _run(item)
            finally:
                with self._changed:
                    self._current = False
                    if item is _REFRESH:
                        self.done += 1
                    self._changed.notify_all()


def refresh(db: Database) -> bool:
    """Run the upkeep once, logging a failure instead of raising it; whether it ran to the end."""
    try:
        states.refresh_statistics(db)
    except Exception as exc:  # the thread must outlive one failure; vacuum catches up meanwhile
        log.warning("the upkeep after a bulk write failed (%s)", exc.__class__.__name__)
        return False
    return True


def _run(work: Callable[[], object]) -> None:
    try:
        work()
    except Exception as exc:  # the thread must outlive one failure
        log.warning("work after the upkeep failed (%s)", exc.__class__.__name__)
