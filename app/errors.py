"""The KlError tree: every failure the service reports, with its HTTP status and data.

Errors carry what a caller needs to act (the lock holder, the conflicting serials); they are
turned into responses in exactly one place, ``app.web.errors``. Messages never contain state
bodies or secrets, and say what to do next.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


class KlError(Exception):
    """Base of every expected failure. ``status`` is the HTTP status, inherited unless a class sets its
    own; ``code`` a stable slug: the class name in snake case without ``Error`` (``StateLockedError`` →
    ``state_locked``) unless the class sets another."""

    status = 500
    code = "internal"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:
            cls.code = re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.removesuffix("Error")).lower()

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class ConfigError(KlError):
    """The environment is missing or mis-states settings; lists every problem at once."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(
            "invalid configuration:\n  - " + "\n  - ".join(self.problems), problems=list(self.problems)
        )


class RetryLaterError(KlError):
    """Refused before any work: the client must wait ``retry_after`` seconds (sent as Retry-After)."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, retry_after=retry_after)
        self.retry_after = retry_after


# The statuses, each with the family of errors answered with it.

class BadRequestError(KlError):
    status = 400


class UnauthorizedError(KlError):
    status = 401


class ForbiddenError(KlError):
    status = 403


class NotFoundError(KlError):
    status = 404


class ConflictError(KlError):
    status = 409


class PayloadTooLargeError(KlError):
    status = 413


class TooManyRequestsError(RetryLaterError):
    status = 429


class ServiceUnavailableError(KlError):
    status = 503
    code = "unavailable"


class DatabaseUnavailableError(KlError):
    """Postgres cannot be reached at startup; the message says where it tried and what to check."""

    status = 503


class InvalidStateError(BadRequestError):
    """A state body that is not a Terraform v4 state."""


class InvalidStateNameError(BadRequestError):
    """A state name outside the allowed characters or length."""


class UnstorableValueError(BadRequestError):
    """A value the database refused as data (out of range, not storable text): the request's fault."""


class InvalidLockInfoError(BadRequestError):
    """A LOCK or UNLOCK body that is not Terraform's LockInfo."""


class ArchiveError(BadRequestError):
    """A backup archive that cannot be restored: damaged, not a kl backup, or from a newer schema."""


class DatabaseNotEmptyError(ConflictError):
    """A restore refused because the target database holds data of its own."""


class StateNotFoundError(NotFoundError):
    """No state of that name for this credential."""


class RunNotFoundError(NotFoundError):
    """No apply run of that id for this credential."""


class NotRunHolderError(ForbiddenError):
    """The apply run belongs to another credential or holder."""


class SerialConflictError(ConflictError):
    """A POST whose serial is already taken by other bytes, or lies below the head."""


class StateLockedError(KlError):
    """The state is locked by someone else. ``lock_info`` is the holder's LockInfo JSON bytes,
    which the backend lane returns verbatim so Terraform can show who holds it and wait."""

    status = 423

    def __init__(self, message: str, lock_info: bytes) -> None:
        super().__init__(message)
        self.lock_info = lock_info


class AuthThrottledError(TooManyRequestsError):
    """Too many failed authentications from this client address or for this token."""


class BodyCapacityError(RetryLaterError, ServiceUnavailableError):
    """Too many large request bodies are being read at once; retry after ``retry_after`` seconds."""


class ReservationConflictError(ConflictError):
    """Requested reservations overlap live ones (or an earlier waiter's request). ``conflicts``
    lists each overlapping holding; ``message`` is the human one-liner per conflict. Refused because
    earlier waiters go first, ``waiting`` names the first of them and ``waiting_total`` counts them."""

    def __init__(self, message: str, conflicts: list[dict[str, object]], *, total: int | None = None,
                 **data: object) -> None:
        super().__init__(message, conflicts=conflicts,
                         conflicts_total=len(conflicts) if total is None else total, **data)
        self.conflicts = conflicts


class TicketExpiredError(ConflictError):
    """A wait ticket was not presented again within its window, or is not this caller's (another
    credential, state or set of reservations): its place in the queue is gone."""

    code = "wait_ticket_expired"


class LeaseExpiredError(ConflictError):
    """A run's lease ran out: someone else may now hold its addresses, so the holder must stop."""


class RunClosedError(ConflictError):
    """The apply run is no longer live (committed, failed, aborted or expired)."""


class StalePlanError(ConflictError):
    """Addresses the run reserved changed on the trunk after its base serial."""


class WriteOutsideReservationError(ConflictError):
    """A commit would change addresses that none of the run's write reservations cover."""


class AddressScopeError(ForbiddenError):
    """The token's address scopes do not allow this: ``glob`` is what was asked for or written, ``mode``
    the mode it needed, ``nearest_scope`` the token's scope closest to it ("" when it has none that meets).
    Audited where it is answered (``app.web.errors``)."""

    code = "address_scope"

    def __init__(self, message: str, *, glob: str, mode: str, nearest_scope: str, state: str) -> None:
        super().__init__(message, glob=glob, mode=mode, nearest_scope=nearest_scope, state=state)
        self.glob, self.mode, self.nearest_scope, self.state = glob, mode, nearest_scope, state


class HoldLimitError(ConflictError):
    """A manual hold would pass the holds a token or a state may have (KL_MAX_HOLDS_PER_TOKEN/STATE)."""


class HoldNotFoundError(NotFoundError):
    """No live manual hold of that id for this credential."""


class HoldForbiddenError(ForbiddenError):
    """The caller may not take a hold without expiry, or release a hold another credential took."""
