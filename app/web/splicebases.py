"""Building splice bases in the background: one thread per server process, started by ``create_app``.

After a whole-state POST of at least ``KL_SPLICE_BASE_BYTES`` (0: never) the backend lane hands the new
version to ``submit`` and answers; this process's ``kl-splice-bases`` thread then builds the version's
splice base (``app.store.splicebase.build``) on a pooled connection of its own, so no request worker waits
for it and the embedded default needs no Redis or worker process. One base is built at a time per process
(its memory is the assembly's: a batch of rows and a few pieces), and at most ``PENDING`` versions wait;
beyond that a submission is dropped (the reads after it assemble from the rows, as without a base). A
failure is logged by its class alone (the database's message may quote state content) and leaves no base.
A process that stops loses its queue, with the same effect.
"""

from __future__ import annotations

import logging
import queue
import threading

from app.store import splicebase
from app.store.db import Database

log = logging.getLogger("kilolock.splicebases")

PENDING = 8


class Builder:
    """The process's queue of versions to build a splice base for, and the thread that builds them."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._queue: queue.Queue[int | None] = queue.Queue(PENDING)
        self._thread: threading.Thread | None = None  # started by the first submission
        self._start = threading.Lock()

    def submit(self, version_id: int) -> bool:
        """Queue a version; False when the queue is full (the submission is dropped)."""
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kl-splice-bases", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(version_id)
        except queue.Full:
            log.info("splice base of version %s not queued: %d already waiting", version_id, PENDING)
            return False
        return True

    @property
    def pending(self) -> int:
        """Versions queued or being built (0: idle), for ``/metrics``."""
        return self._queue.unfinished_tasks

    def join(self) -> None:
        """Wait until every queued version has been handled (for tests and benches)."""
        self._queue.join()

    def stop(self) -> None:
        with self._start:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()

    def _loop(self) -> None:
        while True:
            version_id = self._queue.get()
            try:
                if version_id is None:
                    return
                build(self._db, version_id)
            finally:
                self._queue.task_done()


def build(db: Database, version_id: int) -> bool:
    """Build one base, logging a failure instead of raising it; whether a base was stored."""
    try:
        stored = splicebase.build(db, version_id)
    except Exception as exc:  # the thread must outlive one failure; the reads fall back to the rows
        log.warning("building the splice base of version %s failed (%s)", version_id, exc.__class__.__name__)
        return False
    if stored:
        log.info("stored the splice base of version %s", version_id)
    return stored
