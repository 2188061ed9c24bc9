"""HTTP client for the engine lane (/v1/engine). kl talks to the server only through this.

Reads (every GET, and the slice and edges queries, which are POSTs only to carry their glob lists) go through
a session whose adapter retries as Terraform's own HTTP backend client does: a refused or dropped connection,
429 and 5xx other than 501, twice, with exponential backoff and ``Retry-After`` respected. Requests that change
something (open, acquire, commit, abort, drift records) are never re-sent blindly: a lost answer could hide a
change that happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from analyzer.globs import Mode, Reservation
from app.domain.reservations import RunStatus
from app.wire import ReadError, read
from runner.core.config import ClientConfig
from runner.core.errors import EngineCode


class EngineError(Exception):
    """The server refused or failed a request; carries the JSON envelope's code (an ``EngineCode`` when the
    client acts on it) and status."""

    def __init__(self, message: str, *, status: int, code: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.body = body or {}


class EngineBadRequest(EngineError):
    """The server found the request itself wrong (HTTP 400): what was given must change, not the server."""


def engine_error(message: str, *, status: int, code: str, body: dict[str, Any] | None = None) -> EngineError:
    kind = EngineBadRequest if status == 400 else EngineError
    return kind(message, status=status, code=code, body=body)


class MalformedAnswer(EngineError):
    """A success answer without the fields the client reads from it (a server of another version, or not
    Kilolock's): nothing the answer said is acted on."""


# --- the answers kl acts on, parsed in one place (``parse_answer``) -----------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """A run as the engine describes it: the fields kl acts on (the rest of the answer is ignored)."""

    id: str
    state: str
    status: RunStatus
    actor: str  # the holder: who opened it, and must name itself to renew, commit or close it
    base_serial: int | None = None
    committed_serial: int | None = None
    error_summary: str | None = None


@dataclass(frozen=True, slots=True)
class RunAnswer:
    """An answer that carries one run (get, renew, running, close, reservations)."""

    run: Run


@dataclass(frozen=True, slots=True)
class OpenedRun:
    """A granted run: the run, the reservations it holds, and where the trunk stood when they were granted
    (the head serial and its lineage, read under the state's row lock in the granting transaction)."""

    run: Run
    reservations: tuple[Reservation, ...] = ()
    granted_at_serial: int | None = None
    granted_at_lineage: str | None = None

    @property
    def id(self) -> str:
        return self.run.id

    @property
    def holder(self) -> str:
        return self.run.actor


@dataclass(frozen=True, slots=True)
class Commit:
    """What a row-level commit wrote: the new serial (None when nothing changed), the addresses and the
    counts of rows created, updated and deleted, and the root outputs it changed."""

    serial: int | None
    addresses: tuple[str, ...] = ()
    created: int = 0
    updated: int = 0
    deleted: int = 0
    outputs_changed: tuple[str, ...] = ()

    @property
    def rows(self) -> dict[str, int]:
        return {"created": self.created, "updated": self.updated, "deleted": self.deleted}


@dataclass(frozen=True, slots=True)
class CommitAnswer:
    run: Run
    commit: Commit


@dataclass(frozen=True, slots=True)
class Edge:
    """One dependency edge of the trunk: ``address`` depends on ``depends_on``."""

    address: str
    depends_on: str


@dataclass(frozen=True, slots=True)
class EdgesAnswer:
    edges: tuple[Edge, ...]


@dataclass(frozen=True, slots=True)
class QueuedAnswer:
    conflicts: tuple[HeldBy, ...] = ()


_Answer = TypeVar("_Answer")


def parse_answer(kind: type[_Answer], body: Mapping[str, Any], what: str) -> _Answer:
    """``body`` (a decoded success answer to ``what``) as ``kind``; MalformedAnswer naming the fields that
    are missing or of the wrong type (never their values)."""
    try:
        answer = read(kind, body)
    except ReadError as exc:
        raise MalformedAnswer(f"the server's answer to {what} is not what kl expects ({exc.summary('the answer')}): "
                              "is the address a Kilolock server of a matching version?", status=200,
                              code=EngineCode.MALFORMED_ANSWER) from exc
    return answer


@dataclass(frozen=True, slots=True)
class HeldBy:
    """A reservation a queued request waits behind, as the server's conflict object names it."""

    glob: str
    mode: Mode
    holder: str
    run_id: str | None = None
    expires_in: int | None = None  # seconds left on its lease; None for one without


@dataclass(frozen=True, slots=True)
class Waiting:
    """A reservation request still queued: what it waits for, for how long so far, and the most it will wait
    (seconds)."""

    conflicts: tuple[HeldBy, ...]
    waited: float
    limit: float
    done: bool = False  # the wait is over (granted, refused, or given up): the last call


# Terraform's HTTP backend: retry_max 2, retry_wait_min 1 s, retry_wait_max 30 s; 5xx other than 501 and 429.
READ_RETRY = Retry(total=2, connect=2, read=2, status=2, backoff_factor=1.0, backoff_max=30.0,
                   status_forcelist=(429, 500, 502, 503, 504), allowed_methods=frozenset({"GET", "POST"}),
                   respect_retry_after_header=True, raise_on_status=False)


def _session(config: ClientConfig, retry: Retry | None) -> requests.Session:
    session = requests.Session()
    if retry is not None:
        adapter = HTTPAdapter(max_retries=retry)
        session.mount("http://", adapter)
        session.mount("https://", adapter)
    if config.token:
        if config.username:
            session.auth = (config.username, config.token)
        else:
            session.headers["Authorization"] = f"Bearer {config.token}"
    return session


class EngineClient:
    def __init__(self, config: ClientConfig, *, timeout: float = 60.0,
                 sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.timeout = timeout
        # Told of every queued answer while a reservation request waits (kl apply --wait shows it).
        self.on_wait: Callable[[Waiting], None] | None = None
        self._sleep = sleep
        self._monotonic = monotonic
        self._session = _session(config, None)  # changes: sent once
        self._reads = _session(config, READ_RETRY)  # reads: retried like Terraform's backend client

    def _url(self, path: str) -> str:
        return self.config.base_url.rstrip("/") + "/v1/engine" + path

    def _state_path(self, state: str) -> str:
        return "/states/" + quote(state, safe="/")

    def _read(self, method: str, path: str, *, params: dict[str, Any] | None = None,
              body: dict[str, Any] | None = None) -> requests.Response:
        """A read (retried like Terraform's backend client); an error answer raises as EngineError."""
        try:
            response = self._reads.request(method, self._url(path), params=params, json=body, timeout=self.timeout)
        except requests.ConnectionError as exc:
            raise self._unreachable() from exc
        if response.status_code >= 400:
            self._decode(response)
        return response

    def _get(self, path: str, params: dict[str, Any] | None = None) -> requests.Response:
        return self._read("GET", path, params=params)

    def _get_json(self, path: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        answer: dict[str, Any] = self._get(path, params).json()
        return answer

    def _get_list(self, path: str, key: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The list a read answers under ``key`` (``{"states": [...]}``)."""
        items: list[dict[str, Any]] = self._get_json(path, params)[key]
        return items

    def _unreachable(self) -> EngineError:
        return EngineError(f"cannot reach Kilolock at {self.config.base_url}: is the server running (kl serve)?",
                           status=0, code=EngineCode.UNREACHABLE)

    def list_states(self) -> list[dict[str, Any]]:
        return self._get_list("/states", "states")

    def list_resources(self, state: str, *, serial: int | None = None, prefix: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in {"serial": serial, "prefix": prefix}.items() if v is not None}
        return self._get_json(self._state_path(state) + "/resources", params)

    def history(self, state: str, address: str) -> list[dict[str, Any]]:
        return self._get_list(self._state_path(state) + "/history", "lifecycles", {"address": address})

    def blame(self, state: str, glob: str, *, after: str = "", limit: int = 100,
              changes: int = 20) -> dict[str, Any]:
        """One page of the history of the addresses under ``glob``: ``instances`` and ``next_after``."""
        params: dict[str, Any] = {"glob": glob, "limit": limit, "changes": changes}
        if after:
            params["after"] = after
        return self._get_json(self._state_path(state) + "/history", params)

    def dependencies(self, state: str, *, serial: int | None = None) -> list[dict[str, Any]]:
        params = {"serial": serial} if serial is not None else None
        return self._get_list(self._state_path(state) + "/dependencies", "edges", params)

    def assembled(self, state: str, *, serial: int | None = None) -> bytes:
        params = {"serial": serial} if serial is not None else None
        return self._get(self._state_path(state) + "/assembled", params).content

    # --- runs and reservations ------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any], *, timeout: float | None = None, read: bool = False,
              ) -> dict[str, Any]:
        return self._post_status(path, body, timeout=timeout, read=read)[0]

    def _post_status(self, path: str, body: dict[str, Any], *, timeout: float | None = None, read: bool = False,
                     ) -> tuple[dict[str, Any], int]:
        session = self._reads if read else self._session
        try:
            response = session.post(self._url(path), json=body, timeout=timeout or self.timeout)
        except requests.ConnectionError as exc:
            raise self._unreachable() from exc
        return self._decode(response), response.status_code

    def _acquire(self, path: str, body: dict[str, Any], wait_seconds: float | None) -> dict[str, Any]:
        """POST a reservation request; while the server answers 202 (queued), wait as it says and
        ask again with the ticket, until granted, refused, or ``wait_seconds`` is used up (then one
        last ask without a wait gets the final answer). Stopping early (Ctrl-C, SIGTERM, a cancelled job)
        gives the place up on the server at once (:meth:`cancel_ticket`); if even that cannot reach it,
        the ticket lapses there within its window and is never granted."""
        began = self._monotonic()
        deadline = began + (wait_seconds or 0)
        request = dict(body)
        try:
            return self._wait_in_queue(path, request, began, deadline, wait_seconds or 0.0)
        except EngineError as exc:
            if exc.status != 409:  # a refusal (409) has ended the place on the server already
                self._give_up(request, body)
            raise
        except BaseException:
            # Stopped while queued (Ctrl-C, SIGTERM, a lost connection, a cancelled job): the place goes with us.
            self._give_up(request, body)
            raise

    def _give_up(self, request: dict[str, Any], body: dict[str, Any]) -> None:
        if request.get("ticket"):
            self.cancel_ticket(str(request["ticket"]), str(body.get("actor") or body.get("holder") or ""))

    def _wait_in_queue(self, path: str, request: dict[str, Any], began: float, deadline: float,
                       limit: float) -> dict[str, Any]:
        queued = False
        try:
            while True:
                answer, status = self._post_status(path, request)
                if status != 202:
                    request.pop("ticket", None)  # granted or refused: the server has ended the queue place
                    return answer
                queued = True
                self._pace(answer, request, began, deadline, limit)
        finally:
            if queued and self.on_wait is not None:
                self.on_wait(Waiting((), self._monotonic() - began, limit, done=True))

    def _pace(self, answer: dict[str, Any], request: dict[str, Any], began: float, deadline: float,
              limit: float) -> None:
        """One queued answer: note its ticket, report the wait, and pause as the server asks (or, once the
        wait is used up, ask for the final answer at once)."""
        request["ticket"] = answer["ticket"]
        if self.on_wait is not None:
            self.on_wait(Waiting(conflicts=parse_answer(QueuedAnswer, {"conflicts": answer.get("conflicts") or ()},
                                                          "a queued request").conflicts,
                                 waited=self._monotonic() - began, limit=limit))
        remaining = deadline - self._monotonic()
        if remaining <= 0:
            request["wait_seconds"] = 0
            return
        pause = float(answer.get("poll_after_seconds") or 1.0)
        # Pooled connections idle for the pause may be closed by the server's keep-alive timeout just
        # as the next poll goes out on them; asking on a fresh connection never races that.
        self._session.close()
        self._sleep(max(min(pause, remaining), 0.05))

    def cancel_ticket(self, ticket: str, holder: str) -> bool:
        """Give up a queue place (best effort: False when the server is unreachable or the place is gone)."""
        try:
            answer, _ = self._post_status(f"/tickets/{quote(ticket, safe='')}/cancel", {"holder": holder},
                                          timeout=min(self.timeout, 10.0))
        except (EngineError, requests.RequestException):
            return False
        return bool(answer.get("cancelled"))

    @staticmethod
    def _decode(response: requests.Response) -> dict[str, Any]:
        try:
            body: dict[str, Any] = response.json()
        except ValueError:
            body = {"error": response.text.strip()[:300], "code": EngineCode.HTTP_ERROR}
        if response.status_code >= 400:
            raise engine_error(str(body.get("error")), status=response.status_code, code=str(body.get("code")),
                               body=body)
        return body

    def list_runs(self, state: str | None = None, *, status: str | None = None,
                  limit: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {k: v for k, v in {"state": state, "status": status, "limit": limit}.items() if v}
        return self._get_list("/runs", "runs", params)

    def list_reservations(self, state: str | None = None) -> list[dict[str, Any]]:
        params = {"state": state} if state else None
        return self._get_list("/reservations", "reservations", params)

    def take_hold(self, state: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._post(self._state_path(state) + "/holds", body)["hold"]
        return result

    def list_holds(self, state: str | None = None) -> list[dict[str, Any]]:
        params = {"state": state} if state else None
        return self._get_list("/holds", "holds", params)

    def release_hold(self, hold_id: str) -> dict[str, Any]:
        try:
            response = self._session.delete(self._url(f"/holds/{quote(hold_id, safe='')}"), timeout=self.timeout)
        except requests.ConnectionError as exc:
            raise self._unreachable() from exc
        result: dict[str, Any] = self._decode(response)["hold"]
        return result

    def get_run(self, run_id: str) -> dict[str, Any]:
        """The run's whole answer, as ``kl runs show`` prints it (``run`` is the typed view kl acts on)."""
        return self._get_json(f"/runs/{quote(run_id)}")

    def run(self, run_id: str) -> Run:
        return parse_answer(RunAnswer, self.get_run(run_id), "a run read").run

    def renew(self, run_id: str, holder: str) -> Run:
        """Extend the run's lease by its length; the run as it now stands."""
        return parse_answer(RunAnswer, self.run_action(run_id, "renew", {"holder": holder}), "a renewal").run

    def list_events(self, state: str, *, limit: int = 1000) -> list[dict[str, Any]]:
        """The state's newest audit events, newest first."""
        return self._get_list(self._state_path(state) + "/events", "events", {"limit": limit})

    def open_run(
        self, state: str, *, actor: str, reservations: Sequence[Reservation], wait_seconds: float | None = None,
        lease_seconds: float | None = None, base_serial: int | None = None, info: dict[str, Any] | None = None,
    ) -> OpenedRun:
        body: dict[str, Any] = {"actor": actor, "reservations": [r.to_json() for r in reservations]}
        for key, value in (("wait_seconds", wait_seconds), ("lease_seconds", lease_seconds),
                           ("base_serial", base_serial), ("info", info)):
            if value is not None:
                body[key] = value
        return parse_answer(OpenedRun, self._acquire(self._state_path(state) + "/runs", body, wait_seconds),
                            "opening a run")

    def run_action(self, run_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        """renew, release, running, close, abort or reservations on one run (``reservations``
        waits like ``open_run`` when the body has ``wait_seconds``)."""
        path = f"/runs/{quote(run_id)}/{action}"
        if action == "reservations":
            wait = body.get("wait_seconds")
            return self._acquire(path, body, float(wait) if isinstance(wait, int | float) else None)
        return self._post(path, body)

    def commit(self, run_id: str, *, holder: str, state: dict[str, Any], slice_addresses: list[str],
               prune_outputs: bool | list[str] = True) -> Commit:
        body = {"holder": holder, "state": state, "slice_addresses": slice_addresses, "prune_outputs": prune_outputs}
        answer = self._post(f"/runs/{quote(run_id)}/commit", body, timeout=self.timeout * 5)
        return parse_answer(CommitAnswer, answer, "a commit").commit

    def dry_commit(self, run_id: str, *, holder: str, addresses: list[str], outputs: list[str]) -> dict[str, Any]:
        """The commit's refusals for the changes a plan will make (raises the refusal as EngineError);
        changes nothing on the server."""
        body = {"holder": holder, "addresses": addresses, "outputs": outputs}
        return self._post(f"/runs/{quote(run_id)}/dry-commit", body)["dry_commit"]  # type: ignore[no-any-return]

    def slice(self, state: str, globs: list[str]) -> bytes:
        """The head's instances under ``globs`` as a v4 state (404 when the state has no versions)."""
        return self._read("POST", self._state_path(state) + "/slice", body={"globs": globs}).content

    def edges(self, state: str, globs: list[str]) -> list[tuple[str, str]]:
        body = self._post(self._state_path(state) + "/edges", {"globs": globs}, read=True)
        return [(e.address, e.depends_on) for e in parse_answer(EdgesAnswer, body, "an edges query").edges]

    def drift(self, state: str) -> dict[str, Any]:
        """The state's latest drift report (its outstanding drift and when it was checked)."""
        return self._get_json(self._state_path(state) + "/drift")

    def record_drift(self, state: str, report: dict[str, Any]) -> dict[str, Any]:
        """Store a drift check's findings (addresses and attribute names only)."""
        return self._post(self._state_path(state) + "/drift", report)
