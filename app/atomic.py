"""Atomic file writes: the one way Kilolock writes a file that other processes may read or write at once.

Several ``kl`` processes (parallel applies from one checkout, one CI runner's jobs, a worker's horses)
share one data directory, and two of them may write the same file at the same moment. Each write goes to
a temporary file with a unique name in the target's own directory (same filesystem, so the rename is
atomic), is flushed to disk, and then replaces the target with ``os.replace``: a reader sees the old
content or the new, never a mixture or a truncated file, and concurrent writers simply leave the last
one's content. Readers still treat a missing or unreadable file as absent (another process may remove it).
Where a whole step must not interleave (one Redis started for two processes, one git mirror fetched at a
time), :func:`locked` holds an advisory lock on a lock file beside what the step touches.

Must not: decide what is written or where; callers own their formats.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_bytes(path: Path, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically (creating its directory), with permissions ``mode``.

    ``durable`` flushes the data to disk before the replace, so a crash leaves the old file or the new one;
    a cache that checks itself on reading may skip that cost."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path: Path, *, shared: bool = False) -> Iterator[None]:
    """Hold an advisory lock on the file ``path`` (created, with its directory, when missing) for the block:
    exclusive, or ``shared`` with the other shared holders. The lock goes with the process if it dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_text(path: Path, text: str, *, mode: int = 0o600, durable: bool = True) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically; see :func:`write_bytes`."""
    write_bytes(path, text.encode("utf-8"), mode=mode, durable=durable)
