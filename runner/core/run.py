"""The run stage: one run on the server, from its opening to its end, for ``kl apply``, ``kl refresh``,
``kl drift`` and ``kl recover`` (and the bot, which applies through them and ends a timed-out job's runs).

``ApplyRun.open`` asks for the reservations and turns the server's refusal into the command's outcome by
one rule (``Refused``); ``heartbeat`` keeps the lease while the run works; ``commit`` hands the post-apply
state to the server; ``close`` and ``close_failed`` end it, and never raise: the lease or an operator may
have ended it already, and the error the caller is about to raise is what matters.

Must not: decide what a run may write (the server does, at commit) or run Terraform.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.globs import Reservation
from app.domain.reservations import LIVE_STATUSES, RunStatus
from runner.core.engine_client import Commit, EngineClient, EngineError, OpenedRun
from runner.core.errors import REFUSALS, RUN_LOST, EngineCode, Failed, KlExit, ReservationRefused, StalePlan

Echo = Callable[[str], None]

# The longest error summary a closed run keeps (its tail: Terraform's last lines say what went wrong).
SUMMARY_CHARS = 2000


@dataclass(frozen=True, slots=True)
class Refused:
    """What a refused opening becomes: ``words`` puts the server's error into the command's sentence. A stale
    base serial is a ``StalePlan`` and a conflict (or a lapsed queue place) a ``ReservationRefused`` — unless
    ``conflict`` names another outcome (``kl drift``, whose exit 2 means drift was found); any other engine
    error stays itself, unless ``other`` names its outcome (``kl recover``)."""

    words: Callable[[EngineError], str] = str
    conflict: type[KlExit] | None = None
    other: type[KlExit] | None = None

    def outcome(self, exc: EngineError) -> Exception:
        if exc.code == EngineCode.STALE_PLAN:
            return StalePlan(self.words(exc))
        if exc.code in REFUSALS:
            return (self.conflict or ReservationRefused)(self.words(exc))
        return self.other(self.words(exc)) if self.other is not None else exc


# How each command's opening reads when the server refuses it: kl apply says the server's error as it is.
APPLY_REFUSED = Refused()


def check_refused(kind: str, *, write: bool) -> Refused:
    """kl refresh (``write``) and kl drift: a conflict fails kl drift, whose exit 2 means drift was found."""
    return Refused(words=lambda exc: f"cannot reserve the slice for kl {kind}:\n{exc}",
                   conflict=None if write else Failed)


def recovery_refused(run_id: str) -> Refused:
    """kl recover of ``run_id`` through a new run: nothing was opened, whatever the server said."""
    return Refused(words=lambda exc: f"cannot recover {run_id}: {exc}; nothing was opened or committed",
                   other=Failed)


@dataclass(frozen=True, slots=True)
class ApplyRun:
    """A run this command holds as ``holder``; ``opened`` is the server's answer that opened it (None for a
    run opened earlier, which ``kl recover`` commits through while it is live)."""

    client: EngineClient
    id: str
    holder: str
    opened: OpenedRun | None = None

    @classmethod
    def open(cls, client: EngineClient, state: str, *, holder: str, reservations: Sequence[Reservation],
             base_serial: int | None, info: dict[str, Any], wait_seconds: float | None = None,
             lease_seconds: float | None = None, refused: Refused = APPLY_REFUSED) -> ApplyRun:
        """Open a run holding ``reservations`` at ``base_serial``; raises ``refused``'s outcome when the
        server refuses."""
        try:
            opened = client.open_run(state, actor=holder, reservations=reservations, wait_seconds=wait_seconds,
                                     lease_seconds=lease_seconds, base_serial=base_serial, info=info)
        except EngineError as exc:
            outcome = refused.outcome(exc)
            if outcome is exc:
                raise
            raise outcome from exc
        return cls(client, opened.id, holder, opened)

    def heartbeat(self, lease_seconds: float, echo: Echo) -> Heartbeat:
        """The lease renewal for a run whose lease lasts ``lease_seconds`` (renewed every third of it)."""
        return Heartbeat(self.client, self.id, self.holder, max(lease_seconds / 3, 1.0), echo)

    def running(self) -> None:
        """Tell the server Terraform is about to apply."""
        self.client.run_action(self.id, "running", {"holder": self.holder})

    def dry_commit(self, addresses: list[str], outputs: list[str]) -> None:
        """The commit's refusals of these changes, before they are made (raises the refusal as EngineError)."""
        self.client.dry_commit(self.id, holder=self.holder, addresses=addresses, outputs=outputs)

    def commit(self, state: dict[str, Any], slice_addresses: list[str], prune_outputs: bool | list[str]) -> Commit:
        return self.client.commit(self.id, holder=self.holder, state=state, slice_addresses=slice_addresses,
                                  prune_outputs=prune_outputs)

    def close(self, status: RunStatus, summary: str) -> EngineError | None:
        """End the run as ``status`` (failed or aborted) with ``summary``'s tail as its error summary; the
        error when the server would not (the run may have ended already), else None."""
        try:
            self.client.run_action(self.id, "close", {"holder": self.holder, "status": status,
                                                      "error_summary": summary[-SUMMARY_CHARS:]})
        except EngineError as exc:
            return exc
        return None

    def close_failed(self, summary: str) -> EngineError | None:
        return self.close(RunStatus.FAILED, summary)


class Heartbeat:
    """Renews the run's lease in the background and watches the run's status between renewals. A failed
    renew is loud and sticky; while ``watching``, a run an operator is aborting, or one whose reservations
    are lost, sets ``stop``, which interrupts the Terraform command running under it
    (``TerraformContext.stop``)."""

    def __init__(self, client: EngineClient, run_id: str, holder: str, every: float, echo: Echo,
                 poll: float = 2.0) -> None:
        self._client, self._run_id, self._holder, self._every, self._echo = client, run_id, holder, every, echo
        self._poll = min(poll, every)
        self._stop = threading.Event()
        self.stop = threading.Event()
        self.watching = threading.Event()  # set while Terraform applies: the run's status is watched
        self.lost: str | None = None
        self.aborted: str | None = None  # who aborted the run, and why (the run's error summary)
        self._thread = threading.Thread(target=self._loop, name="kl-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        waited = 0.0
        while not self._stop.wait(self._poll):
            waited += self._poll
            renew = waited >= self._every
            if not renew and not self.watching.is_set():
                continue
            try:
                if renew:
                    run = self._client.renew(self._run_id, self._holder)
                    waited = 0.0
                else:
                    run = self._client.run(self._run_id)
            except EngineError as exc:
                if exc.code in RUN_LOST:
                    self._lose(str(exc))
                    return
                self._echo(f"kl: warning: {'lease renewal' if renew else 'the run status check'} failed ({exc}); "
                           "retrying")
                continue
            if not self.watching.is_set():
                continue  # before and after the apply the caller itself moves the run on
            status = run.status
            if status == RunStatus.ABORTING and self.aborted is None:
                self.aborted = run.error_summary or "aborted"
                self._echo(f"kl: run {self._run_id} is being aborted ({self.aborted}): stopping Terraform")
                self.stop.set()
            elif status not in LIVE_STATUSES:
                self._lose(f"the run is {status}")
                return

    def _lose(self, why: str) -> None:
        self.lost = why
        self._echo(f"kl: LOST the reservations of {self._run_id}: {why}. Stopping Terraform; nothing will be "
                   "committed.")
        self.stop.set()
