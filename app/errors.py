"""The KlError tree: every failure the service reports, with its HTTP status and data.

Errors carry what a caller needs to act (the lock holder, the conflicting serials); they are
turned into responses in exactly one place, ``app.web.errors``. Messages never contain state
bodies or secrets, and say what to do next.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class KlError(Exception):
    """Base of every expected failure. ``status`` is the HTTP status, ``code`` a stable slug."""

    status = 500
    code = "internal"

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class ConfigError(KlError):
    """The environment is missing or mis-states settings; lists every problem at once."""

    code = "config"

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(
            "invalid configuration:\n  - " + "\n  - ".join(self.problems), problems=list(self.problems)
        )


class DatabaseUnavailableError(KlError):
    """Postgres cannot be reached at startup; the message says where it tried and what to check."""

    status = 503
    code = "database_unavailable"


class BadRequestError(KlError):
    status = 400
    code = "bad_request"


class InvalidStateError(BadRequestError):
    code = "invalid_state"


class InvalidStateNameError(BadRequestError):
    code = "invalid_state_name"


class UnstorableValueError(BadRequestError):
    """A value the database refused as data (out of range, not storable text): the request's fault."""

    code = "unstorable_value"


class InvalidLockInfoError(BadRequestError):
    code = "invalid_lock_info"


class UnauthorizedError(KlError):
    status = 401
    code = "unauthorized"


class ForbiddenError(KlError):
    status = 403
    code = "forbidden"


class NotFoundError(KlError):
    status = 404
    code = "not_found"


class StateNotFoundError(NotFoundError):
    code = "state_not_found"


class ConflictError(KlError):
    status = 409
    code = "conflict"


class SerialConflictError(ConflictError):
    """A POST whose serial is already taken by other bytes, or lies below the head."""

    code = "serial_conflict"


class PayloadTooLargeError(KlError):
    status = 413
    code = "payload_too_large"


class StateLockedError(KlError):
    """The state is locked by someone else. ``lock_info`` is the holder's LockInfo JSON bytes,
    which the backend lane returns verbatim so Terraform can show who holds it and wait."""

    status = 423
    code = "state_locked"

    def __init__(self, message: str, lock_info: bytes) -> None:
        super().__init__(message)
        self.lock_info = lock_info


class TooManyRequestsError(KlError):
    """Refused before any work: the client must wait ``retry_after`` seconds (sent as Retry-After)."""

    status = 429
    code = "too_many_requests"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after


class AuthThrottledError(TooManyRequestsError):
    code = "auth_throttled"


class ServiceUnavailableError(KlError):
    status = 503
    code = "unavailable"


class BodyCapacityError(ServiceUnavailableError):
    """Too many large request bodies are being read at once; retry after ``retry_after`` seconds."""

    code = "body_capacity"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after


class ReservationConflictError(ConflictError):
    """Requested reservations overlap live ones (or an earlier waiter's request). ``conflicts``
    lists each overlapping holding; ``message`` is the human one-liner per conflict."""

    code = "reservation_conflict"

    def __init__(self, message: str, conflicts: list[dict[str, object]], *, total: int | None = None) -> None:
        super().__init__(message, conflicts=conflicts,
                         conflicts_total=len(conflicts) if total is None else total)
        self.conflicts = conflicts


class TicketExpiredError(ConflictError):
    """A wait ticket was not presented again within its window, or is not this caller's (another
    credential, state or set of reservations): its place in the queue is gone."""

    code = "wait_ticket_expired"


class LeaseExpiredError(ConflictError):
    """A run's lease ran out: someone else may now hold its addresses, so the holder must stop."""

    code = "lease_expired"


class RunClosedError(ConflictError):
    """The apply run is no longer live (committed, failed, aborted or expired)."""

    code = "run_closed"


class NotRunHolderError(ForbiddenError):
    code = "not_run_holder"


class RunNotFoundError(NotFoundError):
    code = "run_not_found"


class StalePlanError(ConflictError):
    """Addresses the run reserved changed on the trunk after its base serial."""

    code = "stale_plan"


class WriteOutsideReservationError(ConflictError):
    """A commit would change addresses that none of the run's write reservations cover."""

    code = "write_outside_reservation"
