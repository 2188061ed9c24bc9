"""A state's first write while its body is parsed: the version row and the rows stored beside the parse.

``FirstRows`` is the parser's ``watch`` (``analyzer.statestream``) for the optimistic first write of
``states.write_state``. Once the top-level fields before ``resources`` are read it has the state's row made
(created when missing) and starts storing the version row on the write's connection, in a thread of its own:
the body's bytes are in memory already, their sha256 (taken as they are sent) and the insert's wait leave the
interpreter free, and the storing is Postgres's work. A version stored after hundreds of thousands of rows
costs Postgres up to two or three times as much as one stored before them (its buffers then hold the rows'
dirty pages). The rows the parser makes meanwhile wait in a list (the parse offers the interpreter to the
version's thread every few of them, so the thread's writes do not each wait for a switch interval); the rows'
COPY starts on the same connection once the version is stored, and then takes each row as it is made. A body
whose lineage or Terraform version is not read before its resources has its version stored after the parse
instead, by the caller.

Used as a context manager around the parse: its exit ends the rows' COPY (which fails, storing nothing, when
the block raises) and waits for the version's thread, so the connection is free again for the caller.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType

import psycopg

from analyzer.jsontext import INT64_MAX
from analyzer.state import InstanceRow
from app.store import rawwrite, resources

# Rows the parse makes between two offers of the interpreter to the version's thread (about 0.2 ms of parse).
_YIELD_EVERY = 16


class FirstRows:
    """One first write's version and rows, stored while its body is parsed (see the module's docstring)."""

    def __init__(self, conn: psycopg.Connection, *, tenant_id: int, actor: str, source: str, body: bytes,
                 state_of: Callable[[], tuple[int, str | None]]) -> None:
        self._conn, self._tenant_id, self._actor, self._source, self._body = conn, tenant_id, actor, source, body
        # The state's id and the id of the lock it holds, its row created when missing (may raise to stop the
        # parse).
        self._state_of = state_of
        self._stack = contextlib.ExitStack()
        self.state_id = 0  # the state the rows are COPYed into (0 until ``watch`` ran)
        self.lock_id: str | None = None  # the lock the state held when ``watch`` found it
        self.serial = 0
        self.ids_after = 0  # the rows' ids follow this one (when no other session took one meanwhile)
        self.version_id = 0  # the version stored (0 until ``finish``, and when the caller stores it)
        self.version_fields: tuple[str, str] | None = None  # the lineage and Terraform version it stores
        self.digest: str | None = None  # the body's sha256, once the version's thread has it
        self._version: _Background | None = None
        self._pending: list[InstanceRow] = []
        self._put: Callable[[InstanceRow], None] | None = None

    def __enter__(self) -> FirstRows:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        return self._stack.__exit__(kind, exc, tb)

    def watch(self, doc: Mapping[str, object]) -> Callable[[InstanceRow], None] | None:
        serial = doc.get("serial")
        if type(serial) is not int or not 0 <= serial <= INT64_MAX:
            return None  # the rows need their serial: stored after the parse, the usual way
        self.state_id, self.lock_id = self._state_of()
        self.serial = serial
        self.ids_after = resources.last_row_id(self._conn, advance=True)
        lineage, terraform_version = doc.get("lineage"), doc.get("terraform_version", "")
        if not (isinstance(lineage, str) and lineage and isinstance(terraform_version, str)):
            return self._start_rows()
        self.version_fields = (lineage, terraform_version)
        self._version = _Background(functools.partial(self._store_version, lineage, terraform_version))
        # Waited for after the rows' COPY ends (the stack unwinds last in, first out).
        self._stack.callback(self._version.wait)
        return self._take

    def _store_version(self, lineage: str, terraform_version: str) -> int:
        """In the version's thread: the version row, the body's sha256 taken as its bytes are sent (hashlib
        leaves the interpreter to the parse)."""
        version_id, self.digest = rawwrite.insert_version_hashing(
            self._conn, tenant_id=self._tenant_id, state_id=self.state_id, serial=self.serial, lineage=lineage,
            terraform_version=terraform_version, raw=self._body, encrypted=False, source=self._source,
            actor=self._actor)
        return version_id

    def _take(self, row: InstanceRow) -> None:
        put = self._put
        if put is not None:
            put(row)
            return
        pending = self._pending
        pending.append(row)
        version = self._version
        assert version is not None
        if not version.done:
            if not len(pending) % _YIELD_EVERY:
                # The version's thread takes the interpreter for a moment between its writes; a parse that
                # kept it would hand it over only every switch interval (5 ms), slowing the version 2-3x.
                time.sleep(0)
        elif version.failed:
            # The parse goes on, for the usual way to reuse; ``finish`` raises the error.
            pending.clear()
            self._put = _ignore
        else:
            self._start_rows()

    def _start_rows(self) -> Callable[[InstanceRow], None]:
        """The rows' COPY (once the version is stored), fed the rows that waited for it."""
        put = self._stack.enter_context(resources.row_copy(self._conn, tenant_id=self._tenant_id,
                                                           state_id=self.state_id, serial=self.serial))
        for row in self._pending:
            put(row)
        self._pending.clear()
        self._put = put
        return put

    def finish(self) -> None:
        """After the parse: the version stored (its error, when Postgres refused it, raised here), every row
        sent; the block's end then ends the COPY."""
        if self._version is not None:
            self.version_id = self._version.join()
        if self._put is None:
            self._start_rows()


def _ignore(row: InstanceRow) -> None:
    """The rows' consumer once the version failed: the transaction is lost, the rows are not sent."""


class _Background:
    """One call run in a thread of its own; ``join`` gives its result or raises its error. For a call that
    mostly waits on Postgres or hashes (the thread holds the interpreter only between its writes)."""

    def __init__(self, call: Callable[[], int]) -> None:
        self.done = False
        self.failed = False
        self._call = call
        self._result = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kl-first-version", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._call()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread, which raises it
            self._error = exc
            self.failed = True
        finally:
            self.done = True

    def wait(self) -> None:
        self._thread.join()

    def join(self) -> int:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._result
