"""Statistics and index upkeep after bulk writes, off the request: one thread per server process.

A whole-state POST that opens ``states.BULK_ROWS`` rows or more leaves the planner's row counts of
``resources`` stale and the dependencies index's pending list full (``states.refresh_statistics``). The
backend lane hands that upkeep to ``request`` and answers; this process's ``kl-upkeep`` thread then runs it
on a pooled connection of its own, outside every state's row lock, so no client waits for it and the
embedded default needs no Redis or worker process. Both steps cover the whole table, not one state, so
requests coalesce: however many bulk writes ask while one refresh runs, one more refresh follows it (a
queue of at most one). Work that should see the refreshed statistics (the splice base of the written
version, whose scan of the rows is then planned for the state's real size) is handed to ``then``, which
runs it on this thread once the refresh that covers the write has run. Until then, reads are answered as
before, with the plans the older statistics give. A failure is logged by its class alone (the database's
message may quote state content); the next bulk write asks again. The thread starts with the first
request (so a process forked after ``create_app`` starts its own), and a process that stops loses a
pending refresh, which vacuum's own analyze and pending-list cleanup then make up for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.store import states
from app.store.db import Database

log = logging.getLogger("kilolock.upkeep")


class Upkeep:
    """The process's pending refresh after bulk writes, and the thread that runs it."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._changed = threading.Condition()
        self._wanted = False  # a refresh was asked for and has not started yet
        self._after_next: list[Callable[[], object]] = []  # to run after the wanted refresh
        self._after_running: list[Callable[[], object]] = []  # to run after the running one
        self._running = False
        self._stopping = False
        self._thread: threading.Thread | None = None  # started by the first request
        self.done = 0  # refreshes finished (successfully or not), for tests and benches

    def request(self) -> None:
        """Ask for a refresh after a bulk write; one already waiting absorbs this one."""
        with self._changed:
            if self._thread is None:
                self._stopping = False
                self._thread = threading.Thread(target=self._loop, name="kl-upkeep", daemon=True)
                self._thread.start()
            self._wanted = True
            self._changed.notify_all()

    def then(self, work: Callable[[], object]) -> None:
        """Run ``work`` once the refresh asked for before it has run (on the upkeep thread), or at once when
        none is pending or running. ``work`` must be quick, such as a submission to another queue."""
        with self._changed:
            if self._wanted:
                self._after_next.append(work)
                return
            if self._running:
                self._after_running.append(work)
                return
        work()

    @property
    def running(self) -> bool:
        """Whether a refresh is running now."""
        with self._changed:
            return self._running

    def join(self, timeout: float) -> bool:
        """Wait until no refresh is pending or running (for tests and benches); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._wanted or self._running:
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

    def _loop(self) -> None:
        while True:
            with self._changed:
                while not self._wanted and not self._stopping:
                    self._changed.wait()
                if not self._wanted:
                    return
                self._wanted, self._running = False, True
                self._after_running, self._after_next = self._after_next, []
            try:
                refresh(self._db)
            finally:
                with self._changed:
                    self._running = False
                    self.done += 1
                    after, self._after_running = self._after_running, []
                    self._changed.notify_all()
            for work in after:
                _run(work)


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
